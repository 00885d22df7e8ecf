"""Training runs and what their engine reports back."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from experiments.models import Experiment
from studio.models import Project


class Method(models.TextChoices):
    SFT = "sft", "SFT"
    DPO = "dpo", "DPO"
    GRPO = "grpo", "GRPO"
    DISTILL = "distill", "DISTILL"


class Status(models.TextChoices):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (Status.PROVISIONING, Status.RUNNING)
TERMINAL_STATUSES = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


class ErrorCode(models.TextChoices):
    """Seed 000's failure table, exactly."""

    OOM = "oom"
    CAPACITY_UNAVAILABLE = "CAPACITY_UNAVAILABLE"
    PROVISIONING_ERROR = "provisioning_error"
    PROVISIONING_TIMEOUT = "provisioning_timeout"
    CONFIGURING_TIMEOUT = "configuring_timeout"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    TRAINING_ERROR = "training_error"


class AttemptOutcome(models.TextChoices):
    """How an attempt ended: the run's terminal status, or interrupted (a spot interruption retried in
    the next attempt)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


class TrainingRun(models.Model):
    # Not stored: what START or STOP says beside the run it answers (services.QUEUE_DOWN_*), "" for nothing.
    queue_notice = ""
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="runs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=200)
    method = models.CharField(max_length=16, choices=Method.choices)
    base_model = models.CharField(max_length=500, blank=True)
    dataset = models.JSONField(null=True, blank=True)
    config = models.JSONField(default=dict, blank=True)
    compute = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    stage = models.CharField(max_length=32, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)  # {code, message, log_tail}

    # Each START is an attempt; the engine's ingest token is valid for one attempt only.
    attempt = models.PositiveIntegerField(default=0)
    ingest_token_hash = models.CharField(max_length=64, blank=True, db_index=True)  # /hub reads by ingest token
    start_requested_at = models.DateTimeField(null=True, blank=True)
    backend_job_id = models.CharField(max_length=200, blank=True)
    # Refs resolved to commits at start (lineage); filled by the Data Hub resolver.
    pinned = models.JSONField(default=dict, blank=True)
    # Lineage of a run made with "resume from here": the run and the saved step it continues from.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    resume_checkpoint = models.ForeignKey("Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The reconciler pushes a run whose backend keeps erroring back by this much.
    next_poll_at = models.DateTimeField(null=True, blank=True)
    poll_failures = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=4, default=0)

    # Reconciler state (training/services.py): when this provisioning phase began (claim, or a retry
    # after an interruption), when the worker came up, when the current submit was handed to the
    # backend (a lease: an older one with no job id is submitted again), and how many spot
    # interruptions were retried.
    provisioning_since = models.DateTimeField(null=True, blank=True)
    worker_up_at = models.DateTimeField(null=True, blank=True)
    submit_started_at = models.DateTimeField(null=True, blank=True)
    interruptions = models.PositiveIntegerField(default=0)
    # Cost: a GPU lease opens when the backend reports a machine and closes when the run ends or
    # loses it; closed leases add to gpu_seconds. The hourly price is taken when the lease opens.
    gpu_leased_at = models.DateTimeField(null=True, blank=True)
    gpu_seconds = models.FloatField(default=0)
    hourly_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "status"]), models.Index(fields=["project", "-created_at"])]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.method}, {self.status})"

    @property
    def backend_name(self) -> str:
        return (self.compute or {}).get("backend") or "local"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def start_attempt(self) -> int:
        """The attempt the run's last START began with. A spot interruption retries in a new attempt
        (attempt and interruptions both count up; a START's claim resets interruptions), so the
        attempts from this one to `attempt` are one START's training: one log, one line of checkpoints."""
        return max(self.attempt - self.interruptions, 0)


class RunAttempt(models.Model):
    """What one attempt of a run trained with, recorded when it was claimed (a START's claim, or the
    retry of a spot interruption): a failed or cancelled run can be edited before it is started again,
    and a resume from one attempt's saved step must continue with the settings that attempt trained
    with, not the run's current ones (training.checkpoints.resume_run)."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.PositiveIntegerField()
    base_model = models.CharField(max_length=500, blank=True)
    dataset = models.JSONField(null=True, blank=True)
    config = models.JSONField(default=dict, blank=True)
    compute = models.JSONField(default=dict, blank=True)
    pinned = models.JSONField(default=dict, blank=True)  # the refs' commits START pinned for it
    # The system prompt its engine put before each GRPO prompt, as it reported it: the config's, or the
    # one the environment package sets itself ("" for none; null when its engine reported none).
    system_prompt = models.TextField(null=True, blank=True)
    # Set when STOP (or the reconciler ending the run) hands this attempt's job to the stop_backend_job
    # task, cleared when that task is done: the task needs the run's row (its backend connection), so
    # the run cannot be deleted in between (services.delete_blockers). Per attempt: a task still
    # stopping an earlier attempt's job must hold a DELETE, and its end must not free a later one's.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The job id (maybe "") of a stop_backend_job task that could not be sent (the broker was down when
    # STOP committed); the reconciler sends it again (services.resend_stop). Null: nothing waits.
    unsent_stop_job = models.CharField(max_length=200, null=True, blank=True)
    claimed_at = models.DateTimeField(auto_now_add=True)
    # When its engine started the run's work (the run went running; status.transition): the run's own
    # started_at is its first attempt's. Null while it provisions, and for an attempt that never ran.
    started_at = models.DateTimeField(null=True, blank=True)
    # How and when it ended (status.end_attempt): as the run ended (completed, failed with error_code,
    # cancelled), or interrupted when the reconciler retried a spot interruption in a new attempt. Null
    # while it is the run's live attempt, and for attempts that ended before the Studio recorded this
    # (migration 0018 backfilled the attempt each ended run ended with).
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, null=True, blank=True)
    error_code = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["attempt"]
        constraints = [models.UniqueConstraint(fields=["run", "attempt"], name="one_record_per_attempt")]


class MetricPoint(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="metric_points")
    key = models.CharField(max_length=100)
    step = models.IntegerField()
    value = models.FloatField()

    class Meta:
        # A series in (step, id) order with its values: the metrics reads (training/metrics.py) find
        # bucket bounds and sum buckets from the index alone, with no lookup of each point's row.
        indexes = [models.Index(fields=["run", "key", "step", "id", "value"], name="metric_series_idx")]


# A log line longer than this is stored cut, with a marker saying how much went: one line (a progress
# bar's carriage returns, a dumped tensor) could fill a page of the log; ingest caps only the batch.
LOG_LINE_CHARS = 10_000


def clip_log_line(line: str) -> str:
    if len(line) <= LOG_LINE_CHARS:
        return line
    return f"{line[:LOG_LINE_CHARS]} … [cut by the Studio: {len(line) - LOG_LINE_CHARS} more characters]"


class LogLine(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="log_lines")
    attempt = models.PositiveIntegerField(default=0)
    line = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "id"])]


class Rollout(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="rollouts")
    step = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField()
    advantage = models.FloatField(null=True)
    components = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["run", "step"])]


class Checkpoint(models.Model):
    """A saved step. Kept across restarts (seed 001: committed checkpoints are preserved)."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveIntegerField()
    step = models.IntegerField()
    kind = models.CharField(max_length=16, default="checkpoint")
    path = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set while a merge of this step is queued or running (training.checkpoints); in the request's
    # transaction, so a request that rolls back leaves no mark behind.
    merge_requested_at = models.DateTimeField(null=True, blank=True)
    # The hash of the token a merge of this step reads its Data Hub base model from /hub with (the
    # commit its attempt trained on: datahub.hf_api.merge_reader); set while the merge runs.
    merge_token_hash = models.CharField(max_length=64, blank=True, default="", db_index=True)
    # A merged checkpoint a person asked for (Merge on the Checkpoints tab), not the engine's own
    # result: it goes beside its step on the run's branch and never onto the Models page, also while
    # the run is still training and that step is its newest.
    requested = models.BooleanField(default=False)
    # The Data Hub commit on the run's branch that holds this checkpoint's files, as committed
    # (datahub.services.commit_checkpoint). A later attempt that saves the same step writes the same
    # folder on the branch: this commit still has this attempt's files. Empty until committed, and for
    # a checkpoint that never was (no folder on this machine, a full disk) or was before this was kept.
    commit = models.CharField(max_length=40, blank=True, default="")
    # Why this final or merged checkpoint, committed, was not published to the run's model repo (a
    # Data Hub rule refused it: datahub.services.publish_failed); empty once published, or never tried.
    publish_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["step", "id"]


class IngestBatch(models.Model):
    """Batch ids already applied, so a retried batch counts once."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="ingest_batches")
    batch_id = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "batch_id"], name="batch_once_per_run")]


class BackendKind(models.TextChoices):
    DSTACK = "dstack", "dstack"
    MODAL = "modal", "Modal"


class BackendConnection(models.Model):
    """A project's connection to a remote backend (admin-editable). Tokens live in the project's
    secret store (encrypted at rest); these rows only name them."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="backend_connections")
    backend = models.CharField(max_length=16, choices=BackendKind.choices)
    enabled = models.BooleanField(default=True)
    # dstack
    server_url = models.URLField(blank=True, help_text="dstack server, e.g. https://sky.dstack.ai or http://127.0.0.1:3000")
    dstack_project = models.CharField(max_length=100, blank=True, help_text="dstack project name")
    backends = models.JSONField(default=list, blank=True, help_text='dstack backends to use, e.g. ["aws", "kubernetes"]; empty: any')
    # Modal
    modal_workspace = models.CharField(max_length=100, blank=True)
    modal_environment = models.CharField(max_length=100, blank=True)
    modal_app = models.CharField(max_length=100, blank=True, default="studio-engine", help_text="deployed Modal app with the engine function")
    token_id_secret = models.CharField(max_length=100, blank=True, help_text="Modal token id: name of a project secret")
    # both
    token_secret = models.CharField(max_length=100, blank=True, help_text="name of the project secret with the dstack token or Modal token secret")
    image = models.CharField(max_length=300, blank=True, help_text="trainer image; empty: the backend's default image")
    setup_commands = models.JSONField(default=list, blank=True, help_text="shell commands run before the engine (e.g. pip install the engine at the Studio's version)")
    regions = models.JSONField(default=list, blank=True, help_text="regions runs may ask for; empty: any region the backend knows")
    retry_window_seconds = models.PositiveIntegerField(default=0, help_text="keep retrying a run that finds no capacity for this long (0: fail at once with CAPACITY_UNAVAILABLE)")
    interruption_retries = models.PositiveIntegerField(default=2, help_text="spot interruptions retried from the last checkpoint before the run fails")
    provisioning_timeout_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="no worker within this long → provisioning_timeout (empty: the Studio default)")
    configuring_timeout_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="worker up but no training step within this long → configuring_timeout (empty: the Studio default)")
    request_timeout_seconds = models.PositiveIntegerField(default=30, help_text="timeout of one call to the backend")
    # Last verification from a Celery task (Modal is never called inside a web request).
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_check_error = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "backend"], name="one_connection_per_backend")]

    def __str__(self) -> str:
        return f"{self.project} → {self.get_backend_display()}"


class GpuPrice(models.Model):
    """Hourly price of one GPU (admin-editable). Lookup: this backend, then any backend ("");
    spot price, then on-demand; the GPU type, then the "GPU" row (any type)."""

    backend = models.CharField(max_length=16, blank=True, help_text="empty: any backend")
    gpu_type = models.CharField(max_length=40, help_text='upper-case type as in accelerators (H100, A100-80GB, L4), or "GPU" for any type')
    spot = models.BooleanField(default=False)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, help_text="per GPU, in the billing currency")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["backend", "gpu_type", "spot"], name="one_price_per_gpu")]
        ordering = ["backend", "gpu_type", "spot"]

    def __str__(self) -> str:
        return f"{self.gpu_type}{' spot' if self.spot else ''} on {self.backend or 'any backend'}: {self.price_per_hour}/h"


class Generation(models.Model):
    """One answer asked for on a run's Try it tab (or POST .../generate): the weights it was asked of,
    the request, and what came back, kept so answers survive a reload. A run keeps its newest
    KEPT_GENERATIONS (training.playground.request_generation drops the older ones)."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="generations")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # The saved weights asked of: null once the run's checkpoint rows are gone (the answer stays).
    checkpoint = models.ForeignKey(Checkpoint, null=True, on_delete=models.SET_NULL, related_name="+")
    step = models.IntegerField(null=True, blank=True)  # the step asked for; null: the final weights
    prompt = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)  # a chat instead of a plain-text prompt
    max_new_tokens = models.PositiveIntegerField()
    temperature = models.FloatField()
    compare_base = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # One per model answered, the run's weights first: {"model": "trained"|"base", "text", "tokens",
    # "seconds", "device"}, or {"model", "error"} for one that could not answer.
    outputs = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)  # a worker took it (running)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Not stored: how many answers asked before this queued one are still to be made (the tab's
    # "Waiting for N earlier answers"; training.playground.count_answers_ahead sets it).
    ahead: int = 0

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "-created_at"])]
