"""The engine's side of the fit model (issue 8, Build 2 and 5): gradient checkpointing only when memory
needs it, and an `oom` failure that names the lever."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from training.engine import fit
from training.engine.common import StudioCallback

from .conftest import IngestStub, make_spec, run_inprocess

L4 = ("NVIDIA L4", 24 * fit.GIB)
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}


@pytest.fixture
def seven_b(tmp_path: Path) -> str:
    """A directory with only a 7B config.json: the decision reads the config, never the weights."""
    path = tmp_path / "qwen-7b"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(QWEN25_7B))
    return str(path)


def test_checkpointing_stays_off_on_the_cpu_even_when_asked(tiny) -> None:
    on, why = fit.decide_checkpointing("sft", {"gradient_checkpointing": True}, tiny["student"], None, "cpu")
    assert not on and "off on the CPU" in why and "applies to GPU runs" in why
    assert fit.decide_checkpointing("sft", {}, tiny["student"], None, "cpu")[0] is False


def test_true_and_false_force_it_on_the_gpu(tiny) -> None:
    assert fit.decide_checkpointing("sft", {"gradient_checkpointing": True}, tiny["student"], None, "cuda") == (True, "gradient checkpointing: on (config.gradient_checkpointing: true)")
    assert fit.decide_checkpointing("sft", {"gradient_checkpointing": False}, tiny["student"], None, "cuda")[0] is False


def test_auto_turns_it_on_only_when_the_estimate_needs_it(tiny, seven_b: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: the visible card is the one boundary faked; the shape comes from the real config.json.
    monkeypatch.setattr(fit, "visible_gpu", lambda: L4)
    on, why = fit.decide_checkpointing("sft", {"gradient_checkpointing": "auto"}, tiny["student"], None, "cuda")
    assert not on and "off (auto)" in why and "under 85% of the NVIDIA L4's 24.0 GiB" in why
    # LoRA of a 7B at 1024 tokens: ≈ 23 GiB without checkpointing, over 85% of an L4.
    on, why = fit.decide_checkpointing("sft", {"lora_rank": 16}, seven_b, None, "cuda")
    assert on and "on (auto)" in why and "over 85%" in why and re.search(r"about 2\d\.\d GiB per GPU", why)
    # QLoRA of the same 7B leaves room: no recomputation.
    assert fit.decide_checkpointing("sft", {"lora_rank": 16, "load_in_4bit": True}, seven_b, None, "cuda")[0] is False
    # An 8-way GRPO group of 2k-token rollouts needs it even with LoRA.
    assert fit.decide_checkpointing("grpo", {"lora_rank": 16}, seven_b, None, "cuda")[0] is True


def test_auto_without_a_readable_shape_keeps_memory_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "visible_gpu", lambda: L4)
    on, why = fit.decide_checkpointing("sft", {}, str(tmp_path / "no-such-model"), None, "cuda")
    assert on and "could not be estimated" in why


def test_out_of_memory_fails_with_code_oom_and_the_lever(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real CUDA OOM cannot happen on this CPU-only machine: raise torch's own OutOfMemoryError at the
    # narrowest boundary, the first training step's callback, and let the engine's error contract run.
    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 22.05 GiB of which 1.20 GiB is free. "
            "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        )

    monkeypatch.setattr(StudioCallback, "on_step_begin", out_of_memory)
    spec = make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, {"max_steps": 2, "max_length": 32}, ingest)
    assert run_inprocess(spec) == 1
    assert ingest.scalars("status") == ["running", "failed"]  # running as the engine started, failed at the first step
    error = ingest.scalars("error")[0]
    assert error["code"] == "oom"
    message = error["message"]
    assert message.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. Out of memory: ")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in message  # torch's allocator advice is not the lever
    # The lever, in the fit check's words, computed from this run's spec (a full fine-tune of the tiny model).
    assert "the fit estimate is about" in message and "train a LoRA adapter (set lora_rank: 16)" in message and "shrink max_length (now 32)" in message
    assert "gradient checkpointing: off on the CPU" in ingest.collect("logs")


def test_oom_advice_without_a_shape_still_names_the_levers() -> None:
    text = fit.oom_advice("grpo", {"lora_rank": 8}, None, card_bytes=None, gpu_name=None)
    assert "max_response_length" in text and "QLoRA" in text and "train a LoRA adapter" not in text  # it has one already


def test_oom_without_checkpointing_leads_with_turning_it_on(seven_b: str) -> None:
    shape = fit.shape_of_model(seven_b)
    text = fit.oom_advice("sft", {"lora_rank": 16}, shape, card_bytes=L4[1], gpu_name=L4[0], checkpointing=False)
    assert text.startswith("the fit estimate is about 2") and "an NVIDIA L4 has 24 GiB: turn on activation checkpointing (gradient_checkpointing: true)" in text
