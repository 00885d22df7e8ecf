"""The engine's process contract: exit codes, failure reports, superseded attempts and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training.engine.__main__ import _is_oom, final_drain_seconds, main
from training.engine.spec import SpecError, parse_spec

from .conftest import IngestStub, make_spec, run_inprocess

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"method": "ppo"}, "method"),
        ({"output_dir": "relative/dir"}, "output_dir"),
        ({"dataset": []}, "dataset"),
        ({"config": {"learning_rate": "fast"}}, "config.learning_rate"),
        ({"config": {"precision": "fp64"}}, "config.precision"),
        ({"config": {"load_in_4bit": True}}, "config.load_in_4bit"),
        ({"method": "dpo", "config": {"lora_rank": 8}}, "config.loss.type"),
        ({"method": "dpo", "config": {"lora_rank": 8, "loss": {"type": "dpo", "target_margin": 1.0}}}, "config.loss.target_margin"),
        ({"method": "dpo", "config": {"loss": {"type": "dpo"}}}, "config.lora_rank"),
        # The batch counts rows, two a pair: TRL would get a half pair.
        ({"method": "dpo", "config": {"lora_rank": 8, "loss": {"type": "dpo"}, "per_device_train_batch_size": 3}}, "config.per_device_train_batch_size"),
        ({"method": "distill", "config": {"distillation": {}}}, "config.distillation.teacher_model"),
        ({"method": "distill", "config": {"distillation": {"teacher_model": "t", "top_k": 4096}}}, "config.distillation.top_k"),
        ({"ingest": {"token": "x"}}, "ingest.url"),
    ],
)
def test_bad_spec_names_the_field(tmp_path: Path, change: dict, field: str) -> None:
    spec = make_spec("sft", "some/model", ["data.jsonl"], tmp_path, {})
    spec.update(change)
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert str(err.value).startswith(field + ":")


def test_cli_exits_2_on_a_bad_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"method": "sft", "base_model": "m", "output_dir": str(tmp_path)}))
    assert main(["--spec", str(path)]) == 2
    assert "dataset: SFT needs at least one dataset" in capsys.readouterr().err
    assert main(["--spec", str(tmp_path / "missing.json")]) == 2


def test_training_error_reports_failed_with_log_tail(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("sft", str(tmp_path / "no-such-model"), [tiny["sft"]], tmp_path / "out", {"max_steps": 2}, ingest)
    assert run_inprocess(spec) == 1
    assert ingest.scalars("status") == ["running", "failed"]  # the engine started the run, then failed loading its model
    error = ingest.scalars("error")[0]
    assert error["code"] == "training_error"
    assert error["message"]
    assert 0 < len(error["log_tail"]) <= 200
    assert any("Traceback" in line for line in error["log_tail"])


def test_a_failure_report_outlasts_a_studio_outage_the_studio_would_ride_out(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    """The last reports are retried for as long as the Studio waits for a heartbeat (heartbeat_timeout_seconds,
    default 300), not a fixed 30 s: a Studio that goes down as the run fails, for 40 s, still learns why."""
    down_since: list[float] = []

    def studio_down_for_40s_from_the_failure_report(body: dict) -> int | None:
        if body.get("status") == "failed" and not down_since:
            down_since.append(time.monotonic())
        return 503 if down_since and time.monotonic() - down_since[0] < 40 else None

    ingest.answer = studio_down_for_40s_from_the_failure_report
    spec = make_spec("sft", str(tmp_path / "no-such-model"), [tiny["sft"]], tmp_path / "out", {"max_steps": 2}, ingest)
    assert run_inprocess(spec) == 1
    assert ingest.scalars("status") == ["running", "failed"], "the engine gave up on its failure report before the Studio came back"
    assert ingest.scalars("error")[0]["code"] == "training_error"
    assert time.monotonic() - down_since[0] >= 40


def test_reports_the_studio_never_took_are_spooled_in_order_and_the_exit_says_so(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch) -> None:
    """The Studio goes down at step 2 and stays down past the final drain: the engine exits 4, and
    every batch it could not deliver (the later steps, the checkpoints, the final model, "completed")
    is in output_dir/undelivered-reports.jsonl, in order, as the bodies it would have POSTed."""
    monkeypatch.setattr("training.engine.__main__.final_drain_seconds", lambda spec: 2.0)  # heartbeat_timeout_seconds' 60 s floor, shortened
    down: list[bool] = []

    def studio_down_from_step_2(body: dict) -> int | None:
        if any(m["step"] >= 2 for m in body["metrics"]):
            down.append(True)
        return 503 if down else None

    ingest.answer = studio_down_from_step_2
    out = tmp_path / "out"
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], out, {"max_steps": 6, "save_steps": 2, "max_length": 32}, ingest)
    assert run_inprocess(spec) == 4

    spooled = [json.loads(line) for line in (out / "undelivered-reports.jsonl").read_text().splitlines()]
    assert spooled, "nothing was spooled"
    delivered_ids = {b["batch_id"] for b in ingest.batches}
    assert not delivered_ids & {b["batch_id"] for b in spooled}, "a delivered batch was spooled too"
    assert all(set(b) == set(ingest.batches[0]) for b in spooled), "a spooled line is not a batch as the engine POSTs it"
    # Delivered and spooled together say everything, once, in the order it happened.
    steps = sorted(m["step"] for b in [*ingest.batches, *spooled] for m in b["metrics"] if m["key"] == "loss")
    assert steps == [1, 2, 3, 4, 5, 6]
    assert "completed" not in ingest.scalars("status")
    assert [b["status"] for b in spooled if b["status"]][-1] == "completed"
    checkpoints = [(c["step"], c["kind"]) for b in spooled for c in b["checkpoints"]]
    assert checkpoints[-1] == (6, "final") and {(4, "checkpoint"), (6, "checkpoint")} <= set(checkpoints), checkpoints
    last_status_line = max(i for i, b in enumerate(spooled) if b["status"] == "completed")
    assert all(not b["checkpoints"] for b in spooled[last_status_line + 1:]), "a checkpoint was spooled after the end status"


def test_the_engine_waits_out_the_heartbeat_deadline_the_studio_uses(tmp_path: Path) -> None:
    # The reconciler took a stored heartbeat_timeout_seconds as given and the engine floored it at 60 s.
    def drain(**config: int) -> float:
        return final_drain_seconds(parse_spec(make_spec("sft", "org/base", ["org/data"], tmp_path, config)))

    assert drain() == 300
    assert drain(heartbeat_timeout_seconds=1) == 60
    assert drain(heartbeat_timeout_seconds=1, heartbeat_interval_seconds=3600) == 7200


def test_out_of_memory_maps_to_oom() -> None:
    assert _is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert _is_oom(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not _is_oom(ValueError("bad row"))


def test_superseded_attempt_stops_training_with_exit_3(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    ingest.always = 403
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {"max_steps": 100000, "max_length": 32}, ingest)
    start = time.monotonic()
    assert run_inprocess(spec) == 3
    assert time.monotonic() - start < 60
    assert len(ingest.attempts) == 1  # one refused batch, then silence
    assert not (tmp_path / "final").exists()


def test_sigterm_flushes_and_exits_143(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {"max_steps": 100000, "max_length": 32}, ingest)
    (tmp_path / "run.json").write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.engine", "--spec", str(tmp_path / "run.json")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while "running" not in ingest.scalars("status"):
            assert proc.poll() is None and time.monotonic() < deadline, "engine never reported running"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # STOP's request, then its task: the second must not start a second flush
        rc = proc.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 143
    assert took < 6
    assert ingest.collect("logs").count("SIGTERM: flushing reports and stopping") == 1  # flushed once, before exit
    assert "completed" not in ingest.scalars("status")


def test_gpu_request_without_a_gpu_fails_loudly(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {"max_steps": 1}, ingest)
    spec["compute"]["accelerators"] = "GPU:1"
    assert run_inprocess(spec) == 1
    assert "no CUDA device" in ingest.scalars("error")[0]["message"]
