"""Experiments pages: the list with an HTMX create form, and one experiment's runs with a metric of
the runs chosen compared on one chart, beside the settings that differ between them."""
from __future__ import annotations

from collections import OrderedDict
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from datahub.repos import find_repo
from datahub.services import experiment_repo_name
from experiments.compare import COMPARE_LIMIT, Comparison, compare_runs
from experiments.models import Experiment
from experiments.services import create_experiment
from studio.errors import ApiError, NotFound
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor
from training import metrics
from training.models import TrainingRun
from training.queries import runs_for
from training.views import RUNS_PER_PAGE, align


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
@form_action("experiments:list")
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
    """The page; for its metric and run choice (#comparison, the whole form) the form alone, and for
    its poll while a compared run trains (#compare-live) the chart and table alone, answered 204 while
    nothing they show has changed."""
    actor = web_actor(request)
    experiment = Experiment.objects.filter(pk=experiment_id, project_id__in=actor.scoped_project_ids()).select_related("project").first()
    if experiment is None:
        raise NotFound(f"No experiment {experiment_id} in your projects.")
    runs = runs_for(actor).filter(experiment=experiment).order_by("-created_at", "-id")
    comparison = compare_runs(runs, request.GET.get("metric") or None, request.GET.getlist("runs"), request.GET.getlist("shown"))
    status = 400 if comparison.findings else 200
    context = {"experiment": experiment, **comparison_context(experiment, runs, comparison)}
    if request.htmx and request.htmx.target == "compare-live":
        if request.GET.get("seen") == comparison.state:
            return HttpResponse(status=204)
        return render(request, "experiments/detail.html#compare_live", context, status=status)
    context.update(runs_context(request, runs, comparison))
    if request.htmx and request.htmx.target == "comparison":
        return render(request, "experiments/detail.html#comparison", context, status=status)
    repo_name = experiment_repo_name(experiment)
    context.update({"section": "experiments", "project": experiment.project, "repo": find_repo(experiment.project, repo_name), "repo_name": repo_name,
                    "writable": actor.can_write(experiment.project)})
    return render(request, "experiments/detail.html", context, status=status)


def comparison_context(experiment: Experiment, runs: QuerySet[TrainingRun], comparison: Comparison) -> dict:
    """The chart (the run page's uPlot layout, a curve a run), the table of the compared runs, how
    many runs the newest-runs chart leaves out for want of points, and the query that shows this
    comparison again (its poll's, the pager's)."""
    chart = align(OrderedDict((f"#{run.pk} {run.name}", comparison.series[run.pk]) for run in comparison.runs))
    chart.update(id="compare-chart", title=f"{comparison.metric} by step", empty=not chart["x"])
    query = {"metric": comparison.metric, **({"runs": ",".join(str(run.pk) for run in comparison.runs)} if comparison.chosen else {})}
    rows = [{"run": run, "last": comparison.last(run), "best": comparison.best.get(run.pk), "settings": comparison.differences_of(i).values()}
            for i, run in enumerate(comparison.runs)]
    return {"comparison": comparison, "charts": [chart], "rows": rows, "query": urlencode(query),
            "without_points": 0 if comparison.chosen else runs.count() - comparison.with_points,
            "poll_url": reverse("experiments:detail", args=[experiment.pk]) + "?" + urlencode({**query, "seen": comparison.state})}


def runs_context(request: HttpRequest, runs: QuerySet[TrainingRun], comparison: Comparison) -> dict:
    """The runs table: a page of the runs, as the runs list shows them (650 runs made a 184 KB page),
    each with its Compare box; the compared runs on other pages go with the form unseen, and so, by
    default, does the run set compared (`shown`): the ticks sent as they came are no choice."""
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    listed = list(page.object_list)
    compared = {run.pk for run in comparison.runs}
    return {"runs": listed, "page": page, "compared_ids": compared, "compare_limit": COMPARE_LIMIT, "metrics": metric_choice(comparison, listed),
            "compared_elsewhere": sorted(compared - {run.pk for run in listed}),
            "shown": "" if comparison.chosen else ",".join(str(run.pk) for run in comparison.runs)}


def metric_choice(comparison: Comparison, listed: list[TrainingRun]) -> list[str]:
    """The Metric list: the compared runs' keys, and by default those of the runs listed too (a page
    of them, an index probe a key each): picking one compares the newest runs that report it, so an
    older run's own metric (a DPO run's rewards/margins) is reachable before it is ticked. A choice's
    list stays its runs' keys: another would be refused."""
    if comparison.chosen:
        return comparison.metrics
    compared = {run.pk for run in comparison.runs}  # their keys are comparison.metrics already: not probed again
    return sorted(set(comparison.metrics).union(metrics.metric_keys([run.pk for run in listed if run.pk not in compared])))
