"""A run on N GPUs trains SFT and DPO on all N: the backends launch the engine under torchrun, one
process a GPU. Here two CPU processes (STUDIO_ENGINE_CPU_PROCESSES) stand in for two GPUs."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import wait_for
from tests.engine.conftest import TOKEN, IngestStub
from training.backends.base import JobSpec
from training.backends.local import LocalBackend, run_dir
from training.engine.launch import CPU_PROCESSES_ENV, engine_argv

TORCHRUN = ["-m", "training.engine.launch", "--standalone", "--nproc_per_node"]
ENGINE = ["-m", "training.engine", "--spec", "/run/spec.json"]


@pytest.mark.parametrize(("method", "accelerators", "processes"), [
    ("sft", "H100:8", 8), ("dpo", "L4:4", 4), ("sft", "A100-80GB:2", 2),
    ("sft", "L4", 1), ("dpo", "GPU:1", 1), ("sft", "CPU", 1), ("grpo", "H100:8", 1), ("distill", "L4:2", 1),
])
def test_sft_and_dpo_on_several_gpus_run_one_process_a_gpu_under_torchrun(method, accelerators, processes):
    command = engine_argv("python", "/run/spec.json", method, {"backend": "local", "accelerators": accelerators})
    if processes == 1:
        assert command == ["python", *ENGINE]
    else:
        assert command == ["python", *TORCHRUN, str(processes), *ENGINE]


@pytest.fixture(scope="module")
def tiny_student(tmp_path_factory) -> dict[str, str]:
    from training.engine.tiny import build_demo_datasets, build_tiny_models

    root = tmp_path_factory.mktemp("tiny")
    return {**build_tiny_models(root / "models"), **build_demo_datasets(root / "datasets")}


@pytest.fixture
def ingest():
    stub = IngestStub()
    yield stub
    stub.close()


def sft_job(tiny: dict[str, str], ingest_url: str, max_steps: int, **config: int) -> JobSpec:
    config = {"precision": "fp32", "seed": 1, "max_steps": max_steps, "per_device_train_batch_size": 2, "max_length": 64, **config}
    return JobSpec(run_id=41, attempt=1, method="sft", base_model=tiny["student"], dataset=[{"path": tiny["sft"], "type": None, "revision": None}],
                   config=config, compute={"backend": "local", "accelerators": "CPU"}, ingest_url=ingest_url, ingest_token=TOKEN)


def engine_log(directory: Path) -> str:
    path = directory / "engine.log"
    return path.read_text() if path.is_file() else ""


def engine_processes(spec_path: Path) -> list[int]:
    """Live processes whose command line names this spec: torchrun and each of its ranks."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if str(spec_path) in cmdline and state != "Z" and "local_runner" not in cmdline and "training.backends.sandbox" not in cmdline:
            pids.append(int(entry.name))
    return pids


def test_the_local_backend_trains_on_every_process_and_the_run_succeeds(settings, tmp_path, monkeypatch, tiny_student, ingest):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    monkeypatch.setenv(CPU_PROCESSES_ENV, "2")
    backend = LocalBackend()
    job_id = backend.submit(sft_job(tiny_student, ingest.url, max_steps=3))
    directory = run_dir(41, 1)
    try:
        wait_for(lambda: (directory / "exit.json").is_file(), 240, message="the engine to finish")
    finally:
        backend.stop(41, 1, job_id)
    log = (directory / "engine.log").read_text()
    assert json.loads((directory / "exit.json").read_text())["returncode"] == 0, log[-3000:]
    assert "data parallel: world size 2" in log
    assert ingest.scalars("status") == ["running", "completed"]
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["final"]


def test_stop_ends_every_rank(settings, tmp_path, monkeypatch, tiny_student, ingest):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 20
    monkeypatch.setenv(CPU_PROCESSES_ENV, "2")
    backend = LocalBackend()
    job_id = backend.submit(sft_job(tiny_student, ingest.url, max_steps=10_000))
    directory = run_dir(41, 1)
    spec_path = directory / "spec.json"
    try:
        wait_for(lambda: "step 1:" in engine_log(directory), 240, message="the first step")
        assert len(engine_processes(spec_path)) == 3  # torchrun and its two ranks
    finally:
        backend.stop(41, 1, job_id)
    wait_for(lambda: not engine_processes(spec_path), 10, message="every rank to exit")
    assert "SIGTERM: flushing reports and stopping" in ingest.collect("logs")


def test_a_run_that_trained_to_its_end_with_the_studio_unreachable_is_no_failure_under_torchrun(settings, tmp_path, monkeypatch, tiny_student):
    """Rank 0 spools the reports the Studio did not take and exits 4 ("trained to its end, reports
    undelivered"); torchrun exits 1 for a rank that does not exit 0, and the run read as failed."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    monkeypatch.setenv(CPU_PROCESSES_ENV, "2")
    with socket.socket() as s:  # a port nothing listens on: the Studio is down for the whole run
        s.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{s.getsockname()[1]}/api/ingest/runs/41"
    backend = LocalBackend()
    # The engine retries its last reports for heartbeat_timeout_seconds (at least 60 s) before it spools them.
    job_id = backend.submit(sft_job(tiny_student, unreachable, max_steps=2, heartbeat_timeout_seconds=60))
    directory = run_dir(41, 1)
    try:
        wait_for(lambda: (directory / "exit.json").is_file(), 300, message="the engine to finish")
    finally:
        backend.stop(41, 1, job_id)
    log = engine_log(directory)
    assert "data parallel: world size 2" in log
    assert json.loads((directory / "exit.json").read_text())["returncode"] == 4, log[-3000:]
    spooled = [json.loads(line) for line in (directory / "output" / "undelivered-reports.jsonl").read_text().splitlines()]
    assert [b["status"] for b in spooled if b["status"]][-1] == "completed"
    result = backend.poll(SimpleNamespace(pk=41, attempt=1, backend_job_id=job_id))
    assert (result.state, result.reports_undelivered) == ("succeeded", True), (result, log[-3000:])
