"""/api/environments: the catalogue, Fork, a project's environment repos and their CONFIG."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import ConfigDict, Field

from datahub.api import query_ref
from environments import services
from studio.api import FindingOut, actor, body_schema, parse_body

router = Router(tags=["environments"])


class ForkIn(Schema):
    model_config = ConfigDict(extra="forbid")
    catalogue: str = Field(min_length=1, max_length=200, description='a catalogue name, e.g. "gsm-maths" (or "builtin/gsm-maths@main")')
    name: str | None = Field(None, min_length=1, max_length=128, description="the new environment repo's name (default: the catalogue name)")
    config: dict[str, Any] | None = Field(None, description="CONFIG values that replace the catalogue's defaults")


class ConfigIn(Schema):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any]


class CatalogueOut(Schema):
    name: str
    environment_id: str = Field(description='what config.environment_id takes, e.g. "builtin/gsm-maths@main"')
    description: str
    config: dict[str, Any] | None = Field(description="the package's CONFIG (null for the engine's own builtins)")
    files: list[str]
    row_keys: list[str] = Field(description="columns each row of a run's own dataset needs for this environment to score it (ROW_KEYS); prompt alone when empty")
    forkable: bool


class EnvironmentOut(Schema):
    repo: str
    environment_id: str
    description: str


class ForkOut(Schema):
    repo: str
    environment_id: str
    commit: str
    forked_from: str
    config: dict[str, Any]


class ConfigOut(Schema):
    repo: str
    environment_id: str
    commit: str
    config: dict[str, Any] | None = Field(description="CONFIG as config.py states it (null when it has none)")
    files: list[str]
    row_keys: list[str] = Field(description="columns each row of a run's own dataset needs for this environment to score it (ROW_KEYS); prompt alone when empty")


class SavedConfigOut(Schema):
    repo: str
    environment_id: str
    commit: str
    config: dict[str, Any]


class CheckOut(Schema):
    repo: str
    commit: str
    backend: str
    findings: list[FindingOut] = Field(description="what START would refuse (422), by field; a CONFIG value that breaks the package's "
                                                   "CONFIG_TYPES or REWARD_COMPONENTS is on its own path (config.max_examples), as PUT …/config names it")


@router.get("/catalogue", response=list[CatalogueOut])
def list_catalogue(request: HttpRequest):
    actor(request).require_project()
    builtin = [{"name": k.removeprefix("builtin/"), "environment_id": f"{k}@main", "description": v, "config": None, "files": [], "row_keys": ["prompt"], "forkable": False}
               for k, v in services.ENGINE_BUILTINS.items()]
    return [{**services.catalogue_info(e), "forkable": True} for e in services.catalogue()] + builtin


@router.post("/fork", response={201: ForkOut}, openapi_extra=body_schema(ForkIn))
def fork_environment(request: HttpRequest):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    payload = parse_body(request, ForkIn)
    return 201, services.fork(project, payload.catalogue, payload.name, payload.config, user=who.user)


@router.get("", response=list[EnvironmentOut])
def list_environments(request: HttpRequest):
    from datahub.models import Repo, RepoType

    project = actor(request).require_project()
    repos = Repo.objects.filter(project=project, type=RepoType.ENVIRONMENT).order_by("name")
    return [{"repo": r.name, "environment_id": f"{r.name}@main", "description": r.description} for r in repos]


@router.get("/{name}/config", response=ConfigOut)
def get_config(request: HttpRequest, name: str, ref: str = "main"):
    project = actor(request).require_project()
    return services.repo_config(project, name, query_ref(request) or "main")


@router.get("/{name}/check", response=CheckOut)
def check_environment(request: HttpRequest, name: str, ref: str = "main", backend: str = "local"):
    """The pre-start package checks (no import): entry point, syntax, imports vs the trainer image."""
    project = actor(request).require_project()
    return services.check_repo(project, name, query_ref(request) or "main", backend)


@router.put("/{name}/config", response=SavedConfigOut, openapi_extra=body_schema(ConfigIn))
def put_config(request: HttpRequest, name: str):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    payload = parse_body(request, ConfigIn)
    return services.update_config(project, name, payload.config, user=who.user)
