"""SFT and DPO train data-parallel under torchrun: two CPU processes (gloo) stand in for two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.engine.launch import CPU_PROCESSES_ENV, engine_argv

from .conftest import IngestStub, make_spec, run_inprocess

REPO = Path(__file__).resolve().parents[2]
# 64 chat rows pack into 32 rows of 64 tokens: a step of 2 ranks x 2 rows is 1/8 of an epoch.
DDP_CONFIG = {"max_steps": 3, "save_steps": 2, "per_device_train_batch_size": 2, "max_length": 64}
# torch's DDP warns (every run) when told to look for unused parameters and finding none, which costs
# a traversal of the autograd graph each step.
FIND_UNUSED_WARNING = "find_unused_parameters=True was specified in DDP constructor"


def run_under_torchrun(spec: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int = 2) -> subprocess.CompletedProcess[str]:
    """The engine on `spec` by the command a backend builds, asked for `processes` CPU processes."""
    spec_path = tmp_path / "run.json"
    spec_path.write_text(json.dumps(spec))
    monkeypatch.setenv(CPU_PROCESSES_ENV, str(processes))
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", "1")  # the CPU has no peak of its own: MFU is then reported
    command = engine_argv(sys.executable, str(spec_path), spec["method"], spec["compute"])
    assert command[1:7] == ["-m", "training.engine.launch", "--standalone", "--nproc_per_node", str(processes), "-m"]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_sft_on_two_processes_trains_the_global_batch_and_reports_once(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", DDP_CONFIG, ingest)
    proc = run_under_torchrun(spec, tmp_path, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert FIND_UNUSED_WARNING not in proc.stderr

    logs = ingest.collect("logs")
    assert logs.count("data parallel: world size 2, one CPU process each; a step's global batch is "
                      "per_device_train_batch_size x gradient_accumulation_steps x 2") == 1
    # Both ranks trained: each step took 2 rows from each, 4 of the 32 packed rows (one process: 1/16).
    epochs = dict(ingest.metrics()["epoch"])
    assert epochs[1] == pytest.approx(0.125) and epochs[3] == pytest.approx(0.375)
    for key, points in ingest.metrics().items():  # rank 1 reports nothing: one point a step
        assert sorted(step for step, _ in points) == [1, 2, 3], (key, points)
    assert ingest.scalars("status") == ["running", "completed"]
    kinds = [(c["step"], c["kind"]) for c in ingest.collect("checkpoints")]
    assert kinds == [(2, "checkpoint"), (3, "checkpoint"), (3, "final")]
    assert logs.count("completed") == 1
    # tokens/s counts both ranks' tokens (TRL's num_tokens is the global count too), and MFU is against both peaks.
    metrics = ingest.metrics()
    num_tokens = [v for _, v in sorted(metrics["num_tokens"])]
    step_tokens = [tps * t for (_, tps), (_, t) in zip(sorted(metrics["tokens_per_s"]), sorted(metrics["step_time_s"]), strict=True)]
    for counted, global_tokens in zip(step_tokens[1:], [b - a for a, b in zip(num_tokens, num_tokens[1:], strict=False)], strict=True):
        assert round(counted) == global_tokens, (step_tokens, num_tokens)  # real tokens only, as num_tokens
    assert any("MFU against 2 TFLOP/s dense bf16 (2 x cpu)" in line for line in logs), logs
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()


def test_dpo_on_two_processes_trains_and_reports_once(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"max_steps": 2, "per_device_train_batch_size": 2, "max_length": 64, "lora": True, "loss": {"type": "dpo", "dpo_beta": 0.1}}
    spec = make_spec("dpo", tiny["student"], [tiny["dpo"]], tmp_path / "out", cfg, ingest)
    proc = run_under_torchrun(spec, tmp_path, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert FIND_UNUSED_WARNING not in proc.stderr
    assert sum(line.startswith("data parallel: world size 2") for line in ingest.collect("logs")) == 1
    assert [step for step, _ in sorted(ingest.metrics()["loss"])] == [1, 2]
    # The batch counts rows (2 a pair): 2 ranks x 1 pair a step is 2 of the 64 pairs.
    assert dict(ingest.metrics()["epoch"])[1] == pytest.approx(2 / 64)
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["adapter", "merged"]
    assert ingest.scalars("status") == ["running", "completed"]


def test_sft_lora_on_two_processes_trains_without_looking_for_unused_parameters(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", {**DDP_CONFIG, "lora": True}, ingest)
    proc = run_under_torchrun(spec, tmp_path, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert FIND_UNUSED_WARNING not in proc.stderr
    assert [step for step, _ in sorted(ingest.metrics()["loss"])] == [1, 2, 3]
    assert ingest.scalars("status") == ["running", "completed"]


def test_a_config_that_sets_find_unused_parameters_keeps_it(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", {**DDP_CONFIG, "max_steps": 1, "ddp_find_unused_parameters": True}, ingest)
    proc = run_under_torchrun(spec, tmp_path, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert FIND_UNUSED_WARNING in proc.stderr


def test_a_rank_that_runs_out_of_memory_fails_the_run_as_oom(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", DDP_CONFIG, ingest)
    spec_path = tmp_path / "run.json"
    spec_path.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(Path(__file__).with_name("rank_fault.py")), "--spec", str(spec_path)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})

    assert proc.returncode != 0  # the backend sees a failed job
    assert ingest.scalars("status") == ["running", "failed"]
    error = ingest.scalars("error")[-1]
    assert error["code"] == "oom", error
    assert error["message"].startswith("rank 1: OutOfMemoryError: CUDA out of memory"), error
    assert any("OutOfMemoryError" in line for line in error["log_tail"])
    assert "rank 1: OutOfMemoryError" in proc.stderr  # in the job's own log too


@pytest.mark.parametrize("method", ["grpo", "distill"])
def test_grpo_and_distill_on_several_gpus_say_they_train_on_one(tiny, tmp_path: Path, method: str) -> None:
    from training.engine.__main__ import log_parallelism
    from training.engine.launch import Rank
    from training.engine.reporter import Reporter
    from training.engine.spec import parse_spec

    config = {"distillation": {"teacher_model": tiny["teacher"]}} if method == "distill" else {"rl_mode": "environment", "environment_id": "builtin/arith@main"}
    spec = make_spec(method, tiny["student"], [tiny[method]] if method == "distill" else [], tmp_path, config)
    spec["compute"]["accelerators"] = "H100:4"
    reporter = Reporter(None, None, echo=False)
    log_parallelism(parse_spec(spec), reporter, "cuda", Rank())
    assert list(reporter.log_tail) == [f"{method.upper()} trains in one process on 1 GPU of the 4 this run asked for: "
                                       "only SFT and DPO train data-parallel across GPUs in this version"]


def test_a_rank_that_completed_leaves_its_process_group(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # Left to the interpreter's exit, gloo's worker threads aborted a rank that had completed (SIGABRT,
    # "terminate called without an active exception"), and torchrun failed the whole run: CI saw it.
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", {"max_steps": 1, "per_device_train_batch_size": 2, "max_length": 64}, ingest)
        assert run_inprocess(spec) == 0
        assert not dist.is_initialized()
        assert ingest.scalars("status")[-1] == "completed"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_rank_that_failed_leaves_its_process_group_alone(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # Tearing down after a failure can hang on peers still inside a collective: the failing rank just exits.
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        spec = make_spec("sft", str(tmp_path / "no-such-model"), [tiny["sft"]], tmp_path / "out", {"max_steps": 1}, ingest)
        assert run_inprocess(spec) == 1
        assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
