"""Who is calling, and in which project: a bearer token (implies its project) or a browser session
(the session's current project). Ingest uses its own per-run tokens (training/ingest.py)."""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.backends import ModelBackend
from django.db.models import F
from django.http import HttpRequest
from ninja.utils import check_csrf

from studio.errors import TOKENS_PAGE, Forbidden, NotFound, Unauthorized
from studio.models import ApiToken, Membership, Project
from studio.ratelimit import count_auth_attempt, login_scope, refund_auth_attempt, refuse_bad_credentials
from studio.services import authenticate_token

SESSION_PROJECT_KEY = "studio_project"


@dataclass
class Actor:
    user: object
    project: Project | None  # the current project; None when a session user belongs to none
    token: ApiToken | None = None

    def membership(self, project: Project) -> Membership | None:
        """The caller's membership of `project`, or None when it must look like it does not exist."""
        if self.token is not None and project.pk != self.token.project_id:
            return None
        return Membership.objects.filter(project=project, user=self.user).first()

    def can_write(self, project: Project) -> bool:
        """Whether the pages offer this caller their forms and buttons in `project` (require_write
        is the check that refuses)."""
        member = self.membership(project)
        return bool(member and member.can_write)

    def scoped_project_ids(self) -> list[int]:
        """Projects whose rows this caller may see at all (a token sees only its own)."""
        if self.token is not None:
            return [self.token.project_id]
        return list(Membership.objects.filter(user=self.user).values_list("project_id", flat=True))

    def require_project(self) -> Project:
        if self.project is None:
            raise NotFound("You are not a member of any project: ask an owner to add you.")
        return self.project

    def require_writable_project(self) -> Project:
        """The current project, for a page's form that changes something in it (404, then 403)."""
        project = self.require_project()
        self.require_write(project)
        return project

    def require_write(self, project: Project) -> Membership:
        member = self.membership(project)
        if member is None:
            raise NotFound()
        if not member.can_write:
            raise Forbidden(f"Viewers cannot change anything in project {project.slug}: ask an owner for the member role.")
        return member


def current_project_for_session(request: HttpRequest) -> Project | None:
    slug = request.session.get(SESSION_PROJECT_KEY)
    memberships = Membership.objects.filter(user=request.user).select_related("project", "project__plan")
    if slug:
        chosen = memberships.filter(project__slug=slug).first()
        if chosen:
            return chosen.project
    # A new session (just logged in) opens the project the user switched to last, else the first by name.
    first = memberships.order_by(F("last_used_at").desc(nulls_last=True), "project__slug").first()
    return first.project if first else None


class RateLimitedModelBackend(ModelBackend):
    """Django's user-name-and-password check under the password failure budget (studio/ratelimit.py),
    so every form that logs in through authenticate() has it: /login/ and the admin's /admin/login/,
    which guards the superusers. The attempt is counted before the slow password check (a burst sent
    at once gets no more checks than the budget) and over the budget TooManyRequests leaves
    authenticate(): LoginView and studio.middleware.TooManyLogInsMiddleware answer it with a 429. A
    right password gives its count back, so only wrong ones use the budget up."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs) -> object | None:
        # Without a request (a shell's authenticate()) there is no address to count against.
        counted = count_auth_attempt(request, login_scope(username or "")) if request is not None else None
        user = super().authenticate(request, username, password, **kwargs)
        if user is not None:
            refund_auth_attempt(counted)
        return user


# A member makes and revokes their own tokens on the Settings → API tokens page; a Studio administrator
# can too (manage.py createapitoken; the admin's API tokens lists and revokes them).
BAD_TOKEN = ("This API token is not valid: it is mistyped, was revoked, or its user is no longer a member of its "
             f"project. Make a new one in {TOKENS_PAGE}, or ask a Studio administrator for one (they make it with "
             "manage.py createapitoken).")
MALFORMED_TOKEN = f"Send the API token as Authorization: Bearer <token> (make one in {TOKENS_PAGE})."


class StudioAuth:
    """ninja auth callable: an Actor; None (a 401 asking for credentials) when none were sent; a 401
    that says what is wrong when a token was sent but is malformed or not valid."""

    openapi_type = "http"
    # What /api/openapi.json states (ninja reads it from an auth callable; without it the document
    # said no operation needs credentials, and /api/docs had no way to send a token).
    openapi_security_schema = {"type": "http", "scheme": "bearer",
                               "description": "A project API token (Settings → API tokens, or manage.py createapitoken); a logged-in browser session works too"}
    # Sessions are CSRF-checked below; ninja's Swagger reads this flag to put the CSRF token on
    # /api/docs (setting the cookie) and send it as X-CSRFToken, so "Try it out" works logged in.
    # Without it the page had an empty token and every write from it was a 403.
    csrf = True

    def __call__(self, request: HttpRequest) -> Actor | None:
        header = request.headers.get("Authorization", "")
        if header:
            # The token first: an address over its failure budget gets 429 for a bad one only (studio/ratelimit.py).
            scheme, _, plaintext = header.partition(" ")
            if scheme.lower() != "bearer" or not plaintext.strip():
                refuse_bad_credentials(request, Unauthorized(MALFORMED_TOKEN))
            token = authenticate_token(plaintext.strip())
            if token is None:
                refuse_bad_credentials(request, Unauthorized(BAD_TOKEN))
            return Actor(user=token.user, project=token.project, token=token)
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        # A session is a browser: unsafe methods need the CSRF token (HTMX sends it in hx-headers).
        if request.method not in ("GET", "HEAD", "OPTIONS") and check_csrf(request) is not None:
            raise Forbidden("CSRF check failed: reload the page and try again.")
        return Actor(user=user, project=current_project_for_session(request))
