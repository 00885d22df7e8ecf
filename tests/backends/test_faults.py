"""Faults: a worker killed between claim and submit, Redis restarted mid-run, the dstack server down.
Real Celery workers, a real dstack server, our own redis-server; state lives in the database."""
from __future__ import annotations

import time

import pytest

from studio.celery import app
from tests.backends.conftest import DstackServer, make_dstack_connection
from tests.backends.test_dstack import dstack_body, server_run, studio_runs_on_server
from tests.conftest import free_port, wait_for
from training import reconciler, services
from training.backends.connections import job_name
from training.models import Status, TrainingRun
from training.tasks import reconcile_runs

pytestmark = pytest.mark.worker


def start_run(api) -> int:
    run_id = api.post("/api/training-runs", dstack_body()).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    return run_id


def beat(broker_url: str | None = None) -> None:
    """What celery beat does every RECONCILE_INTERVAL_SECONDS: enqueue reconcile_runs."""
    if broker_url is None:
        reconcile_runs.delay()
        return
    with app.connection_for_write(broker_url) as connection:
        reconcile_runs.apply_async(connection=connection)


def test_a_worker_killed_between_claim_and_submit_leaves_exactly_one_dstack_job(api, project, dstack_server, dstack_api, worker_factory, blackhole):
    # The dstack server "hangs" (a socket that never answers): the worker claims the run, then blocks in submit.
    conn = make_dstack_connection(project, dstack_server, retry_window_seconds=600, request_timeout_seconds=300)
    run_id = start_run(api)  # START checks the server (reachable); its dispatch task waits in the queue
    conn.server_url = blackhole.url
    conn.save()
    first = worker_factory("first", STUDIO_SUBMIT_LEASE_SECONDS="2")
    wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status=Status.PROVISIONING).exists() and blackhole.accepted, 30,
             message="the worker to claim the run and start submitting")
    first.kill()
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.PROVISIONING and run.backend_job_id == "" and run.attempt == 1

    conn.server_url = dstack_server.url  # the server answers again
    conn.save()
    worker_factory("second", STUDIO_SUBMIT_LEASE_SECONDS="2")
    time.sleep(2.5)  # the dead worker's submit lease runs out
    beat()
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id).exclude(backend_job_id="").first(), 60, message="the resubmission")
    for _ in range(3):  # more beats, and the same dispatch task delivered again, change nothing
        beat()
        app.send_task("training.tasks.dispatch_run", args=(run_id,))
    time.sleep(3)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.attempt == 1 and run.backend_job_id == job_name(run_id, 1)
    assert studio_runs_on_server(dstack_api, run_id) == [run.backend_job_id]
    services.stop_backend_job(run_id, 1, run.backend_job_id)


def test_a_redis_restart_mid_run_loses_and_duplicates_nothing(api, project, dstack_server, dstack_api, worker_factory, own_redis):
    make_dstack_connection(project, dstack_server, retry_window_seconds=600)
    worker = worker_factory("redis", REDIS_URL=own_redis.url, STUDIO_REDISPATCH_AFTER_SECONDS="1")
    # START's own dispatch message goes to the machine's broker, which no worker of ours reads: a
    # lost message. The reconciler (beat → our Redis) dispatches the run anyway.
    first = start_run(api)
    time.sleep(1.5)
    beat(own_redis.url)
    wait_for(lambda: TrainingRun.objects.filter(pk=first).exclude(backend_job_id="").exists(), 60, message="the first run's submit")

    own_redis.kill()  # everything in Redis is gone: queued tasks, unacked ones
    second = start_run(api)  # started while the broker is down
    own_redis.start()
    time.sleep(1.5)

    def reconciled():
        beat(own_redis.url)
        return TrainingRun.objects.filter(pk=second).exclude(backend_job_id="").exists()

    # Up to three minutes: the worker's reconnect back-off, then a submit to the suite's shared dstack
    # server, which is slow late in a full run. (This wait ran out twice in full runs: the worker had
    # stopped on kombu's double close, which the test below pins; studio/celery.py BrokerConnection.)
    try:
        wait_for(reconciled, 180, interval=3, message="the worker to reconnect and dispatch the second run")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- the worker's log ---\n{worker.log()[-6000:]}") from None
    for _ in range(3):
        beat(own_redis.url)
    time.sleep(3)
    for run_id in (first, second):
        run = TrainingRun.objects.get(pk=run_id)
        assert run.status == Status.PROVISIONING and run.attempt == 1, (run_id, run.status, run.attempt)
        assert studio_runs_on_server(dstack_api, run_id) == [job_name(run_id, 1)]
        services.stop_backend_job(run_id, 1, run.backend_job_id)


def test_a_redis_restart_while_a_task_holds_its_message_does_not_kill_the_worker(api, project, dstack_server, worker_factory, own_redis, blackhole):
    """acks_late: a running task's message is unacked. When Redis goes away under it, kombu's redis
    transport closed the consumer's connection twice and the second close, restoring that message
    through a transport already let go, raised AttributeError: "Unrecoverable error", the worker
    exited (found as a flaky timeout of the test above). The worker must reconnect and work on."""
    conn = make_dstack_connection(project, dstack_server, retry_window_seconds=600, request_timeout_seconds=300)
    run_id = start_run(api)
    conn.server_url = blackhole.url  # the submit hangs: the dispatch task runs on, holding its message
    conn.save()
    worker = worker_factory("redis-held", REDIS_URL=own_redis.url, STUDIO_REDISPATCH_AFTER_SECONDS="1")
    time.sleep(1.5)
    beat(own_redis.url)
    wait_for(lambda: blackhole.accepted and TrainingRun.objects.filter(pk=run_id, status=Status.PROVISIONING).exists(), 60,
             message="the dispatch task to hang in its submit")

    own_redis.kill()
    own_redis.start()
    wait_for(lambda: "Connection to broker lost" in worker.log() or worker.proc.poll() is not None, 60, message="the worker to notice")
    done = worker.log().count("reconcile_runs[")

    def works_on() -> bool:
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.log()[-4000:]}"
        beat(own_redis.url)
        return worker.log().count("reconcile_runs[") > done

    try:
        wait_for(works_on, 90, interval=2, message="the worker to reconnect and run a task")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- the worker's log ---\n{worker.log()[-8000:]}") from None
    worker.kill()  # its dispatch thread still hangs on the black hole: a warm shutdown would wait for it


@pytest.fixture
def second_dstack_server(tmp_path):
    """A dstack server of this test's own, so it can be stopped and started again."""
    from tests.backends.conftest import DSTACK_VENV

    if not (DSTACK_VENV / "bin" / "dstack").exists():
        pytest.skip(f"the dstack server's virtualenv is missing ({DSTACK_VENV}): create it with `bash .ci/dstack.sh`")
    port = free_port()
    server = DstackServer(url=f"http://127.0.0.1:{port}", token="studio-tests-admin-token", project="main", port=port,
                          home=tmp_path, log_path=tmp_path / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.mark.django_db
def test_with_the_dstack_server_down_runs_keep_their_state_and_recover(api, project, second_dstack_server):
    from dstack.api import Client

    server = second_dstack_server
    make_dstack_connection(project, server, retry_window_seconds=600, request_timeout_seconds=5)
    run_id = api.post("/api/training-runs", dstack_body()).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    services.dispatch(run_id)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.backend_job_id

    server.stop()
    reconciler.reconcile_run(run_id)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.poll_failures == 1 and run.error is None
    # A run started while it is down is submitted when it returns, not failed.
    other_id = api.post("/api/training-runs", dstack_body()).json()["id"]
    TrainingRun.objects.filter(pk=other_id).update(start_requested_at="2000-01-01T00:00:00Z")
    services.dispatch(other_id)
    other = TrainingRun.objects.get(pk=other_id)
    assert other.status == Status.PROVISIONING and other.backend_job_id == "" and other.error is None

    server.start()  # same home, same database: the server still knows the first task
    TrainingRun.objects.filter(pk__in=(run_id, other_id)).update(next_poll_at=None)
    reconciler.reconcile_run(run_id)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.poll_failures == 0
    assert reconciler.resubmit(other_id)
    other.refresh_from_db()
    assert other.backend_job_id == job_name(other_id, 1)

    services.stop_run(run)
    services.stop_backend_job(run_id, run.attempt, run.backend_job_id)
    api_client = Client.from_config(project_name=server.project, server_url=server.url, user_token=server.token)
    wait_for(lambda: server_run(api_client, run.backend_job_id).status.value == "terminated", 60, message="the task to terminate")
    services.stop_backend_job(other_id, 1, other.backend_job_id)
