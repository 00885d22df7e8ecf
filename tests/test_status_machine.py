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
