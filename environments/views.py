"""Environment pages: the catalogue with Fork, and an environment repo's page with its editable CONFIG.
Each view: parse → authorise → one service (environments.services) → render (HTMX gets the partial)."""
from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from environments import services
from studio.api import loads_json, unstorable
from studio.errors import ApiError, Finding
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor

FORK_FIELDS = {"catalogue", "name"}
CONFIG_FIELDS = {"config"}


def _environment_repos(project) -> list[dict[str, Any]]:
    from datahub.models import Repo, RepoType

    repos = Repo.objects.filter(project=project, type=RepoType.ENVIRONMENT).order_by("name")
    return [{"repo": r.name, "environment_id": f"{r.name}@main", "description": r.description} for r in repos]


def _catalogue_context(request: HttpRequest, project, fork_errors: dict | None = None, fork_values: dict | None = None) -> dict[str, Any]:
    actor = web_actor(request)
    return {
        "section": "environments",
        "project": project,
        "entries": [services.catalogue_info(e) for e in services.catalogue()],
        "builtins": [{"name": k.removeprefix("builtin/"), "environment_id": f"{k}@main", "description": v} for k, v in services.ENGINE_BUILTINS.items()],
        "repos": _environment_repos(project),
        "can_write": actor.can_write(project),
        "fork_errors": fork_errors or {},
        "fork_values": fork_values or {},
    }


@studio_page
@require_GET
def catalogue_page(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_project()
    refused = refused_forms(request).get("fork", {})
    return render(request, "environments/catalogue.html", _catalogue_context(request, project, refused.get("errors"), refused.get("values")))


@studio_page
@form_action("environments")
def fork(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    catalogue_name = request.POST.get("catalogue", "").strip()
    name = request.POST.get("name", "").strip() or None
    try:
        result = services.fork(project, catalogue_name, name, None, user=request.user)
    except ApiError as exc:
        errors = errors_by_field(exc, FORK_FIELDS)
        if not set(errors) - {"general"}:  # a finding beside its field already says it: the sentence would repeat it
            errors.setdefault("general", []).insert(0, exc.detail)
        return refuse_form(request, reverse("environments"), "fork", {catalogue_name: errors}, {catalogue_name: name or ""})
    messages.success(request, f"Forked {result['forked_from']} into {result['repo']}: it is your project's own now, edit its CONFIG below.")
    return redirect("environment_repo", name=result["repo"])


def _repo_context(request: HttpRequest, project, name: str, *, config_text: str | None = None, errors: dict | None = None, saved: bool = False) -> dict[str, Any]:
    info = services.repo_config(project, name)
    try:
        check = services.check_repo(project, name)
    except ApiError:
        check = None
    if config_text is None:
        config_text = json.dumps(info["config"], indent=2, default=str) if info["config"] is not None else "{}"
    return {
        "section": "environments",
        "project": project,
        "info": info,
        "check": check,
        "config_text": config_text,
        "errors": errors or {},
        "saved": saved,
        "can_write": web_actor(request).can_write(project),
    }


@studio_page
@require_GET
def repo_page(request: HttpRequest, name: str) -> HttpResponse:
    project = web_actor(request).require_project()
    refused = refused_forms(request).get("config", {})
    context = _repo_context(request, project, name, config_text=refused.get("values", {}).get("config"), errors=refused.get("errors"))
    return render(request, "environments/repo.html", context)


def _parse_config(text: str) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The CONFIG box, read as PUT /api/environments/{name}/config reads its body: NaN, Infinity, NUL
    characters or a deep nesting would be written into config.py as something that no longer parses."""
    try:
        value = loads_json(text)
    except json.JSONDecodeError as exc:
        return None, [Finding("config", f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})")]
    except ValueError as exc:
        return None, [Finding("config", f"not valid JSON: {exc}")]
    if not isinstance(value, dict):
        return None, [Finding("config", "CONFIG is a JSON object: {\"key\": value, …}")]
    problem = unstorable({"config": value})
    return (None, [problem]) if problem else (value, [])


@studio_page
@form_action("environment_repo")
def edit_config(request: HttpRequest, name: str) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    services.environment_repo(project, name)  # 404 before reading the form
    text = request.POST.get("config", "")
    config, findings = _parse_config(text)
    status = 400
    if config is not None:
        try:
            services.update_config(project, name, config, user=request.user)
        except ApiError as exc:
            findings, status = list(exc.errors) or [Finding("config", exc.detail)], exc.status
    if findings:
        errors = errors_by_field(findings, CONFIG_FIELDS)
        if not request.htmx:
            return refuse_form(request, reverse("environment_repo", kwargs={"name": name}), "config", errors, {"config": text})
        context = _repo_context(request, project, name, config_text=text, errors=errors)
        return render(request, "environments/repo.html#config_card", context, status=status)
    if request.htmx:
        return render(request, "environments/repo.html#config_card", _repo_context(request, project, name, saved=True))
    messages.success(request, "CONFIG saved as a new commit on main.")
    return redirect("environment_repo", name=name)
