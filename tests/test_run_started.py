"""When a run starts and what it shows meanwhile: running as soon as its engine starts the run's work
(not after the first step), started_at the same moment on the run and on its attempt, the Duration
counted from it, and no ETA from before a retry or after the run ended."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from studio import crypto
from studio.templatetags.studio_ui import duration, run_duration
from tests.conftest import sft_body
from training import services
from training.backends.local import output_dir
from training.models import LogLine, RunAttempt, Status, TrainingRun
from training.status import transition

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(api):
    """A run a worker claimed for attempt 1 (recorded as dispatch records it), with its ingest token."""
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, ingest_token_hash=crypto.hash_token(token),
                                                 provisioning_since=timezone.now())
    run = TrainingRun.objects.get(pk=run_id)
    services.record_attempt(run)
    return run, token


def line_id(run, prefix: str) -> int:
    return LogLine.objects.filter(run=run, line__startswith=prefix).order_by("id").values_list("id", flat=True)[0]


def test_a_tiny_engine_run_is_running_before_its_first_step_ends_and_started_at_is_its_attempts(
        transactional_db, live_server, settings, tmp_path, api, claimed, tiny_models):
    # A GRPO run whose first step took 45 s stayed "provisioning · stage: train" all that time, runs
    # of 15-45 s showed "Duration 0s", and the API gave the attempt a start a minute before the run's.
    from tests.engine.conftest import make_spec, run_inprocess

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run, token = claimed
    spec = make_spec("sft", tiny_models["student"], [tiny_models["data_sft"]], output_dir(run.pk, 1), {"max_steps": 3, "max_length": 32}, run_id=run.pk)
    spec["ingest"] = {"url": f"{live_server.url}/api/ingest/runs/{run.pk}", "token": token}
    assert run_inprocess(spec) == 0

    run.refresh_from_db()
    assert run.status == Status.COMPLETED, list(LogLine.objects.filter(run=run).values_list("line", flat=True))[-20:]
    # Running as the engine started, before its model was loaded and before step 1 trained.
    assert line_id(run, "[studio] status → running") < line_id(run, "stage: train") < line_id(run, "step 1:")
    step_1 = LogLine.objects.filter(run=run, line__startswith="step 1:").values_list("created_at", flat=True)[0]
    attempt = RunAttempt.objects.get(run=run, attempt=1)
    assert attempt.claimed_at <= run.started_at == attempt.started_at < step_1
    # The API says the same start for the run and its attempt.
    api_run = api.get(f"/api/training-runs/{run.pk}").json()
    [api_attempt] = api.get(f"/api/training-runs/{run.pk}/attempts").json()
    assert api_run["started_at"] == api_attempt["started_at"] and api_attempt["claimed_at"] <= api_attempt["started_at"]
    # The Duration covers the model load and every step, not the time after the first one.
    assert run_duration(run) == duration(run.finished_at - attempt.started_at)
    assert "eta_s" not in api_run["progress"] and api_run["progress"]["step"] == 3


def test_a_spot_retry_starts_its_attempt_anew_and_the_run_keeps_its_start(claimed):
    run, _ = claimed
    first = transition(run.pk, Status.RUNNING, attempt=1)
    TrainingRun.objects.filter(pk=run.pk).update(stage="train", progress={"step": 2, "max_steps": 3, "step_time_s": 0.73, "eta_s": 0.73})
    # The reconciler's retry after an interruption: back to provisioning, then a new attempt is claimed.
    retried = transition(run.pk, Status.PROVISIONING, note="dstack lost the machine")
    assert retried.stage == "" and retried.progress == {}  # no ETA of the lost attempt while the next one starts
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2)
    services.record_attempt(TrainingRun.objects.get(pk=run.pk))
    assert RunAttempt.objects.get(run=run, attempt=2).started_at is None  # provisioning: not started yet
    second = transition(run.pk, Status.RUNNING, attempt=2)
    starts = dict(RunAttempt.objects.filter(run=run).values_list("attempt", "started_at"))
    assert second.started_at == first.started_at == starts[1] < starts[2]


@pytest.mark.parametrize("end", [Status.CANCELLED, Status.COMPLETED, Status.FAILED])
def test_a_run_that_ended_has_no_eta(api, claimed, end):
    # A cancelled run's API progress kept "eta_s": 53.91.
    run, _ = claimed
    transition(run.pk, Status.RUNNING, attempt=1)
    progress = {"step": 30, "max_steps": 100, "step_time_s": 0.77, "eta_s": 53.91}
    TrainingRun.objects.filter(pk=run.pk).update(progress=progress)
    if end == Status.CANCELLED:
        assert api.post(f"/api/training-runs/{run.pk}/stop").status_code == 200
    else:
        transition(run.pk, end, attempt=1)
    shown = api.get(f"/api/training-runs/{run.pk}").json()
    assert shown["status"] == end and shown["progress"] == {"step": 30, "max_steps": 100, "step_time_s": 0.77}


def test_the_duration_counts_from_the_start_or_for_a_run_that_never_ran_from_its_claim(claimed):
    run, _ = claimed
    claim = timezone.now() - timedelta(minutes=10)
    # Completed: from the moment it went running (45 s after its claim) to its end.
    run.provisioning_since, run.started_at, run.finished_at = claim, claim + timedelta(seconds=45), claim + timedelta(seconds=75)
    assert run_duration(run) == "30s"
    # Stopped while it waited for a CPU slot: it never ran, so from the claim to the stop.
    run.started_at, run.finished_at = None, claim + timedelta(seconds=20)
    assert run_duration(run) == "20s"
    # Still provisioning: nothing has run yet.
    run.finished_at = None
    assert run_duration(run) == "—"
