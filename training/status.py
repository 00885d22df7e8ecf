"""The one owner of run status transitions (the contract's status machine)."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from training.models import LogLine, Status, TrainingRun

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
    run.status = target
    if target == Status.RUNNING and run.started_at is None:
        run.started_at, fields = now, fields + ["started_at"]
    if target in (Status.COMPLETED, Status.FAILED, Status.CANCELLED):
        run.finished_at, fields = now, fields + ["finished_at"]
    if target == Status.FAILED:
        run.error, fields = error or {"code": "training_error", "message": "the run failed", "log_tail": []}, fields + ["error"]
    if target == Status.QUEUED:
        # A restart ends the old attempt's ingest token now, not when a worker dispatches the next
        # attempt: until then a left-over engine would write into the series the restart wiped.
        run.error, run.started_at, run.finished_at, run.stage, run.progress = None, None, None, "", {}
        run.ingest_token_hash = ""
        fields += ["error", "started_at", "finished_at", "stage", "progress", "ingest_token_hash"]
    run.save(update_fields=fields)
    LogLine.objects.create(run=run, attempt=run.attempt, line=f"[studio] status → {target}" + (f": {note}" if note else ""))
    return run
