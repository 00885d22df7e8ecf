"""What the engine takes from the base model and the dataset's files rather than the run's config:
a default max_length within the model's learned positions, and a warning for evaluation-named files."""
from __future__ import annotations

import json
from pathlib import Path

from training.engine.common import Context
from training.engine.data import load_rows
from training.engine.modeling import pick_device
from training.engine.reporter import Reporter
from training.engine.spec import parse_spec

from .conftest import make_spec


def _gpt2(tiny: dict[str, str], path: Path, positions: int) -> str:
    """A GPT-2 with a learned position table of `positions` rows, on the tiny models' tokenizer."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny["student"])
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=positions, n_embd=32, n_layer=1, n_head=2))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_default_max_length_is_capped_at_the_models_positions_and_trains(tiny, tmp_path):
    # QA: GPT-2 with n_positions 256 and the default max_length 1024 failed with IndexError in wpe.
    from training.engine import sft

    base = _gpt2(tiny, tmp_path / "gpt2", 32)
    spec = parse_spec(make_spec("sft", base, [tiny["sft_text"]], tmp_path / "out", {"max_steps": 1, "per_device_train_batch_size": 2}))
    reporter = Reporter(None, None, echo=False)
    trainer, _ = sft.build_trainer(Context(spec, reporter, pick_device(spec)))
    assert trainer.args.max_length == 32
    assert any("attends over 32 positions, fewer than the default max_length 1024" in line for line in reporter.log_tail), list(reporter.log_tail)
    trainer.train()  # packed rows of up to 32 tokens fit the position table
    # A max_length the run sets is its own (START refuses one past the limit).
    spec = parse_spec(make_spec("sft", base, [tiny["sft_text"]], tmp_path / "out2", {"max_steps": 1, "max_length": 16}))
    trainer, _ = sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))
    assert trainer.args.max_length == 16


def test_files_named_like_an_evaluation_split_are_trained_on_with_a_warning(tmp_path):
    folder = tmp_path / "data"
    (folder / "eval").mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl", "eval/rows.jsonl", "contest.jsonl"):
        (folder / name).write_text(json.dumps({"text": name}) + "\n")
    lines: list[str] = []
    rows = load_rows(parse_spec(make_spec("sft", "org/m", [str(folder)], tmp_path / "out", {})).datasets, lines.append)
    assert len(rows) == 4
    assert lines == ["warning: dataset[0]: eval/rows.jsonl, test.jsonl are named like an evaluation split, and a run trains on every data file "
                     "of its dataset: move evaluation files to another branch or repo if they are not for training"], lines
