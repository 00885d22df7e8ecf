"""The audit log: services call `record(...)` for each change a person makes.

Who made it comes from the request being served: AuditMiddleware keeps it in a context variable,
so a service records the actor without every caller passing one (the API resolves a bearer token
into request.auth; a browser session has request.user). Outside a request (Celery, management
commands) the actor is "system" unless one is given.

Call `record` inside the service's transaction: the event commits or rolls back with the change.
"""
from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse

from studio.models import AuditEvent

_request: ContextVar[HttpRequest | None] = ContextVar("studio_audit_request", default=None)


class AuditMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


def _who(request: HttpRequest | None, user: Any) -> tuple[Any, str, str | None]:
    """(user, via, ip) for the current request."""
    if request is None:
        return user, "system", None
    ip = request.META.get("REMOTE_ADDR") or None
    actor = getattr(request, "auth", None)
    api_token = getattr(actor, "token", None)
    if api_token is not None:
        return user or api_token.user, f"token {api_token.prefix}…", ip
    if actor is not None and getattr(actor, "user", None) is not None:
        return user or actor.user, "session", ip
    session_user = getattr(request, "user", None)
    if session_user is not None and session_user.is_authenticated:
        return user or session_user, "session", ip
    return user, "anonymous", ip


def record(action: str, target: Any, *, project: Any = None, user: Any = None, name: str | None = None, details: dict | None = None) -> AuditEvent:
    """Note that the current actor did `action` to `target` (a model instance), named `name` (else its
    `name` field). `details` is shown to anyone who reads the trail: never a secret's value or a token."""
    who, via, ip = _who(_request.get(), user)
    project = project if project is not None else getattr(target, "project", None)
    return AuditEvent.objects.create(
        actor=who if getattr(who, "pk", None) else None,
        actor_name=getattr(who, "get_username", lambda: "")() if who is not None else "",
        via=via,
        ip=ip,
        project=project,
        project_slug=getattr(project, "slug", "") or "",
        action=action,
        target_type=target._meta.model_name,
        target_id=str(target.pk),
        target_name=str(name if name is not None else getattr(target, "name", "") or "")[:200],
        details=details or {},
    )
