"""The contract's status machine: legal moves apply with their timestamps; illegal ones are refused."""
from __future__ import annotations

import itertools

import pytest

from tests.conftest import sft_body
from training.models import LogLine, Status, TrainingRun
from training.status import ALLOWED, IllegalTransition, transition

LEGAL = {
    ("queued", "provisioning"),
    ("provisioning", "running"), ("provisioning", "failed"), ("provisioning", "cancelled"),
    ("running", "completed"), ("running", "failed"), ("running", "cancelled"), ("running", "provisioning"),
    ("failed", "queued"), ("cancelled", "queued"),
}
ALL_PAIRS = list(itertools.product(Status.values, Status.values))


@pytest.fixture
def run(api):
    return TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body()).json()["id"])


def test_the_table_is_the_contract():
    assert {(a, b) for a, targets in ALLOWED.items() for b in targets} == LEGAL


@pytest.mark.parametrize(("source", "target"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_transition_is_refused_and_changes_nothing(run, source, target):
    TrainingRun.objects.filter(pk=run.pk).update(status=source)
    with pytest.raises(IllegalTransition):
        transition(run.pk, target)
    assert TrainingRun.objects.get(pk=run.pk).status == source
    assert not LogLine.objects.filter(run=run).exists()


@pytest.mark.parametrize(("source", "target"), sorted(LEGAL))
def test_legal_transition_applies(run, source, target):
    TrainingRun.objects.filter(pk=run.pk).update(status=source)
    moved = transition(run.pk, target, error={"code": "oom", "message": "m", "log_tail": []} if target == "failed" else None)
    assert moved.status == target == TrainingRun.objects.get(pk=run.pk).status
    if target == "running":
        assert moved.started_at is not None
    if target in ("completed", "failed", "cancelled"):
        assert moved.finished_at is not None
    if target == "failed":
        assert moved.error["code"] == "oom"
    if target == "queued":
        assert moved.error is None and moved.finished_at is None


def test_a_report_from_an_older_attempt_changes_nothing(run):
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=3)
    assert transition(run.pk, Status.COMPLETED, attempt=2) is None
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING


def test_stop_before_a_worker_claims_the_start_withdraws_it_and_the_run_stays_queued(api, run, users):
    from django.test import Client
    from django.utils import timezone

    from training import services

    # START was asked for, but no worker has picked it up (they are busy or down): the page says
    # "starting…" and offers STOP, which withdraws the request instead of answering 409.
    TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=timezone.now())
    client = Client()
    client.force_login(users["owner"])
    page = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert "starting…" in page and 'id="stop-btn"' in page and "Withdraw the START" in page
    r = api.post(f"/api/training-runs/{run.pk}/stop")
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "queued"
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.start_requested_at is None and run.attempt == 0
    assert LogLine.objects.filter(run=run, line__contains="START withdrawn").exists()
    # The worker that comes late finds nothing to claim; the run can be started again later.
    assert services.dispatch(run.pk) is False
    assert TrainingRun.objects.get(pk=run.pk).status == Status.QUEUED
    page = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert 'id="stop-btn"' not in page and 'id="start-btn"' in page
    # A queued run that was never started has nothing to stop.
    assert api.post(f"/api/training-runs/{run.pk}/stop").status_code == 409
