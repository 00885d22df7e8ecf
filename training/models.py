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


class TrainingRun(models.Model):
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
    ingest_token_hash = models.CharField(max_length=64, blank=True)
    start_requested_at = models.DateTimeField(null=True, blank=True)
    backend_job_id = models.CharField(max_length=200, blank=True)
    # Refs resolved to commits at start (lineage); filled by the Data Hub resolver.
    pinned = models.JSONField(default=dict, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The reconciler pushes a run whose backend keeps erroring back by this much.
    next_poll_at = models.DateTimeField(null=True, blank=True)
    poll_failures = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=4, default=0)

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


class MetricPoint(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="metric_points")
    key = models.CharField(max_length=100)
    step = models.IntegerField()
    value = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["run", "key", "step"])]


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

    class Meta:
        ordering = ["step", "id"]


class IngestBatch(models.Model):
    """Batch ids already applied, so a retried batch counts once."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="ingest_batches")
    batch_id = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "batch_id"], name="batch_once_per_run")]
