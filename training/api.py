"""/api/training-runs: parse → authorise → one service → return.

No `from __future__ import annotations` here: ninja reads a @paginate-wrapped view's annotations
in ninja.pagination's globals, where `Query[RunFilters]` as a string cannot be resolved (every list
call was a 500).
"""
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from django.http.request import RawPostDataException
from ninja import Field, Query, Router, Schema
from ninja.pagination import LimitOffsetPagination, paginate

from datahub import services as hub
from studio.api import MAX_LIMIT, MAX_OFFSET, ErrorOut, actor, body_schema, parse_body
from studio.errors import BadRequest, Finding
from training import checkpoints, metrics, playground, services
from training.fit_report import fit_report
from training.models import Checkpoint, Rollout, RunAttempt, TrainingRun
from training.queries import (
    LOGS_MAX_LINES,
    filter_rollouts,
    get_generation_for,
    get_run_for,
    log_lines,
    log_page,
    log_tail,
    log_text,
    run_list_place,
    runs_after,
    runs_for,
    search_runs,
)
from training.schemas import (
    AttemptOut,
    CheckpointOut,
    CheckpointQuery,
    FitOut,
    GenerateIn,
    GenerationOut,
    LogsOut,
    LogsQuery,
    LogTextQuery,
    MergeOut,
    MetricsOut,
    MetricsQuery,
    RolloutOut,
    RolloutQuery,
    RunCreateIn,
    RunDetailOut,
    RunFilters,
    RunListOut,
    RunOut,
    RunPatchIn,
    with_published_models,
)

router = Router(tags=["training-runs"])

class Pagination(LimitOffsetPagination):
    class Input(Schema):
        limit: int = Field(100, ge=1, le=MAX_LIMIT)
        offset: int = Field(0, ge=0, le=MAX_OFFSET)


class RunPagination(Pagination):
    """The run list's pages: by offset, or by a keyset, after=<run id>: the runs after that one in the
    list's order. An offset counts runs from the newest, so a run created between two pages showed
    the last run of a page again on the next, and one deleted made the next page skip a run."""

    class Input(Pagination.Input):
        after: int | None = Field(None, ge=1, le=2**63 - 1, description="The runs after this run (the last of your previous page) in the "
                                                                        "list's order, newest first: pages that runs created or deleted "
                                                                        "meanwhile do not shift (instead of offset)")

    class Output(Pagination.Output):
        has_more: bool = Field(description="Whether runs come after this page: the next page is after=<the id of this page's last run> "
                                           "(or the next offset)")

    def paginate_queryset(self, queryset: QuerySet[TrainingRun], pagination: Any, request: HttpRequest, **params: Any) -> dict[str, Any]:
        page = self.page(queryset, pagination, request, **params)
        return {**page, "items": with_published_models(page["items"])}

    def page(self, queryset: QuerySet[TrainingRun], pagination: Any, request: HttpRequest, **params: Any) -> dict[str, Any]:
        if pagination.after is None:
            page = super().paginate_queryset(queryset, pagination, request, **params)
            items = list(page["items"])
            return {"items": items, "count": page["count"], "has_more": pagination.offset + len(items) < page["count"]}
        if "offset" in request.GET:
            raise BadRequest("after and offset both say where the page starts.", [
                Finding("offset", "drop offset when you give after: after pages from a run, offset counts runs from the newest"),
                Finding("after", "or drop after, to page by offset")])
        rows = list(runs_after(queryset, run_list_place(actor(request), pagination.after))[: pagination.limit + 1])
        return {"items": rows[: pagination.limit], "count": self._items_count(queryset), "has_more": len(rows) > pagination.limit}


@router.get("", response=list[RunListOut])
@paginate(RunPagination)
def list_runs(request: HttpRequest, filters: Query[RunFilters]):
    """The project's runs, newest first, filtered. A page by `limit` and `offset`, or by `after`: the
    runs after a run of your previous page (its last), so that runs created or deleted meanwhile
    neither repeat nor skip a run; `has_more` says whether another page follows. An `after` run that
    is not in the project's runs (deleted since) is a 400 naming after. Each run comes with the model
    repo it published (published_model, as GET .../{id} has it), looked up once for the page."""
    who = actor(request)
    project = who.require_project()
    runs = runs_for(who).filter(project=project).select_related("project", "experiment", "resume_checkpoint")
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.method:
        runs = runs.filter(method=filters.method)
    if filters.experiment:
        # An unknown one is a 400 as at create, not an empty list that reads as "no runs there yet".
        runs = runs.filter(experiment=services.resolve_experiment(project, filters.experiment))
    return search_runs(runs, filters.search)


@router.post("", response={201: RunOut, 402: ErrorOut}, openapi_extra=body_schema(RunCreateIn))
def create_run(request: HttpRequest):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    services.require_training_plan(project)  # 402 before any body error (the precedence)
    payload = parse_body(request, RunCreateIn)
    run = services.create_run(project, who.user, **payload.model_dump())
    return 201, run


@router.get("/{int:run_id}", response=RunDetailOut)
def get_run(request: HttpRequest, run_id: int):
    """The run, with the model repo it published (published_model)."""
    return get_run_for(actor(request), run_id)


@router.patch("/{int:run_id}", response={200: RunOut, 409: ErrorOut}, openapi_extra=body_schema(RunPatchIn))
def patch_run(request: HttpRequest, run_id: int):
    run = get_run_for(actor(request), run_id, write=True)
    services.require_patchable(run)  # 409 before any body error (the precedence)
    try:
        patch = parse_body(request, RunPatchIn)
    except BadRequest as exc:  # "unknown field" would read as a typo for a field a run has but cannot change
        exc.errors = [Finding(f.field, services.FIXED_FIELDS.get(f.field, f.message)) for f in exc.errors]
        raise
    return services.update_run(run, patch.model_dump(exclude_unset=True))


@router.delete("/{int:run_id}", response={204: None, 409: ErrorOut})
def delete_run(request: HttpRequest, run_id: int):
    """Delete a run with its metrics, logs, rollouts, checkpoint records and run folder; what it
    committed stays on branch run-<id> of its experiment's repo, and a branch it committed nothing
    to goes with it. 409, with each reason and what to do,
    while it is live (STOP it first), its engine is exiting, a merge of one of its steps runs, or
    another run was resumed from it."""
    services.delete_run(get_run_for(actor(request), run_id, write=True))
    return 204, None


@router.post("/{int:run_id}/start", response={202: RunOut, 402: ErrorOut, 409: ErrorOut, 422: ErrorOut})
def start_run(request: HttpRequest, run_id: int):
    run = get_run_for(actor(request), run_id, write=True)
    return 202, services.start_run(run)


@router.post("/{int:run_id}/stop", response={200: RunOut, 409: ErrorOut})
def stop_run(request: HttpRequest, run_id: int):
    """Abort the run's backend job and end it cancelled; before a worker has claimed its START, withdraw
    the START instead (the run stays queued). 409 for a run with nothing to stop."""
    run = get_run_for(actor(request), run_id, write=True)
    return services.stop_run(run)


@router.get("/{int:run_id}/fit", response=FitOut)
def run_fit(request: HttpRequest, run_id: int):
    """The GPU memory estimate for the run as it stands: the figures START's fit check refuses on."""
    run = get_run_for(actor(request), run_id)
    return fit_report(services.draft_of(run)).as_dict()


@router.get("/{int:run_id}/metrics", response=MetricsOut)
def run_metrics(request: HttpRequest, run_id: int, query: Query[MetricsQuery]):
    """The run's series by key, each downsampled to max_points; with after_step, only the points of
    later steps, and last_step to ask with next, to follow a live run without reading it all again."""
    run = get_run_for(actor(request), run_id)
    keys = [k.strip() for k in query.keys.split(",") if k.strip()] if query.keys else None
    known = metrics.metric_keys([run.pk])
    series = metrics.series(run, keys, query.max_points, query.after_step)
    last_step = max((points[-1][0] for points in series.values() if points), default=query.after_step)
    return {"series": series, "known_keys": known, "unknown": sorted(set(keys or []) - set(known)), "last_step": last_step}


@router.get("/{int:run_id}/rollouts", response=list[RolloutOut])
@paginate(Pagination)
def run_rollouts(request: HttpRequest, run_id: int, query: Query[RolloutQuery]):
    run = get_run_for(actor(request), run_id)
    if query.min_reward is not None and query.max_reward is not None and query.min_reward > query.max_reward:
        raise BadRequest("The reward range is empty.", [Finding("max_reward", f"max_reward {query.max_reward:g} is below min_reward {query.min_reward:g}: swap them")])
    return filter_rollouts(Rollout.objects.filter(run=run).order_by("step", "id"), query.step, query.min_reward, query.max_reward)


@router.get("/{int:run_id}/logs", response=LogsOut)
def run_logs(request: HttpRequest, run_id: int, query: Query[LogsQuery]):
    """The run's log since it was last started, or with `attempt` that attempt's: a restart keeps
    the earlier attempts' logs. Its last lines (tail), or a page of it after a line id (after, then
    each answer's next): the whole log of a long run is too big for one answer (log.txt streams it)."""
    run = get_run_for(actor(request), run_id)
    if "tail" in request.GET and (query.full or query.after is not None):
        raise BadRequest("tail and a page (after, full=true) ask for different things.",
                         [Finding("tail", "tail gives the last lines, after= and full=true page from the first: drop one of them")])
    if query.full and query.after is not None:
        raise BadRequest("full=true and after both say where to start.", [Finding("full", "full=true is after=0: drop it when you give after")])
    if query.limit is not None and not query.full and query.after is None:
        raise BadRequest("limit sizes a page that starts somewhere.", [Finding("limit", "give after=0 (then each answer's next) with limit, or tail for the last lines")])
    require_attempt(run, query.attempt)
    lines = log_lines(run, query.attempt)
    total = lines.count()
    if query.full or query.after is not None:
        after = query.after or 0
        page, cursor = log_page(lines, after, query.limit or LOGS_MAX_LINES)
        return {**timed(page, after), "total": total, "next": cursor}
    return {**timed(log_tail(lines, query.tail), 0), "total": total, "next": None}


def timed(rows: list, after: int) -> dict:
    """The rows' lines and times, and `last`: the `after` that asks for the lines stored since (this
    page's last line id; `after` itself for no rows, where `next` is null too and a follower would
    have nothing to go on)."""
    return {"lines": [line for _, line, _ in rows], "times": [at for _, _, at in rows], "last": rows[-1][0] if rows else after}


def require_attempt(run, attempt: int | None) -> None:
    if attempt is not None and attempt > run.attempt:
        had = f"has had attempts 1 to {run.attempt}" if run.attempt else "has not been started yet"
        raise BadRequest(f"Run {run.pk} has no attempt {attempt}.", [Finding("attempt", f"the run {had}: give one of those, or leave attempt out for its current log")])


@router.get("/{int:run_id}/log.txt", openapi_extra={"responses": {200: {"description": "Every line of the log, streamed", "content": {"text/plain": {"schema": {"type": "string"}}}}}})
def run_log_text(request: HttpRequest, run_id: int, query: Query[LogTextQuery]):
    """The whole log as plain text, a line each, streamed (the run page's log.txt, for a token): the
    lines since the run was last started, or with `attempt` that attempt's. 400 for an attempt it has not had."""
    run = get_run_for(actor(request), run_id)
    require_attempt(run, query.attempt)
    return log_text(run, query.attempt)


@router.get("/{int:run_id}/checkpoints", response=list[CheckpointOut])
def run_checkpoints(request: HttpRequest, run_id: int):
    """The run's saved steps, in step order: where each one's files are on the Data Hub, and the
    metrics the run reported at its step."""
    run = get_run_for(actor(request), run_id)
    saved = list(Checkpoint.objects.filter(run=run))
    repo = hub.kept_run_repo(run)  # None once the experiment repo went, with the run's branch and its commits
    last_step = max((c.step for c in saved), default=0)
    values = metrics.at_checkpoints(run, saved)
    for c in saved:
        c.metrics = values[c.pk]
        if repo is not None and c.commit:
            c.hub_repo, c.hub_repo_name, c.hub_branch, c.hub_path = repo.full_name, repo.name, hub.run_branch_name(run), hub.branch_folder(c, last_step)
    return saved


@router.get("/{int:run_id}/attempts", response=list[AttemptOut])
def run_attempts(request: HttpRequest, run_id: int):
    """What each attempt of the run trained with (a failed or cancelled run can be edited before it is
    started again), oldest first. Attempts claimed before the Studio recorded them are not listed."""
    run = get_run_for(actor(request), run_id)
    return RunAttempt.objects.filter(run=run)


@router.post("/{int:run_id}/checkpoints/{int:step}/resume", response={201: RunOut, 402: ErrorOut})
def resume_from_checkpoint(request: HttpRequest, run_id: int, step: int, query: Query[CheckpointQuery]):
    """A new queued run that continues from this saved step (weights, optimizer, scheduler, RNG) of
    `attempt`, or of the newest attempt that saved it."""
    who = actor(request)
    run = get_run_for(who, run_id, write=True)
    services.require_training_plan(run.project)  # 402 before the body's 400, as the contract orders them
    if sent_a_body(request):  # it was ignored: {"config": {...}} made a child with the parent's settings
        raise BadRequest("Resume takes no body: the new run copies this run's settings.",
                         [Finding("body", "send no body, then PATCH the new run (it is queued) to change its settings")])
    return 201, checkpoints.resume_run(run, step, who.user, query.attempt)


def sent_a_body(request: HttpRequest) -> bool:
    """Whether a request that takes no body came with one (JSON beyond {}, or form fields)."""
    if request.content_type == "multipart/form-data":  # a form, empty or not, is its fields
        return bool(request.POST or request.FILES)
    try:
        return request.body.strip() not in (b"", b"{}")
    except RawPostDataException:  # a form the CSRF check has parsed already
        return bool(request.POST or request.FILES)


@router.post("/{int:run_id}/checkpoints/{int:step}/merge", response={202: MergeOut})
def merge_checkpoint(request: HttpRequest, run_id: int, step: int, query: Query[CheckpointQuery]):
    """Merge a LoRA checkpoint into its base: this step of `attempt`, or of the newest attempt that
    saved it. The merged weights appear as a `merged` checkpoint of that attempt."""
    run = get_run_for(actor(request), run_id, write=True)
    checkpoint = checkpoints.checkpoint_of(run, step, query.attempt)
    unsent = checkpoints.request_merge(run, checkpoint).unsent
    return 202, {"run": run.pk, "step": step, "attempt": checkpoint.attempt, "queued": not unsent,
                 "notice": checkpoints.MERGE_UNSENT if unsent else ""}


@router.post("/{int:run_id}/generate", response={202: GenerationOut, 409: ErrorOut}, openapi_extra=body_schema(GenerateIn))
def generate(request: HttpRequest, run_id: int):
    """Answer a prompt with the run's final weights, or a saved `step`'s, and with its base model too
    when `compare_base`: a worker answers it (GET .../generations/{id} for the outputs). 400 naming
    each bad field, as every body's; 409 when the run has no weights that can answer on the Studio machine, saying why."""
    who = actor(request)
    run = get_run_for(who, run_id, write=True)
    ask = parse_body(request, GenerateIn)
    return 202, playground.request_generation(run, who.user, ask.model_dump())


@router.get("/generations/{int:generation_id}", response=GenerationOut)
def get_generation(request: HttpRequest, generation_id: int):
    """A Try it answer: its status, and once answered each model's text, tokens, seconds and device."""
    return get_generation_for(actor(request), generation_id)
