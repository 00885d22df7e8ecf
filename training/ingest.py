"""POST /api/ingest/runs/{id}: what the engine reports, authenticated by the attempt's own token.

A batch id seen twice is applied once. The token is valid for one attempt: an engine left over
from before a restart gets 403 and writes nothing.
"""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja import Router

from datahub.services import record_checkpoint
from studio import crypto
from studio.api import body_schema, parse_body
from studio.errors import Forbidden, Unauthorized
from training import status as status_service
from training.models import Checkpoint, ErrorCode, IngestBatch, LogLine, MetricPoint, Rollout, Status, TrainingRun
from training.schemas import IngestBatchIn, IngestOut

log = logging.getLogger(__name__)
router = Router(tags=["ingest"], auth=None)


def run_for_token(request: HttpRequest, run_id: int) -> TrainingRun:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Send this attempt's ingest token as Authorization: Bearer <token>.")
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or not run.ingest_token_hash or not crypto.same_hash(run.ingest_token_hash, crypto.hash_token(token.strip())):
        raise Forbidden("This token is not valid for this run's current attempt.")
    return run


@router.post("/runs/{int:run_id}", response=IngestOut, openapi_extra=body_schema(IngestBatchIn))
def ingest(request: HttpRequest, run_id: int):
    run = run_for_token(request, run_id)
    batch = parse_body(request, IngestBatchIn)
    try:
        with transaction.atomic():
            IngestBatch.objects.create(run=run, batch_id=batch.batch_id)
            apply_batch(run, batch)
    except IntegrityError:
        return {"ok": True, "duplicate": True}
    return {"ok": True, "duplicate": False}


def apply_batch(run: TrainingRun, batch: IngestBatchIn) -> None:
    """Call inside the transaction that recorded the batch id, so a batch lands whole or not at all."""
    attempt = run.attempt
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=m.step, key=m.key, value=m.value) for m in batch.metrics], batch_size=5000)
    LogLine.objects.bulk_create([LogLine(run=run, attempt=attempt, line=line) for line in batch.logs], batch_size=5000)
    Rollout.objects.bulk_create([Rollout(run=run, **r.model_dump()) for r in batch.rollouts], batch_size=1000)
    for reported in batch.checkpoints:
        record_checkpoint(run, Checkpoint.objects.create(run=run, attempt=attempt, **reported.model_dump()))
    changes = {"last_heartbeat_at": timezone.now()}
    if batch.stage is not None:
        changes["stage"] = batch.stage
    if batch.progress is not None:
        changes["progress"] = batch.progress
    TrainingRun.objects.filter(pk=run.pk).update(**changes)
    if batch.status:
        apply_reported_status(run, batch)


def apply_reported_status(run: TrainingRun, batch: IngestBatchIn) -> None:
    target = {"running": Status.RUNNING, "completed": Status.COMPLETED, "failed": Status.FAILED}[batch.status]
    error = None
    if target == Status.FAILED:
        reported = batch.error
        code = reported.code if reported and reported.code in ErrorCode.values else ErrorCode.TRAINING_ERROR
        error = {"code": code, "message": reported.message if reported else "the engine reported a failure", "log_tail": (reported.log_tail if reported else [])[-200:]}
    current = TrainingRun.objects.get(pk=run.pk).status
    if current == target:
        return
    try:
        status_service.transition(run.pk, target, attempt=run.attempt, error=error)
    except status_service.IllegalTransition as exc:
        # e.g. "completed" from an engine that was already stopped: the user's STOP wins.
        log.info("run %s: ignoring reported status: %s", run.pk, exc)
