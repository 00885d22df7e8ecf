"""Settings → API tokens: the signed-in user's tokens for the current project (an owner sees and
revokes everyone's there, studio.queries.tokens_for), make one, revoke one. Tokens are made and
revoked by studio.services, which write the audit trail. The plaintext is shown once, on the page
that answers the POST that made it: it is never stored (only its hash is), not even in the session
for a redirect's page, and that page is not cached. Reloading it makes no second token (studio.once)."""
from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from studio import once, services
from studio.errors import ApiError, NotFound
from studio.models import ApiToken, Project, Role
from studio.queries import tokens_for
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor

FIELDS = {"name"}


def _context(request: HttpRequest, project: Project, **shown) -> dict:
    member = web_actor(request).membership(project)
    return {
        "section": "api_tokens",
        "project": project,
        "tokens": tokens_for(request.user, project).order_by("-created_at", "-id"),
        "is_owner": bool(member and member.role == Role.OWNER),
        "is_viewer": bool(member and member.role == Role.VIEWER),
        "name_max": ApiToken._meta.get_field("name").max_length,
        "runs_url": request.build_absolute_uri("/api/training-runs"),
        "errors": {},
        "name": "",
        "created": None,
        "once": once.new_key(),
        **shown,
    }


@studio_page
@require_GET
def api_tokens_page(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_project()
    refused = refused_forms(request).get("token", {})
    return render(request, "studio/api_tokens.html", _context(request, project, errors=refused.get("errors", {}),
                                                               name=refused.get("values", {}).get("name", "")))


@never_cache  # the answer holds the plaintext: no browser or proxy keeps a copy of it
@studio_page
@form_action("api_tokens")
def create_token(request: HttpRequest) -> HttpResponse:
    """Any member may make a token, a viewer too: it acts with its user's role at each call, so a
    viewer's token reads and every write it sends is a 403 (Actor.require_write)."""
    project = web_actor(request).require_project()
    name = request.POST.get("name", "").strip()
    if not once.first_send(request):  # a reload of the answer that showed the token
        messages.info(request, "That form was sent before (the page that showed the new token was reloaded): its token was made "
                               "then, and its value is shown only once. If you did not copy it, revoke it below and make another.")
        return redirect("api_tokens")
    try:
        token, plaintext = services.create_api_token(request.user, project, name=name)
    except ApiError as exc:
        return refuse_form(request, reverse("api_tokens"), "token", errors_by_field(exc, FIELDS), {"name": name})
    return render(request, "studio/api_tokens.html", _context(request, project, created={"token": token, "plaintext": plaintext}))


def tokens_page(request: HttpRequest, *args: Any, **kwargs: Any) -> str:
    """Where a GET of a token's Revoke URL goes (form_action): the list, whatever the token."""
    return reverse("api_tokens")


@studio_page
@form_action(tokens_page)
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the tokens the page lists; any other id (another user's, another project's) is a 404."""
    project = web_actor(request).require_project()
    token = tokens_for(request.user, project).filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"No API token {token_id} among yours in project {project.slug}.")
    label = f"{token.prefix}…" + (f" ({token.name})" if token.name else "")
    if services.revoke_api_token(token):
        messages.success(request, f"Revoked token {label}: calls with it now answer 401.")
    else:
        messages.info(request, f"Token {label} was already revoked.")
    return redirect("api_tokens")
