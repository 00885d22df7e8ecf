"""The task queue (Redis, Celery's broker) unreachable from the web server: START and STOP are committed
before their task is sent, so they answer what happened (202/200 with a notice) instead of a 500, and the
reconciler sends them once the queue is back. A START no worker picks up says so after 30 s.

The broker is really unreachable here: the Celery app is pointed at a port where nothing listens."""
from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from studio.celery import app
from tests.conftest import sft_body
from training import reconciler, services
from training.models import Checkpoint, Generation, RunAttempt, Status, TrainingRun
from training.tasks import reconcile_runs

# Transactional: the task is sent as START's or STOP's own transaction commits, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

NOWHERE = "redis://127.0.0.1:6399/0"


def point_broker_at(url: str) -> None:
    """Send the app's next tasks to `url`: its connection and producer pools are made again from it."""
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def broker_down():
    kept = app.conf.broker_url
    point_broker_at(NOWHERE)
    try:
        yield
    finally:
        point_broker_at(kept)


def queued_tasks() -> list[tuple[str, list]]:
    """(name, args) of the tasks waiting on the main queue."""
    raw = redis.Redis.from_url(settings.CELERY_BROKER_URL).lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1)
    messages = [json.loads(m) for m in raw]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages]


@pytest.fixture
def clean_queue():
    app.control.purge()
    yield
    app.control.purge()


@pytest.fixture
def provisioning(api):
    """A run a worker claimed for attempt 1 (as dispatch records it)."""
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, provisioning_since=timezone.now())
    run = TrainingRun.objects.get(pk=run_id)
    services.record_attempt(run)
    return run


def test_start_with_the_queue_unreachable_is_a_202_that_says_it_is_recorded_and_the_reconciler_dispatches_it(
        api, broker_down):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    started = api.post(f"/api/training-runs/{run_id}/start")
    assert started.status_code == 202, started.content
    assert started.json()["notice"].startswith("START is recorded, but the task queue (Redis) cannot be reached")
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.QUEUED and run.start_requested_at is not None
    # What sends it again: the reconciler's pass dispatches a START no worker claimed.
    TrainingRun.objects.filter(pk=run_id).update(start_requested_at=timezone.now() - timedelta(seconds=settings.STUDIO_REDISPATCH_AFTER_SECONDS + 1))
    assert run_id in reconciler.runs_to_redispatch()


def test_stop_with_the_queue_unreachable_cancels_says_so_and_the_reconciler_sends_the_backend_stop_later(
        api, provisioning, clean_queue):
    kept = app.conf.broker_url
    point_broker_at(NOWHERE)
    try:
        stopped = api.post(f"/api/training-runs/{provisioning.pk}/stop")
    finally:
        point_broker_at(kept)
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["status"] == "cancelled"
    assert stopped.json()["notice"].startswith("The run is cancelled, but the task queue (Redis) cannot be reached")
    attempt = RunAttempt.objects.get(run=provisioning, attempt=1)
    assert attempt.unsent_stop_job == "" and attempt.stop_requested_at is not None
    assert queued_tasks() == []

    # The queue is back: the reconciler's pass sends the stop once.
    reconcile_runs()
    assert queued_tasks() == [("training.tasks.stop_backend_job", [provisioning.pk, 1, ""])]
    assert RunAttempt.objects.get(pk=attempt.pk).unsent_stop_job is None
    reconcile_runs()
    assert len(queued_tasks()) == 1


def test_a_stop_sent_as_usual_leaves_nothing_for_the_reconciler(api, provisioning, clean_queue):
    stopped = api.post(f"/api/training-runs/{provisioning.pk}/stop")
    assert stopped.status_code == 200 and stopped.json()["notice"] == ""
    assert RunAttempt.objects.get(run=provisioning, attempt=1).unsent_stop_job is None
    assert queued_tasks() == [("training.tasks.stop_backend_job", [provisioning.pk, 1, ""])]


def test_the_start_button_with_the_queue_unreachable_shows_the_notice(users, project, api, broker_down):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    client = Client()
    client.force_login(users["owner"])
    page = client.post(f"/training/runs/{run_id}/start", follow=True)
    assert page.status_code == 200
    assert "START is recorded, but the task queue (Redis) cannot be reached" in page.content.decode()
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is not None


def test_the_stop_button_with_the_queue_unreachable_shows_the_notice_in_the_status_area(users, provisioning, broker_down):
    client = Client()
    client.force_login(users["owner"])
    area = client.post(f"/training/runs/{provisioning.pk}/stop", HTTP_HX_REQUEST="true")
    assert area.status_code == 200
    assert "The run is cancelled, but the task queue (Redis) cannot be reached" in area.content.decode()
    assert TrainingRun.objects.get(pk=provisioning.pk).status == Status.CANCELLED


def test_a_start_no_worker_picked_up_for_over_30_s_asks_whether_the_worker_runs(api, users):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(start_requested_at=timezone.now() - timedelta(seconds=5))
    assert api.get(f"/api/training-runs/{run_id}").json()["notice"] == ""
    TrainingRun.objects.filter(pk=run_id).update(start_requested_at=timezone.now() - timedelta(seconds=125))
    notice = api.get(f"/api/training-runs/{run_id}").json()["notice"]
    assert notice.startswith("No worker has picked this run up for 12") and "is the Studio's worker running? (make studio starts it" in notice
    client = Client()
    client.force_login(users["owner"])
    assert "No worker has picked this run up for 12" in client.get(f"/training/runs/{run_id}/").content.decode()
    # Claimed, it waits on nothing.
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, start_requested_at=None)
    assert api.get(f"/api/training-runs/{run_id}").json()["notice"] == ""


def test_an_ask_with_the_queue_unreachable_fails_at_once_saying_to_ask_again(api, project, users, settings, tmp_path, broker_down):
    # Nothing sends an ask again: left queued it would say "Waiting for a worker…" for 30 minutes.
    from tests.test_answers_queue import ASK, some_weights, weights_run

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = weights_run(project, users["owner"], settings.STUDIO_RUNS_DIR, some_weights(tmp_path / "model"))
    asked = api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "max_new_tokens": 8})
    assert asked.status_code == 202, asked.content
    assert asked.json()["status"] == "failed" and "the task queue (Redis) could not be reached" in asked.json()["error"]
    assert Generation.objects.get(pk=asked.json()["id"]).status == Generation.State.FAILED


def test_a_merge_with_the_queue_unreachable_is_not_marked_merging_and_says_to_press_merge_again(api, broker_down):
    run_id = api.post("/api/training-runs", sft_body(config={"lora_rank": 8})).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED, attempt=1)
    run = TrainingRun.objects.get(pk=run_id)
    services.record_attempt(run)
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=2, kind="checkpoint", path="/nowhere/step-2")
    merged = api.post(f"/api/training-runs/{run_id}/checkpoints/2/merge")
    assert merged.status_code == 202, merged.content
    assert merged.json()["queued"] is False and merged.json()["notice"].startswith("The task queue (Redis) cannot be reached, so the merge was not started")
    assert Checkpoint.objects.get(pk=checkpoint.pk).merge_requested_at is None  # the tab shows no Merging…, and Merge can be pressed again
