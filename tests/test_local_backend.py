"""The local backend's process hygiene (the engine never sees the Studio's secrets), and how an engine
killed by SIGKILL is diagnosed: out of memory only when the kernel's OOM-kill counters say so."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import wait_for
from training.backends.local import ENV_ALLOW_LIST, REPO_ROOT, LocalBackend, engine_env, group_alive, run_dir
from training.backends.local_runner import oom_kill_counters, oom_kills_between
from training.backends.mapping import exit_result


def test_engine_environment_is_an_allow_list(monkeypatch):
    for name in ("SECRET_KEY", "DATABASE_URL", "STUDIO_ENCRYPTION_KEY", "REDIS_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "do-not-leak")
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    env = engine_env({"EXTRA": "1"})
    assert "do-not-leak" not in env.values()
    assert env["HF_HOME"] == "/cache/hf" and env["EXTRA"] == "1"
    assert set(env) <= set(ENV_ALLOW_LIST) | {"PYTHONPATH", "PYTHONUNBUFFERED", "EXTRA"}


def test_the_run_folder_is_the_studio_users_alone_and_the_spec_0600(settings, tmp_path):
    import stat

    from training.backends.base import JobSpec
    from training.backends.local import LocalBackend, run_dir

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 1
    job = JobSpec(run_id=7, attempt=1, method="sft", base_model="org/none", dataset=[], config={}, compute={},
                  ingest_url="http://127.0.0.1:9/none", ingest_token="ing_secret-token")
    backend = LocalBackend()
    job_id = backend.submit(job)
    try:
        folder = run_dir(7, 1)
        for path in (folder.parent, folder):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        assert stat.S_IMODE((folder / "spec.json").stat().st_mode) == 0o600
    finally:
        backend.stop(7, 1, job_id)


# ---- SIGKILL: out of memory, or killed from outside ---------------------------------------------

@pytest.mark.parametrize(("returncode", "sig"), [(-9, 9), (137, None)], ids=["local-signal", "container-137"])
@pytest.mark.parametrize(("oom_kills", "code", "says"), [
    (1, "oom", "by the kernel's OOM killer (the kernel counted an OOM kill"),
    (0, "training_error", "from outside the Studio, not out of memory"),
    (None, "oom", "possibly by the kernel's OOM killer"),
], ids=["counter-grew", "counter-still", "unknown"])
def test_a_sigkill_maps_by_the_oom_evidence(returncode, sig, oom_kills, code, says):
    result = exit_result(returncode, sig, ["step 3"], oom_kills)
    assert (result.state, result.error_code) == ("failed", code)
    assert says in result.message, result.message
    assert "per_device_train_batch_size" in result.message if code == "oom" else "start the run again" in result.message


def test_a_sigkill_without_an_oom_kill_but_cuda_oom_in_the_log_is_still_oom():
    result = exit_result(-9, 9, ["torch.OutOfMemoryError: CUDA out of memory"], 0)
    assert result.error_code == "oom" and "GPU memory" in result.message


def test_other_exits_do_not_read_the_oom_evidence():
    assert exit_result(0, None, [], 0).state == "succeeded"
    assert exit_result(1, None, [], 3).error_code == "training_error"  # an OOM elsewhere on the machine
    assert exit_result(-15, 15, [], None).message == "the engine stopped with signal 15"


def test_the_engines_own_cgroup_counter_is_the_evidence_when_it_can_be_read():
    # Another container on the host was OOM-killed (the machine's counter grew), the engine was not.
    assert oom_kills_between({"vmstat": 5, "cgroup": 2}, {"vmstat": 6, "cgroup": 2}) == 0
    assert oom_kills_between({"vmstat": 5, "cgroup_v1": 0}, {"vmstat": 6, "cgroup_v1": 1}) == 1
    assert oom_kills_between({"vmstat": 5}, {"vmstat": 6}) == 1  # no memory cgroup to read: the machine's
    assert oom_kills_between({"vmstat": 5, "cgroup": 2}, {"vmstat": 5}) == 0  # read both times: vmstat only
    assert oom_kills_between({}, {}) is None  # nothing readable: unknown, not zero


def start_runner(directory: Path, engine_code: str, preexec_fn=None) -> subprocess.Popen:
    """The runner exactly as LocalBackend.submit starts it, with a small Python program as the engine."""
    directory.mkdir(parents=True, exist_ok=True)
    runner = subprocess.Popen([sys.executable, "-m", "training.backends.local_runner", str(directory), "--", sys.executable, "-c", engine_code],
                              cwd=REPO_ROOT, start_new_session=True, stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)
    wait_for(lambda: (directory / "engine.pid").is_file() or runner.poll() is not None, 30, message="the engine to start")
    return runner


def poll(runner: subprocess.Popen, attempt: int = 1):
    run = SimpleNamespace(pk=71, attempt=attempt, backend_job_id=f"{socket.gethostname()}:{runner.pid}")
    return LocalBackend().poll(run)


def test_an_engine_killed_by_kill_9_is_not_reported_as_out_of_memory(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    directory = run_dir(71, 1)
    runner = start_runner(directory, "import time; print('training', flush=True); time.sleep(120)")
    assert poll(runner).state == "running"
    os.kill(int((directory / "engine.pid").read_text()), signal.SIGKILL)  # what a user's `kill -9` does
    assert runner.wait(30) == 0
    exit_status = json.loads((directory / "exit.json").read_text())
    assert exit_status["signal"] == signal.SIGKILL
    if not oom_kill_counters():
        assert exit_status["oom_kills"] is None
        pytest.skip("this kernel has no readable OOM-kill counter: the evidence is unknown (checked above)")
    assert exit_status["oom_kills"] == 0
    result = poll(runner)
    assert (result.state, result.error_code) == ("failed", "training_error")
    assert "killed (SIGKILL) from outside the Studio" in result.message and result.log_tail == ["training"]


def test_an_exit_json_from_before_the_evidence_reads_as_possibly_oom(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    directory = run_dir(71, 2)
    directory.mkdir(parents=True)
    (directory / "exit.json").write_text(json.dumps({"returncode": -9, "signal": 9}))
    result = LocalBackend().poll(SimpleNamespace(pk=71, attempt=2, backend_job_id="elsewhere:1"))
    assert result.error_code == "oom" and "possibly" in result.message


def memory_limited_cgroup(limit: int) -> Path | None:
    """A new memory cgroup (v2, else v1) capped at `limit` bytes with no swap, or None where this
    process may not make one (not root, no memory controller, a read-only /sys/fs/cgroup)."""
    name = f"studio-oom-test-{uuid.uuid4().hex[:8]}"
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
    group = None
    try:
        if (v2 / "cgroup.subtree_control").is_file() and "memory" in (v2 / "cgroup.subtree_control").read_text().split():
            group = v2 / name
            group.mkdir()
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").is_file():
                (group / "memory.swap.max").write_text("0")
            return group
        if (v1 / "memory.limit_in_bytes").is_file():
            group = v1 / name
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").is_file():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return group
    except OSError:
        if group is not None and group.is_dir():
            group.rmdir()
    return None


def test_an_engine_the_kernel_kills_for_memory_is_reported_as_oom(settings, tmp_path):
    group = memory_limited_cgroup(200 * 2**20)
    if group is None:
        pytest.skip("cannot make a memory-limited cgroup here (needs root and a writable cgroup memory controller)")
    try:
        settings.STUDIO_RUNS_DIR = tmp_path / "runs"
        directory = run_dir(71, 3)
        # The runner joins the cgroup before it starts (the engine inherits it), as under a container's limit.
        runner = start_runner(directory, "chunks = []\nwhile True: chunks.append(b'x' * (16 << 20))",
                              preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        assert runner.wait(60) == 0
        exit_status = json.loads((directory / "exit.json").read_text())
        assert exit_status["signal"] == signal.SIGKILL and exit_status["oom_kills"] >= 1, exit_status
        result = poll(runner, attempt=3)
        assert result.error_code == "oom" and "by the kernel's OOM killer (the kernel counted an OOM kill" in result.message
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30, message="the cgroup to empty")
        group.rmdir()


def test_stop_still_cancels_when_the_grace_period_ends_in_sigkill(api, settings, tmp_path):
    from tests.conftest import sft_body
    from training import reconciler, services
    from training.models import Status, TrainingRun

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 1
    run = TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body()).json()["id"])
    # An engine that ignores SIGTERM, so STOP's grace period runs out and the group gets SIGKILL.
    runner = start_runner(run_dir(run.pk, 1), "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)")
    job_id = f"{socket.gethostname()}:{runner.pid}"
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1, backend_job_id=job_id)
    r = api.post(f"/api/training-runs/{run.pk}/stop")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content
    services.stop_backend_job(run.pk, 1, job_id)  # what the stop_backend_job task queued on commit does
    # The SIGKILL takes the runner too (it is the group's leader), so there is no exit to map.
    wait_for(lambda: not group_alive(runner.pid), 10, message="the engine's group to die")
    assert not (run_dir(run.pk, 1) / "exit.json").exists()
    reconciler.reconcile_run(run.pk)
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.error is None


def test_a_job_whose_group_number_another_program_has_now_is_gone_and_never_signalled(settings, tmp_path):
    """A job id names the runner's process group by number. Once the job has ended, the kernel gives the
    number to other processes (the pid space wraps within minutes on a busy machine, and starts again at
    a reboot): a poll reads the job as gone, not that program as its runner, and STOP signals nothing."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 1
    directory = run_dir(72, 1)
    directory.mkdir(parents=True)
    (directory / "engine.pid").write_text("12345")  # the ended job's engine ran once
    # Another program, leading a process group of its own, under the number the job id names.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        job_id = f"{socket.gethostname()}:{other.pid}"
        backend = LocalBackend()
        result = backend.poll(SimpleNamespace(pk=72, attempt=1, backend_job_id=job_id))
        assert (result.state, result.error_code) == ("gone", "training_error")
        backend.signal_stop(72, 1, job_id)
        backend.stop(72, 1, job_id)
        time.sleep(0.5)
        assert other.poll() is None, f"STOP of an ended job signalled another program's group (it exited {other.returncode})"
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(("backend", "returncode", "says"), [
    ("modal", 4, "its last reports did not reach the Studio (exit code 4)"),
    ("dstack", 0, "its final report never reached the Studio"),
    ("local", 0, "its final report never reached the Studio"),
])
def test_a_job_that_ended_without_its_end_report_completes_saying_what_is_missing_and_where(api, settings, tmp_path, backend, returncode, says):
    """No spool this machine can read (a remote job's disk, or none written): the run is not called a
    clean completion; its log says the last reports are missing and where the output is."""
    from tests.conftest import sft_body
    from training import reconciler
    from training.models import LogLine, Status, TrainingRun

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body()).json()["id"])
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1, compute={**run.compute, "backend": backend})
    run.refresh_from_db()
    result = exit_result(returncode, None, [])
    assert result.state == "succeeded" and result.reports_undelivered == (returncode == 4)
    reconciler.apply_poll(run, result)
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    note = LogLine.objects.filter(run=run, line__startswith="[studio] status → completed").get().line
    where = str(run_dir(run.pk, 1) / "output") if backend == "local" else f"/tmp/studio-output on the machine the {backend} job ran on"
    assert says in note and where in note, note
