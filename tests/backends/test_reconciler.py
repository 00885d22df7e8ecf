"""The reconciler: claim lease, deadlines (provisioning_timeout, configuring_timeout), back-off of an
erroring backend, and cost from "GPU leased" to the run's end per the price table."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.backends.test_dstack import server_run, start
from tests.conftest import free_port, sft_body, wait_for
from training import reconciler, services
from training.backends import BACKENDS
from training.backends.base import Backend, PollResult
from training.models import GpuPrice, LogLine, Status, TrainingRun

pytestmark = pytest.mark.django_db
LONG_AGO = timedelta(hours=2)


def test_no_worker_within_the_provisioning_deadline_is_provisioning_timeout(api, dstack_connection, dstack_api):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.provisioning_timeout_seconds = 60
    dstack_connection.save()
    run = start(api)
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).status == Status.PROVISIONING  # within 60 s + the retry window
    claimed_long_ago = timezone.now() - LONG_AGO  # the claim sets both; no heartbeat since
    TrainingRun.objects.filter(pk=run.pk).update(provisioning_since=claimed_long_ago, last_heartbeat_at=claimed_long_ago)
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "provisioning_timeout"
    assert "provisioning deadline (660 s)" in run.error["message"]
    # The dstack task is stopped with it.
    wait_for(lambda: server_run(dstack_api, run.backend_job_id).status.is_finished(), 60, message="dstack to stop the task")


def test_a_worker_whose_engine_does_not_start_within_the_configuring_deadline_is_configuring_timeout(api, dstack_connection):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.configuring_timeout_seconds = 120
    dstack_connection.save()
    run = start(api)
    now = timezone.now()
    # The job called home an hour ago (the worker is up), and its engine never reported that it started the run.
    TrainingRun.objects.filter(pk=run.pk).update(provisioning_since=now - LONG_AGO, last_heartbeat_at=now - timedelta(hours=1))
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "configuring_timeout", run.error
    assert run.worker_up_at is not None


def test_waiting_for_capacity_is_not_a_lost_heartbeat(api, dstack_connection):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.save()
    run = start(api)
    TrainingRun.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).status == Status.PROVISIONING
    services.stop_run(run)


def test_one_pass_at_a_time_holds_a_run(api, dstack_connection):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.save()
    run = start(api)
    now = timezone.now()
    assert reconciler.claim_for_reconcile(run.pk, now)
    assert not reconciler.claim_for_reconcile(run.pk, now)  # a second pass skips it
    assert run.pk not in reconciler.runs_to_reconcile()
    TrainingRun.objects.filter(pk=run.pk).update(next_poll_at=None)
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).next_poll_at is None  # released after the pass
    services.stop_run(run)


def test_an_unreachable_backend_is_backed_off_and_the_run_keeps_its_state(api, dstack_connection):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.save()
    run = start(api)
    dstack_connection.server_url = f"http://127.0.0.1:{free_port()}"
    dstack_connection.save()
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.poll_failures == 1
    assert run.next_poll_at > timezone.now() + timedelta(seconds=10)
    assert run.pk not in reconciler.runs_to_reconcile()
    assert LogLine.objects.filter(run=run, line__contains="did not answer").exists()
    TrainingRun.objects.filter(pk=run.pk).update(next_poll_at=None)
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.poll_failures == 2 and run.next_poll_at > timezone.now() + timedelta(seconds=25)  # doubling


# ---- cost ---------------------------------------------------------------------------------------

class LeasingBackend(Backend):
    """No backend here can lease a GPU (no fleets, no Modal), so this fake stands in for the
    backend's answer only: "a GPU is leased" / "running" / "done"."""

    name = "dstack"

    def __init__(self) -> None:
        self.answer = PollResult("pending", leased=False)

    def poll(self, run) -> PollResult:
        return self.answer

    def stop(self, run_id, attempt, job_id) -> None:
        pass

    def logs(self, run, tail=200):
        return []


@pytest.fixture
def prices(db):
    GpuPrice.objects.create(gpu_type="H100", spot=False, price_per_hour=Decimal("4.00"))
    GpuPrice.objects.create(gpu_type="H100", spot=True, price_per_hour=Decimal("1.50"))
    GpuPrice.objects.create(backend="dstack", gpu_type="H100", spot=False, price_per_hour=Decimal("3.00"))
    GpuPrice.objects.create(gpu_type="GPU", spot=False, price_per_hour=Decimal("2.00"))


def fake_run(api, monkeypatch, **compute) -> tuple[TrainingRun, LeasingBackend]:
    backend = LeasingBackend()
    monkeypatch.setitem(BACKENDS, "dstack", backend)
    run_id = api.post("/api/training-runs", sft_body(compute={"backend": "dstack", **compute})).json()["id"]
    now = timezone.now()
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, backend_job_id="job-1", provisioning_since=now, last_heartbeat_at=now)
    return TrainingRun.objects.get(pk=run_id), backend


def test_the_price_table_lookup(prices, api, monkeypatch):
    run, _ = fake_run(api, monkeypatch, accelerators="H100:8")
    assert reconciler.hourly_price_for(run, None) == Decimal("24.00")  # the dstack row wins, × 8 GPUs
    run.compute["spot"] = True
    assert reconciler.hourly_price_for(run, None) == Decimal("12.00")  # spot, any backend
    run.compute = {"backend": "modal", "accelerators": "GPU:2", "spot": False}
    assert reconciler.hourly_price_for(run, None) == Decimal("4.00")  # generic GPU row
    assert reconciler.hourly_price_for(run, "H100") == Decimal("8.00")  # the GPU the backend gave
    run.compute = {"backend": "local", "accelerators": "CPU"}
    assert reconciler.hourly_price_for(run, None) == 0


def test_cost_accrues_from_gpu_leased_to_the_runs_end(prices, api, monkeypatch):
    run, backend = fake_run(api, monkeypatch, accelerators="H100:2")
    reconciler.reconcile_run(run.pk)  # queued for a machine: no lease, no cost
    run.refresh_from_db()
    assert run.gpu_leased_at is None and run.cost == 0

    backend.answer = PollResult("pending", leased=True, gpu_type="H100")  # the machine is booting: rented
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.gpu_leased_at is not None and run.hourly_price == Decimal("6.00")
    # Pretend the lease began half an hour ago.
    TrainingRun.objects.filter(pk=run.pk).update(gpu_leased_at=timezone.now() - timedelta(minutes=30))
    backend.answer = PollResult("running", leased=True)
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert Decimal("2.99") < run.cost < Decimal("3.02"), run.cost

    services.stop_run(run)  # the run ends: the lease closes at finished_at
    TrainingRun.objects.filter(pk=run.pk).update(gpu_leased_at=F_minus(run, minutes=6))
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.gpu_leased_at is None and Decimal("3.59") < run.cost < Decimal("3.62"), run.cost
    final = run.cost
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).cost == final  # nothing after the end
    assert api.get(f"/api/training-runs/{run.pk}").json()["cost"] in (str(final), float(final), f"{final:.4f}")


def F_minus(run: TrainingRun, minutes: int):
    run.refresh_from_db()
    return run.finished_at - timedelta(minutes=minutes)


def test_a_run_that_never_got_a_gpu_costs_nothing(prices, api, monkeypatch):
    run, backend = fake_run(api, monkeypatch, accelerators="H100:8")
    backend.answer = PollResult("failed", "CAPACITY_UNAVAILABLE", "no capacity", leased=False)
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.cost == 0 and run.gpu_seconds == 0


def test_a_studio_outage_longer_than_the_heartbeat_deadline_does_not_fail_runs_that_trained_through_it(api, monkeypatch):
    from django.core.cache import cache

    run, backend = fake_run(api, monkeypatch, accelerators="H100:1")
    backend.answer = PollResult("running", leased=True)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, worker_up_at=timezone.now(), config={**run.config, "heartbeat_timeout_seconds": 60})
    # The Studio was down for 10 minutes: the engine's reports could not land, so its last heartbeat is old.
    TrainingRun.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    cache.delete_many([reconciler.PASS_KEY, reconciler.RESUMED_KEY])  # the embedded Redis keeps nothing across a restart
    resumed = reconciler.passes_resumed_at()
    assert timezone.now() - resumed < timedelta(seconds=5)
    reconciler.reconcile_run(run.pk, silence_from=resumed)
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING  # silence counts from the passes' return
    # Passes that keep coming keep that start; 61 s of silence after it is a lost heartbeat again.
    later = resumed + timedelta(seconds=10)
    assert reconciler.passes_resumed_at(later) == resumed
    reconciler.reconcile_run(run.pk, silence_from=resumed - timedelta(seconds=61))
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "heartbeat_timeout"
    # A gap between passes of over three intervals starts the count again.
    assert reconciler.passes_resumed_at(later + timedelta(minutes=5)) == later + timedelta(minutes=5)


def test_a_poll_that_finds_the_job_gone_stops_what_is_left_of_it(api, monkeypatch):
    run, backend = fake_run(api, monkeypatch, accelerators="H100:1")
    stopped = []
    monkeypatch.setattr(backend, "stop", lambda run_id, attempt, job_id: stopped.append((run_id, attempt, job_id)))
    backend.answer = PollResult("gone", "training_error", "the engine's process is gone without an exit status", ["last line"])
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["log_tail"] == ["last line"]
    assert stopped == [(run.pk, 1, "job-1")]  # the engine may outlive its runner: its group is stopped too


def test_a_heartbeat_deadline_stored_below_the_floor_is_the_floor(api, monkeypatch):
    # QA: a run stored with heartbeat_timeout_seconds 1 was failed within seconds, while the engine took 60.
    run, backend = fake_run(api, monkeypatch, accelerators="H100:1")
    backend.answer = PollResult("running", leased=True)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, worker_up_at=timezone.now(), last_heartbeat_at=timezone.now() - timedelta(seconds=20),
                                                 config={**run.config, "heartbeat_timeout_seconds": 1})
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING
    TrainingRun.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=61))
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and "no heartbeat for 60 s" in run.error["message"]


def test_a_job_that_waited_longer_than_the_heartbeat_deadline_gets_the_whole_deadline_once_its_engine_starts(api, monkeypatch):
    # QA: a local run that waited 8 minutes for a CPU slot was failed with heartbeat_timeout the moment
    # its engine started (58 ms before its first heartbeat): silence counted from the submit.
    run, backend = fake_run(api, monkeypatch, accelerators="H100:1")
    submitted = timezone.now() - timedelta(minutes=8)
    TrainingRun.objects.filter(pk=run.pk).update(provisioning_since=submitted, last_heartbeat_at=submitted, config={**run.config, "heartbeat_timeout_seconds": 60})
    backend.answer = PollResult("pending", leased=False, waiting="waits for a CPU slot (STUDIO_LOCAL_MAX_CPU_JOBS=1), held by run 1 (attempt 1)")
    reconciler.reconcile_run(run.pk)
    assert TrainingRun.objects.get(pk=run.pk).status == Status.PROVISIONING
    backend.answer = PollResult("running", leased=False)  # the wait ended: the engine starts
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.worker_up_at is not None, run.error
    # A deadline still counts, from the engine's start: 61 s of silence after it is a lost heartbeat.
    TrainingRun.objects.filter(pk=run.pk).update(worker_up_at=timezone.now() - timedelta(seconds=61))
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "heartbeat_timeout", run.error
