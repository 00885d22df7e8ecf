"""GET .../attempts says how each attempt ended: ended_at, outcome and a failed one's error_code,
recorded where the run ends (the engine's status report through ingest, STOP, the reconciler's spot
retry), and backfilled by migration 0018 for the attempt each ended run ended with."""

from __future__ import annotations

import importlib
import json

import pytest
from django.apps import apps
from django.test import Client
from django.utils import timezone

from studio import crypto
from tests.conftest import sft_body
from training import reconciler, services
from training.backends.base import PollResult
from training.models import ErrorCode, RunAttempt, Status, TrainingRun
from training.status import transition

pytestmark = pytest.mark.django_db


def claim(run_id: int, attempt: int) -> str:
    """Claim `attempt` of the run as dispatch does (recorded, with its ingest token); the token."""
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=attempt, interruptions=0, ingest_token_hash=crypto.hash_token(token))
    services.record_attempt(TrainingRun.objects.get(pk=run_id))
    return token


@pytest.fixture
def claimed(api):
    """A run a worker claimed for attempt 1, and the token its engine reports with."""
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    return TrainingRun.objects.get(pk=run_id), claim(run_id, 1)


def report(run, token: str, batch_id: str, **body):
    r = Client().post(
        f"/api/ingest/runs/{run.pk}", data=json.dumps({"batch_id": batch_id, **body}), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert r.status_code == 200, r.content


def ended(api, run) -> list[tuple]:
    return [(a["attempt"], a["outcome"], a["error_code"], a["ended_at"] is not None) for a in api.get(f"/api/training-runs/{run.pk}/attempts").json()]


def test_an_attempt_the_engine_reports_completed_ends_completed_when_the_run_does(api, claimed):
    run, token = claimed
    report(run, token, "b1", status="running")
    assert ended(api, run) == [(1, None, None, False)]  # still going
    report(run, token, "b2", status="completed")
    run.refresh_from_db()
    [attempt] = api.get(f"/api/training-runs/{run.pk}/attempts").json()
    assert (attempt["outcome"], attempt["error_code"]) == ("completed", None)
    assert attempt["ended_at"] == api.get(f"/api/training-runs/{run.pk}").json()["finished_at"]
    assert RunAttempt.objects.get(run=run, attempt=1).ended_at == run.finished_at


def test_a_failed_attempt_keeps_its_error_code_after_the_run_is_started_again(api, claimed):
    run, token = claimed
    report(run, token, "b1", status="running")
    report(run, token, "b2", status="failed", error={"code": "oom", "message": "CUDA out of memory"})
    assert ended(api, run) == [(1, "failed", "oom", True)]
    # START again: a new attempt, still going; the first one keeps how it ended.
    assert api.post(f"/api/training-runs/{run.pk}/start").status_code == 202
    token = claim(run.pk, 2)
    report(run, token, "c1", status="running")
    assert ended(api, run) == [(1, "failed", "oom", True), (2, None, None, False)]


def test_an_unknown_reported_error_code_is_recorded_as_the_run_records_it(api, claimed):
    run, token = claimed
    report(run, token, "b1", status="running")
    report(run, token, "b2", status="failed", error={"code": "segfault"})
    assert TrainingRun.objects.get(pk=run.pk).error["code"] == "training_error"
    assert ended(api, run) == [(1, "failed", "training_error", True)]


@pytest.mark.parametrize("running", [True, False])
def test_a_stopped_attempt_ends_cancelled(api, claimed, running):
    run, token = claimed
    if running:
        report(run, token, "b1", status="running")
    assert api.post(f"/api/training-runs/{run.pk}/stop").status_code == 200
    assert ended(api, run) == [(1, "cancelled", None, True)]
    # the engine's late "completed" is ignored (the STOP wins), and so the attempt's outcome stays
    report(run, token, "b2", status="completed")
    assert ended(api, run) == [(1, "cancelled", None, True)]


def test_an_interruption_past_the_retry_budget_fails_the_attempt_with_the_backends_code(api, claimed):
    # A local run has no connection, so no retries: the reconciler fails it. (A retried interruption ends
    # its attempt "interrupted": tests/backends/test_dstack.py, against a real dstack server.)
    run, _ = claimed
    transition(run.pk, Status.RUNNING, attempt=1)
    reconciler.apply_poll(TrainingRun.objects.get(pk=run.pk), PollResult("interrupted", ErrorCode.CAPACITY_UNAVAILABLE, "the machine was taken away"))
    assert TrainingRun.objects.get(pk=run.pk).status == Status.FAILED
    assert ended(api, run) == [(1, "failed", "CAPACITY_UNAVAILABLE", True)]


def test_migration_0018_backfills_the_attempt_an_ended_run_ended_with(api):
    migration = importlib.import_module("training.migrations.0018_attempt_outcome")
    runs = {}
    for status, error in ((Status.COMPLETED, None), (Status.FAILED, {"code": "oom"}), (Status.CANCELLED, None), (Status.RUNNING, None)):
        run_id = api.post("/api/training-runs", sft_body(name=f"run {status}")).json()["id"]
        TrainingRun.objects.filter(pk=run_id).update(attempt=2)
        run = TrainingRun.objects.get(pk=run_id)
        for attempt in (1, 2):
            RunAttempt.objects.create(run=run, attempt=attempt)
        TrainingRun.objects.filter(pk=run_id).update(status=status, error=error, finished_at=timezone.now() if status != Status.RUNNING else None)
        runs[status] = TrainingRun.objects.get(pk=run_id)
    migration.backfill_outcome(apps, None)
    for status, run in runs.items():
        got = list(RunAttempt.objects.filter(run=run).values_list("attempt", "outcome", "error_code", "ended_at"))
        last = (2, None, "", None) if status == Status.RUNNING else (2, status, "oom" if status == Status.FAILED else "", run.finished_at)
        assert got == [(1, None, "", None), last], status  # the earlier attempt: not known
