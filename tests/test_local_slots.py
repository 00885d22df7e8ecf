"""The local backend's device slots: a job trains only once it holds the machine's devices it asked
for (its GPUs, exclusively, or one of STUDIO_LOCAL_MAX_CPU_JOBS CPU slots); until then it waits,
pending, saying why, with no deadline counting and nothing leased, and STOP ends it at once."""
from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import wait_for
from training.backends import local, local_runner
from training.backends.base import JobSpec
from training.backends.local import LocalBackend, group_alive, parse_job_id, run_dir
from training.models import LogLine, MetricPoint, Status, TrainingRun

FAST = {"learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "heartbeat_interval_seconds": 2}
WAITS = "[studio] the job waits for a CPU slot (STUDIO_LOCAL_MAX_CPU_JOBS=1)"


@pytest.fixture
def one_cpu_slot_worker(transactional_db, monkeypatch, request):
    """The real worker (and beat) with one CPU slot, and a provisioning deadline far shorter than a
    wait behind another run: a waiting job that the deadline counted would fail."""
    monkeypatch.setenv("STUDIO_LOCAL_MAX_CPU_JOBS", "1")
    monkeypatch.setenv("STUDIO_PROVISIONING_TIMEOUT_SECONDS", "10")
    return request.getfixturevalue("studio_worker")


def start_two(api, tiny_models, first_steps: int, second_steps: int) -> tuple[int, int]:
    """Two SFT runs started together; returns (the one that trains, the one that waits)."""
    ids = []
    for name, steps in (("first", first_steps), ("second", second_steps)):
        r = api.post("/api/training-runs", {"name": name, "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
                                            "config": {**FAST, "max_steps": steps}})
        assert r.status_code == 201, r.content
        ids.append(r.json()["id"])
    for run_id in ids:
        assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    waiting = wait_for(lambda: LogLine.objects.filter(run_id__in=ids, line__startswith=WAITS).values_list("run_id", flat=True).first(),
                       60, message="one of the two runs to say it waits for a CPU slot")
    other = ids[0] if waiting == ids[1] else ids[1]
    line = LogLine.objects.filter(run_id=waiting, line__startswith=WAITS).values_list("line", flat=True).first()
    assert f"held by run {other} (attempt 1)" in line, line
    return other, waiting


@pytest.mark.worker
def test_with_one_cpu_slot_the_second_run_waits_then_trains_after_the_first(api, one_cpu_slot_worker, tiny_models):
    first, second = start_two(api, tiny_models, 60, 5)

    def first_ended():
        run = TrainingRun.objects.get(pk=second)
        # It waits on the machine: no engine, no step, no "worker up" for a deadline to count from.
        if not TrainingRun.objects.get(pk=first).is_active:
            return True
        assert run.status == Status.PROVISIONING and run.worker_up_at is None and run.gpu_leased_at is None, (run.status, run.error)
        assert not MetricPoint.objects.filter(run_id=second).exists()
        return False

    wait_for(first_ended, 300, interval=0.5, message="the first run to end")
    wait_for(lambda: not TrainingRun.objects.get(pk=second).is_active, 300, interval=0.5, message="the second run to end")
    a, b = TrainingRun.objects.get(pk=first), TrainingRun.objects.get(pk=second)
    assert a.status == Status.COMPLETED, a.error
    assert b.status == Status.COMPLETED, (b.error, list(LogLine.objects.filter(run=b).values_list("line", flat=True)))
    assert b.started_at > a.finished_at
    # It waited past the 10 s provisioning deadline, which does not count while a job waits for its slots.
    assert (b.started_at - b.provisioning_since).total_seconds() > 10
    engine_log = (run_dir(b.pk, 1) / "engine.log").read_text()
    assert "[runner] waits for a CPU slot" in engine_log and "[runner] took a CPU slot" in engine_log


@pytest.mark.worker
def test_stop_of_a_waiting_run_cancels_it_at_once_and_leaves_no_process(api, one_cpu_slot_worker, tiny_models):
    first, second = start_two(api, tiny_models, 400, 5)
    pgid = parse_job_id(TrainingRun.objects.get(pk=second).backend_job_id)[1]
    assert group_alive(pgid)
    r = api.post(f"/api/training-runs/{second}/stop")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content
    # Within the STOP's own SIGTERM, not the 5 s grace period's SIGKILL: a waiting runner has nothing to flush.
    wait_for(lambda: not group_alive(pgid), 3, interval=0.1, message="the waiting run's runner to be gone")
    assert not (run_dir(second, 1) / "engine.pid").exists()
    assert TrainingRun.objects.get(pk=first).status in (Status.PROVISIONING, Status.RUNNING)
    assert api.post(f"/api/training-runs/{first}/stop").status_code == 200
    first_pgid = parse_job_id(TrainingRun.objects.get(pk=first).backend_job_id)[1]
    wait_for(lambda: not group_alive(first_pgid), 30, message="the first run's engine to be stopped")
    assert TrainingRun.objects.get(pk=second).status == Status.CANCELLED


def test_jobs_waiting_for_a_slot_take_it_in_the_order_they_came_and_a_dead_waiter_is_passed(tmp_path):
    # QA: waiters retried a non-blocking flock, so whichever retried first won: a run started first
    # was passed by ~25 later ones. The runners here are real; their engine only says its turn came.
    slots, order = tmp_path / ".slots", tmp_path / "order"
    slots.mkdir()
    busy = (slots / "cpu-0.lock").open("a+")
    fcntl.flock(busy, fcntl.LOCK_EX)  # another job holds the one CPU slot
    runners = {}
    for n in range(1, 6):
        directory = tmp_path / str(n) / "attempt-1"
        directory.mkdir(parents=True)
        runners[n] = subprocess.Popen([sys.executable, "-m", "training.backends.local_runner", str(directory), "--slots", str(slots), "--cpu-slots", "1",
                                       "--", "sh", "-c", f"echo {n} >> {order}"], cwd=Path(__file__).resolve().parents[1])
        wait_for((directory / "waiting.json").is_file, 30, interval=0.05, message=f"runner {n} to wait")
        # Apart by about 0.6 of a retry: waiters that merely retried in turn would not retry in the order they came.
        time.sleep(0.45 * local_runner.RETRY_SECONDS)
    waiting = json.loads((tmp_path / "5" / "attempt-1" / "waiting.json").read_text())["message"]
    assert waiting == ("waits for a CPU slot (STUDIO_LOCAL_MAX_CPU_JOBS=1), after 4 jobs that came before it "
                       "(run 1 (attempt 1), run 2 (attempt 1), run 3 (attempt 1), …): it starts in its turn"), waiting
    runners.pop(2).send_signal(signal.SIGKILL)  # a waiter killed (its worker's machine, say): no clean-up
    busy.close()
    for n, runner in runners.items():
        assert runner.wait(timeout=60) == 0, n
    assert order.read_text().split() == ["1", "3", "4", "5"]
    assert list(slots.glob("queue-cpu/*.ticket")) == []


# ---- GPUs: this machine has none, so the device count is the one thing faked -------------------

def gpu_job(run_id: int, method: str, accelerators: str) -> JobSpec:
    return JobSpec(run_id=run_id, attempt=1, method=method, base_model="org/none", dataset=[], config={},
                   compute={"backend": "local", "accelerators": accelerators}, ingest_url="http://127.0.0.1:9/none", ingest_token="ing_x")


def engine_of(run_id: int) -> tuple[str, list[str]]:
    """The CUDA_VISIBLE_DEVICES the started engine process really has, and its command line."""
    pid = wait_for(lambda: (run_dir(run_id, 1) / "engine.pid").is_file() and (run_dir(run_id, 1) / "engine.pid").read_text(), 30,
                   message=f"job {run_id}'s engine to start")
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return environ["CUDA_VISIBLE_DEVICES"], Path(f"/proc/{pid}/cmdline").read_text().split("\0")


@pytest.fixture
def eight_gpus(monkeypatch, settings, tmp_path):
    """local_gpu_count (nvidia-smi) says 8: the narrowest boundary. The runners, their lock files and
    the engine processes they start are real."""
    monkeypatch.setattr(local, "local_gpu_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 1
    backend, jobs = LocalBackend(), {}
    yield backend, jobs
    for run_id, job_id in jobs.items():
        backend.stop(run_id, 1, job_id)


def poll(backend: LocalBackend, run_id: int, job_id: str):
    return backend.poll(SimpleNamespace(pk=run_id, attempt=1, backend_job_id=job_id))


def test_gpu_jobs_take_disjoint_gpus_and_a_third_waits_until_one_is_free(eight_gpus):
    backend, jobs = eight_gpus
    for run_id in (1, 2):
        jobs[run_id] = backend.submit(gpu_job(run_id, "sft", "H100:4"))
    (first, first_cmd), (second, second_cmd) = engine_of(1), engine_of(2)
    first_gpus, second_gpus = set(first.split(",")), set(second.split(","))
    assert len(first_gpus) == len(second_gpus) == 4 and first_gpus | second_gpus == {str(i) for i in range(8)}, (first, second)
    # Data-parallel over exactly its 4: torchrun's ranks count cuda:0-3 of what it sees.
    assert [cmd[cmd.index("--nproc_per_node") + 1] for cmd in (first_cmd, second_cmd)] == ["4", "4"]
    assert poll(backend, 1, jobs[1]).state == "running"

    jobs[3] = backend.submit(gpu_job(3, "grpo", "H100:1"))
    waiting = wait_for(lambda: poll(backend, 3, jobs[3]).waiting, 30, message="the third job to say it waits")
    assert waiting.startswith("waits for 1 GPU of this machine's 8, held by run 1 (attempt 1), run 2 (attempt 1)"), waiting
    result = poll(backend, 3, jobs[3])
    assert result.state == "pending" and not (run_dir(3, 1) / "engine.pid").exists()

    backend.stop(1, 1, jobs.pop(1))
    third, _ = engine_of(3)
    # Job 2's engine (a spec naming no real model) fails by itself after its imports, freeing its GPUs
    # too: on a loaded machine that can come before job 1's stop, and then either four are free.
    ended = poll(backend, 2, jobs[2]).state not in ("pending", "running")
    assert third in (first_gpus | second_gpus if ended else first_gpus), (third, first, second, ended)
    assert poll(backend, 3, jobs[3]).state == "running"


def test_two_one_gpu_jobs_do_not_share_a_gpu(eight_gpus):
    backend, jobs = eight_gpus
    for run_id in (1, 2):
        jobs[run_id] = backend.submit(gpu_job(run_id, "grpo", "GPU:1"))
    assert {engine_of(1)[0], engine_of(2)[0]} == {"0", "1"}


def test_the_studios_own_cuda_visible_devices_are_the_gpus_jobs_share(eight_gpus, monkeypatch):
    backend, jobs = eight_gpus
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert local.local_gpu_devices() == ["2", "5"]
    assert [f.message for f in backend.check(None, {"accelerators": "GPU:3"})] == [
        "the local backend has 2 GPUs and this run asks for 3: use CPU here, or a remote backend"]
    jobs[1] = backend.submit(gpu_job(1, "grpo", "GPU:2"))
    assert engine_of(1)[0] == "2,5"


def test_a_cpu_job_sees_no_gpu(eight_gpus):
    backend, jobs = eight_gpus
    jobs[1] = backend.submit(gpu_job(1, "grpo", "CPU"))
    assert engine_of(1)[0] == ""
    assert (local.slots_dir() / "cpu-0.lock").read_text() == "run 1 (attempt 1)"


def test_a_job_asking_for_more_gpus_than_the_machine_has_fails_instead_of_waiting_for_ever(eight_gpus, monkeypatch):
    backend, jobs = eight_gpus
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # START refuses it; here the machine lost GPUs after START
    jobs[2] = backend.submit(gpu_job(2, "sft", "H100:4"))
    result = wait_for(lambda: (r := poll(backend, 2, jobs[2])).state not in ("pending", "running") and r, 30, message="job 2 to end")
    assert result.state == "failed"
    assert "[runner] this machine has 2 GPUs and the job asks for 4: it cannot start" in (run_dir(2, 1) / "engine.log").read_text()
