"""Training pages: the runs list, NEW RUN, and the run detail page with its tabs.
Each view: parse → authorise → one service → render (HTMX gets the partial). A refused NEW RUN or
Edit run (a plain form) answers 303 to its page, which shows the findings and what was typed once
(studio.views.refuse_form): a reload never sends the form again."""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter, OrderedDict
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import yaml
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Avg, Count, Max, Min, Q, StdDev
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseNotFound
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET

from datahub import repos as hub_repos
from datahub import services as hub
from datahub.models import Branch, Commit, Repo, RepoType, Tag, TreeEntry
from datahub.refs import RESERVED_NAMESPACES, gone_pins, pin_deleted
from environments import services as env_services
from environments.services import FIELD as FIELD_ENVIRONMENT
from experiments.models import Experiment
from experiments.services import DEFAULT_EXPERIMENT
from studio.errors import ApiError, BadRequest, Conflict, Finding, Forbidden, NotFound, PaymentRequired, Unprocessable
from studio.parsing import ascii_int, isolated
from studio.views import errors_by_field, form_action, htmx_fragment, refuse_form, refused_forms, studio_page, web_actor
from training import checkpoints, forms, metrics, services
from training.backends.local import checkpoint_dir, shown_path
from training.compute import accelerators_of
from training.engine.environments import group_std
from training.fit_report import fit_report, form_fit_report
from training.ingest import LATE_REPORTS
from training.methods import distill as distill_method
from training.methods.base import lora_enabled
from training.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Checkpoint, Method, Rollout, RunAttempt, Status, TrainingRun
from training.playground_views import try_context
from training.queries import filter_rollouts, get_run_for, log_lines, log_rows_after, log_rows_before, log_text, runs_for, search_runs
from training.refs import EVAL_DATASET, HUB_REF, dataset_entries, entry_fields, ref_kind
from training.suggestions import RefSuggestions
from training.validation import start_notices

MAX_POINTS = 500
LOG_TAIL = 200
# The Overview's log box, polled every 5 s while a run reports: 200 lines at ingest's 10,000-character cut
# were 2 MB an answer. It keeps the newest lines within this many characters; the log page has the rest.
LOG_TAIL_CHARS = 100_000

# Seed 000's failure table: what to do for each error.code.
FAILURE_HELP = {
    "oom": "The model was too large for the chosen GPU: drop to a smaller base, ask for more or bigger GPUs, or shrink max_length / max_response_length.",
    "CAPACITY_UNAVAILABLE": "No GPU capacity for the requested type: retry later, pick a different GPU type, or launch in another region. Capacity is provider-side and cannot be checked in advance.",
    "provisioning_error": "The instance booted but the worker did not come up: start again; if it keeps happening, try a different GPU type.",
    "provisioning_timeout": "The instance never reached a running worker in time: start again; capacity or boot was too slow.",
    "configuring_timeout": "The worker booted but its engine did not start in time: start again; if it keeps happening, read the full log.",
    "heartbeat_timeout": "The worker stopped reporting for longer than heartbeat_timeout_seconds (likely OOM-killed or cut off): start again; if it keeps happening, ask for more GPUs.",
    "training_error": "The worker crashed, a reward function failed or the dataset did not load: read the message and the log below, fix the config or data, then start again.",
}

def failure_help(run: TrainingRun, code: str) -> str:
    """Seed 000's line for the code; only a GRPO run has reward functions to blame."""
    text = FAILURE_HELP.get(code, FAILURE_HELP["training_error"])
    return text if run.method == Method.GRPO else text.replace(", a reward function failed", "")


# Charts on the Overview tab, per method: (title, metric keys).
CHARTS = {
    "sft": [("Training loss", ["loss"]), ("Throughput (tokens/s)", ["tokens_per_s"])],
    "dpo": [("Training loss", ["loss"]), ("Reward margins", ["rewards/margins"]), ("Reward accuracies", ["rewards/accuracies"])],
    "distill": [("KD Loss", ["kd_loss"]), ("Training Loss (CE)", ["loss"])],
    "grpo": [("Reward", ["reward", "reward_std"]), ("KL", ["kl"]), ("Completion length", ["completions/mean_length"]), ("Entropy", ["entropy"])],
}
# Speed-of-light charts for every method, drawn only once the run reports them: a CPU run has no
# peak and no GPU memory, and an empty "MFU" chart there would read as a failure.
GPU_CHARTS = [
    ("Speed of light (MFU %)", ["mfu"]),
    ("GPU memory (GB)", ["gpu_memory_gb", "gpu_reserved_gb"]),
    ("Rollout speed (tokens/s)", ["rollout/tokens_per_s"]),  # GRPO's generation, apart from training throughput
]


# ---- helpers -----------------------------------------------------------------------------------

def align(named: OrderedDict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    """Several step-ordered series on one shared x axis (uPlot's layout); gaps are null."""
    steps = sorted({step for points in named.values() for step, _ in points})
    index = {step: i for i, step in enumerate(steps)}
    series = []
    for label, points in named.items():
        values: list[float | None] = [None] * len(steps)
        for step, value in points:
            values[index[step]] = value
        series.append({"label": label, "values": values, "summary": series_summary(points)})
    return {"x": steps, "series": series}


def series_summary(points: list[tuple[int, float]]) -> dict[str, Any] | None:
    """A series' row in its chart's "Show data" table, the text a screen reader gets for the curve:
    its last step and value, its lowest and highest value (of the points drawn); None with no points."""
    if not points:
        return None
    values = [value for _, value in points]
    return {"last_step": points[-1][0], "last": points[-1][1], "min": min(values), "max": max(values)}


def chart_series(run_id: int, keys: list[str], max_points: int = MAX_POINTS) -> dict[str, list[tuple[int, float]]]:
    """Step-ordered series for charts, downsampled inside the database the way the metrics API does
    it (training.metrics), so a 100k-point run page stays fast and draws the API's points."""
    return metrics.series_in_sql(run_id, keys, max_points) if keys else {}


# A run with held-out rows (config eval_split / eval_dataset) reports this at its eval steps: drawn
# beside the training loss, on the same axes, where overfitting shows as the two curves parting.
EVAL_LOSS = "eval_loss"


def run_charts(run: TrainingRun) -> list[dict[str, Any]]:
    spec = CHARTS.get(run.method, CHARTS["sft"])
    keys = sorted({k for _, ks in spec + GPU_CHARTS for k in ks} | {EVAL_LOSS})
    data = chart_series(run.pk, keys)
    if data.get(EVAL_LOSS):
        spec = [(title, [*ks, EVAL_LOSS]) if "loss" in ks else (title, ks) for title, ks in spec]
    spec = spec + [(title, ks) for title, ks in GPU_CHARTS if any(data.get(k) for k in ks)]
    charts = []
    for i, (title, ks) in enumerate(spec):
        chart = align(OrderedDict((k, data.get(k, [])) for k in ks))
        chart.update(id=f"chart-{i}", title=title, empty=not chart["x"])
        if chart["empty"] and ks == ["kl"] and not (run.config or {}).get("kl_coef"):
            chart["empty_note"] = "No KL: it is measured against a reference model, which a run with kl_coef 0 does not load."
        charts.append(chart)
    return charts


def tabs_for(run: TrainingRun) -> list[tuple[str, str]]:
    """Seed 001's table: which tabs a run of this method has. A GRPO run saves checkpoints and has a
    lineage like any run; its Datasets tab is there when it names a dataset (its prompts may come from
    the environment instead)."""
    tabs = [("overview", "Overview"), ("configuration", "Configuration")]
    if run.method != Method.GRPO or dataset_rows(run):
        tabs.append(("datasets", "Datasets"))
    if run.method == Method.GRPO:
        if (run.config or {}).get("rl_mode", "environment") == "environment":
            tabs.append(("environment", "Environment"))
        tabs.append(("rollouts", "Rollouts"))
    tabs.append(("checkpoints", "Checkpoints"))
    if run.checkpoints.exists():  # saved weights to answer with (playground_views)
        tabs.append(("try", "Try it"))
    tabs += [("lineage", "Lineage"), ("repository", "Repository")]
    return tabs


def dataset_rows(run: TrainingRun) -> list[dict[str, Any]]:
    """The Datasets tab's rows (and the Lineage tab's data): the run's dataset entries, a GRPO RULER
    run's prompts dataset (config.ruler_task_args.dataset) and the held-out rows' (config.eval_dataset),
    each with its pin. Not a query."""
    rows = [{"role": "Dataset" + (f" {i + 1}" if i else ""), "ref": e.ref, "type": e.type or "—", "kind": ref_kind(e.ref), "field": dataset_field(run, i)}
            for i, e in enumerate(dataset_entries(run.dataset))]
    config = run.config or {}
    ruler = config.get("ruler_task_args")
    if run.method == Method.GRPO and config.get("rl_mode") == "ruler" and isinstance(ruler, dict) and isinstance(ruler.get("dataset"), str) and ruler["dataset"]:
        rows.append({"role": "Prompts (RULER task)", "ref": ruler["dataset"], "type": "prompts (ruler_task_args)", "kind": ref_kind(ruler["dataset"]),
                     "field": "config.ruler_task_args.dataset"})
    held_out = entry_fields(config.get("eval_dataset"), EVAL_DATASET)
    rows += [{"role": "Evaluation (held out)" + (f" {i + 1}" if i else ""), "ref": e.ref, "type": e.type or "—", "kind": ref_kind(e.ref), "field": field}
             for i, (field, e) in enumerate(held_out)]
    return rows


def is_live(run: TrainingRun) -> bool:
    return run.status in ACTIVE_STATUSES or (run.status == Status.QUEUED and run.start_requested_at is not None)


def reports_open(run: TrainingRun) -> bool:
    """Whether an ended run's engine may still report (ingest.require_open's window): a STOP's
    SIGTERM flush or a retried batch can still add a checkpoint, log lines or metrics after the end."""
    return run.status in TERMINAL_STATUSES and run.finished_at is not None and timezone.now() - run.finished_at <= LATE_REPORTS


# How the run page's status area follows the run, by phase (page_phase): every part refreshes while
# it trains, and for the minute after its end while its engine may still report; a run that is not
# live can be started or edited from another tab, by a teammate or over the API, so a slow poll notices
# that (answered 204 while nothing changed: one query, no rendering); a completed run never changes again.
STATUS_POLL = {"live": "every 2s", "settling": "every 5s", "idle": "every 15s", "done": ""}


def page_phase(run: TrainingRun) -> str:
    if is_live(run):
        return "live"
    if reports_open(run):
        return "settling"
    return "done" if run.status == Status.COMPLETED else "idle"


def edit_stamp(run: TrainingRun) -> str:
    """Moves with every edit of the run's settings (a PATCH, the Edit run form): services.update_run
    is the only writer of these fields."""
    settings = [run.name, run.base_model, run.dataset, run.config, run.compute]
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def page_state(run: TrainingRun) -> str:
    """What the status area was rendered for (its poll's ?seen=): a START, a STOP, an end, a new
    attempt, the end of the reports window or an edit each changes it."""
    return f"{run.status}.{run.attempt}.{page_phase(run)}.{edit_stamp(run)}"


def edited_since(seen: str, run: TrainingRun) -> bool:
    """Whether the page that sent `seen` shows the run's settings from before an edit. (A page from
    before the stamp existed sends three parts: it is not reloaded for that alone.)"""
    parts = seen.split(".")
    return len(parts) == 4 and parts[3] != edit_stamp(run)


def status_context(request: HttpRequest, run: TrainingRun, actor=None, error: ApiError | None = None) -> dict[str, Any]:
    actor = actor or web_actor(request)
    startable = run.status in (Status.QUEUED, Status.FAILED, Status.CANCELLED) and not is_live(run)
    trained_before = startable and run.attempt > 0  # START again after an attempt (or a withdrawn restart)
    draft = services.draft_of(run)  # one draft: the Start button's findings and the estimate share its fit check
    blockers = services.start_blockers(run, draft) if startable else []
    if isinstance(error, Unprocessable):
        blockers = error.errors
    error_obj = run.error or {}
    return {
        "run": run,
        "run_notice": services.run_notice(run),
        "live": is_live(run),
        "state": page_state(run),
        "poll": STATUS_POLL[page_phase(run)],
        "writable": actor.can_write(run.project),
        "blockers": blockers,
        # Rows START did not check (a dataset file past DATAHUB_VALIDATE_MAX_ROWS): said, never refused.
        "notices": start_notices(draft) if startable else [],
        "action_error": None if isinstance(error, Unprocessable) else error,
        "failure_help": failure_help(run, error_obj.get("code") or "") if run.status == Status.FAILED else "",
        "error_log_tail": failure_log_tail(run) if run.status == Status.FAILED else [],
        "progress": run.progress or {},
        # The GPU memory estimate beside START; a CPU run or an unknown model shows nothing.
        "fit": fit_report(draft) if startable else None,
        # Start again trains from step 0: beside it, and in its confirmation, where a saved step is resumed instead.
        "saved_steps": trained_before and Checkpoint.objects.filter(run=run, kind__in=checkpoints.RESUMABLE_KINDS).exists(),
        "restart_from": restart_from(run) if trained_before else "",
    }


def restart_from(run: TrainingRun) -> str:
    """Where START trains from: step 0, or for a run resumed from another run's step, that step again."""
    saved = run.resume_checkpoint if run.resume_checkpoint_id else None
    return f"step {saved.step} of run #{saved.run_id}, where this run was resumed from" if saved is not None else "step 0"


def failure_log_tail(run: TrainingRun) -> list[str]:
    """The worker's last 200 lines (error.log_tail); the run's own log when the backend sent none."""
    tail = (run.error or {}).get("log_tail") or []
    if not tail:
        tail = list(log_lines(run).order_by("-id").values_list("line", flat=True)[:LOG_TAIL])[::-1]
    return tail[-LOG_TAIL:]


def live_context(run: TrainingRun) -> dict[str, Any]:
    """The Overview's charts and log box: the last lines of the run's current log (since its last
    START), with links to all of it and to each earlier attempt's."""
    rows, earlier = log_rows_before(log_lines(run), None, LOG_TAIL, LOG_TAIL_CHARS)
    first = max(run.start_attempt, 1)
    label = "" if not run.attempt else f"attempt {run.attempt}" if first == run.attempt else f"attempts {first}–{run.attempt}"
    return {"run": run, "live": is_live(run), "following": is_live(run) or reports_open(run), "charts": run_charts(run),
            "log_tail": [line for _, line in rows], "log_tail_cut": earlier and len(rows) < LOG_TAIL, "log_label": label, "earlier_attempts": list(range(1, first)),
            **published_context(run)}


def published_context(run: TrainingRun) -> dict[str, Any]:
    """The Overview's Published model: its repo; why it was not published, when a Data Hub rule refused
    it (the run's log says so too); or once it was deleted its name, marked deleted (the line used to
    vanish, as if the run had published nothing). GET /api/training-runs/{id} says the same."""
    published, deleted, failed = hub.published_model(run)
    return {"published": published, "published_deleted": deleted, "publish_failed": failed,
            "publish_repo": hub.model_repo_full_name(run)}


def config_rows(run: TrainingRun) -> list[tuple[str, Any]]:
    """Hyperparameters not already shown on the method's own card."""
    skip = {"loss", "distillation", "judge", "ruler_task_args"}
    if run.method == Method.GRPO:
        skip |= {"rl_mode", "environment_id", "inference_blocks", "trainer_blocks", "judge_blocks"}
    return [(k, v) for k, v in sorted((run.config or {}).items()) if k not in skip]


def precision_of(run: TrainingRun) -> str:
    """What the run trains in, by the engine's rule (modeling.pick_device): the CPU always trains in
    fp32; on a GPU the configured precision, bf16 by default."""
    asked = (run.config or {}).get("precision")
    if accelerators_of(run.compute or {}).is_cpu:
        return "fp32 (CPU run" + (f"; {asked} applies on a GPU only)" if asked and asked != "fp32" else ")")
    return asked or "bf16 (default)"


def adapter_of(config: dict) -> str:
    rank = config.get("lora_rank") or (16 if config.get("lora") else None)
    if rank is None:
        return "Full fine-tune"
    kind = "QLoRA (4-bit base)" if config.get("load_in_4bit") else "LoRA"
    return f"{kind}, rank {rank}, alpha {config.get('lora_alpha', rank)}"


# ---- the runs list -----------------------------------------------------------------------------

RUNS_PER_PAGE = 50
SEARCH_MAX = 100


def parse_filters(request: HttpRequest, experiments: list[Experiment]) -> dict[str, str]:
    """Only known values pass; anything else is ignored (and the control shows "All")."""
    status, method, experiment = (request.GET.get(k, "") for k in ("status", "method", "experiment"))
    return {
        "status": status if status in Status.values else "",
        "method": method if method in Method.values else "",
        "experiment": experiment if experiment in {str(e.pk) for e in experiments} else "",
        "q": request.GET.get("q", "").strip()[:SEARCH_MAX],
    }


@studio_page
@require_GET
def runs(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.project
    experiments = list(Experiment.objects.filter(project=project).order_by("name")) if project else []
    filters = parse_filters(request, experiments)
    rows = runs_for(actor).filter(project=project).select_related("experiment") if project else TrainingRun.objects.none()
    if filters["status"]:
        rows = rows.filter(status=filters["status"])
    if filters["method"]:
        rows = rows.filter(method=filters["method"])
    if filters["experiment"]:
        rows = rows.filter(experiment_id=int(filters["experiment"]))
    rows = search_runs(rows, filters["q"])
    page = Paginator(rows, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in filters.items() if v})
    context = {
        "section": "training", "project": project, "runs": list(page.object_list), "page": page, "filters": filters, "query": query,
        "experiments": experiments, "statuses": Status.values, "methods": Method.choices, "writable": project is not None and actor.can_write(project),
    }
    parts = {"run-rows": "training/runs.html#rows", "run-list": "training/runs.html#list"}
    template = parts.get(request.htmx.target, "training/runs.html") if request.htmx else "training/runs.html"
    return render(request, template, context)


# ---- NEW RUN -----------------------------------------------------------------------------------

def experiment_choices(project) -> list[tuple[str, str]]:
    """The project's default experiment first (what a blank choice means), then the others by name."""
    experiments = sorted(Experiment.objects.filter(project=project), key=lambda e: (e.slug != DEFAULT_EXPERIMENT, e.name))
    default = [] if experiments and experiments[0].slug == DEFAULT_EXPERIMENT else [("", f"{DEFAULT_EXPERIMENT} (the project's default)")]
    return default + [(str(e.pk), f"{e.name} (the project's default)" if e.slug == DEFAULT_EXPERIMENT else e.name) for e in experiments]


def form_context(request: HttpRequest, project, values: dict[str, Any], errors: dict[str, list[str]] | None = None, run: TrainingRun | None = None) -> dict[str, Any]:
    method = values.get("method") or "sft"
    distill = method == "distill"
    return {
        "section": "training", "project": project, "run": run,
        "form": {"values": values, "errors": errors or {}},
        "method": method,
        "lr_default": forms.LEARNING_RATE_DEFAULTS.get(method, ""),
        "lr_help": f"Blank trains at {forms.LEARNING_RATE_DEFAULTS.get(method, '')}, the default for {method.upper()}.",
        "rl_mode": values.get("config.rl_mode") or "environment",
        "experiments": experiment_choices(project),
        "choices": {"method": forms.METHOD_CHOICES, "precision": forms.PRECISION_CHOICES, "backend": forms.BACKEND_CHOICES,
                    "rl_mode": forms.RL_MODE_CHOICES, "judge_mode": forms.JUDGE_MODE_CHOICES, "dataset_type": forms.DATASET_TYPE_CHOICES,
                    "liger": forms.LIGER_CHOICES, "checkpointing": forms.CHECKPOINTING_CHOICES, "packing": forms.PACKING_CHOICES,
                    "rollout_engine": forms.ROLLOUT_ENGINE_CHOICES},
        "performance_open": forms.performance_open(values, errors),
        "dataset_kept_note": forms.kept_dataset_note(values),
        "estimate": forms.distill_storage_estimate(values, project) if distill else None,
        "estimate_finding": top_k_finding_of(values) if distill else None,
        "environment_choices": environment_choices(project) if method == "grpo" else [],
        "suggestions": RefSuggestions(project, method),
        "teacher": forms.teacher_fit(values.get("config.distillation.teacher_model"), values.get("compute.accelerators"), project) if distill else None,
        "fit": form_fit_report(*forms.draft_of_values({**values, "method": method}, project)),
    }


def top_k_finding_of(values: dict[str, Any]) -> str | None:
    """START's top_k rule for the value typed so far (none while the field is empty: the default
    applies), so the storage estimate never prices a top_k that START would refuse."""
    raw = str(values.get("config.distillation.top_k") or "").strip()
    if not raw:
        return None
    try:
        top_k: Any = int(raw)
    except ValueError:
        top_k = raw
    finding = distill_method.top_k_finding(top_k)
    return finding.message if finding else None


# The run form's name in a refusal kept for its page (refuse_form): NEW RUN's, also the Create of
# New run like this (its action is NEW RUN's), and Edit run's.
RUN_FORM = "run"


def refused_run_page(request: HttpRequest, project, refused: dict[str, Any], run: TrainingRun | None = None) -> HttpResponse:
    """The form page of a refused NEW RUN or Edit run (refused_forms' RUN_FORM, on the GET its 303
    led to): what was typed, the findings, and the link to Billing where the plan refused it."""
    context = form_context(request, project, refused["values"], refused["errors"], run=run)
    context["billing_hint"] = refused.get("billing_hint", False)
    return render(request, "training/new_run.html", context)


@studio_page
def new_run(request: HttpRequest) -> HttpResponse:
    actor = web_actor(request)
    project = actor.require_writable_project()
    if request.method == "GET":
        refused = refused_forms(request).get(RUN_FORM)
        if refused is not None:
            return refused_run_page(request, project, refused)
        method = request.GET.get("method") if request.GET.get("method") in Method.values else "sft"
        experiment = request.GET.get("experiment", "")
        return render(request, "training/new_run.html", form_context(request, project, forms.initial_values(method, experiment)))
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    parsed = forms.parse_run_form(request.POST)
    fields = forms.finding_fields(parsed.values, parsed.values.get("method", ""))
    if parsed.findings:
        errors = errors_by_field(with_the_rest(parsed, project), fields)
        return refuse_form(request, reverse("training:new"), RUN_FORM, errors, parsed.values)
    try:
        run = services.create_run(project, request.user, **parsed.kwargs)
    except ApiError as exc:
        errors = errors_by_field(exc, fields)
        if not exc.errors or isinstance(exc, PaymentRequired):
            errors.setdefault("general", []).insert(0, exc.detail)
        return refuse_form(request, reverse("training:new"), RUN_FORM, errors, parsed.values, {"billing_hint": isinstance(exc, PaymentRequired)})
    messages.success(request, f"Run {isolated(run.name)} is queued. Press START when it is ready.")
    return redirect("training:run", run_id=run.pk)


@studio_page
@require_GET
def new_run_like(request: HttpRequest, run_id: int) -> HttpResponse:
    """"New run like this": NEW RUN filled with the run's settings (as Edit run shows them) under a
    name no run of the project has; nothing is stored until Create run is pressed."""
    actor = web_actor(request)
    run = get_run_for(actor, run_id, write=True)
    if run.project_id != actor.require_writable_project().pk:  # Create run makes the run in the current project
        messages.error(request, f"Run #{run.pk} is in project {run.project.slug}, not the one you are working in: switch to {run.project.slug} "
                                "with the project menu, then press New run like this again.")
        return redirect("training:run", run_id=run.pk)
    values = {**forms.values_from_run(run), "name": forms.like_name(run.project, run.name)}
    resumed = f" It trains from step 0: to continue from a saved step of run #{run.pk}, use Resume from here on its Checkpoints tab." if run.parent_id else ""
    messages.info(request, f"The settings of run #{run.pk} ({isolated(run.name)}): nothing is saved until you press Create run.{resumed}")
    return render(request, "training/new_run.html", form_context(request, run.project, values))


def with_the_rest(parsed: forms.ParsedRun, project) -> list:
    """The form's own findings (a value it could not parse) and what create would say of the fields
    it could, all in one answer: the same validator as create's, one finding per field."""
    own = {f.field for f in parsed.findings}
    return parsed.findings + [f for f in services.run_findings(project, **parsed.kwargs) if f.field not in own]


@studio_page
def edit_run(request: HttpRequest, run_id: int) -> HttpResponse:
    actor = web_actor(request)
    try:
        run = get_run_for(actor, run_id, write=True)
    except NotFound as exc:
        if request.method != "POST":
            raise
        # Save on a run deleted since the form was opened (in another tab, by a teammate): the runs
        # list says so, rather than a bare 404 that reads as if the typed changes were lost silently.
        typed = request.POST.get("name", "").strip()
        messages.error(request, f"{exc.detail} It may have been deleted since its Edit run page was loaded (in another tab, or by a teammate): "
                                f"your changes{f' to {isolated(typed)}' if typed else ''} were not saved.")
        return redirect("training:runs")
    # Taken before the check below: a refusal whose run can no longer be edited is not shown later.
    refused = refused_forms(request).get(RUN_FORM) if request.method == "GET" else None
    try:
        services.require_patchable(run)  # the API's own 409 and its sentence
    except Conflict as exc:
        messages.error(request, exc.detail)
        return redirect("training:run", run_id=run.pk)
    if refused is not None:
        return refused_run_page(request, run.project, refused, run)
    if request.method == "GET":
        values = forms.values_from_run(run)
        errors = errors_by_field(services.start_blockers(run), forms.finding_fields(values, run.method))
        return render(request, "training/new_run.html", form_context(request, run.project, values, errors, run=run))
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    parsed = forms.parse_run_form(request.POST)
    parsed.values["method"] = parsed.kwargs["method"] = run.method
    fields = forms.finding_fields(parsed.values, run.method)
    if parsed.findings:
        errors = errors_by_field(with_the_rest(parsed, run.project), fields)
        return refuse_form(request, reverse("training:edit", args=[run.pk]), RUN_FORM, errors, parsed.values)
    kwargs = parsed.kwargs
    patch = {"name": kwargs["name"], "base_model": kwargs["base_model"], "dataset": kwargs["dataset"],
             "config": replacement_patch(run.config, kwargs["config"]), "compute": replacement_patch(run.compute, kwargs["compute"])}
    try:
        services.update_run(run, patch)
    except ApiError as exc:
        errors = errors_by_field(exc, fields)
        errors.setdefault("general", []).insert(0, exc.detail)
        return refuse_form(request, reverse("training:edit", args=[run.pk]), RUN_FORM, errors, parsed.values)
    messages.success(request, "Saved.")
    return redirect("training:run", run_id=run.pk)


def replacement_patch(old: Any, new: Any) -> Any:
    """A JSON merge patch that turns `old` into exactly `new` (keys that went away become null)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    patch = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = replacement_patch(old.get(key), value)
    return patch


def new_run_page(request: HttpRequest, part: str = "") -> str:
    """NEW RUN, with the method and experiment a live part's query string picked (what its GET reads)."""
    kept = {k: request.GET[k] for k in ("method", "experiment") if request.GET.get(k)}
    return reverse("training:new") + (f"?{urlencode(kept)}" if kept else "")


def run_page(request: HttpRequest, run_id: int, *args: Any, **kwargs: Any) -> str:
    return reverse("training:run", args=[run_id])


def checkpoints_page(request: HttpRequest, run_id: int, *args: Any, **kwargs: Any) -> str:
    return reverse("training:run_tab", args=[run_id, "checkpoints"])


@studio_page
@htmx_fragment(new_run_page)
@require_GET
def new_run_part(request: HttpRequest, part: str) -> HttpResponse:
    """The form's live pieces: the method card (picker changed), GRPO's mode fields, DISTILL's
    weights (Pure distillation preset) and its estimate. Values come in the query string."""
    project = web_actor(request).require_project()
    values = {k: request.GET.get(k, "") for k in request.GET.keys()}
    method = values["method"] if values.get("method") in Method.values else "sft"
    swap_config = part == "method" and forms.holds_default_config(values)
    if part == "method":
        values = forms.with_method_defaults(values, method)
    elif part == "preset":
        values["config.distillation.ce_weight"] = "0"  # seed 001's preset: take cross-entropy out entirely
    elif part == "mode":
        values.update({k: v for k, v in forms.METHOD_DEFAULTS["grpo"].items() if not values.get(k)})
    elif part == "quick":
        values.update(forms.GRPO_QUICK_TRY)
        if not values.get("config.environment_id"):
            values["config.environment_id"] = forms.DEMO_ENVIRONMENT
    names = {"method": "method_fields", "mode": "grpo_mode", "preset": "distill_weights", "quick": "grpo_numbers",
             "estimate": "distill_estimate", "fit": "fit_estimate"}
    if part not in names:
        return HttpResponseNotFound(format_html(
            '<p class="alert alert-error" role="alert">NEW RUN has no live part "{}": the parts are {}. Open <a href="{}">NEW RUN</a> instead.</p>',
            part, ", ".join(names), reverse("training:new")))
    values["method"] = method
    # A base model typed or a method picked: GRPO's default rollout length fitted to the model (the fit
    # estimate's request follows every change of the form, and then swaps the numbers in out of band,
    # only when the length moved: a swap takes the focus from a field of the numbers the user is in).
    # The numbers say what this request sent (data-sent-values): the page swaps them in only while its
    # fields still hold that (studio.js), as what was typed after the request went out is newer than this.
    length = values.get("config.max_response_length")
    response_help = forms.fit_response_length(values, project) if part in ("method", "fit") else ""
    context = {**form_context(request, project, values), "swap_dataset_help": part == "method", "oob": part == "quick", "swap_config": swap_config,
               "response_help": response_help, "numbers_oob": part == "fit" and values.get("config.max_response_length") != length,
               "sent_numbers": json.dumps({name: request.GET.get(name, "") for name in forms.GRPO_NUMBER_FIELDS})}
    if part == "method":
        context["carried"] = forms.other_methods_values(values, method)
    response = render(request, f"training/new_run.html#{names[part]}", context)
    if part == "quick":
        response["HX-Trigger-After-Settle"] = "change"  # the GPU memory estimate listens for the form's change: it prices the new lengths
    return response


# ---- run detail --------------------------------------------------------------------------------

def tab_context(request: HttpRequest, run: TrainingRun, tab: str) -> dict[str, Any]:
    context: dict[str, Any] = {"run": run, "tab": tab}
    config = run.config or {}
    if tab == "overview":
        context.update(live_context(run))
    elif tab == "configuration":
        blockers = services.start_blockers(run) if run.status != Status.COMPLETED and not is_live(run) else []
        context.update(
            rows=config_rows(run), adapter=adapter_of(config), precision=precision_of(run), loss=config.get("loss"), distillation=config.get("distillation"),
            judge=config.get("judge"), ruler=config.get("ruler_task_args"), config_yaml=yaml.safe_dump(config, sort_keys=True),
            findings=errors_by_field(blockers), editable=run.status in (Status.QUEUED, Status.FAILED, Status.CANCELLED) and not is_live(run),
        )
        if run.method == Method.DISTILL and isinstance(config.get("distillation"), dict):
            context["teacher"] = forms.teacher_fit(config["distillation"].get("teacher_model"), (run.compute or {}).get("accelerators"), run.project)
            context["per_token"] = 6 * int(config["distillation"].get("top_k") or 64)
    elif tab == "datasets":
        context["entries"] = [{**row, "pin": pin_state(run, row["field"], row["kind"]), "pinned": pinned_of(run, row["field"])} for row in dataset_rows(run)]
        mark_deleted_refs(run, context["entries"])  # a deleted repo's ref, or its name's new repo, is not linked
    elif tab == "checkpoints":
        context.update(checkpoints_context(run, writable=web_actor(request).can_write(run.project)))
    elif tab == "try":
        context.update(try_context(run, web_actor(request)))
    elif tab == "lineage":
        context["lineage"] = lineage_of(run)
    elif tab == "environment":
        context["environment_id"] = config.get("environment_id")
        name = str(config.get("environment_id") or "").partition("@")[0]
        builtin = name in env_services.ENGINE_BUILTINS or name.startswith("builtin/")
        context["pin"] = pin_state(run, "config.environment_id", "builtin" if builtin else "hub")
        # A repo made since under a deleted one's name is not the environment this run was pinned to.
        gone = gone_pins({FIELD_ENVIRONMENT: pinned_of(run, FIELD_ENVIRONMENT)})
        context["env_gone"] = pin_deleted(gone[FIELD_ENVIRONMENT]) if gone else ""
        context["env"] = None if gone else environment_info(run.project, config.get("environment_id"))
    elif tab == "rollouts":
        context.update(rollout_groups(run, request))
    elif tab == "repository":
        context.update(repository_of(run, request.GET.get("path", ""), request.GET.get("commit", "")))
    return context


def checkpoints_context(run: TrainingRun, writable: bool) -> dict[str, Any]:
    """The Checkpoints tab: a row per saved checkpoint with what it offers. A restarted run saves a
    step again in its new attempt (other weights, in its own folder), at the same place on the run's
    branch: each row's Download opens the commit that holds its own files, and Resume and Merge name
    its attempt. A row committed before commits were recorded links the branch's head only while no
    later attempt has replaced its files there."""
    config = run.config or {}
    saved = list(Checkpoint.objects.filter(run=run))
    last_step = max((c.step for c in saved), default=0)
    prefixes = {c.pk: hub.branch_folder(c, last_step) for c in saved}
    newest: dict[str, int] = {}  # the newest attempt whose files went to each place on the branch
    for c in saved:
        newest[prefixes[c.pk]] = max(newest.get(prefixes[c.pk], 0), c.attempt)
    branch_gone, live = not branch_exists(run), is_live(run)
    unrecorded = {prefixes[c.pk] for c in saved if not c.commit}
    committed = committed_prefixes(run, unrecorded) if unrecorded and not branch_gone else set()
    merging = {c.pk for c in checkpoints.merging(saved)}
    merged = {(c.attempt, c.step) for c in saved if c.kind == "merged"}
    twins = Counter((c.kind, c.step) for c in saved)  # a step saved by more than one attempt
    repository = reverse("training:run_tab", args=[run.pk, "repository"])
    repo_name = hub.experiment_repo_name(run.experiment)  # each row's Download folder (.tar): the Data Hub's archive of its folder
    recent, pending = timezone.now() - timedelta(minutes=5), False
    # Merge is offered by each row's attempt's settings: the run may have been edited since (request_merge checks the same).
    lora_of = {attempt: lora_enabled(services.attempt_settings(run, attempt)["config"] or {}) for attempt in {c.attempt for c in saved}}
    # What Resume and Merge would refuse (409), said beside their disabled buttons: the same checks, per attempt.
    resume_blocked = {attempt: "; ".join(f.message for f in checkpoints.resume_blockers(run, attempt)) for attempt in lora_of} if writable else {}
    merge_blocked = {attempt: checkpoints.merge_blocker(run, attempt, not branch_gone) for attempt in lora_of if lora_of[attempt]} if writable else {}
    values = metrics.at_checkpoints(run, saved)
    rows = []
    for c in saved:
        prefix = prefixes[c.pk]
        row: dict[str, Any] = {"c": c, "twin": twins[(c.kind, c.step)] > 1, "merged": (c.attempt, c.step) in merged, "merging": c.pk in merging,
                               "lora": lora_of[c.attempt], "path": shown_path(c), "loss": values[c.pk].get("loss"),
                               "resume_blocked": resume_blocked.get(c.attempt, ""), "merge_blocked": merge_blocked.get(c.attempt, "")}
        if branch_gone:
            row["download_note"] = "deleted with its repo"
        elif c.commit:
            row["download"] = f"{repository}?{urlencode({'path': prefix, 'commit': c.commit}, safe='/')}"
            row["archive"] = reverse("datahub:archive_path", args=[run.project.slug, repo_name, c.commit, prefix])
        elif newest[prefix] > c.attempt:
            row["replaced_by"] = newest[prefix]
        elif prefix in committed:
            row["download"] = f"{repository}?{urlencode({'path': prefix}, safe='/')}"
            row["archive"] = reverse("datahub:archive_path", args=[run.project.slug, repo_name, hub.run_branch_name(run), prefix])
        else:
            # Only a step whose folder is on this machine gets committed, and within minutes: the table follows it.
            pending = pending or (c.created_at > recent and checkpoint_dir(c) is not None)
        rows.append(row)
    steps = any(c.kind in checkpoints.RESUMABLE_KINDS for c in saved)
    lora = any(lora_of[c.attempt] for c in saved if c.kind in checkpoints.RESUMABLE_KINDS)
    return {
        "checkpoints": saved, "rows": rows, "branch_gone": branch_gone, "live": live, "save_steps": config.get("save_steps"),
        # New steps while it trains or its engine still reports after the end (a STOP's flush), a merge
        # in flight, a commit that lands in a moment: the table follows them.
        "refreshing": bool(merging) or live or reports_open(run) or pending,
        "has_steps": steps, "several_attempts": len({c.attempt for c in saved}) > 1,
        "lora": lora, "writable": writable, "resume_offered": writable and steps, "merge_offered": writable and steps and lora,
    }


def branch_exists(run: TrainingRun) -> bool:
    """Whether the run's Data Hub branch is there: made with the run, it goes only with its repo
    (as repository_of and lineage_of say), and then no checkpoint of the run will be committed."""
    return Branch.objects.filter(repo__project_id=run.project_id, repo__name=hub.experiment_repo_name(run.experiment), name=hub.run_branch_name(run)).exists()


def committed_prefixes(run: TrainingRun, prefixes: set[str]) -> set[str]:
    """Which of these folders the head of the run's Data Hub branch has: a checkpoint is committed
    by a Celery task after it is reported, so Download links only once its folder is there."""
    repo = hub_repos.find_repo(run.project, hub.experiment_repo_name(run.experiment))
    if repo is None or not prefixes:
        return set()
    try:
        head = hub_repos.resolve(repo, hub.run_branch_name(run))
    except hub_repos.RefNotFound:
        return set()
    condition = Q()
    for prefix in prefixes:
        condition |= Q(path__startswith=prefix + "/")
    paths = TreeEntry.objects.filter(condition, commit=head).values_list("path", flat=True)
    return {prefix for prefix in prefixes if any(path.startswith(prefix + "/") for path in paths)}


def repository_of(run: TrainingRun, prefix: str, at: str = "") -> dict[str, Any]:
    """The run's Data Hub branch: its files (optionally under one folder) and its commits; with `at`,
    the files of that commit of the repo (a checkpoint's Download: the commit holding that attempt's
    files, which a later attempt may have replaced at the head). Every run's branch is made when the
    run is, so a missing repo or branch was deleted with the repo (`gone`); a later run of the
    experiment makes the repo again, without this run's branch."""
    repo_name = hub.experiment_repo_name(run.experiment)
    repo = hub_repos.find_repo(run.project, repo_name)
    branch = hub.run_branch_name(run)
    out: dict[str, Any] = {"repo": repo, "repo_name": f"{run.project.slug}/{repo_name}", "branch": branch, "prefix": prefix.strip("/"),
                           "files": [], "commits": [], "gone": repo is None, "ref": branch, "at": None, "at_note": ""}
    if repo is None:
        return out
    try:
        commits = hub_repos.history(repo, branch, 20)
    except hub_repos.RefNotFound:
        out["gone"] = True
        return out
    shown = commits[0] if commits else None
    if at:
        found = Commit.objects.filter(repo=repo, pk=at).first() if hub_repos.FULL_COMMIT_RE.match(at) else None
        if found is None:
            out["at_note"] = f"{at[:40]!r} is not a commit of {repo.full_name}: showing the head of {branch}"
        else:
            shown = out["at"] = found
            out["ref"] = found.pk
    files = sorted(hub_repos.tree(shown).items()) if shown else []
    if out["prefix"]:
        files = [(path, blob) for path, blob in files if path.startswith(out["prefix"] + "/")]
    out.update(commits=commits, files=[{"path": path, "size": blob.size} for path, blob in files[:500]], truncated=len(files) > 500)
    return out


def environment_info(project, environment_id: str | None) -> dict[str, Any] | None:
    """What the Environment tab shows: description, CONFIG and files of a catalogue entry, an engine
    builtin, or a Data Hub environment repo; None when it does not resolve (START says why)."""
    if not environment_id:
        return None
    name, _, ref = environment_id.partition("@")
    if name in env_services.ENGINE_BUILTINS:
        return {"kind": "Built into the engine", "description": env_services.ENGINE_BUILTINS[name], "config": None, "files": []}
    if name.startswith("builtin/"):
        entry = env_services.catalogue_entry(name)
        if entry is None:
            return None
        info = env_services.catalogue_info(entry)
        return {"kind": "Studio catalogue", **info}
    try:
        info = env_services.repo_config(project, name.rsplit("/", 1)[-1], ref or "main")
    except ApiError:
        return None
    return {"kind": "Data Hub environment repo", "description": (info.get("config") or {}).get("description", ""), **info}


def environment_choices(project) -> list[str]:
    """Environment ids to suggest in the NEW RUN form: the engine's builtins, the catalogue, the project's repos."""
    ids = [f"{name}@main" for name in env_services.ENGINE_BUILTINS] + [e.environment_id for e in env_services.catalogue()]
    ids += [f"{name}@main" for name in Repo.objects.filter(project=project, type=RepoType.ENVIRONMENT).order_by("name").values_list("name", flat=True)]
    return ids


def dataset_field(run: TrainingRun, index: int) -> str:
    return f"dataset[{index}]" if isinstance(run.dataset, list) else "dataset"


def pinned_of(run: TrainingRun, field: str) -> dict | None:
    """The commit a Data Hub ref was pinned to at START (run.pinned is keyed by field path)."""
    return (run.pinned or {}).get(field)


def pin_state(run: TrainingRun, field: str, kind: str) -> dict[str, str]:
    """What a tab says about a ref's pin: the commit START pinned it to, or why there is none. Only
    Data Hub refs are pinned; a local path, an HF id or a builtin is used as it is at run time."""
    pinned = pinned_of(run, field)
    if pinned:
        return {"commit": pinned["commit"]}
    notes = {"builtin": "built in (not versioned)", "path": "local path (not versioned)", "hf": "Hugging Face id (not pinned)"}
    if kind in notes:
        return {"note": notes[kind]}
    not_started = run.status == Status.QUEUED and run.start_requested_at is None
    return {"note": "pinned at START" if not_started else "not pinned"}


def lineage_of(run: TrainingRun) -> list[dict[str, Any]]:
    """Where the run's weights, data and (GRPO) rewards came from, and what it made (issue 5: base
    model ref → dataset ref → run → checkpoints): its output branch at its head commit, and each
    checkpoint with the commit that holds its files. `gone` says why a Data Hub ref is not linked
    (mark_deleted_refs); its pin, if any, stays as the record of what was used, and links to the repo
    at that commit while the commit is there (link_pins): a deleted branch's ref links its pin."""
    config = run.config or {}
    items = [{"role": "Base model (weights)", "ref": run.base_model or "— not set", "kind": ref_kind(run.base_model) if run.base_model else "", "pinned": pinned_of(run, "base_model")}]
    for row in dataset_rows(run):
        items.append({"role": row["role"], "ref": row["ref"], "kind": row["kind"], "pinned": pinned_of(run, row["field"])})
    teacher = (config.get("distillation") or {}).get("teacher_model")
    if teacher:
        items.append({"role": "Teacher (distilled from)", "ref": teacher, "kind": ref_kind(teacher), "pinned": pinned_of(run, "config.distillation.teacher_model")})
    environment = config.get("environment_id")
    if run.method == Method.GRPO and config.get("rl_mode", "environment") == "environment" and isinstance(environment, str) and environment:
        if environment.partition("/")[0] in RESERVED_NAMESPACES:  # builtin/<name>@ref: the catalogue's or the engine's, not versioned
            # The same source the Environment tab names (environment_info).
            kind = "engine" if environment.partition("@")[0] in env_services.ENGINE_BUILTINS else "builtin"
            items.append({"role": "Environment (rewards)", "ref": environment, "kind": kind, "pinned": None, "url": reverse("environments")})
        else:
            items.append({"role": "Environment (rewards)", "ref": environment, "kind": ref_kind(environment), "pinned": pinned_of(run, FIELD_ENVIRONMENT)})
    if run.parent_id:
        saved = run.resume_checkpoint
        step = f"step {saved.step} of attempt {saved.attempt}" if saved is not None else "step ?"
        # The commit on the parent's branch that holds the step's files (Checkpoint.commit), once committed.
        pinned = {"commit": saved.commit, "repo": f"{run.project.slug}/{hub.experiment_repo_name(run.parent.experiment)}"} if saved is not None and saved.commit else None
        items.append({"role": f"Resumed from ({step})", "ref": f"run #{run.parent_id}: {run.parent.name}", "kind": "run", "pinned": pinned,
                      "url": reverse("training:run", args=[run.parent_id])})
    mark_deleted_refs(run, items)
    repo_name, branch = hub.experiment_repo_name(run.experiment), hub.run_branch_name(run)
    output = f"{run.project.slug}/{repo_name}"
    head = Branch.objects.filter(repo__project_id=run.project_id, repo__name=repo_name, name=branch).values_list("head_id", flat=True).first()
    items.append({"role": "Output branch", "ref": f"{output}@{branch}", "kind": "hub", "pinned": {"commit": head, "repo": output} if head else None,
                  "commit_note": "its head", "gone": "" if head else "deleted with its repo"})
    saved_steps = checkpoint_items(run, output)
    link_pins(run, items + saved_steps)
    repository = reverse("training:run_tab", args=[run.pk, "repository"])
    for item in saved_steps:
        c = item.pop("checkpoint")
        if item.get("pinned_url"):  # its files, as its Download on the Checkpoints tab opens them
            item["url"] = f"{repository}?{urlencode({'path': item['ref'].rstrip('/'), 'commit': c.commit}, safe='/')}"
        elif c.commit:
            item["gone"] = "deleted with its repo"
        elif c.created_at > timezone.now() - hub.COMMIT_PENDING and checkpoint_dir(c) is not None:
            item["gone"] = "commit pending"
        else:
            item["gone"] = "not committed"
    return items + saved_steps


CHECKPOINT_ROLES = {"checkpoint": "Checkpoint", "final": "Final weights", "adapter": "LoRA adapter", "merged": "Merged model"}


def checkpoint_items(run: TrainingRun, output: str) -> list[dict[str, Any]]:
    """The Lineage rows of the run's checkpoints, in the Checkpoints tab's order: each its folder on
    the run's branch and the commit that holds its files (its `checkpoint`, for lineage_of). One query."""
    saved = list(Checkpoint.objects.filter(run=run))
    last_step = max((c.step for c in saved), default=0)
    several = len({c.attempt for c in saved}) > 1
    items = []
    for c in saved:
        earlier_merge = hub.is_earlier_merge(c, last_step)
        attempt = f"attempt {c.attempt}" if several else ""
        if earlier_merge:  # a Merge a person asked for, beside its step
            role = f"Merge of step {c.step}" + (f" ({attempt})" if attempt else "")
        else:
            role = f"{CHECKPOINT_ROLES.get(c.kind, c.kind)} (step {c.step}" + (f", {attempt}" if attempt else "") + ")"
        items.append({"role": role, "ref": hub.checkpoint_prefix(c, earlier_merge) + "/", "kind": "checkpoint", "checkpoint": c,
                      "pinned": {"commit": c.commit, "repo": output} if c.commit else None})
    return items


def mark_deleted_refs(run: TrainingRun, items: list[dict[str, Any]]) -> None:
    """Set `gone` on the Data Hub refs that no longer open: their repo was deleted, it is another
    project's (a run can only use its own), or the branch or tag they name was deleted (its commits
    stay, so a pin still opens: link_pins). Three queries for all of them."""
    slug = run.project.slug
    refs = [(item, match) for item in items if item["kind"] == "hub" and (match := HUB_REF.match(item["ref"]))]
    names = {match["repo"] for _, match in refs if match["project"] in (None, slug)}
    there = set(Repo.objects.filter(project_id=run.project_id, name__in=names).values_list("name", flat=True)) if names else set()
    named: set[tuple[str, str]] = set()
    if there:
        # Unordered: SQLite takes no ORDER BY (Branch's and Tag's Meta.ordering) inside a UNION.
        branches = Branch.objects.filter(repo__project_id=run.project_id, repo__name__in=there).order_by().values_list("repo__name", "name")
        tags = Tag.objects.filter(repo__project_id=run.project_id, repo__name__in=there).order_by().values_list("repo__name", "name")
        named = set(branches.union(tags))
    # A pin belongs to the repo of that name only while the repo holds its commit: one made since
    # under a deleted repo's name is another repo, and must not be linked as the one the run used.
    replaced = gone_pins({str(i): item["pinned"] for i, (item, match) in enumerate(refs)
                          if item.get("pinned") and item["pinned"].get("repo") == f"{slug}/{match['repo']}"})
    for i, (item, match) in enumerate(refs):
        if match["project"] not in (None, slug):
            item["gone"] = f"not a repo of project {slug}"
        elif match["repo"] not in there:
            item["gone"] = "deleted"
        elif str(i) in replaced:
            item["gone"] = f"deleted: the repo named {match['repo']} now is a new one, without commit {item['pinned']['commit'][:12]}"
        elif (match["repo"], match["ref"]) not in named and not names_commit(match["ref"], item.get("pinned")):
            item["gone"] = f"branch or tag {match['ref']} deleted"


def names_commit(ref: str, pinned: dict | None) -> bool:
    """Whether a ref that is no branch or tag of its repo is a commit id (commits go only with their
    repo): one START pinned, or, before START, any run of hex digits a commit id can be."""
    if not hub_repos.COMMIT_RE.match(ref):
        return False
    return pinned is None or pinned["commit"].startswith(ref)


def link_pins(run: TrainingRun, items: list[dict[str, Any]]) -> None:
    """Set `pinned_url`, the Data Hub page of the repo at the pinned commit, on the items whose
    commit is still there (its repo was not deleted; a deleted branch's commits stay). One query for all of them."""
    pinned = [item for item in items if item.get("pinned")]
    commits = [item["pinned"]["commit"] for item in pinned]
    there = set(Commit.objects.filter(repo__project_id=run.project_id, pk__in=commits).values_list("pk", flat=True)) if commits else set()
    for item in pinned:
        project_slug, _, repo_name = item["pinned"]["repo"].partition("/")
        if item["pinned"]["commit"] in there and project_slug == run.project.slug:
            item["pinned_url"] = reverse("datahub:tree", args=[project_slug, repo_name, item["pinned"]["commit"]])


ROLLOUTS_SHOWN = 1000


def rollout_groups(run: TrainingRun, request: HttpRequest) -> dict[str, Any]:
    """The Rollouts tab: one step's groups (the latest by default), a reward range. A value that
    cannot be used is said next to its field, not silently dropped."""
    steps = list(Rollout.objects.filter(run=run).order_by("step").values_list("step", flat=True).distinct())
    step = request.GET.get("step", "")
    notes: dict[str, str] = {}
    chosen_step = ascii_int(step)  # a step is never negative
    if chosen_step not in steps:
        chosen_step = None
    if chosen_step is None and steps and step != "all":
        chosen_step = steps[-1]
        if step:
            notes["step"] = f"no rollouts were sampled at step {step}: showing the latest step, {chosen_step}"
    bounds: dict[str, float | None] = {}
    for key in ("min_reward", "max_reward"):
        raw = request.GET.get(key, "").strip()
        try:
            bound = float(raw) if raw else None
            bounds[key] = bound
            if bound is not None and not math.isfinite(bound):
                raise ValueError(raw)
        except ValueError:
            bounds[key] = None
            notes[key] = f"{raw[:40]!r} is not a number: give one like 0.5 (this filter is off)"
    low, high = bounds["min_reward"], bounds["max_reward"]
    if low is not None and high is not None and low > high:
        notes["max_reward"] = f"the range is empty: max {high:g} is below min {low:g}; swap them"
    qs = filter_rollouts(Rollout.objects.filter(run=run).order_by("step", "id"), chosen_step, bounds["min_reward"], bounds["max_reward"])
    shown = list(qs[:ROLLOUTS_SHOWN + 1])
    if len(shown) > ROLLOUTS_SHOWN:
        shown = shown[:ROLLOUTS_SHOWN]
        notes["general"] = f"showing the first {ROLLOUTS_SHOWN} rollouts: pick a step or a reward range to see the others"
    groups: OrderedDict[tuple[int, str], list[Rollout]] = OrderedDict()
    for rollout in shown:
        groups.setdefault((rollout.step, rollout.prompt), []).append(rollout)
    stats = whole_group_stats(run, groups) if (low is not None or high is not None or "general" in notes) else {}
    out = []
    for (s, prompt), items in groups.items():
        rewards = [r.reward for r in items]
        whole = stats.get((s, prompt)) or {"count": len(rewards), "mean": statistics.fmean(rewards), "std": group_std(rewards), "min": min(rewards),
                                           "max": max(rewards)}
        out.append({"step": s, "prompt": prompt, "rollouts": items, **whole})
    raw_bounds = {k: request.GET.get(k, "") if k in notes else bounds[k] for k in bounds}
    return {"groups": out, "steps": steps, "chosen_step": "all" if step == "all" else chosen_step, "notes": notes,
            "system_prompt": shown_system_prompt(run), **raw_bounds}


def whole_group_stats(run: TrainingRun, groups: dict[tuple[int, str], list[Rollout]]) -> dict[tuple[int, str], dict[str, float]]:
    """Each shown group's reward mean, std, min and max over all its rollouts, where a reward filter or
    the cap shows only some: a group of 0.5, 1, 1, 1 filtered to min 0.6 read "mean 1.000, std 0.000",
    while its advantages and the reward metrics came from 0.875 and 0.25. The std is the sample one,
    as group_std's (STDDEV_SAMP: SQLite's is Django's statistics.stdev)."""
    if not groups:
        return {}
    rows = (Rollout.objects.filter(run=run, step__in={s for s, _ in groups}, prompt__in={p for _, p in groups})
            .values("step", "prompt").annotate(count=Count("id"), mean=Avg("reward"), std=StdDev("reward", sample=True), min=Min("reward"), max=Max("reward")))
    return {(r["step"], r["prompt"]): {"count": r["count"], "mean": r["mean"], "std": r["std"] or 0.0, "min": r["min"], "max": r["max"]} for r in rows}


def shown_system_prompt(run: TrainingRun) -> dict[str, str] | None:
    """The system prompt the Rollouts tab shows, and where it came from: the one the latest attempt's
    engine reported it used (an environment package may set its own), else the configured one (an
    engine that reports none, a run not started yet). A reported prompt is credited against the
    config of the attempt that reported it: a stopped run may have been edited since."""
    configured = str((run.config or {}).get("system_prompt") or "")
    reporter = RunAttempt.objects.filter(run=run, system_prompt__isnull=False).order_by("-attempt").values("system_prompt", "config").first()
    if reporter is None:
        return {"text": configured, "source": "config.system_prompt"} if configured else None
    reported = reporter["system_prompt"]
    if not reported:
        return None
    return {"text": reported, "source": system_prompt_source(reported, reporter["config"] or {})}


def system_prompt_source(reported: str, config: dict) -> str:
    ruler = config.get("ruler_task_args")
    ruler = ruler if isinstance(ruler, dict) else {}
    if reported == str(config.get("system_prompt") or ""):
        return "config.system_prompt"
    if config.get("rl_mode") == "ruler" and reported == ruler.get("system_prompt"):
        return "ruler_task_args.system_prompt: RULER gives the policy the judge's criteria"
    return f"set by the environment {config.get('environment_id') or ''} itself".replace("  ", " ")


@studio_page
@require_GET
def run_detail(request: HttpRequest, run_id: int, tab: str = "overview") -> HttpResponse:
    actor = web_actor(request)
    run = get_run_for(actor, run_id)
    tabs = tabs_for(run)
    if tab not in dict(tabs):
        # The status area too, so its role line is the reader's own (not "Viewers cannot ...").
        context = {**status_context(request, run, actor), "tabs": tabs, "tab": None, "missing_tab": tab, "section": "training", "project": run.project}
        return render(request, "training/run_detail.html", context, status=404)
    context = {**tab_context(request, run, tab), "tabs": tabs, "tab_label": dict(tabs)[tab], "section": "training", "project": run.project}
    if request.htmx and request.htmx.target == "tab-panel":
        # With the page's new <title>: htmx sets document.title from a <title> at the top of an answer.
        return render(request, "training/run_detail.html#tab_panel", {**context, "title_in_answer": True})
    if request.htmx and request.htmx.target == "checkpoint-table" and tab == "checkpoints":  # polled while a merge runs
        return render(request, "training/run_detail.html#checkpoint_table", context)
    context.update(status_context(request, run, actor))
    return render(request, "training/run_detail.html", context)


def status_answer(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    """The status area, and the live figures out of band (hx-swap-oob) in the same answer: one poll
    refreshes both, while the status area's own markup stays the same as the run trains step by step,
    so the page leaves it (and the focus on STOP) alone (studio.js skipUnchangedPoll)."""
    area = render_to_string("training/run_detail.html#run_status", context, request)
    figures = render_to_string("training/run_detail.html#run_figures", {**context, "out_of_band": True}, request)
    return HttpResponse(area + figures)


@studio_page
@htmx_fragment(run_page)
@require_GET
def run_status(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(web_actor(request), run_id)
    seen, state = request.GET.get("seen", ""), page_state(run)
    if seen == state and page_phase(run) == "idle":
        return HttpResponse(status=204)  # the slow poll of a run that is not live: nothing to swap
    response = status_answer(request, status_context(request, run))
    if seen and seen != state:
        response.headers["HX-Trigger"] = "run-changed"
    if seen and edited_since(seen, run):
        # An edit moves more than the status area: the heading's name, the tabs (a dataset added or
        # taken out) and the one open. The whole page shows the run as it is now.
        response.headers["HX-Refresh"] = "true"
    return response


@studio_page
@htmx_fragment(run_page)
@require_GET
def run_live(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(web_actor(request), run_id)
    return render(request, "training/run_detail.html#live", live_context(run))


# The log page opens on the newest lines of a log and loads earlier ones a page at a time, by the API's
# cursor (line ids): it showed the last 20,000 lines, one 3.6 MB page for a training log's ~110-character
# lines and 20 MB for 1,000-character ones (bench/log_page.py), up to 200 MB at the 10,000-character cut.
LOG_PAGE_LINES = 1000
LOG_PAGE_CHARS = 500_000


def log_request(request: HttpRequest, run: TrainingRun) -> tuple[int | None, str]:
    """The ?attempt= of a log page: (attempt, "") with None for the current log, or (None, what was
    given) when the run has no such attempt."""
    raw = request.GET.get("attempt", "")
    if not raw:
        return None, ""
    attempt = ascii_int(raw)
    return (attempt, "") if attempt is not None and 1 <= attempt <= run.attempt else (None, raw[:20])


def log_cursor(request: HttpRequest) -> tuple[str, int | None, str]:
    """The log page's ?before= or ?after= (a line id): (which, id, ""), ("", None, "") for the newest
    lines, or ("", None, a sentence) for a value that is not a line id."""
    given = [name for name in ("before", "after") if name in request.GET]
    if len(given) > 1:
        return "", None, "before and after both say where the page is: give one of them (each page's links carry the right one)."
    if not given:
        return "", None, ""
    raw = request.GET[given[0]]
    cursor = ascii_int(raw)
    if cursor is None or cursor > 2**63 - 1:
        return "", None, f"{given[0]}={raw[:20]!r} is not a line id: use the page's own links, or open the log afresh for its newest lines."
    return given[0], cursor, ""


@studio_page
@require_GET
def run_log(request: HttpRequest, run_id: int) -> HttpResponse:
    """A run's log (the Overview shows its last lines): its current log, since it was last started,
    or with ?attempt= an attempt's, earlier ones included: a restart keeps them. The page opens on the
    newest lines; "Load earlier lines" (?before=, htmx prepends them) pages back, and while the run can
    still report, the page follows it (?after=, polled: htmx appends the new lines)."""
    run = get_run_for(web_actor(request), run_id)
    attempt, missing = log_request(request, run)
    context: dict[str, Any] = {"section": "training", "project": run.project, "run": run, "attempt": attempt, "missing": missing,
                               "attempts": list(range(1, run.attempt + 1)), "current": list(range(max(run.start_attempt, 1), run.attempt + 1))}
    if missing:
        return render(request, "training/run_log.html", context, status=404)
    which, cursor, bad = log_cursor(request)
    if bad:
        return render(request, "400.html", {"exception": bad}, status=400)
    lines = log_lines(run, attempt)
    if which == "after":
        rows, later = log_rows_after(lines, cursor or 0, LOG_PAGE_LINES, LOG_PAGE_CHARS)
        earlier = False if request.htmx else lines.filter(id__lte=cursor).exists()
    else:
        rows, earlier = log_rows_before(lines, cursor, LOG_PAGE_LINES, LOG_PAGE_CHARS)
        later = which == "before" and not request.htmx and lines.filter(id__gte=cursor).exists()
    context.update({"lines": [line for _, line in rows], "first_id": rows[0][0] if rows else cursor, "last_id": rows[-1][0] if rows else cursor or 0,
                    "after": cursor, "earlier": earlier, "later": later, "page_lines": LOG_PAGE_LINES})
    if request.htmx and which == "before":  # "Load earlier lines": they go before the shown ones, with the next such link
        return render(request, "training/run_log.html#earlier_page", context)
    if request.htmx and which == "after":  # the follow poll: the new lines go at the end, with the next poll
        context.update({"later": False, "follow": log_follow(run, attempt, behind=later), "total": lines.count() if rows else None})
        return render(request, "training/run_log.html#later_page", context)
    context.update({"follow": "" if later else log_follow(run, attempt, behind=False), "total": lines.count()})
    return render(request, "training/run_log.html", context)


def log_follow(run: TrainingRun, attempt: int | None, behind: bool) -> str:
    """The hx-trigger of the log page's poll for new lines ("" for none): at once while a page of them
    is still waiting, every 5 s while the run can still report to the log shown (the Overview's pace)."""
    if behind:
        return "load delay:200ms"
    return "every 5s" if (attempt is None or attempt == run.attempt) and (is_live(run) or reports_open(run)) else ""


@studio_page
@require_GET
def run_log_text(request: HttpRequest, run_id: int) -> HttpResponse:
    """The same log as plain text, every line (streamed: a log can be long)."""
    run = get_run_for(web_actor(request), run_id)
    attempt, missing = log_request(request, run)
    if missing:
        return HttpResponseNotFound(f"Run #{run.pk} has no attempt {missing!r}: give one from 1 to {run.attempt}, or none for its current log.\n",
                                    content_type="text/plain; charset=utf-8")
    return log_text(run, attempt)


def _action(request: HttpRequest, run_id: int, service) -> HttpResponse:
    actor = web_actor(request)
    run = get_run_for(actor, run_id, write=True)
    error: ApiError | None = None
    try:
        run = service(run)
    except (Unprocessable, Conflict, PaymentRequired, Forbidden) as exc:
        error = exc
        run.refresh_from_db()
    return _status_response(request, run, actor, error)


def _status_response(request: HttpRequest, run: TrainingRun, actor, error: ApiError | None) -> HttpResponse:
    """After a run action: the status area (htmx) with the refusal, if any; else back to the run page."""
    if not request.htmx:
        if error is not None:
            messages.error(request, error.detail + "".join(f" {f.field}: {f.message}" for f in error.errors))
        elif run.queue_notice:
            messages.warning(request, run.queue_notice)
        return redirect("training:run", run_id=run.pk)
    response = status_answer(request, status_context(request, run, actor, error))
    response.headers["HX-Trigger"] = "run-changed"
    return response


@studio_page
@form_action(run_page)
def start(request: HttpRequest, run_id: int) -> HttpResponse:
    return _action(request, run_id, services.start_run)


@studio_page
@form_action(run_page)
def stop(request: HttpRequest, run_id: int) -> HttpResponse:
    return _action(request, run_id, services.stop_run)


@studio_page
@form_action(run_page)
def delete(request: HttpRequest, run_id: int) -> HttpResponse:
    """"Delete run": services.delete_run, as the API's DELETE. Done, the runs list says what stays in
    the Data Hub (or that its empty branch went too); refused, the status area names each reason."""
    actor = web_actor(request)
    run = get_run_for(actor, run_id, write=True)
    deleted = f"Run #{run.pk} ({isolated(run.name)}) was deleted."
    branch, repo = hub.run_branch_name(run), hub.experiment_repo_name(run.experiment)
    try:
        branch_removed = services.delete_run(run)
    except Conflict as exc:
        run.refresh_from_db()
        return _status_response(request, run, actor, exc)
    if branch_removed:
        messages.success(request, f"{deleted} It had committed nothing, so its branch {isolated(branch)} of {isolated(repo)} was removed from the Data Hub too.")
    else:
        messages.success(request, f"{deleted} What it committed stays on branch {isolated(branch)} of {isolated(repo)} in the Data Hub: delete that branch there if nothing needs it.")
    if request.htmx:
        response = HttpResponse(status=204)
        response.headers["HX-Redirect"] = reverse("training:runs")
        return response
    return redirect("training:runs")


@studio_page
@form_action(checkpoints_page)
def resume_checkpoint(request: HttpRequest, run_id: int, step: int) -> HttpResponse:
    """"Resume from here": a child run continuing from the saved step, opened at its Configuration."""
    actor = web_actor(request)
    run = get_run_for(actor, run_id, write=True)
    try:
        child = checkpoints.resume_run(run, step, actor.user, posted_attempt(request))
    except ApiError as exc:
        messages.error(request, exc.detail)
        return redirect("training:run_tab", run_id=run.pk, tab="checkpoints")
    trained = services.attempt_settings(run, child.resume_checkpoint.attempt)["config"] or {}
    if (child.config or {}).get("max_steps") != trained.get("max_steps"):
        messages.info(request, f"Step {step} is where run #{run.pk} ends (its max_steps is {trained.get('max_steps')}): this run's max_steps is "
                               f"{child.config['max_steps']}, so it trains {child.config['max_steps'] - step} steps more. Edit run to change that.")
    return redirect("training:run_tab", run_id=child.pk, tab="configuration")


@studio_page
@form_action(checkpoints_page)
def merge_checkpoint(request: HttpRequest, run_id: int, step: int) -> HttpResponse:
    """"Merge": the LoRA checkpoint merged into its base by a Celery task; it appears as `merged`."""
    run = get_run_for(web_actor(request), run_id, write=True)
    try:
        checkpoint = checkpoints.checkpoint_of(run, step, posted_attempt(request))
        if checkpoints.request_merge(run, checkpoint).unsent:
            messages.warning(request, checkpoints.MERGE_UNSENT)
        else:
            messages.info(request, f"Merge of step {step} (attempt {checkpoint.attempt}) into the base requested: the table below says Merging… until it is done, "
                                   "then lists it as a merged checkpoint.")
    except ApiError as exc:
        messages.error(request, exc.detail)
    return redirect("training:run_tab", run_id=run.pk, tab="checkpoints")


def posted_attempt(request: HttpRequest) -> int | None:
    """The attempt a Checkpoints row's Resume or Merge names (its hidden field); none: the newest.
    A value that is no attempt number is refused, not read as "the newest"."""
    raw = request.POST.get("attempt", "")
    if not raw:
        return None
    attempt = ascii_int(raw)
    if attempt is None or not 1 <= attempt <= 2**31 - 1:
        raise BadRequest(f"attempt {raw[:20]!r} is not an attempt number.", [Finding("attempt", "give the attempt that saved the step (a whole number from 1), or none for the newest")])
    return attempt


def run_url(run: TrainingRun, tab: str = "overview") -> str:
    return reverse("training:run_tab", args=[run.pk, tab])
