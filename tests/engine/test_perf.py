"""Speed-of-light figures: FLOP counts from the live model, device peaks, MFU, and the per-step metrics."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from training.engine import perf
from training.engine.common import Context, StepCounts, StudioCallback, batch_counts, sequence_lengths
from training.engine.distill import collate_packed
from training.engine.modeling import Device, pick_device
from training.engine.reporter import Reporter
from training.engine.sft import build_trainer, collate_packed_rows, counted_one_row
from training.engine.spec import parse_spec

from .conftest import ON_GPU, IngestStub, make_spec, run_inprocess

SFT = {"learning_rate": 5e-3, "max_length": 64}


def load_student(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def hand_count(cfg: Any) -> tuple[int, int, int]:
    """Σ in×out over the Llama block's seven projections and the output head, from config.json alone."""
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    head_dim = h // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * head_dim
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * inter  # q, k+v, o, gate+up+down
    return layers * per_layer + h * cfg.vocab_size, per_layer, kv


def test_shape_of_the_tiny_model_matches_a_hand_count(tiny) -> None:
    model = load_student(tiny["student"])
    cfg = model.config
    total, _, _ = hand_count(cfg)
    shape = perf.shape_of(model)
    assert shape.matmul_params == total
    assert shape.trainable_matmul_params == total  # a full fine-tune trains every matmul
    assert shape.layers == 2 and shape.attn_dim == cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads) == 64


def test_shape_of_a_lora_model_trains_only_the_adapters(tiny) -> None:
    from peft import LoraConfig, get_peft_model

    from training.engine.modeling import LORA_TARGETS

    base = load_student(tiny["student"])
    total, _, kv = hand_count(base.config)
    h, inter, r = base.config.hidden_size, base.config.intermediate_size, 8
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    # Each adapted projection in→out adds A (in×r) and B (r×out): r·(in + out).
    adapters = base.config.num_hidden_layers * r * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + inter))
    shape = perf.shape_of(model)
    assert shape.trainable_matmul_params == adapters
    assert shape.matmul_params == total + adapters


def test_flops_per_token_formulas() -> None:
    shape = perf.Shape(matmul_params=1000, trainable_matmul_params=10, layers=2, attn_dim=8)
    # forward 2N + backward 2N (activations) + 2T (weight grads of what trains) + attention 12·L·d·s
    assert shape.train_flops_per_token(16) == 4 * 1000 + 2 * 10 + 12 * 2 * 8 * 16
    assert shape.forward_flops_per_token(16) == 2 * 1000 + 4 * 2 * 8 * 16
    full = perf.Shape(1000, 1000, 2, 8)
    assert full.train_flops_per_token(16) == 3 * full.forward_flops_per_token(16)  # the classic 6N rule


def test_mfu_arithmetic() -> None:
    peak = perf.Peak("x", 100.0, 1.0)
    assert perf.mfu(2e9, 10_000, peak) == pytest.approx(100 * 2e13 / 1e14)  # 20 %
    assert perf.mfu(2e9, 10_000, None) is None
    assert perf.mfu(2e9, 0, peak) is None
    assert perf.mfu(2e9, 10_000, perf.Peak("x", 0.0, 0.0)) is None


@pytest.mark.parametrize(
    ("name", "tflops"),
    [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0),
     ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10G", 70.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA B200", 2250.0)],
)
def test_device_peak_by_card_name(name: str, tflops: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUDIO_PEAK_TFLOPS", raising=False)
    peak = perf.device_peak(name)
    assert peak is not None and peak.tflops == tflops and peak.name == name


def test_gh200_is_not_taken_for_an_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUDIO_PEAK_TFLOPS", raising=False)
    assert perf.device_peak("NVIDIA GH200 480GB").tb_per_s == 4.0  # type: ignore[union-attr]
    assert perf.device_peak("NVIDIA H200").tb_per_s == 4.8  # type: ignore[union-attr]


def test_unknown_card_and_cpu_have_no_peak_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUDIO_PEAK_TFLOPS", raising=False)
    assert perf.device_peak("Imaginary Accelerator 9000") is None
    assert perf.device_peak("cpu") is None
    if not torch.cuda.is_available():
        assert perf.device_peak() is None
        assert perf.gpu_memory_gb() == {}
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", "2.5")
    assert perf.device_peak("cpu") == perf.Peak("cpu", 2.5, 0.0)
    assert perf.device_peak("Imaginary Accelerator 9000").tflops == 2.5  # type: ignore[union-attr]
    if not torch.cuda.is_available():
        assert perf.device_peak() == perf.Peak("cpu", 2.5, 0.0)


# ---- counting tokens and sequences --------------------------------------------------------------


def counts(inputs: dict[str, torch.Tensor]) -> list[int]:
    c = batch_counts(inputs)
    assert c is not None
    return c.tolist()


def test_padded_rows_count_real_tokens_and_one_sequence_per_row() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert counts({"input_ids": torch.zeros_like(mask), "attention_mask": mask}) == [7, 2, 9 + 16]
    assert StepCounts(7, 2, 25).attention_len == pytest.approx(25 / 7)


def test_packed_rows_count_sequences_at_position_resets() -> None:
    # TRL's padding-free collator: one row, no attention mask, positions restart per sequence.
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert sorted(x for x in sequence_lengths({"input_ids": torch.zeros_like(positions), "position_ids": positions}).tolist() if x) == [2, 3, 4]
    assert counts({"input_ids": torch.zeros_like(positions), "position_ids": positions}) == [9, 3, 9 + 4 + 16]


def test_packed_rows_with_a_mask_ignore_padding() -> None:
    positions = torch.tensor([[0, 1, 0, 1, 2, 0], [1, 1, 0, 1, 0, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])  # right padding, then left padding
    assert counts({"input_ids": torch.zeros_like(mask), "attention_mask": mask, "position_ids": positions}) == [9, 4, 4 + 9 + 4 + 4]


def test_a_packed_row_s_padding_tail_is_no_token_and_no_sequence() -> None:
    # SFT's packed rows for SDPA: [batch, longest row], each shorter row ending in a tail (positions from 0).
    examples = [{"input_ids": [5] * 6, "seq_lengths": [2, 4]}, {"input_ids": [5] * 3, "seq_lengths": [3]}]
    batch = collate_packed_rows(examples, pad_id=0)
    assert batch["position_ids"].tolist()[1] == [0, 1, 2, 0, 1, 2]  # the second row's tail: 3 padding tokens
    assert counts(batch) == [9, 3, 4 + 16 + 9]
    # DISTILL's packed rows of at most row_length tokens, the same way.
    item = {"input_ids": torch.zeros(1, dtype=torch.long), "loss_mask": torch.ones(1), "kd_ids": torch.zeros(1, 2), "kd_logprobs": torch.zeros(1, 2)}
    rows = collate_packed([{k: v.repeat(n, *([1] * (v.dim() - 1))) for k, v in item.items()} for n in (4, 5, 2)], row_length=7)
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 0]]
    assert counts(rows) == [11, 3, 16 + 4 + 25]


def test_the_flash_row_s_pad_to_multiple_of_tail_is_no_token_and_no_sequence() -> None:
    # TRL's one padding-free row (the flash layout) pads to pad_to_multiple_of with position 0 at each
    # padding token: bare, each of those 5 read as a sequence of 1 token.
    trl_collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=8)
    examples = [{"input_ids": [5] * 6, "seq_lengths": [2, 4]}, {"input_ids": [5] * 5, "seq_lengths": [5]}]
    assert counts(trl_collate(examples)) == [16, 8, 4 + 16 + 25 + 5]
    batch = counted_one_row(trl_collate, examples)
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0]]
    assert counts(batch) == [11, 3, 4 + 16 + 25]


def test_grpo_rows_are_prompt_plus_completion() -> None:
    prompt = torch.tensor([[0, 1, 1], [1, 1, 1]])
    completion = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert counts({"prompt_ids": prompt, "prompt_mask": prompt, "completion_ids": completion, "completion_mask": completion}) == [11, 2, 16 + 49]


# ---- the callback's arithmetic ------------------------------------------------------------------


class FakeReporter:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.progressed: list[dict[str, Any]] = []
        self.superseded = SimpleNamespace(is_set=lambda: False)

    def metric(self, step: int, key: str, value: float) -> None:
        self.metrics[key] = value

    def progress(self, progress: dict[str, Any]) -> None:
        self.progressed.append(progress)

    def log(self, line: str) -> None:
        pass

    def status(self, status: str) -> None:
        pass


class FakeTrainer:
    """Counts one step of 3 sequences of lengths 10, 20, 30 (60 tokens)."""

    def __init__(self) -> None:
        self.tokens_seen = 0
        self.pending: StepCounts | None = None

    def take_step_counts(self) -> StepCounts:
        step, self.pending = self.pending or StepCounts(), None
        self.tokens_seen += step.tokens
        return step


def test_callback_reports_mfu_from_the_step_s_tokens_and_lengths(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", "0.001")
    reporter, trainer = FakeReporter(), FakeTrainer()
    ctx = Context(spec=None, reporter=reporter, device=Device("cpu", False, "fp32"))  # type: ignore[arg-type]
    callback = StudioCallback(ctx, [trainer])
    model = load_student(tiny["student"])
    state = SimpleNamespace(global_step=0, max_steps=10)
    callback.on_train_begin(None, state, None, model=model)
    callback.on_step_begin(None, state, None)
    trainer.pending = StepCounts(60, 3, 100 + 400 + 900)
    state.global_step = 1
    callback.on_step_end(None, state, None)
    tps = reporter.metrics["tokens_per_s"]
    flops = perf.shape_of(model).train_flops_per_token(1400 / 60)  # Σs²/Σs, not the plain mean 20
    assert reporter.metrics["mfu"] == pytest.approx(100 * flops * tps / 1e9, rel=1e-12)
    assert reporter.progressed[-1]["mfu"] == round(reporter.metrics["mfu"], 2)
    assert "gpu_memory_gb" not in reporter.metrics and "gpu_memory_gb" not in reporter.progressed[-1]


# ---- an engine run --------------------------------------------------------------------------------


def test_sft_run_with_a_peak_reports_mfu_every_step(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peak_tflops = 0.05
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", str(peak_tflops))
    # The whole 64-row dataset in every step: each step sees the same sequences, so the same FLOPs per token.
    cfg = {**SFT, "max_steps": 3, "per_device_train_batch_size": 64}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, cfg, ingest)) == 0
    metrics = ingest.metrics()
    assert [s for s, _ in sorted(metrics["mfu"])] == [1, 2, 3]
    tps = dict(metrics["tokens_per_s"])
    shape = perf.shape_of(load_student(tiny["student"]))
    implied_lengths = []
    for step, value in metrics["mfu"]:
        assert value > 0
        flops = value / 100 * peak_tflops * 1e12 / tps[step]
        # Undo train_flops_per_token: the attention length it was priced at.
        implied_lengths.append((flops - 4 * shape.matmul_params - 2 * shape.trainable_matmul_params) / (12 * shape.layers * shape.attn_dim))
    assert all(4 <= s <= cfg["max_length"] for s in implied_lengths), implied_lengths
    assert max(implied_lengths) - min(implied_lengths) < 1e-6 * max(implied_lengths), implied_lengths
    progress = ingest.scalars("progress")[-1]
    assert progress["mfu"] == round(dict(metrics["mfu"])[3], 2)
    # The CPU has no GPU memory; a GPU reports its own every step.
    assert ("gpu_memory_gb" in progress) == ("gpu_memory_gb" in metrics) == ON_GPU


def test_packed_sft_run_counts_real_tokens_and_documents_not_the_rows_padding(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peak_tflops = 0.05
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", str(peak_tflops))
    # Every packed row in each step's batch: each step sees the same documents and the same padding tails.
    cfg = {**SFT, "max_steps": 2, "per_device_train_batch_size": 64, "packing": True}
    spec = make_spec("sft", tiny["student"], [tiny["sft_text"]], tmp_path / "run", cfg, ingest)
    parsed = parse_spec(make_spec("sft", tiny["student"], [tiny["sft_text"]], tmp_path / "rows", cfg))
    rows = build_trainer(Context(parsed, Reporter(None, None, echo=False), pick_device(parsed)))[0].train_dataset
    widths = [len(r["input_ids"]) for r in rows]
    documents = [n for r in rows for n in r["seq_lengths"]]
    assert len(rows) < 64 and min(widths) < max(widths)  # one batch of rows, the shorter ones ending in a padding tail
    real, padded = sum(widths), len(rows) * max(widths)
    assert real == sum(documents) < padded

    assert run_inprocess(spec) == 0
    metrics = ingest.metrics()
    tps, step_time = dict(metrics["tokens_per_s"]), dict(metrics["step_time_s"])
    assert {step: round(tps[step] * step_time[step]) for step in tps} == {1: real, 2: real}
    assert dict(metrics["num_tokens"])[2] == 2 * real
    # MFU priced each document's attention (Σ length² over documents), not the rows' tails.
    shape = perf.shape_of(load_student(tiny["student"]))
    for step, value in metrics["mfu"]:
        flops = value / 100 * peak_tflops * 1e12 / tps[step]
        implied = (flops - 4 * shape.matmul_params - 2 * shape.trainable_matmul_params) / (12 * shape.layers * shape.attn_dim)
        assert implied == pytest.approx(sum(n * n for n in documents) / real, rel=1e-6)


@pytest.mark.skipif(ON_GPU, reason="a GPU always has a peak: the H200 is in the table")
def test_sft_run_without_a_peak_reports_no_mfu_and_no_gpu_memory(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STUDIO_PEAK_TFLOPS", raising=False)
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {**SFT, "max_steps": 2, "per_device_train_batch_size": 8}, ingest)) == 0
    metrics = ingest.metrics()
    assert len(metrics["tokens_per_s"]) == 2
    assert not {"mfu", "gpu_memory_gb", "gpu_reserved_gb"} & set(metrics)
    for progress in ingest.scalars("progress"):
        assert "mfu" not in progress and "gpu_memory_gb" not in progress


def test_grpo_run_prices_its_training_tokens(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", "0.05")
    cfg = {"max_steps": 2, "learning_rate": 1e-2, "rollouts_per_prompt": 4, "max_response_length": 4, "environment_id": "builtin/arith@main"}
    assert run_inprocess(make_spec("grpo", tiny["student"], [], tmp_path, cfg, ingest)) == 0
    metrics = ingest.metrics()
    assert [s for s, _ in sorted(metrics["mfu"])] == [1, 2]
    assert all(v > 0 for _, v in metrics["mfu"]) and all(v > 0 for _, v in metrics["tokens_per_s"])
