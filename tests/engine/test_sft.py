from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .conftest import GPU_ONLY_PROGRESS, IngestStub, make_spec, mean, run_inprocess

REPO = Path(__file__).resolve().parents[2]
SFT_CONFIG = {"max_steps": 20, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}


def test_sft_chat_full_finetune_through_the_cli_learns_and_reports(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "out", {**SFT_CONFIG, "save_steps": 10}, ingest)
    spec_path = tmp_path / "run.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "training.engine", "--spec", str(spec_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    losses = ingest.series("loss")
    assert len(losses) == 20
    drop = 1 - mean(losses[-3:]) / mean(losses[:3])
    assert drop >= 0.30, f"loss fell only {drop:.0%}: {losses}"
    metrics = ingest.metrics()
    for key in ("tokens_per_s", "step_time_s", "eta_s", "grad_norm", "learning_rate"):
        assert len(metrics[key]) >= 20, key
    assert all(v > 0 for _, v in metrics["tokens_per_s"])
    for key, points in metrics.items():  # one point a step: the trainer's end-of-training summary repeated epoch
        assert len({step for step, _ in points}) == len(points), (key, points[-3:])
    progress = ingest.scalars("progress")
    assert progress[-1]["step"] == 20 and progress[-1]["max_steps"] == 20
    assert set(progress[-1]) == {"step", "max_steps", "tokens_per_s", "step_time_s", "eta_s", *GPU_ONLY_PROGRESS}
    assert ingest.scalars("stage") == ["setup", "train"]
    assert ingest.scalars("status") == ["running", "completed"]
    kinds = [(c["step"], c["kind"]) for c in ingest.collect("checkpoints")]
    assert kinds == [(10, "checkpoint"), (20, "checkpoint"), (20, "final")]
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
    # The local backend captures stdout as the run log: every log line goes there too.
    assert "completed" in proc.stdout and "step 20:" in proc.stdout


def test_sft_text_rows_with_lora_save_adapter_and_merged(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {**SFT_CONFIG, "max_steps": 4, "learning_rate": 1e-2, "lora": True}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft_text"]], tmp_path, cfg, ingest)) == 0
    kinds = [c["kind"] for c in ingest.collect("checkpoints")]
    assert kinds == ["adapter", "merged"]
    adapter_cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 16 and adapter_cfg["lora_alpha"] == 16
    assert set(adapter_cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    base = load_file(str(Path(tiny["student"]) / "model.safetensors"))
    assert not any("lora" in k for k in merged)
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert any("q_proj" in k for k in changed)  # the adapter really was merged in


QLORA_CONFIG = {**SFT_CONFIG, "max_steps": 3, "learning_rate": 1e-2, "lora_rank": 8, "lora_alpha": 16, "load_in_4bit": True}


def test_sft_prompt_completion_rows_with_qlora(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")  # requirements.txt installs it; the device check's GPU image has none
    cfg = QLORA_CONFIG
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft_prompt_completion"]], tmp_path, cfg, ingest)) == 0
    assert len(ingest.series("loss")) == 3
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["lora_alpha"] == 16


def test_qlora_in_an_image_without_bitsandbytes_fails_naming_load_in_4bit(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen on the device machine's GPU image: transformers' ImportError ("pip install -U bitsandbytes") ended the run.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft_prompt_completion"]], tmp_path, QLORA_CONFIG, ingest)) == 2
    logs = ingest.collect("logs")
    assert any(line.startswith("bad spec: config.load_in_4bit: QLoRA loads the base in 4 bits with the bitsandbytes package, which this trainer image lacks")
               for line in logs), logs[-5:]


def test_sft_trains_on_csv_chat_rows_as_chats(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    """A CSV's messages cells hold JSON chat lists, which START reads and checks as chats: the run
    trains on them as chats (assistant-only loss, the system prompt added), not as text, which
    SFTTrainer refused ("the dataset is not conversational") after the job had started."""
    rows = [json.loads(line) for line in Path(tiny["sft"]).read_text().splitlines()]
    data = tmp_path / "chat.csv"
    with data.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["messages"])
        writer.writerows([json.dumps(row["messages"])] for row in rows)
    cfg = {**SFT_CONFIG, "max_steps": 2, "system_prompt": "Answer in one sentence."}
    assert run_inprocess(make_spec("sft", tiny["student"], [str(data)], tmp_path / "out", cfg, ingest)) == 0, ingest.collect("logs")[-20:]
    assert any(line.startswith(f"sft: {len(rows)} chat rows") for line in ingest.collect("logs")), ingest.collect("logs")
    assert len(ingest.series("loss")) == 2


def test_resume_from_checkpoint_matches_an_uninterrupted_run(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {**SFT_CONFIG, "max_steps": 6, "save_steps": 3, "per_device_train_batch_size": 4}
    full = tmp_path / "full"
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], full, cfg)) == 0
    resumed = tmp_path / "resumed"
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], resumed, cfg, ingest, resume_from=str(full / "checkpoint-3"))
    assert run_inprocess(spec) == 0
    assert [step for step, _ in sorted(ingest.metrics()["loss"])] == [4, 5, 6]  # picked up after step 3
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    base = load_file(str(Path(tiny["student"]) / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-5, worst


def progress_reports(monkeypatch) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every progress the engine hands its reporter, in order: a batch carries only the newest of
    those made within its flush interval, and a tiny model's steps take milliseconds."""
    from training.engine.reporter import Reporter

    made: list[dict] = []
    send = Reporter.progress

    def record(self: Reporter, progress: dict) -> None:
        made.append(dict(progress))
        send(self, progress)

    monkeypatch.setattr(Reporter, "progress", record)
    return made


def test_the_engine_reports_running_as_it_starts_before_its_first_step_ends(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch) -> None:
    # "running" came with the first step's progress: a GRPO run whose first step took 45 s showed
    # "provisioning · stage: train" all that time, and a 30 s run "Duration 0s".
    made = progress_reports(monkeypatch)
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {**SFT_CONFIG, "max_steps": 2}, ingest)) == 0
    batches = ingest.batches

    def first(found) -> int:
        return next(i for i, b in enumerate(batches) if found(b))

    running, setup = first(lambda b: b["status"] == "running"), first(lambda b: b["stage"] == "setup")
    # Before the model and data are loaded: no later than the batch with the run's first log line.
    loading = first(lambda b: any(line.startswith("run 1 attempt 1: sft") for line in b["logs"]))
    train, stepped = first(lambda b: b["stage"] == "train"), first(lambda b: b["metrics"])
    shape = [(b["status"], b["stage"], len(b["metrics"]), b["logs"][:2]) for b in batches]
    assert max(running, setup) <= loading <= train <= stepped and running < stepped, shape
    # While the first step runs the run shows where it starts, with no speed or ETA yet.
    assert made[0] == {"step": 0, "max_steps": 2} and all("eta_s" in p for p in made[1:]), made


def test_a_resumed_attempt_shows_no_eta_until_one_of_its_own_steps_has_ended(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch) -> None:
    # A resumed run showed "66% · 0.73 s/step · ETA 0s" for the 20 s its next step took.
    cfg = {**SFT_CONFIG, "max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 4}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "first", cfg)) == 0
    made = progress_reports(monkeypatch)
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "resumed", cfg, ingest, resume_from=str(tmp_path / "first" / "checkpoint-2"))
    assert run_inprocess(spec) == 0
    assert made[0] == {"step": 2, "max_steps": 4}, made  # the step it resumes at, nothing timed yet
    assert [p["step"] for p in made[1:]] == [3, 4] and all(p["step_time_s"] > 0 and "eta_s" in p for p in made[1:]), made
    assert ingest.scalars("progress")[-1]["step"] == 4


def test_settings_the_studio_owns_are_ignored_by_the_engine_too(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # Studio refuses them at create; a spec from elsewhere (an older Studio, a hand-written one) must
    # still not write a run's checkpoints outside its own folder or report to another tracker.
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    out = tmp_path / "run"
    evil = tmp_path.parent / f"{tmp_path.name}-evil.jinja"
    evil.write_text("{{ raise_exception('the engine read a template from outside the run') }}")
    cfg = {**SFT_CONFIG, "max_steps": 2, "save_steps": 1, "output_dir": str(elsewhere), "report_to": "tensorboard", "chat_template_path": str(evil)}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft_text"]], out, cfg, ingest)) == 0
    assert not elsewhere.exists()
    assert {c["step"] for c in ingest.collect("checkpoints") if c["kind"] == "checkpoint"} == {1, 2}
    assert all(c["path"].startswith(str(out)) for c in ingest.collect("checkpoints"))
    logs = ingest.collect("logs")
    assert any(line.startswith("config.output_dir: set by the Studio") for line in logs)
    assert any(line.startswith("config.report_to: set by the Studio") for line in logs)
    assert any(line.startswith("config.chat_template_path: set by the Studio") for line in logs)


def test_a_resume_with_more_steps_follows_its_own_learning_rate_schedule(tiny, tmp_path: Path) -> None:
    # Saved at step 3 of 6, resumed with max_steps 9: the first resumed step took the old schedule's rate
    # (stored in the optimizer), the next ones the new schedule's, so the rate went down and up again.
    cfg = {**SFT_CONFIG, "max_steps": 6, "save_steps": 3, "per_device_train_batch_size": 4}
    first = tmp_path / "first"
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], first, cfg)) == 0
    fresh, resumed = IngestStub(), IngestStub()
    try:
        longer = {**cfg, "max_steps": 9}
        assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "fresh", longer, fresh)) == 0
        spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path / "resumed", longer, resumed, resume_from=str(first / "checkpoint-3"))
        assert run_inprocess(spec) == 0
        rates = sorted(resumed.metrics()["learning_rate"])
        assert [step for step, _ in rates] == [4, 5, 6, 7, 8, 9]
        assert rates == [(step, rate) for step, rate in sorted(fresh.metrics()["learning_rate"]) if step > 3]  # an unbroken 9-step schedule
        assert any("resume: learning rate" in line for line in resumed.collect("logs"))
    finally:
        fresh.close()
        resumed.close()


def test_sft_trains_on_csv_cells_as_the_text_start_checked(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    """pandas guessed types: an all-number completion column read as numbers (TRL then failed joining
    text and an int) and a cell "NA" or "null" as a missing value, where START checked text. The engine
    reads every cell as its text, as START does, and trains on it."""
    pytest.importorskip("django")  # START's own check (datahub.datasets) runs beside the engine's; the GPU image has no Django
    from datahub.datasets import Source, iter_rows, rows_findings
    from training.engine.data import load_rows
    from training.engine.spec import DatasetRef

    data = tmp_path / "sums.csv"
    data.write_text("prompt,completion\n" + "".join(f"{i}+{i}=,{2 * i}\n" for i in range(7)) + "Is it known?,NA\n")
    source = Source("sums.csv", data.stat().st_size, lambda: data.open("rb"))
    assert rows_findings([source], "sft", "dataset") == []
    assert load_rows([DatasetRef(str(data))]).to_list() == [row for _, row in iter_rows(source)]
    cfg = {**SFT_CONFIG, "max_steps": 2}
    assert run_inprocess(make_spec("sft", tiny["student"], [str(data)], tmp_path / "out", cfg, ingest)) == 0, ingest.collect("logs")[-20:]
    assert any(line.startswith("sft: 8 prompt_completion rows") for line in ingest.collect("logs")), ingest.collect("logs")
    assert len(ingest.series("loss")) == 2
