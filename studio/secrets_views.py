"""Settings → Secrets: a project's secret names, add or replace a value, delete one.
A value goes in through studio.services.set_secret and is never shown back (not even after an error,
and never kept in the session for the refused form's page: only its name is)."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from studio import services
from studio.errors import ApiError
from studio.models import ProjectSecret
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor

FIELDS = {"name", "value"}


def _context(request: HttpRequest, project, errors: dict | None = None, name: str = "") -> dict:
    member = web_actor(request).membership(project)
    return {
        "section": "secrets",
        "project": project,
        "secrets": ProjectSecret.objects.filter(project=project).order_by("name").values("name", "updated_at"),
        "can_write": bool(member and member.can_write),
        "errors": errors or {},
        "name": name,  # the name only: the value is never rendered
    }


@studio_page
@require_GET
def secrets_page(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_project()
    refused = refused_forms(request).get("secret", {})
    return render(request, "studio/secrets.html", _context(request, project, refused.get("errors"), refused.get("values", {}).get("name", "")))


@studio_page
@form_action("secrets")
def set_secret(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    name = request.POST.get("name", "").strip()
    try:
        services.set_secret(project, name, request.POST.get("value", ""))
    except ApiError as exc:
        return refuse_form(request, reverse("secrets"), "secret", errors_by_field(exc, FIELDS), {"name": name})  # never the value
    messages.success(request, f"Saved secret {name}. Its value is stored encrypted and will not be shown again.")
    return redirect("secrets")


@studio_page
@form_action("secrets")
def delete_secret(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    name = request.POST.get("name", "")
    services.delete_secret(project, name)  # NotFound → 404
    messages.success(request, f"Deleted secret {name}.")
    return redirect("secrets")
