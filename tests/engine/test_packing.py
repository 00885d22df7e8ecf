"""Padding-free packing for SFT and DISTILL: the packed loss is the padded loss, and packed runs learn.

Equality is the proof that packing keeps sequences apart: a packed row with attention across sequence
boundaries, or a target predicted across one, gives a different loss (checked too, so the equality
tests cannot pass vacuously).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from training.engine.common import Context
from training.engine.distill import MODEL_INPUTS, collate, collate_packed, kd_losses
from training.engine.modeling import Device, load_model, pick_device
from training.engine.reporter import Reporter
from training.engine.sft import ROW_TOKENS
from training.engine.spec import parse_spec

from .conftest import EXPECTED_ATTENTION, IngestStub, make_spec, mean, run_inprocess

CPU = Device("cpu", False, "fp32")


def _kd_items(vocab: int, lengths: list[int], k: int = 8, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """KDDataset-shaped items with random tokens and a random sorted top-K per position."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for n in lengths:
        logprobs = torch.log_softmax(torch.randn(n, k, generator=g) * 3, dim=-1).sort(dim=-1, descending=True).values
        items.append(
            {
                "input_ids": torch.randint(0, vocab, (n,), generator=g),
                "loss_mask": (torch.rand(n, generator=g) > 0.3).long(),
                "kd_ids": torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(n)]),
                "kd_logprobs": logprobs,
            }
        )
    return items


def _kd_forward(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(**{key: batch[key] for key in MODEL_INPUTS if key in batch}, use_cache=False)
    return kd_losses(out.logits, batch, temperature=2.0)


def test_packed_collate_restarts_positions_per_sequence_in_one_row_or_in_bounded_rows() -> None:
    items = _kd_items(50, [3, 5, 2])
    one_row = collate_packed(items, flash=True)
    assert one_row["input_ids"].shape == (1, 10) and "attention_mask" not in one_row
    assert one_row["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
    assert torch.equal(one_row["input_ids"][0], torch.cat([x["input_ids"] for x in items]))
    assert one_row["kd_ids"].shape == (1, 10, 8) and one_row["kd_logprobs"].shape == (1, 10, 8)
    assert one_row["cu_seq_lens_q"].tolist() == [0, 3, 8, 10] and one_row["max_length_k"] == 5

    # Without varlen kernels, rows hold at most row_length tokens; a short row's padding is its own sequence.
    rows = collate_packed(_kd_items(50, [4, 5, 2]), row_length=7, pad_id=99)
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 0]]
    assert rows["input_ids"][1, 5].item() == 99 and rows["loss_mask"][1, 5].item() == 0
    assert "cu_seq_lens_q" not in rows


@pytest.mark.parametrize("row_length", [None, 20], ids=["one-row", "rows-of-20"])
def test_packed_distill_loss_and_gradients_equal_the_padded_ones(tiny, row_length: int | None) -> None:
    model = load_model(tiny["student"], None, CPU).eval()
    assert model.config._attn_implementation == "sdpa"
    items = _kd_items(model.config.vocab_size, [7, 19, 4, 12, 19, 1])
    padded, packed = collate(items, pad_id=0), collate_packed(items, row_length=row_length)
    assert packed["input_ids"].shape[0] == (1 if row_length is None else 4)

    ce_pad, kd_pad = _kd_forward(model, padded)
    (ce_pad + kd_pad).backward()
    grads_pad = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ce_pack, kd_pack = _kd_forward(model, packed)
    (ce_pack + kd_pack).backward()
    grads_pack = [p.grad.clone() for p in model.parameters()]

    assert ce_pack.item() == pytest.approx(ce_pad.item(), rel=1e-5)
    assert kd_pack.item() == pytest.approx(kd_pad.item(), rel=1e-5)
    worst = max((a - b).abs().max().item() / (a.abs().max().item() + 1e-12) for a, b in zip(grads_pad, grads_pack, strict=True))
    assert worst < 1e-4, worst

    with torch.no_grad():
        # Sensitivity: the same rows read as long sequences (attention and targets across boundaries) differ.
        leaky = {key: value for key, value in packed.items() if key != "position_ids"}
        ce_leaky, _ = _kd_forward(model, leaky)
    assert abs(ce_leaky.item() - ce_pack.item()) > 1e-3


def _sft_trainer(tiny: dict[str, str], dataset: str, out: Path, packing: bool, layout: str = "rows") -> Any:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from training.engine import sft

    cfg = {"max_steps": 1, "per_device_train_batch_size": 8, "max_length": 64, "packing": packing}
    spec = parse_spec(make_spec("sft", tiny["student"], [dataset], out, cfg))
    trainer, tokenizer = sft.build_trainer(Context(spec, Reporter(None, None, echo=False), pick_device(spec)))
    if layout == "one_row":
        # The layout the engine uses with flash attention: TRL's own padding-free collator, whole batch in one row.
        trainer.data_collator = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=True)
    return trainer


def _dataset_nll(trainer: Any, *, drop: tuple[str, ...] = ()) -> tuple[float, int]:
    """Summed next-token NLL over every labelled token of one epoch of the trainer's own batches."""
    model = trainer.model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in trainer.get_train_dataloader():
            labels = batch["labels"]
            inputs = {key: value for key, value in batch.items() if key not in ("labels", ROW_TOKENS) and key not in drop}
            logits = model(**inputs, use_cache=False).logits[:, :-1].float()
            targets = labels[:, 1:]
            nll = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum")
            total += nll.item()
            count += int((targets != -100).sum())
    return total, count


@pytest.mark.parametrize(("dataset", "layout"), [("sft", "rows"), ("sft_prompt_completion", "rows"), ("sft", "one_row")])
def test_packed_sft_batches_give_the_padded_per_token_loss(tiny, tmp_path: Path, dataset: str, layout: str) -> None:
    packed = _sft_trainer(tiny, tiny[dataset], tmp_path / "packed", packing=True, layout=layout)
    padded = _sft_trainer(tiny, tiny[dataset], tmp_path / "padded", packing=False)
    assert len(packed.train_dataset) < len(padded.train_dataset)  # rows were really packed together
    batch = next(iter(packed.get_train_dataloader()))
    assert "attention_mask" not in batch and "position_ids" in batch
    assert batch["input_ids"].shape[0] == (1 if layout == "one_row" else 8)
    assert int((batch["position_ids"] == 0).sum()) > batch["input_ids"].shape[0]  # several sequences per row
    assert batch["input_ids"].shape[1] <= (8 * 64 if layout == "one_row" else 64)

    nll_packed, n_packed = _dataset_nll(packed)
    nll_padded, n_padded = _dataset_nll(padded)
    # The same tokens carry loss (assistant-only / completion-only masks survive packing) ...
    assert n_packed == n_padded
    assert n_packed < sum(len(r["input_ids"]) for r in padded.train_dataset)  # the prompt really is masked
    # ... and each gets the same loss: no attention leaks across packed sequences.
    assert nll_packed / n_packed == pytest.approx(nll_padded / n_padded, rel=1e-5)
    leaky, _ = _dataset_nll(packed, drop=("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"))
    assert abs(leaky / n_packed - nll_packed / n_packed) > 1e-3


@pytest.mark.parametrize("packing", [True, False])
def test_sft_run_learns_with_and_without_packing(tiny, ingest: IngestStub, tmp_path: Path, packing: bool) -> None:
    cfg = {"max_steps": 12, "learning_rate": 5e-3, "per_device_train_batch_size": 4, "max_length": 64, "packing": packing}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, cfg, ingest)) == 0
    losses = ingest.series("loss")
    assert len(losses) == 12
    assert mean(losses[-3:]) < 0.8 * mean(losses[:3]), losses
    logs = ingest.collect("logs")
    assert any(f"packing={'on' if packing else 'off'}" in line for line in logs)
    assert any(line.startswith(EXPECTED_ATTENTION) for line in logs)


@pytest.mark.parametrize("packing", [True, False])
def test_distill_run_learns_with_and_without_packing(tiny, ingest: IngestStub, tmp_path: Path, packing: bool) -> None:
    dist = {"teacher_model": tiny["teacher"], "top_k": 16, "temperature": 1.0, "kd_weight": 0.5}
    cfg = {"max_steps": 12, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "packing": packing, "distillation": dist}
    assert run_inprocess(make_spec("distill", tiny["student"], [tiny["distill"]], tmp_path, cfg, ingest)) == 0
    kd = ingest.series("kd_loss")
    assert len(kd) == 12
    assert mean(kd[-3:]) < 0.8 * mean(kd[:3]), kd
    assert any(f"packing={'on' if packing else 'off'}" in line for line in ingest.collect("logs"))
