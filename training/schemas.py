from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from functools import reduce
from operator import or_
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from django.db.models import Q
from ninja import Schema
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from datahub.models import Branch, Repo
from datahub.services import model_repo_full_name, model_repo_name, published_model, published_models
from studio.parsing import control_character
from training.backends.local import shown_path
from training.methods import NOT_YET_SUPPORTED
from training.models import Method, Status, TrainingRun
from training.queries import LOGS_MAX_LINES

# cost as its column stores it (four decimals), for a run that was not read back from the database too
COST_PLACES = Decimal(1).scaleb(-TrainingRun._meta.get_field("cost").decimal_places)


class RunCreateIn(Schema):
    model_config = ConfigDict(extra="forbid")
    # Its length is checked with every other field (validation.name_findings), so one 400 names them all.
    name: str = Field(json_schema_extra={"minLength": 1, "maxLength": 200})
    experiment: StrictStr | StrictInt | None = Field(None, description="an experiment's id or slug; the project's default when absent")
    # An enum in the schema only: ppo is in it (seed 001) and create answers it, like any other name, with
    # its own 400 ("PPO not yet supported"), not a type error.
    method: str = Field(description="sft | dpo | grpo | distill; ppo is refused: PPO not yet supported",
                        json_schema_extra={"enum": [*Method.values, *NOT_YET_SUPPORTED]})
    base_model: str | None = Field(None, max_length=500, description="An HF id, a Data Hub repo@ref, or a local path (local backend)")
    dataset: Any = Field(None, description="A ref, {ref, type}, or a list of those")
    config: dict[str, Any] = Field(default_factory=dict)
    compute: dict[str, Any] = Field(default_factory=dict, description="{backend, accelerators, spot, region}")


class RunPatchIn(Schema):
    """A JSON merge patch (RFC 7386) of these fields."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    base_model: str | None = Field(None, max_length=500)
    dataset: Any = None
    config: dict[str, Any] | None = None
    compute: dict[str, Any] | None = None


class ExperimentRef(Schema):
    id: int
    name: str
    slug: str


class RunOut(Schema):
    id: int
    name: str
    project: str
    experiment: ExperimentRef
    method: str
    base_model: str
    dataset: Any
    config: dict[str, Any]
    compute: dict[str, Any]
    status: str
    stage: str
    progress: dict[str, Any]
    error: dict[str, Any] | None
    attempt: int
    pinned: dict[str, Any]
    created_at: datetime
    started_at: datetime | None = Field(description="When the engine of its last START's first attempt started the run's work and the run went "
                                                    "running (that attempt's started_at in .../attempts); null until then")
    finished_at: datetime | None
    last_heartbeat_at: datetime | None
    cost: Decimal
    parent: int | None = Field(None, description="The run this one was resumed from")
    resumed_from_step: int | None = None
    resumed_from_attempt: int | None = Field(None, description="The attempt of the parent run that saved resumed_from_step")
    notice: str = Field("", description="A sentence to show beside the status, \"\" for none: START or STOP is recorded but the task "
                                        "queue was unreachable, or a START no worker has picked up for 30 s or more")

    @staticmethod
    def resolve_project(obj) -> str:
        return obj.project.slug

    @staticmethod
    def resolve_notice(obj) -> str:
        from training.services import run_notice

        return run_notice(obj)

    @staticmethod
    def resolve_cost(obj) -> Decimal:
        return Decimal(obj.cost).quantize(COST_PLACES)

    @staticmethod
    def resolve_parent(obj) -> int | None:
        return obj.parent_id

    @staticmethod
    def resolve_resumed_from_step(obj) -> int | None:
        return obj.resume_checkpoint.step if obj.resume_checkpoint_id else None

    @staticmethod
    def resolve_resumed_from_attempt(obj) -> int | None:
        return obj.resume_checkpoint.attempt if obj.resume_checkpoint_id else None


class PublishedModelOut(Schema):
    name: str = Field(description="The model repo's name, as /api/hub/repos/{name} takes it (e.g. x-run2)")
    full_name: str = Field(description="<project>/<name>, as the Data Hub shows it and HF_ENDPOINT=<studio>/hub loads it")
    commit: str | None = Field(description="The head of its default branch (what a download without ref reads); null once deleted")
    deleted: bool = Field(description="The repo was deleted: name and full_name are what it was called, and nothing of it can be downloaded")
    error: str = Field("", description="Why the weights were not published there (a Data Hub rule refused it; the run's log says so too): "
                                       "the repo was never made, and the files are on the run's branch. \"\" when published or deleted")


PUBLISHED_MODEL = ("The model repo its final (or merged) weights were published to, as the run page's Overview names it; null until "
                   "it published one. Its saved steps are on its experiment's repo: GET .../checkpoints gives each one's hub_* fields")


class RunDetailOut(RunOut):
    """GET /api/training-runs/{id}: the run, and where its outputs are."""

    published_model: PublishedModelOut | None = Field(description=PUBLISHED_MODEL)

    @staticmethod
    def resolve_published_model(obj) -> dict[str, Any] | None:
        repo, deleted, failed = published_model(obj)
        head = Branch.objects.filter(repo=repo, name=repo.default_branch).values_list("head_id", flat=True).first() if repo else None
        return published_model_out(obj, repo, deleted, failed, head)


class RunListOut(RunOut):
    """An item of GET /api/training-runs: the run, with the model repo it published as its detail has it."""

    published_model: PublishedModelOut | None = Field(description=PUBLISHED_MODEL)

    @staticmethod
    def resolve_published_model(obj) -> dict[str, Any] | None:
        return obj.published  # with_published_models looked them up for the whole page


def with_published_models(runs: list[TrainingRun]) -> list[TrainingRun]:
    """The runs, each with `published`: its published_model answer, looked up for them all at once (a
    lookup a run made the list's queries grow with its page)."""
    found = published_models(runs)
    repos = [repo for repo, _, _ in found.values() if repo is not None]
    heads = dict(Branch.objects.filter(reduce(or_, (Q(repo=r, name=r.default_branch) for r in repos))).values_list("repo_id", "head_id")) if repos else {}
    for run in runs:
        repo, deleted, failed = found[run.pk]
        run.published = published_model_out(run, repo, deleted, failed, heads.get(repo.pk) if repo else None)
    return runs


def published_model_out(run: TrainingRun, repo: Repo | None, deleted: str, failed: str, head: str | None) -> dict[str, Any] | None:
    """PublishedModelOut of a run's published_model (repo, deleted, failed) and its repo's head commit."""
    if repo is not None:
        return {"name": repo.name, "full_name": repo.full_name, "commit": head, "deleted": False}
    if deleted:
        return {"name": deleted.partition("/")[2], "full_name": deleted, "commit": None, "deleted": True}
    if failed:
        return {"name": model_repo_name(run), "full_name": model_repo_full_name(run), "commit": None, "deleted": False, "error": failed}
    return None


class RunFilters(Schema):
    model_config = ConfigDict(extra="forbid")
    status: Status | None = None
    method: Method | None = None
    experiment: str | None = None
    search: str | None = Field(None, max_length=100, description="Runs whose name or base model contains this text (any case)")

    @field_validator("status", "method", "experiment", "search", mode="before")
    @classmethod
    def empty_is_no_filter(cls, value: Any) -> Any:
        """`?status=` (a form's "any" choice, a script's unset variable) filters nothing."""
        return None if value == "" else value


class MetricsQuery(Schema):
    keys: str | None = Field(None, description="Comma-separated metric keys; all keys when absent")
    max_points: int = Field(1000, ge=2, le=100_000, description="The most points a series comes with: a longer one is downsampled to bucket "
                                                                 "means, each at its bucket's middle step, its first and last points kept. With after_step, the points after "
                                                                 "that step are downsampled among themselves (not as a full read buckets them)")
    after_step: int | None = Field(None, ge=0, le=2**31 - 1, description="Only the points of later steps, to follow a live run: each "
                                                                         "answer's last_step is the after_step of the next")


class MetricsOut(Schema):
    series: dict[str, list[tuple[int, float]]] = Field(description="[step, value] points by key; with keys, every key asked for, [] for one without points")
    known_keys: list[str] = Field(description="Every key the run has reported so far (with or without keys), sorted")
    unknown: list[str] = Field(description="The keys asked for that the run has not reported: not yet while it trains (a key can come later, "
                                           "e.g. eval_loss at the first eval), never once it has ended (status): check the spelling against known_keys")
    last_step: int | None = Field(description="The highest step in this answer's series: the after_step that asks for only the points "
                                              "reported since; the given after_step when the answer has none (null without one). A point "
                                              "that lands later with a step at or below it (a retried batch) is not in the next answer")


class MergeOut(Schema):
    run: int
    step: int
    attempt: int = Field(description="The attempt whose saved step is merged")
    queued: bool = Field(description="false when the task queue could not be reached: nothing was started (notice says so)")
    notice: str = ""


# Attempts are stored as PostgreSQL integers, as steps are.
AttemptNumber = Annotated[int, Field(ge=1, le=2**31 - 1)]


class CheckpointQuery(Schema):
    attempt: AttemptNumber | None = Field(None, description="The attempt that saved the step (a restarted run can save a step again, "
                                                            "with other weights); without it, the newest attempt that saved it")


class LogsQuery(Schema):
    tail: int = Field(200, ge=1, le=LOGS_MAX_LINES, description="The last lines of the log (the default reading)")
    after: int | None = Field(None, ge=0, le=2**63 - 1, description="Page through the log from its start: the lines after this line id, oldest "
                                                                    "first; 0 for the first page, then each answer's `next`")
    limit: int | None = Field(None, ge=1, le=LOGS_MAX_LINES, description=f"The most lines in a page of `after` or `full` (default {LOGS_MAX_LINES})")
    full: bool = Field(False, description="The first page of the log, the same as after=0 (it was every line: follow `next` for the rest)")
    attempt: AttemptNumber | None = Field(None, description="One attempt's log (RunOut.attempt is the current one); without it, the lines since "
                                                            "the run was last started (its current attempt, with any a spot interruption retried from)")


class LogTextQuery(Schema):
    model_config = ConfigDict(extra="forbid")
    attempt: AttemptNumber | None = Field(None, description="One attempt's log; without it, the lines since the run was last started")


class LogsOut(Schema):
    lines: list[str]
    times: list[datetime] = Field(description="When the Studio stored each line (UTC), one per line, in the same order")
    total: int = Field(description="Lines in the whole log (of the attempt, or since the last start)")
    next: int | None = Field(None, description="With `after` or `full`: the `after` of the next page; null when this page reaches the end "
                                               "of the log as it is now (a page of long lines may hold fewer than `limit` lines)")
    last: int = Field(description="The `after` that asks for only the lines stored since this answer, to follow a live run's log: the id of "
                                  "this answer's last line (with `tail` too), or the given `after` when it has none (0 for an empty tail)")


class RolloutOut(Schema):
    step: int
    prompt: str
    completion: str
    reward: float
    advantage: float | None
    components: dict[str, Any]


class RolloutQuery(Schema):
    step: int | None = Field(None, ge=0)
    min_reward: float | None = Field(None, allow_inf_nan=False, description="Only rollouts with reward ≥ this")
    max_reward: float | None = Field(None, allow_inf_nan=False, description="Only rollouts with reward ≤ this")


class CheckpointOut(Schema):
    step: int
    kind: str
    attempt: int
    path: str
    created_at: datetime
    commit: str | None = Field(None, description="The Data Hub commit of the run's branch (run-<id>) that holds this checkpoint's files; "
                                                 "null until it is committed. A later attempt that saves the same step replaces them at the branch's head, not in this commit. "
                                                 "A merge of a step that a later attempt saved again is committed on that step's own commit, beside the files it merged, "
                                                 "and moves no branch")
    # Set by GET .../checkpoints, which looks the run's repo up once for all its checkpoints.
    hub_repo: str | None = Field(None, description="<project>/<repo>: the run's experiment repo (its ExperimentOut.hub_repo) that holds the files; "
                                                   "null until committed, and once the repo was deleted")
    hub_repo_name: str | None = Field(None, description="The same repo's name alone, as /api/hub/repos/{name} takes it")
    hub_branch: str | None = Field(None, description="The run's branch, run-<id> (a later attempt may have replaced the files at its head: use commit)")
    hub_path: str | None = Field(None, description="The folder of the files in that commit: checkpoints/step-<n>, final, adapter, merged, "
                                                   "or checkpoints/step-<n>/merged for a Merge of a saved step")
    archive_url: str | None = Field(None, description="The folder as one .tar, each file under its path in the repo: "
                                                      "GET /api/hub/repos/{hub_repo_name}/archive?ref={commit}&path={hub_path}, with the same token")
    metrics: dict[str, float] = Field(default_factory=dict, description="{key: value} of the metrics the run reported at this step "
                                                                         "(loss, and eval_loss at an eval step...); {} for none, and for a "
                                                                         "checkpoint of an attempt before the run's last START, whose "
                                                                         "metrics that START wiped")

    @staticmethod
    def resolve_commit(obj) -> str | None:
        return obj.commit or None

    @staticmethod
    def resolve_archive_url(obj) -> str | None:
        if not getattr(obj, "hub_path", None):
            return None
        return f"/api/hub/repos/{quote(obj.hub_repo_name)}/archive?{urlencode({'ref': obj.commit, 'path': obj.hub_path}, safe='/')}"

    @staticmethod
    def resolve_path(obj) -> str:
        return shown_path(obj)  # under the current STUDIO_RUNS_DIR, also after the Studio's var/ moved


class ChatMessageIn(Schema):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: StrictStr


class GenerateIn(Schema):
    """POST /api/training-runs/{id}/generate: one prompt for the run's weights (training.playground checks the ranges)."""

    model_config = ConfigDict(extra="forbid")
    prompt: StrictStr | None = Field(None, description="Plain text, given to the model as it is; or send messages")
    messages: list[ChatMessageIn] | None = Field(None, description="A chat, put through the model's chat template for the assistant's turn")
    max_new_tokens: StrictInt = Field(128, description="1 to 512")
    temperature: StrictFloat | StrictInt = Field(0.7, description="0 to 2; 0 always picks the likeliest token")
    step: StrictInt | None = Field(None, description="A saved step (its merged copy when there is one); without it, the run's final weights")
    compare_base: StrictBool = Field(False, description="Answer with the run's base model too")


class GenerationOut(Schema):
    id: int
    run: int
    status: str = Field(description="queued | running | completed | failed")
    step: int | None = Field(description="The step asked for; null: the run's final weights")
    weights: str | None = Field(description="The kind of the saved weights that answer (final, merged, adapter, checkpoint); null once deleted")
    prompt: str
    messages: list[dict[str, Any]] | None
    max_new_tokens: int
    temperature: float
    compare_base: bool
    outputs: list[dict[str, Any]] = Field(description='One per model, the run\'s first: {"model": "trained" | "base", "text", "tokens", '
                                                      '"seconds", "device", "device_note"?}, or {"model", "error"}')
    error: str = Field(description="Why a failed answer failed")
    created_at: datetime
    finished_at: datetime | None

    @staticmethod
    def resolve_run(obj) -> int:
        return obj.run_id

    @staticmethod
    def resolve_weights(obj) -> str | None:
        return obj.checkpoint.kind if obj.checkpoint else None


class AttemptOut(Schema):
    """GET /api/training-runs/{id}/attempts: what each attempt trained with."""

    attempt: int
    claimed_at: datetime = Field(description="When a worker claimed the attempt (it then provisions: waits for a machine or a slot)")
    started_at: datetime | None = Field(description="When its engine started the run's work and the run went running: the run's "
                                                    "started_at is its first attempt's; null while it provisions, and for an attempt that never ran")
    base_model: str
    dataset: Any
    config: dict[str, Any] = Field(description="The config the attempt trained with: a resume from one of its steps "
                                               "(POST .../checkpoints/{step}/resume?attempt=N) copies these settings, not the run's current ones")
    compute: dict[str, Any]
    pinned: dict[str, Any] = Field(description="The commits its Data Hub refs were pinned to at START")
    system_prompt: str | None = Field(description="GRPO: the system prompt its engine reported it put before each prompt (the config's, "
                                                  "RULER's criteria, or one the environment package sets itself); \"\" for none, "
                                                  "null until its engine reports one")
    ended_at: datetime | None = Field(description="When it ended (see outcome); null while it is the run's live attempt, and for an "
                                                  "attempt that ended before the Studio recorded this (all but an ended run's current one)")
    outcome: Literal["completed", "failed", "cancelled", "interrupted"] | None = Field(
        description="How it ended: completed, failed or cancelled as the run ended with it; interrupted when a spot interruption was "
                    "retried in the next attempt. null while it provisions or runs, and for an attempt that ended before the Studio "
                    "recorded outcomes (only an ended run's current attempt was backfilled)")
    error_code: str | None = Field(description="A failed attempt's error code (the run's error.code as it failed: oom, heartbeat_timeout, ...); "
                                               "null for any other outcome")

    @staticmethod
    def resolve_error_code(obj) -> str | None:
        return obj.error_code or None if obj.outcome == "failed" else None


# Steps are stored as PostgreSQL integers; a larger one must be a 400, not an overflow at INSERT.
# Strict: true or 1.5 is no step (pydantic's lax mode read true as step 1).
Step = Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]


# Strict as Step is: lax mode stored "5" as 5.0 and true as 1.0. An int is still a number (5 → 5.0).
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _progress_number(value: Any) -> Any:
    # One message for the whole union (strict int | strict float | None would answer with three).
    if value is None or type(value) in (int, float):
        return value
    raise PydanticCustomError("progress_number", "must be a number or null: send 5 or 0.5, not a string, true/false, a list or an object")


ProgressValue = Annotated[int | float | None, BeforeValidator(_progress_number)]


def _one_line(text: str) -> str:
    if control_character(text) is not None:
        raise PydanticCustomError("control_character", "must not contain control characters (a newline, a tab, an escape): remove them")
    return text


# A metric key or a stage: shown in the UI and in terminals, so one line of text.
Label = Annotated[str, AfterValidator(_one_line)]


# The ingest models are plain pydantic models, not ninja Schemas: ninja's Schema validates every
# nested object through its attribute getter (~50 µs a point), and an engine sends hundreds of points
# a second per run (training/ingest.py parses batches with these directly).


class IngestMetric(BaseModel):
    step: Step
    key: Label = Field(min_length=1, max_length=100)
    value: Number


class IngestRollout(BaseModel):
    step: Step
    prompt: str
    completion: str
    reward: Number
    advantage: Number | None = None
    components: dict[str, Any] = Field(default_factory=dict)


class IngestCheckpoint(BaseModel):
    step: Step
    path: str = Field(min_length=1, max_length=1000)
    kind: Literal["checkpoint", "final", "adapter", "merged"] = "checkpoint"


class IngestError(BaseModel):
    code: str
    message: str = ""
    log_tail: list[str] = Field(default_factory=list)


class IngestBatchIn(BaseModel):
    batch_id: str = Field(min_length=1, max_length=64)
    metrics: list[IngestMetric] = Field(default_factory=list, max_length=100_000)
    logs: list[str] = Field(default_factory=list, max_length=100_000)
    rollouts: list[IngestRollout] = Field(default_factory=list, max_length=10_000)
    checkpoints: list[IngestCheckpoint] = Field(default_factory=list, max_length=1000)
    stage: Label | None = Field(None, max_length=32)
    status: Literal["running", "completed", "failed"] | None = None
    error: IngestError | None = None
    # step, max_steps, tokens_per_s, step_time_s, eta_s, mfu, gpu_memory_gb: numbers the run page shows
    progress: dict[Annotated[str, Field(max_length=64)], ProgressValue] | None = Field(None, max_length=64)
    # Optional (engines before it send none): the system prompt GRPO put before each prompt, the
    # config's or the environment's own; "" when it used none. The Rollouts tab shows it.
    system_prompt: str | None = Field(None, max_length=100_000)


class IngestOut(Schema):
    ok: bool
    duplicate: bool


class FitOut(Schema):
    """GET /api/training-runs/{id}/fit: the GPU memory estimate START's fit check works from."""

    status: Literal["fits", "tight", "too_big", "unknown"] = Field(
        description="fits; tight (fits only with activation checkpointing, or over 80% of the card); too_big (START answers 422); unknown (CPU, GPU:n, or a model/GPU the Studio cannot size)")
    total_gib: float | None = Field(None, description="Peak GiB per GPU, for the phase that sets the peak")
    gpu: str | None = Field(None, description="The GPU type of compute.accelerators")
    gpu_count: int = 0
    gpu_gib: float | None = Field(None, description="GiB of memory on one such card")
    checkpointing: bool | None = Field(None, description="Whether activation checkpointing will be on (the engine's auto rule, or the config's forced value)")
    phase: str | None = Field(None, description="train, rollouts (GRPO generation) or capture (DISTILL's teacher)")
    breakdown: dict[str, float] = Field(default_factory=dict, description="GiB per part: weights, gradients, optimizer, activations, logits, reference, kv_cache, overhead")
    field: str | None = Field(None, description="When too_big: the config field of the best lever (the 422's field)")
    message: str
