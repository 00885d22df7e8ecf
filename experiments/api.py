from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from experiments import services
from experiments.models import Experiment
from experiments.schemas import ExperimentIn, ExperimentOut
from studio.api import actor, body_schema, parse_body

router = Router(tags=["experiments"])


@router.get("", response=list[ExperimentOut])
def list_experiments(request: HttpRequest):
    project = actor(request).require_project()
    return Experiment.objects.filter(project=project)


@router.post("", response={201: ExperimentOut}, openapi_extra=body_schema(ExperimentIn))
def create_experiment(request: HttpRequest):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    payload = parse_body(request, ExperimentIn)
    return 201, services.create_experiment(project, payload.name)
