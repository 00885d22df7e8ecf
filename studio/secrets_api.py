"""Secrets are written and listed by name; their values never leave the server."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import ConfigDict

from studio import services
from studio.api import actor, body_schema, parse_body
from studio.models import ProjectSecret

router = Router(tags=["secrets"])


class SecretIn(Schema):
    model_config = ConfigDict(extra="forbid")
    value: str


class SecretOut(Schema):
    name: str


@router.get("", response=list[SecretOut])
def list_secrets(request: HttpRequest):
    project = actor(request).require_project()
    return ProjectSecret.objects.filter(project=project).order_by("name").only("name")


@router.put("/{name}", response={204: None}, openapi_extra=body_schema(SecretIn))
def put_secret(request: HttpRequest, name: str):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    payload = parse_body(request, SecretIn)
    services.set_secret(project, name, payload.value)
    return 204, None


@router.delete("/{name}", response={204: None})
def delete_secret(request: HttpRequest, name: str):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    services.delete_secret(project, name)
    return 204, None
