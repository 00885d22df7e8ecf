"""The one owner of run status transitions (the contract's status machine)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from studio import webhooks
from training.models import TERMINAL_STATUSES, AttemptOutcome, LogLine, RunAttempt, Status, TrainingRun

ALLOWED: dict[str, frozenset[str]] = {
    Status.QUEUED: frozenset({Status.PROVISIONING}),
    Status.PROVISIONING: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    # running → provisioning: a backend retries after a spot interruption.
    Status.RUNNING: frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.PROVISIONING}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset({Status.QUEUED}),
    Status.CANCELLED: frozenset({Status.QUEUED}),
}


class IllegalTransition(Exception):
    def __init__(self, current: str, target: str) -> None:
        self.current, self.target = current, target
        super().__init__(f"a {current} run cannot become {target}")


def can_move(current: str, target: str) -> bool:
    return target in ALLOWED.get(current, frozenset())


@transaction.atomic
def transition(run_id: int, target: str, *, attempt: int | None = None, error: dict | None = None, note: str = "") -> TrainingRun | None:
    """Move a run to `target`, or raise IllegalTransition.

    With `attempt`, the move only applies to that attempt: a report from an engine of an earlier
    attempt returns None and changes nothing.
    """
    run = TrainingRun.objects.select_for_update().get(pk=run_id)
    if attempt is not None and run.attempt != attempt:
        return None
    if not can_move(run.status, target):
        raise IllegalTransition(run.status, target)
    now = timezone.now()
    fields = ["status"]
    moving_from, run.status = run.status, target
    if target == Status.RUNNING:
        # Running is reached when the attempt's engine starts the run's work (it reports so before it
        # loads the model): the run's start is its first attempt's, and each attempt keeps its own.
        RunAttempt.objects.filter(run=run, attempt=run.attempt, started_at__isnull=True).update(started_at=now)
        if run.started_at is None:
            run.started_at, fields = now, fields + ["started_at"]
    if target == Status.PROVISIONING and moving_from == Status.RUNNING:
        # A retry after a spot interruption: the next attempt resumes from a checkpoint and reports its
        # own stage and progress; the last attempt's speed and ETA would be shown as if they were its.
        run.stage, run.progress, fields = "", {}, fields + ["stage", "progress"]
    if target in TERMINAL_STATUSES:
        run.finished_at, fields = now, fields + ["finished_at"]
        if "eta_s" in (run.progress or {}):  # nothing is left to wait for
            run.progress, fields = {k: v for k, v in run.progress.items() if k != "eta_s"}, fields + ["progress"]
    if target == Status.FAILED:
        run.error, fields = error or {"code": "training_error", "message": "the run failed", "log_tail": []}, fields + ["error"]
    if target in TERMINAL_STATUSES:
        end_attempt(run.pk, run.attempt, AttemptOutcome(target), now, run.error.get("code", "") if target == Status.FAILED else "")
    if target == Status.QUEUED:
        # A restart ends the old attempt's ingest token now, not when a worker dispatches the next
        # attempt: until then a left-over engine would write into the series the restart wiped.
        run.error, run.started_at, run.finished_at, run.stage, run.progress = None, None, None, "", {}
        run.ingest_token_hash = ""
        fields += ["error", "started_at", "finished_at", "stage", "progress", "ingest_token_hash"]
    run.save(update_fields=fields)
    LogLine.objects.create(run=run, attempt=run.attempt, line=f"[studio] status → {target}" + (f": {note}" if note else ""))
    if target in TERMINAL_STATUSES:
        webhooks.queue_event(run.project_id, f"run.{target}", run.pk, lambda: webhook_data(run))
    return run


def webhook_data(run: TrainingRun) -> dict[str, Any]:
    """The `data` of a run.* webhook: what a receiver needs to act on the run's end, nothing secret
    (the error's code and message, not its log tail). The model is the one published by now: a
    run's final weights are published after it completes, so it is often still null."""
    from datahub.services import published_model  # datahub builds on training's models

    repo, _, _ = published_model(run)
    return {
        "run_id": run.pk, "name": run.name, "project": run.project.slug, "method": run.method, "status": run.status,
        "error": {"code": run.error.get("code", ""), "message": run.error.get("message", "")} if run.error else None,
        "published_model": repo.full_name if repo is not None else None,
        "url": settings.STUDIO_PUBLIC_URL + reverse("training:run", args=[run.pk]),
    }


def end_attempt(run_id: int, attempt: int, outcome: str, at: datetime, error_code: str = "") -> None:
    """Record how the run's attempt ended: the run's terminal status (transition), or interrupted (the
    reconciler's retry of a spot interruption): an AttemptOutcome. Once: an attempt ends one way."""
    RunAttempt.objects.filter(run_id=run_id, attempt=attempt, outcome__isnull=True).update(
        outcome=outcome, ended_at=at, error_code=str(error_code or "")[: RunAttempt._meta.get_field("error_code").max_length])
