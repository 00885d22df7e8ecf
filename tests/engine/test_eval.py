"""Held-out evaluation: eval_split and eval_dataset reach TRL's evaluation, their rows are never
trained on, and eval_* metrics stream to the Studio like the training ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.engine import sft
from training.engine.common import Context, eval_arguments
from training.engine.modeling import pick_device
from training.engine.reporter import Reporter
from training.engine.spec import SpecError, parse_spec

from .conftest import IngestStub, make_spec, run_inprocess

SFT_EVAL = {"max_steps": 5, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "eval_steps": 2}
DPO_EVAL = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 8, "max_length": 64, "lora_rank": 8, "loss": {"type": "dpo"}}


def logs(ingest: IngestStub) -> list[str]:
    return [line["line"] if isinstance(line, dict) else line for line in ingest.collect("logs")]


def test_sft_with_eval_split_reports_eval_loss_at_the_eval_steps_and_at_the_end(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {**SFT_EVAL, "eval_split": 0.25}, ingest)
    assert run_inprocess(spec) == 0, logs(ingest)[-20:]
    metrics = ingest.metrics()
    assert [step for step, _ in metrics["eval_loss"]] == [2, 4, 5]  # every eval_steps, and once more at the last step
    assert all(value > 0 for _, value in metrics["eval_loss"])
    assert [step for step, _ in metrics["loss"]] == [1, 2, 3, 4, 5]  # the training loss is still its own series
    assert "eval_num_tokens" not in metrics and "num_tokens" in metrics  # TRL's eval logs echo the training total
    assert any("eval: 16 rows (from eval_split 0.25); 48 rows train" in line for line in logs(ingest)), logs(ingest)


def distinct_rows(folder: Path, count: int = 64) -> str:
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": f"row number {i} says {i * 7 % 13}"}) + "\n" for i in range(count)))
    return str(path)


def test_held_out_rows_are_not_trained_on(tiny, tmp_path: Path) -> None:
    cfg = {"max_steps": 1, "per_device_train_batch_size": 8, "max_length": 64, "packing": False, "eval_split": 0.25}
    spec = parse_spec(make_spec("sft", tiny["student"], [distinct_rows(tmp_path)], tmp_path / "out", cfg))
    trainer, _ = sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))
    train = {tuple(ids) for ids in trainer.train_dataset["input_ids"]}
    held = {tuple(ids) for ids in trainer.eval_dataset["input_ids"]}
    assert (len(trainer.train_dataset), len(trainer.eval_dataset)) == (48, 16)
    assert len(train | held) == 64 and not train & held
    # The same seed holds out the same rows.
    again, _ = sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))
    assert {tuple(ids) for ids in again.eval_dataset["input_ids"]} == held


def test_packed_eval_rows_are_packed_apart_from_the_training_rows(tiny, tmp_path: Path) -> None:
    cfg = {"max_steps": 1, "per_device_train_batch_size": 8, "max_length": 64, "eval_split": 0.25}
    spec = parse_spec(make_spec("sft", tiny["student"], [tiny["sft_text"]], tmp_path, cfg))
    trainer, _ = sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))
    assert len(trainer.eval_dataset) < 16  # packed: fewer, fuller rows, of the 16 held-out rows alone
    assert sum(len(lengths) for lengths in trainer.eval_dataset["seq_lengths"]) == 16
    assert sum(len(lengths) for lengths in trainer.train_dataset["seq_lengths"]) == 48


def test_dpo_with_an_eval_dataset_reports_eval_loss_and_rewards(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in Path(tiny["dpo"]).read_text().splitlines()]
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(row) + "\n" for row in rows[:6]))
    spec = make_spec(
        "dpo", tiny["student"], [tiny["dpo"]], tmp_path / "out", DPO_EVAL, ingest, eval_dataset=[{"path": str(held), "type": None, "revision": None}]
    )
    assert run_inprocess(spec) == 0, logs(ingest)[-20:]
    metrics = ingest.metrics()
    assert [step for step, _ in metrics["eval_loss"]] == [1, 2, 3]  # max_steps 3: about 10 evaluations is every step
    assert {"eval_rewards/accuracies", "eval_rewards/margins"} <= set(metrics)
    assert any(f"eval: 6 rows (from {held})" in line for line in logs(ingest)), logs(ingest)


def test_an_eval_dataset_of_another_shape_fails_naming_eval_dataset(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("dpo", tiny["student"], [tiny["dpo"]], tmp_path, DPO_EVAL, ingest, eval_dataset=[{"path": tiny["sft"], "type": None, "revision": None}])
    assert run_inprocess(spec) == 2
    assert any("eval_dataset: its rows are chat rows and the training rows are preference" in line for line in logs(ingest)), logs(ingest)[-5:]


@pytest.mark.parametrize(
    ("config", "extra", "says"),
    [
        ({"eval_split": 0.25}, {"eval_dataset": [{"path": "/data/held.jsonl"}]}, "config.eval_split: give eval_split or eval_dataset, not both"),
        ({"eval_split": 0.6}, {}, "config.eval_split: a fraction of the rows greater than 0 and at most 0.5"),
        ({"eval_split": 0}, {}, "config.eval_split: a fraction"),
        ({"eval_steps": 0, "eval_split": 0.1}, {}, "config.eval_steps: must be > 0"),
    ],
)
def test_bad_eval_settings_are_spec_errors(tmp_path: Path, config: dict, extra: dict, says: str) -> None:
    with pytest.raises(SpecError, match=says.replace(".", r"\.")):
        parse_spec(make_spec("sft", "org/model", ["/data/rows.jsonl"], tmp_path, config, **extra))


def test_a_dpo_eval_batch_must_be_even(tmp_path: Path) -> None:
    config = {"loss": {"type": "dpo"}, "lora_rank": 8, "eval_split": 0.1, "per_device_eval_batch_size": 3}
    with pytest.raises(SpecError, match="config.per_device_eval_batch_size: counts rows"):
        parse_spec(make_spec("dpo", "org/model", ["/data/rows.jsonl"], tmp_path, config))


def test_grpo_refuses_eval_settings(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="held-out evaluation is for SFT and DPO"):
        parse_spec(make_spec("grpo", "org/model", [], tmp_path, {"eval_split": 0.1}))


def test_an_eval_split_that_holds_out_no_row_fails_with_the_row_count(tiny, tmp_path: Path) -> None:
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    spec = parse_spec(make_spec("sft", tiny["student"], [str(few)], tmp_path / "out", {"max_steps": 1, "eval_split": 0.2}))
    with pytest.raises(SpecError, match="config.eval_split: 0.2 of 3 rows holds out no row"):
        sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))


def test_eval_steps_default_to_about_ten_evaluations_and_the_eval_batch_to_the_train_batch() -> None:
    assert eval_arguments({"max_steps": 100, "per_device_train_batch_size": 4}) == {"eval_strategy": "steps", "eval_steps": 10, "per_device_eval_batch_size": 4}
    assert eval_arguments({"num_epochs": 3})["eval_steps"] == 0.1  # a fraction of the run's steps, as TRL reads it
    assert eval_arguments({"max_steps": 100, "eval_steps": 7, "per_device_eval_batch_size": 2}) == {
        "eval_strategy": "steps",
        "eval_steps": 7,
        "per_device_eval_batch_size": 2,
    }
