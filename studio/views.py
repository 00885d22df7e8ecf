"""Studio's own pages (login lives in django.contrib.auth), and what the app pages share:
the session's Actor, and turning service errors into pages."""
from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from functools import wraps
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db.models import Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render, resolve_url
from django.templatetags.static import static
from django.urls import Resolver404, resolve
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

from studio import services
from studio.auth import SESSION_PROJECT_KEY, Actor, current_project_for_session
from studio.errors import ApiError, Finding, Forbidden, NotFound
from studio.models import Membership, Role
from studio.queries import projects_for
from studio.ratelimit import TooManyRequests
from training.compute import accelerators_of
from training.models import ACTIVE_STATUSES, TrainingRun


def web_actor(request: HttpRequest) -> Actor:
    """The browser session as the services see it: its user in its current project."""
    return Actor(user=request.user, project=current_project_for_session(request))


# The login URL's flag for a form POST that came after its session ended (a fixed sentence, never text from the URL).
SESSION_ENDED = "expired"
SESSION_ENDED_NOTE = "Your session ended: nothing was done. Log in, then do it again."


def login_redirect(request: HttpRequest) -> HttpResponse:
    """Where an anonymous request goes: the login page, then back. An htmx request (a poll, a
    button) would follow a plain redirect inside its XMLHttpRequest and swap the login form into
    its fragment, so it is told to load the login page in place of the whole page (HX-Redirect),
    with `next` the page it came from rather than the fragment's own URL. A plain form's POST
    returns to the page the form was on (its same-origin Referer): after logging in the browser
    GETs `next`, and a POST-only URL would answer 405. What the form sent is dropped, so the login
    page is told to say so (SESSION_ENDED): the user would otherwise believe it was done."""
    if not request.htmx:
        if request.method in ("GET", "HEAD"):
            return auth_views.redirect_to_login(request.get_full_path())
        page = form_page(request)
        return redirect(f"{resolve_url(settings.LOGIN_URL)}?{urlencode({**({'next': page} if page else {}), SESSION_ENDED: '1'})}")
    page = request.htmx.current_url_abs_path  # None from another origin: never send anyone there
    login_url = resolve_url(settings.LOGIN_URL)
    return HttpResponseClientRedirect(f"{login_url}?{urlencode({'next': page})}" if page else login_url)


def form_page(request: HttpRequest) -> str | None:
    """The path of the page a form was sent from, from its Referer when that is this site; else None."""
    referer = request.headers.get("Referer", "")
    if not url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return None
    parts = urlsplit(referer)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path or None


def studio_page(view: Callable) -> Callable:
    """Login required; a NotFound from a lookup is a 404 page and a Forbidden a 403 page."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return login_redirect(request)
        try:
            response = view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.detail) from exc
        except Forbidden as exc:
            raise PermissionDenied(exc.detail) from exc
        if getattr(request, REFUSED_FORM_SHOWN, False):
            focus_refusal(response)
        if request.htmx:
            response.headers["Vary"] = ", ".join(filter(None, [response.headers.get("Vary"), "HX-Request"]))
        return response

    return wrapper


def form_action(page: str | Callable[..., str]) -> Callable:
    """A form's or button's action URL: POST only. A GET of it (the address bar, a bookmark, a
    link shared from a page once drawn at this URL) goes to the form's page, `page`, a URL name taking
    the same URL arguments (or a function of the request and them giving its URL), instead of a 405
    with an empty body."""

    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method in ("GET", "HEAD"):
                return redirect(page(request, *args, **kwargs)) if callable(page) else redirect(page, *args, **kwargs)
            return require_POST(view)(request, *args, **kwargs)

        return wrapper

    return decorator


def htmx_fragment(page: Callable[..., str]) -> Callable:
    """A view that answers htmx with a piece of a page (a poll, a form's live part): requested without
    htmx (the address bar, a bookmark, a link opened in a new tab) it redirects to the page the piece
    belongs to, `page(request, *args, **kwargs)`, rather than answer a bare fragment with no layout."""

    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not request.htmx:
                return redirect(page(request, *args, **kwargs))
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def errors_by_field(error: ApiError | list[Finding], fields: set[str] | None = None) -> dict[str, list[str]]:
    """Findings keyed by the form field that shows them: the exact dotted path when the form has it,
    else the nearest shown parent (config.loss.x → config.loss → config), else "general"."""
    findings = error.errors if isinstance(error, ApiError) else error
    out: dict[str, list[str]] = {}
    for finding in findings:
        key = finding.field
        if fields is not None:
            candidate = finding.field.split("[")[0] if finding.field.startswith("dataset") else finding.field
            while candidate and candidate not in fields:
                candidate = candidate.rpartition(".")[0]
            key = candidate or ("config_text" if finding.field.startswith("config") and "config_text" in fields else "general")
        message = finding.message if key == finding.field else f"{finding.field}: {finding.message}"
        out.setdefault(key, []).append(message)
    return out


# The plain form refused on the way to the page its POST was redirected to (refuse_form, refused_forms).
REFUSED_FORM_KEY = "refused_form"
# Set on the request whose page shows that refusal (refused_forms), for studio_page's focus_refusal.
REFUSED_FORM_SHOWN = "studio_refused_form_shown"
# Where focus_refusal puts the focus: what studio.js focuses on load, for a browser without JavaScript
# (the error summary, which says what to fix, else the first field marked invalid).
REFUSAL_FOCUS = [re.compile(r"<[a-z]+\b[^>]*\bdata-error-summary\b"), re.compile(r'<(?:input|select|textarea)\b[^>]*\baria-invalid="true"')]


class HttpResponseSeeOther(HttpResponseRedirect):
    status_code = 303  # a POST's answer: the browser GETs the page, and a reload GETs it again


def refuse_form(request: HttpRequest, url: str, form: str, errors: dict[str, Any], values: dict[str, Any] | None = None,
                shown: dict[str, Any] | None = None) -> HttpResponse:
    """A plain (non-htmx) form's refusal as redirect-after-POST: 303 to the form's page `url`, which
    shows `errors` beside its fields, with the `values` entered, once (refused_forms); `shown` is
    what else that page says of the refusal (NEW RUN's link to Billing). A page drawn straight from
    the POST made its reload send the form again, after the browser asked to resubmit.
    The session is stored server-side, but `values` still hold nothing secret: a secret's value is
    never kept, so a refused secret form asks for it again."""
    request.session[REFUSED_FORM_KEY] = {"path": urlsplit(url).path, "form": form, "errors": errors, "values": values or {}, "shown": shown or {}}
    return HttpResponseSeeOther(url)


def refused_forms(request: HttpRequest) -> dict[str, dict[str, Any]]:
    """{form: {"values": ..., "errors": ..., **shown}} for the form refused on the way to this page,
    or {}. Taken from the session as it is shown, so the next GET of the page shows a clean form."""
    kept = request.session.get(REFUSED_FORM_KEY)
    if not kept or kept["path"] != request.path:
        return {}
    del request.session[REFUSED_FORM_KEY]
    setattr(request, REFUSED_FORM_SHOWN, True)
    return {kept["form"]: {**kept.get("shown", {}), "values": kept["values"], "errors": kept["errors"]}}


def focus_refusal(response: HttpResponse) -> None:
    """Marks `autofocus` where the page showing a refused form puts the focus. Without JavaScript the
    focus stayed on the page's body after the redirect, and a keyboard or screen reader user started
    from the top, away from what was refused. Only that GET: the next one shows a clean form."""
    html = response.content.decode()
    for pattern in REFUSAL_FOCUS:
        found = pattern.search(html)
        if found:
            response.content = (html[:found.end()] + " autofocus" + html[found.end():]).encode()
            return


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The 400 page (handler400) for a form Django refuses before any view runs: the CSRF check
    reads the whole form first, so a form over DATA_UPLOAD_MAX_NUMBER_FILES files or
    DATA_UPLOAD_MAX_MEMORY_SIZE bytes of fields ends here rather than beside its field."""
    if isinstance(exception, TooManyFilesSent):
        sentence = (f"Too many files in one form: choose at most {settings.DATA_UPLOAD_MAX_NUMBER_FILES} in Files and commit the rest "
                    "in another upload (the Data Hub's upload API, POST /api/hub/repos/<name>/uploads, takes more).")
    elif isinstance(exception, TooManyFieldsSent):
        sentence = f"The form has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields: send fewer."
    elif isinstance(exception, RequestDataTooBig):
        sentence = f"A form field is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 1024} KiB (files are not counted): shorten it and send again."
    else:
        sentence = "The request could not be understood: reload the page and try again."
    return render(request, "400.html", {"exception": sentence}, status=400)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """The 403 for a stale form token (CSRF_FAILURE_VIEW). Reloading a page that a full-page POST
    answered sends the POST again with the same stale token, so the page links to a fresh GET of
    the form's page instead (for an htmx request, the page it was made from)."""
    htmx = getattr(request, "htmx", None)
    page = htmx.current_url_abs_path if htmx else form_page(request)
    return render(request, "403_csrf.html", {"fresh_page": page, "full_page": not htmx}, status=403)


class LoginView(auth_views.LoginView):
    """django.contrib.auth's login form. Its password check has a failure budget per address and
    user name (studio.auth.RateLimitedModelBackend): over it every POST is a 429, shown beside the
    form (the right password too, so guessing learns nothing until the window ends)."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs) -> dict[str, Any]:
        ended = self.request.GET.get(SESSION_ENDED) == "1" or self.request.POST.get(SESSION_ENDED) == "1"
        context = super().get_context_data(session_ended=SESSION_ENDED_NOTE if ended else None, session_ended_flag=SESSION_ENDED, **kwargs)
        form = context["form"]
        # A refused log-in names neither field (which one was wrong is not said): both are marked, and
        # read with the sentence above them.
        if context.get("refusal") or (form.is_bound and form.non_field_errors()):
            for name in ("username", "password"):
                form.fields[name].widget.attrs.update({"aria-invalid": "true", "aria-describedby": "login-errors"})
        return context

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return super().post(request, *args, **kwargs)
        except TooManyRequests as exc:
            # An unbound form: rendering a bound one validates it (its fields' aria-invalid), which is
            # another password check, refused again, and the 429 came as the page without the form.
            form = self.get_form_class()(request, initial={"username": request.POST.get("username", "")})
            return self.render_to_response(self.get_context_data(form=form, refusal=too_many_log_ins_sentence(exc)), status=429, headers=exc.headers())


def too_many_log_ins_sentence(exc: TooManyRequests) -> str:
    return f"Too many failed log-ins from this address: try again in {exc.retry_after} s."


def too_many_log_ins(request: HttpRequest, exc: TooManyRequests) -> HttpResponse:
    """The 429 page for a password form over its failure budget that does not show it beside the
    form itself, as the admin's log-in (studio.middleware.TooManyLogInsMiddleware)."""
    response = render(request, "429.html", {"refusal": too_many_log_ins_sentence(exc), "form_page": request.get_full_path()}, status=429)
    for name, value in exc.headers().items():
        response[name] = value
    return response


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico → the Studio's icon, for pages without a <link rel="icon"> (the admin's): resolved
    per request, as the hashed static name exists only once collectstatic has run."""
    return redirect(static("img/favicon.svg"), permanent=True)


@csrf_exempt  # it changes nothing, and an API client has no CSRF cookie
def api_root(request: HttpRequest) -> HttpResponse:
    """/api without its slash. A GET goes on to the API's home; any other method is a JSON 404 (with
    APPEND_SLASH, DEBUG's CommonMiddleware raised a 500 for a POST it cannot redirect)."""
    if request.method in ("GET", "HEAD"):
        return redirect("/api/")
    return JsonResponse({"detail": "There is no endpoint at /api: the API's endpoints are under /api/, listed at /api/docs.", "errors": []}, status=404)


@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness, for a load balancer or Kubernetes' livenessProbe: the web process answers. It asks
    nothing else (no database, session or Redis), so an outage of those does not have every web
    process restarted; /api/health says what is down (studio.health)."""
    return JsonResponse({"status": "ok"})


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("training:runs")


@studio_page
@require_POST
def switch_project(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("project", "")
    project = projects_for(request.user).filter(slug=slug).first()
    if project is None:
        raise Http404("No such project among yours.")
    request.session[SESSION_PROJECT_KEY] = slug
    services.remember_project(request.user, project)
    target = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "/"
    return redirect(landing_after_switch(target))


def landing_after_switch(target: str) -> str:
    """Where the project switcher lands: the page it was sent from, unless that page shows one object
    (its URL names it: a run, an experiment, a Data Hub or environment repo), which belongs to the
    project just left; then the list page of its section (/training/, /experiments/, /hub/, ...)."""
    path = urlsplit(target).path
    try:
        match = resolve(path)
    except Resolver404:
        return "/"
    if not match.kwargs:
        return target
    section = "/" + path.strip("/").split("/")[0] + "/"
    try:
        return section if not resolve(section).kwargs else "/"
    except Resolver404:
        return "/"


@studio_page
def billing(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_project()
    runs = TrainingRun.objects.filter(project=project)
    now = timezone.now()
    gpu_hours = 0.0
    for started, finished, compute in runs.filter(started_at__isnull=False).values_list("started_at", "finished_at", "compute"):
        gpus = accelerators_of(compute or {}).count
        gpu_hours += gpus * ((finished or now) - started).total_seconds() / 3600
    owners = Membership.objects.filter(project=project, role=Role.OWNER).select_related("user").order_by("user__username")
    context = {
        "section": "settings",
        "project": project,
        "plan": project.plan,
        "active_runs": runs.filter(status__in=ACTIVE_STATUSES).count(),
        "gpu_hours": gpu_hours,
        "cost": runs.aggregate(total=Sum("cost"))["total"] or Decimal("0"),
        "owners": [m.user for m in owners],
        "is_owner": any(m.user_id == request.user.pk for m in owners),
    }
    return render(request, "studio/billing.html", context)
