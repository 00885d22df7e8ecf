"""Experiments pages: the list with an HTMX create form, and one experiment's runs with their
loss curves compared on one chart."""
from __future__ import annotations

from collections import OrderedDict

from django.core.paginator import Paginator
from django.db.models import Count, Exists, OuterRef
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from datahub.repos import find_repo
from datahub.services import experiment_repo_name
from experiments.models import Experiment
from experiments.services import create_experiment
from studio.errors import ApiError, NotFound
from studio.views import errors_by_field, refuse_form, refused_forms, studio_page, web_actor
from training.models import MetricPoint
from training.queries import runs_for
from training.views import MAX_POINTS, RUNS_PER_PAGE, align, chart_series

COMPARE_LIMIT = 12


def list_context(actor, values: dict | None = None, errors: dict | None = None, created: Experiment | None = None) -> dict:
    project = actor.project
    experiments = Experiment.objects.filter(project=project).annotate(run_count=Count("runs")).order_by("-created_at", "-id") if project else []
    return {"section": "experiments", "project": project, "experiments": experiments, "form": {"values": values or {}, "errors": errors or {}},
            "writable": bool(project) and actor.can_write(project), "created": created}


@studio_page
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    refused = refused_forms(request).get("experiment", {})
    return render(request, "experiments/list.html", list_context(web_actor(request), refused.get("values"), refused.get("errors")))


@studio_page
@require_POST
def experiment_create(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    name = request.POST.get("name", "")
    try:
        experiment = create_experiment(project, name)
    except ApiError as exc:
        errors = errors_by_field(exc, {"name"})
        if exc.detail and exc.detail != exc.default_detail:
            errors.setdefault("name", []).insert(0, exc.detail)
        if not request.htmx:
            return refuse_form(request, reverse("experiments:list"), "experiment", errors, {"name": name})
        return render(request, "experiments/list.html#experiments", list_context(actor, {"name": name}, errors), status=exc.status)
    template = "experiments/list.html#experiments" if request.htmx else "experiments/list.html"
    return render(request, template, list_context(actor, created=experiment), status=201 if request.htmx else 200)


@studio_page
@require_GET
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    actor = web_actor(request)
    experiment = Experiment.objects.filter(pk=experiment_id, project_id__in=actor.scoped_project_ids()).select_related("project").first()
    if experiment is None:
        raise NotFound(f"No experiment {experiment_id} in your projects.")
    # The chart compares the most recent runs that have loss points: queued runs with none would
    # take its slots and push out the curves there are (an index probe per run, not a count).
    # The table shows a page of the runs, as the runs list does: 650 runs made a 184 KB page.
    runs = runs_for(actor).filter(experiment=experiment).order_by("-created_at", "-id")
    with_loss = runs.filter(Exists(MetricPoint.objects.filter(run=OuterRef("pk"), key="loss")))
    compared = list(with_loss[:COMPARE_LIMIT])
    with_points = with_loss.count() if len(compared) == COMPARE_LIMIT else len(compared)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    named = OrderedDict()
    for run in compared:
        named[f"#{run.pk} {run.name}"] = chart_series(run.pk, ["loss"], MAX_POINTS).get("loss", [])
    chart = align(named)
    chart.update(id="compare-loss", title="Loss by step", empty=not chart["x"])
    repo_name = experiment_repo_name(experiment)
    repo = find_repo(experiment.project, repo_name)
    context = {"section": "experiments", "project": experiment.project, "experiment": experiment, "runs": list(page.object_list), "page": page,
               "repo": repo, "repo_name": repo_name,
               "charts": [chart], "compared": len(compared), "with_points": with_points, "without_points": page.paginator.count - with_points,
               "writable": actor.can_write(experiment.project)}
    return render(request, "experiments/detail.html", context)
