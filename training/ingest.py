"""POST /api/ingest/runs/{id}: what the engine reports, authenticated by the attempt's own token.

A batch id seen twice is applied once. The token is valid for one attempt: an engine left over
from before a restart gets 403 and writes nothing.

`deliver_spooled` applies an engine's spool file (the batches it could not POST before it exited,
reporter.SPOOL_NAME) through the same checks and transaction as a POST, when the reconciler sees
the job end.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, connection, models, transaction
from django.db.models import Max
from django.http import HttpRequest
from django.utils import timezone
from ninja import Router
from pydantic import ValidationError as PydanticValidationError

from datahub.services import record_checkpoint
from studio import crypto
from studio.api import ErrorOut, body_schema, json_body, loads_json, parse_body, unstorable
from studio.errors import ApiError, BadRequest, Conflict, Finding, Forbidden, Unauthorized
from studio.ratelimit import check_auth_allowed, refuse_bad_credentials
from training import status as status_service
from training.backends import get_backend
from training.models import TERMINAL_STATUSES, Checkpoint, ErrorCode, IngestBatch, LogLine, MetricPoint, Rollout, RunAttempt, Status, TrainingRun, clip_log_line
from training.schemas import IngestBatchIn, IngestOut

log = logging.getLogger(__name__)
router = Router(tags=["ingest"], auth=None)


def run_for_token(request: HttpRequest, run_id: int) -> TrainingRun:
    # The token first: every local engine reports from 127.0.0.1, and one's bad tokens must not lock
    # out the others; an address over its failure budget gets 429 for a bad token only.
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        check_auth_allowed(request)
        raise Unauthorized("Send this attempt's ingest token as Authorization: Bearer <token>.")
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or not run.ingest_token_hash or not crypto.same_hash(run.ingest_token_hash, crypto.hash_token(token.strip())):
        refuse_bad_credentials(request, Forbidden("This token is not valid for this run's current attempt."))
    return run


# After a run ends its engine may still be flushing: its last lines after a STOP (SIGTERM grace) or a
# batch being retried. Past this window the attempt's reports are closed (409, nothing stored; a batch
# already applied is still answered as a duplicate): a token kept after the run must not add to, or
# publish a model for, a run that is over.
LATE_REPORTS = timedelta(seconds=60)
# What only a run that trained to its end produces; from a run that was stopped or failed it is refused.
END_OF_TRAINING_KINDS = ("final", "adapter", "merged")


def require_open(run: TrainingRun) -> None:
    if run.status in TERMINAL_STATUSES and run.finished_at and timezone.now() - run.finished_at > LATE_REPORTS:
        again = "" if run.status == Status.COMPLETED else "; START the run again for a new attempt"
        raise Conflict(f"Run {run.pk} is {run.status} since {run.finished_at:%Y-%m-%d %H:%M:%S} UTC: this attempt's reports are closed.", [
            Finding("status", f"an engine reports until its run ends and for {LATE_REPORTS.seconds} s after{again}")])


@router.post("/runs/{int:run_id}", response={200: IngestOut, 409: ErrorOut}, openapi_extra=body_schema(IngestBatchIn))
def ingest(request: HttpRequest, run_id: int):
    run = run_for_token(request, run_id)
    batch = parse_batch(request)
    return {"ok": True, "duplicate": ingest_batch(run, batch)}


def ingest_batch(run: TrainingRun, batch: IngestBatchIn) -> bool:
    """Apply one batch of `run`'s current attempt, once; True when its batch id was applied before.
    `run` is the row its token (or, for a spooled batch, its attempt) was checked against. Raises
    ApiError (nothing of the batch stored) for a batch the run cannot take."""
    # A batch resent because its answer was lost is a duplicate even after the reports closed: the
    # reporter reads a 409 as "superseded" and would stop retrying what it has still to send.
    if IngestBatch.objects.filter(run=run, batch_id=batch.batch_id).exists():
        return True
    require_open(run)
    refuse_foreign_checkpoints(run, batch)
    try:
        with transaction.atomic():
            locked = locked_run_for_token(run)
            if IngestBatch.objects.filter(run=locked, batch_id=batch.batch_id).exists():
                return True
            require_open(locked)
            IngestBatch.objects.create(run=locked, batch_id=batch.batch_id)
            apply_batch(locked, batch)
    except IntegrityError:
        if not TrainingRun.objects.filter(pk=run.pk).exists():
            raise Forbidden("This token is not valid for this run's current attempt.") from None
        if IngestBatch.objects.filter(run=run, batch_id=batch.batch_id).exists():
            return True
        raise
    return False


# ---- an engine's spool file ----------------------------------------------------------------------

CHECKPOINT_ITEM = re.compile(r"^checkpoints\[(\d+)\]")


@dataclass
class SpoolOutcome:
    delivered: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)  # sentences for the run log: what was not stored, and why


def deliver_spooled(run: TrainingRun, lines: list[str]) -> SpoolOutcome:
    """Apply the batches of `run`'s current attempt that its engine spooled, in order, as if it had
    POSTed them: the same validation, dedup on batch_id (a batch that did land is applied once) and
    locked run row. As the engine's reporter does with a 400, a refused checkpoint is left out and
    the rest of its batch applied. Call outside a transaction, after the attempt's job has ended."""
    outcome = SpoolOutcome()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = loads_json(line.encode())
            if unstorable(raw) is not None:
                raise ValueError("it holds text PostgreSQL cannot store")
            batch = IngestBatchIn.model_validate(raw)
        except (ValueError, RecursionError, PydanticValidationError) as exc:  # a line cut short by a full disk, say
            outcome.problems.append(f"line {number} is not a report batch ({str(exc).splitlines()[0]}) and was skipped")
            continue
        while True:
            try:
                duplicate = ingest_batch(run, batch)
            except BadRequest as exc:
                named = {int(m[1]) for finding in exc.errors if (m := CHECKPOINT_ITEM.match(finding.field))}
                outcome.problems.append(f"line {number}: {exc.detail} ({'; '.join(f'{f.field}: {f.message}' for f in exc.errors)})")
                if not named:
                    break
                batch = batch.model_copy(update={"checkpoints": [c for i, c in enumerate(batch.checkpoints) if i not in named]})
                continue
            except ApiError as exc:  # the run was stopped or restarted meanwhile: nothing more of it belongs to the run
                outcome.problems.append(f"line {number} and after were not stored: {exc.detail}")
                return outcome
            if duplicate:
                outcome.duplicates += 1
            else:
                outcome.delivered += 1
            break
    return outcome


def locked_run_for_token(checked: TrainingRun) -> TrainingRun:
    """The run's row, locked for the batch's transaction and re-read: `checked` is the copy the token
    was checked against before the batch was parsed. A STOP, a restart (which ends the attempt's
    token) or a DELETE may have landed since; the batch is judged and applied against what the run
    is now, and those wait for it while it is written."""
    locked = TrainingRun.objects.select_for_update().filter(pk=checked.pk).first()
    if locked is None or not locked.ingest_token_hash or locked.ingest_token_hash != checked.ingest_token_hash:
        raise Forbidden("This token is not valid for this run's current attempt.")
    return locked


# ---- parsing -------------------------------------------------------------------------------------
# The common batch goes straight to the pydantic models; anything they refuse, and any body with a
# \u escape (the only way to spell a NUL or a lone surrogate in JSON), goes through parse_body,
# which answers with the error shape of the whole API.


def parse_batch(request: HttpRequest) -> IngestBatchIn:
    body = json_body(request)
    if body and b"\\u" not in body:
        try:
            raw = loads_json(body)
            if isinstance(raw, dict):
                # Metrics and logs are flat; only the free-form parts can be nested too deeply.
                free = {"progress": raw.get("progress"), "rollouts": raw.get("rollouts"), "error": raw.get("error")}
                if unstorable(free) is None:
                    return IngestBatchIn.model_validate(raw)
        except (ValueError, RecursionError, PydanticValidationError):
            pass
    return parse_body(request, IngestBatchIn)


def refuse_foreign_checkpoints(run: TrainingRun, batch: IngestBatchIn) -> None:
    """A 400 (nothing of the batch stored, as for any bad item) for a checkpoint this attempt's engine
    cannot have saved. Studio commits, merges and resumes from the folders an engine reports, and an
    engine runs code its project controls: a path elsewhere on this machine (/etc, another run's
    output) or a "merged" model of a step that was never trained to its end must not be listed."""
    backend = get_backend(run.backend_name)
    findings = []
    adapters = {c.step for c in batch.checkpoints if c.kind == "adapter"}
    for i, reported in enumerate(batch.checkpoints):
        problem = backend.reported_path_problem(run.pk, run.attempt, reported.path) if backend is not None else None
        if problem:
            findings.append(Finding(f"checkpoints[{i}].path", problem))
        # The engine merges its adapter into the base at the end of a LoRA run, after reporting the
        # adapter; a Merge asked for in the Studio records its own. (A run that ended other than
        # completed records neither: apply_batch logs them instead.)
        if reported.kind == "merged" and not ended_early(run) and reported.step not in adapters and not Checkpoint.objects.filter(
                run=run, attempt=run.attempt, step=reported.step, kind="adapter").exists():
            findings.append(Finding(f"checkpoints[{i}].kind", f"a merged model comes at the end of a LoRA run, after its adapter, and step {reported.step} "
                                                              "has no adapter: report the adapter of that step first, or report this folder as kind checkpoint"))
    if findings:
        raise BadRequest("This batch reports a checkpoint this attempt's engine cannot have saved: nothing of the batch was stored.", findings)


def ended_early(run: TrainingRun) -> bool:
    """Whether the run ended without completing: its end-of-training checkpoints are not recorded."""
    return run.status in TERMINAL_STATUSES and run.status != Status.COMPLETED


def insert_metric_points(run_id: int, rows: list[tuple[int, str, float]]) -> None:
    """PostgreSQL: one COPY (~10× an INSERT of model instances); elsewhere insert_rows."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor, cursor.copy(f"COPY {MetricPoint._meta.db_table} (run_id, step, key, value) FROM STDIN") as copy:
            for step, key, value in rows:
                copy.write_row((run_id, step, key, value))
        return
    insert_rows(MetricPoint, ("run", "step", "key", "value"), [(run_id, step, key, value) for step, key, value in rows])


def insert_rows(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> None:
    """One executemany of plain values. bulk_create spends ~0.3 ms of Python a row building model
    instances and SQL (a batch of 600 points and 100 lines: ~200 ms, seconds when the process's
    other threads want the CPU too), and on SQLite all of it is spent holding the database's one
    write lock, which every other writer of every process waits for."""
    if not rows:
        return
    quote = connection.ops.quote_name
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", rows)


def apply_batch(run: TrainingRun, batch: IngestBatchIn) -> None:
    """Call inside the transaction that recorded the batch id, so a batch lands whole or not at all."""
    attempt, ended = run.attempt, run.status in TERMINAL_STATUSES
    insert_metric_points(run.pk, [(m.step, m.key, m.value) for m in batch.metrics])
    lines = [clip_log_line(line) for line in batch.logs]
    recorded = set(Checkpoint.objects.filter(run=run, attempt=attempt, requested=False).values_list("step", "kind"))  # a Merge asked for is not the engine's own
    for reported in batch.checkpoints:
        if ended_early(run) and reported.kind in END_OF_TRAINING_KINDS:
            lines.append(f"[studio] the {reported.kind} checkpoint (step {reported.step}) reported after the run was {run.status} is not recorded")
            continue
        if (reported.step, reported.kind) in recorded:  # reported again in a later batch (a reporter's resend under a new batch id)
            continue
        recorded.add((reported.step, reported.kind))
        record_checkpoint(run, Checkpoint.objects.create(run=run, attempt=attempt, **reported.model_dump()))
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    insert_rows(LogLine, ("run", "attempt", "line", "created_at"), [(run.pk, attempt, line, now) for line in lines])
    Rollout.objects.bulk_create([Rollout(run=run, **r.model_dump()) for r in batch.rollouts], batch_size=1000)
    changes = {"last_heartbeat_at": timezone.now()}
    if batch.stage is not None and not ended:  # a run that ended keeps the stage it ended with
        changes["stage"] = batch.stage
    if batch.progress is not None and not ended and not behind(batch.progress, run.progress):
        changes["progress"] = batch.progress
    elif batch.progress is not None and ended and (step := step_trained_after_end(run, batch.progress)) is not None:
        changes["progress"] = {**run.progress, "step": step}
    TrainingRun.objects.filter(pk=run.pk).update(**changes)
    if batch.system_prompt is not None:
        RunAttempt.objects.filter(run=run, attempt=attempt).update(system_prompt=batch.system_prompt)
    if batch.status:
        apply_reported_status(run, batch)


def step_trained_after_end(run: TrainingRun, progress: dict) -> int | None:
    """The step a run that ended (a STOP, say) reached in its engine's last flush, when it is past the
    step it ended with: the engine trains on until its SIGTERM lands, and the steps it reports are
    stored, so its progress says so too rather than stop short of its charts. Only as far as its
    metrics go and never past its max_steps: a token kept after the end moves nothing else (the
    stage and speed it ended with stay), nor the step beyond what it trained. None: no move."""
    step, current = progress.get("step"), run.progress or {}
    if not isinstance(step, int | float) or not isinstance(current.get("step"), int | float):
        return None
    limit = current.get("max_steps")
    trained = MetricPoint.objects.filter(run=run).aggregate(last=Max("step"))["last"]
    reached = min(int(step), trained if trained is not None else 0, int(limit) if isinstance(limit, int | float) else int(step))
    return reached if reached > current["step"] else None


def behind(progress: dict, current: dict) -> bool:
    """Whether `progress` is of an earlier step than the run's `current` one: batches can land out of
    order (a retried one after a newer one), and the progress bar must not go back."""
    step, now = progress.get("step"), (current or {}).get("step")
    return isinstance(step, (int, float)) and isinstance(now, (int, float)) and step < now


def apply_reported_status(run: TrainingRun, batch: IngestBatchIn) -> None:
    reported_status = batch.status
    assert reported_status is not None  # apply_batch calls this only for a batch that reports a status
    target = {"running": Status.RUNNING, "completed": Status.COMPLETED, "failed": Status.FAILED}[reported_status]
    error = None
    if target == Status.FAILED:
        reported = batch.error
        code = reported.code if reported and reported.code in ErrorCode.values else ErrorCode.TRAINING_ERROR
        error = {"code": code, "message": reported.message if reported else "the engine reported a failure", "log_tail": (reported.log_tail if reported else [])[-200:]}
    current = TrainingRun.objects.get(pk=run.pk).status
    if current == target:
        return
    try:
        if target == Status.COMPLETED and current == Status.PROVISIONING:
            # The engine trained to the end, but its "running" report never landed (an engine image
            # older than the reporter's sealed status batches could overwrite it): take the step it
            # skipped rather than lose the result.
            status_service.transition(run.pk, Status.RUNNING, attempt=run.attempt)
        status_service.transition(run.pk, target, attempt=run.attempt, error=error)
    except status_service.IllegalTransition as exc:
        # e.g. "completed" from an engine that was already stopped: the user's STOP wins.
        log.info("run %s: ignoring reported status: %s", run.pk, exc)
