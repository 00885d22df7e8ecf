from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router

from experiments import services
from experiments.compare import compare_runs
from experiments.models import Experiment
from experiments.schemas import CompareQuery, ComparisonOut, ExperimentIn, ExperimentOut
from studio.api import actor, body_schema, parse_body
from studio.errors import BadRequest, NotFound
from training.queries import runs_for

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


@router.get("/{int:experiment_id}/compare", response=ComparisonOut)
def compare_experiment_runs(request: HttpRequest, experiment_id: int, query: Query[CompareQuery]):
    """The experiment page's comparison: each run's series of the metric, its last and best value,
    and the settings that differ between the runs."""
    who = actor(request)
    experiment = Experiment.objects.filter(pk=experiment_id, project=who.require_project()).first()
    if experiment is None:
        raise NotFound(f"No experiment {experiment_id} in this project.")
    comparison = compare_runs(runs_for(who).filter(experiment=experiment), query.metric, [query.runs] if query.runs is not None else [])
    if comparison.findings:
        raise BadRequest("The comparison cannot be made as asked.", comparison.findings)
    return {"metric": comparison.metric, "metrics": comparison.metrics, "chosen": comparison.chosen,
            "runs": [{"id": run.pk, "name": run.name, "status": run.status, "last": comparison.last(run), "best": comparison.best.get(run.pk),
                      "points": comparison.series[run.pk], "settings": comparison.differences_of(i)}
                     for i, run in enumerate(comparison.runs)]}
