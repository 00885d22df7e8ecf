from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training.engine.data import with_system_prompt_in_pairs
from training.engine.dpo import sequence_scores, span_masks

from .conftest import IngestStub, make_spec, mean, run_inprocess

# The batch counts rows, two a pair (seed 001): 16 rows is 8 pairs a step.
DPO_CONFIG = {"max_steps": 12, "learning_rate": 1e-2, "per_device_train_batch_size": 16, "max_length": 64, "lora_rank": 8}


def test_span_mask_drops_common_prefix_and_suffix() -> None:
    # rows: [chosen, rejected]; prompt = tokens 1,2 ; completions 5 6 7 9 / 5 8 9 (+ pad)
    input_ids = torch.tensor([[1, 2, 5, 6, 7, 9], [1, 2, 5, 8, 9, 0]])
    completion = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]])
    mask = span_masks(input_ids, completion)
    assert mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 0]]


def test_length_norm_divides_by_scored_tokens() -> None:
    logps = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert sequence_scores(logps, mask, False).item() == -3.0
    assert sequence_scores(logps, mask, True).item() == -1.5


def test_dpo_lora_margins_rise(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {**DPO_CONFIG, "loss": {"type": "dpo", "dpo_beta": 0.1, "span_mask": True}}
    assert run_inprocess(make_spec("dpo", tiny["student"], [tiny["dpo"]], tmp_path, cfg, ingest)) == 0
    margins = ingest.series("rewards/margins")
    assert len(margins) == 12
    assert margins[0] == 0.0  # a fresh adapter is the reference: no margin yet
    assert mean(margins[-3:]) > mean(margins[:3]) + 0.1, margins
    for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies"):
        assert len(ingest.series(key)) == 12, key
    assert mean(ingest.series("rewards/accuracies")[-3:]) > 0.5
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["adapter", "merged"]


def test_dpo_reference_free_with_target_margin_and_length_norm(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    loss = {"type": "dpo", "dpo_beta": 2.0, "reference_free": True, "target_margin": 0.5, "length_norm": True}
    cfg = {**DPO_CONFIG, "max_steps": 8, "loss": loss}
    assert run_inprocess(make_spec("dpo", tiny["student"], [tiny["dpo"]], tmp_path, cfg, ingest)) == 0
    margins = ingest.series("rewards/margins")
    losses = ingest.series("loss")
    # Reference-free: the first step already scores the raw policy, so its margin need not be 0,
    # and with target_margin the loss starts above log 2 when the margin is below the target.
    assert mean(margins[-2:]) > mean(margins[:2]), margins
    assert losses[-1] < losses[0]


def test_a_system_prompt_opens_every_pair_once() -> None:
    # QA: DPO took config.system_prompt and never read it.
    import datasets

    system = {"role": "system", "content": "Answer in one word."}
    text = datasets.Dataset.from_list([{"prompt": "Sky?", "chosen": " blue", "rejected": " green"}])
    assert with_system_prompt_in_pairs(text, system["content"])[0] == {
        "prompt": [system, {"role": "user", "content": "Sky?"}],
        "chosen": [{"role": "assistant", "content": " blue"}], "rejected": [{"role": "assistant", "content": " green"}],
    }
    own = {"role": "system", "content": "Be terse."}
    chats = datasets.Dataset.from_list([
        {"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "assistant", "content": "blue"}], "rejected": [{"role": "assistant", "content": "red"}]},
        {"prompt": [own, {"role": "user", "content": "Grass?"}], "chosen": [{"role": "assistant", "content": "green"}], "rejected": [{"role": "assistant", "content": "red"}]},
    ])
    rows = with_system_prompt_in_pairs(chats, system["content"])
    assert [row["prompt"][0] for row in rows] == [system, own]
    assert with_system_prompt_in_pairs(text, None) is text


def test_dpo_trains_with_a_system_prompt(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {**DPO_CONFIG, "max_steps": 2, "system_prompt": "Answer with the colour only.", "loss": {"type": "dpo"}}
    assert run_inprocess(make_spec("dpo", tiny["student"], [tiny["dpo"]], tmp_path, cfg, ingest)) == 0
    assert len(ingest.series("loss")) == 2


def test_dpo_trains_text_prompts_beside_message_answers_with_a_system_prompt(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # START takes these rows when the run sets system_prompt (the prompt becomes a chat, as the
    # answers are): they train. Without it TRL fails on them ("'list' object has no attribute 'endswith'").
    import json

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Colour {i}?", "chosen": [{"role": "assistant", "content": "blue"}],
                                        "rejected": [{"role": "assistant", "content": "red"}]}) + "\n" for i in range(8)))
    cfg = {**DPO_CONFIG, "max_steps": 2, "per_device_train_batch_size": 4, "system_prompt": "Name the colour.", "loss": {"type": "dpo"}}
    assert run_inprocess(make_spec("dpo", tiny["student"], [str(data)], tmp_path, cfg, ingest)) == 0, ingest.collect("logs")[-20:]
    assert len(ingest.series("loss")) == 2
    assert ingest.series("loss")[-1] < ingest.series("loss")[0]


def test_the_batch_counts_rows_so_a_step_trains_half_as_many_pairs(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # Seed 001: per_device_train_batch_size counts rows, 2 a pair. TRL's DPOConfig counts pairs and stacks
    # chosen and rejected into one forward: given the Studio's number, a step trained twice the batch.
    import json

    pairs = 8
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Colour {i}?", "chosen": " blue", "rejected": " red"}) + "\n" for i in range(pairs)))
    cfg = {"num_epochs": 1, "learning_rate": 1e-2, "per_device_train_batch_size": 4, "max_length": 64, "lora_rank": 8, "loss": {"type": "dpo"}}
    assert run_inprocess(make_spec("dpo", tiny["student"], [str(data)], tmp_path, cfg, ingest)) == 0, ingest.collect("logs")[-20:]
    epochs = dict(ingest.metrics()["epoch"])
    assert sorted(epochs) == [1, 2, 3, 4]  # 8 pairs at 2 a step
    assert epochs[1] == pytest.approx(2 / pairs) and epochs[4] == pytest.approx(1.0)
