"""FP8 training (training/engine/fp8.py): the float8 linear layer's numbers, the in-place conversion of
a real model, and — on a CUDA GPU that has float8 (the device check) — an SFT run in fp8.

The layer's numbers are checked on the CPU, where torch has a reference float8 GEMM; the speed and
the CUDA GEMM's layout rules only exist on the GPU, which the last test and bench/engine_gpu.py cover.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from training.engine import fp8

from .conftest import IngestStub, make_spec, mean, run_inprocess


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.detach().float()).norm() / want.detach().float().norm())


def _pair(in_features: int = 128, out_features: int = 96, bias: bool = True) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(0)
    reference = nn.Linear(in_features, out_features, bias=bias)
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.load_state_dict(reference.state_dict())
    layer.__class__ = fp8.Fp8Linear
    return reference, layer


@pytest.mark.parametrize("tokens", [64, 37])  # 37: the weight gradient's unaligned inner size takes the bf16 GEMM
def test_fp8_linear_is_a_linear_to_float8_precision_forward_and_backward(tokens: int) -> None:
    reference, layer = _pair()
    x = torch.randn(2, tokens, 128) * 3
    x_ref, x_fp8 = x.clone().requires_grad_(), x.clone().requires_grad_()
    upstream = torch.randn(2, tokens, 96)

    (reference(x_ref) * upstream).sum().backward()
    y = layer(x_fp8)
    (y * upstream).sum().backward()

    assert y.shape == (2, tokens, 96) and y.dtype == torch.float32
    # e4m3 keeps 3 mantissa bits (≈ 6 % per element at worst); summed over 128 products the errors average out.
    assert _relative_error(y, reference(x)) < 0.05
    assert _relative_error(x_fp8.grad, x_ref.grad) < 0.08  # e5m2 gradients: 2 mantissa bits
    assert _relative_error(layer.weight.grad, reference.weight.grad) < 0.08
    assert torch.allclose(layer.bias.grad, reference.bias.grad, atol=1e-4)  # the bias add is not float8


def test_fp8_linear_keeps_the_outlier_scale_of_each_tensor() -> None:
    """One dynamic scale per tensor: inputs a thousand times larger (or smaller) lose no more precision."""
    reference, layer = _pair(bias=False)
    for magnitude in (1e-3, 1.0, 1e3):
        x = torch.randn(32, 128) * magnitude
        assert _relative_error(layer(x), reference(x)) < 0.05, magnitude


def test_every_gemm_keeps_the_cuda_layout_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's reference GEMM takes any layout; CUDA's wants the first operand row-major, the second
    column-major, and sizes in multiples of 16 (torch's own meta checks for a CUDA device). Check each
    call the layer makes against those rules, so a layout that only the GPU would refuse fails here."""
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    real = torch._scaled_mm

    def cuda_rules(a: torch.Tensor, b: torch.Tensor, **kwargs: object) -> torch.Tensor:
        assert a.stride(0) > a.stride(1) == 1, f"first operand not row-major: stride {a.stride()}"
        assert b.stride(0) == 1 and b.stride(1) > 1, f"second operand not column-major: stride {b.stride()}"
        assert a.shape[1] % 16 == 0 and b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0, (a.shape, b.shape)
        assert {a.dtype, b.dtype} != {fp8.E5M2}, "CUDA has no e5m2 x e5m2 GEMM"
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", cuda_rules)
    _, layer = _pair(128, 96)
    x = torch.randn(4, 16, 128, requires_grad=True)
    layer(x).sum().backward()
    assert calls == [((64, 128), (128, 96)), ((64, 96), (96, 128)), ((96, 64), (64, 128))]  # y, dx, dW


def test_a_frozen_weight_gets_no_gradient_and_costs_no_weight_gemm() -> None:
    _, layer = _pair()
    layer.weight.requires_grad_(False)
    x = torch.randn(16, 128, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None and x.grad is not None and torch.isfinite(x.grad).all()


def test_convert_switches_the_decoder_linears_in_place_and_leaves_the_head_and_keys(tiny) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny["student"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layers = model.config.num_hidden_layers

    assert fp8.convert(model) == 7 * layers  # q, k, v, o, gate, up, down in every layer
    assert type(model.get_output_embeddings()) is nn.Linear  # the head stays bf16
    assert type(model.model.layers[0].self_attn.q_proj) is fp8.Fp8Linear
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_unaligned_layers_stay_as_they_are() -> None:
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 40), nn.Linear(40, 32))
    assert fp8.convert(model) == 1  # only 64 → 48 has both sizes multiples of 16
    assert [type(m) for m in model] == [fp8.Fp8Linear, nn.Linear, nn.Linear]


def _lora_losses(student: str, convert: bool, steps: int = 20) -> tuple[list[float], object]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.engine.modeling import LORA_TARGETS

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(student)
    model = AutoModelForCausalLM.from_pretrained(student)
    if convert:
        fp8.convert(model)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    batch = tokenizer(["12 + 7 = 19", "3 + 30 = 33", "8 + 8 = 16", "21 + 2 = 23"] * 2, return_tensors="pt", padding=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model


def test_lora_over_a_converted_base_trains_like_the_plain_base(tiny) -> None:
    plain, _ = _lora_losses(tiny["student"], convert=False)
    losses, model = _lora_losses(tiny["student"], convert=True)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert type(q_proj.base_layer) is fp8.Fp8Linear and type(q_proj.lora_A["default"]) is nn.Linear  # adapters stay exact
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)

    assert losses[-1] < losses[0] * 0.85, losses
    # The same run in float8 follows the exact one: the loss curve stays within a few per cent of it.
    assert max(abs(a - b) / b for a, b in zip(losses, plain, strict=True)) < 0.05, (losses, plain)


def test_the_cpu_has_no_fp8_and_enable_says_so() -> None:
    lines: list[str] = []
    model = nn.Sequential(nn.Linear(64, 64))
    assert fp8.enable(model, "cpu", lines.append) is False
    assert type(model[0]) is nn.Linear
    assert lines == ["precision: fp8 off, training in bf16 (fp8 needs a CUDA GPU (this is cpu))"]


def _cuda_fp8() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= fp8.MIN_CAPABILITY


@pytest.mark.skipif(not _cuda_fp8(), reason="needs a CUDA GPU with float8 (compute capability 8.9+): the device check runs it")
def test_sft_in_fp8_on_the_gpu_converts_the_model_and_learns(tiny, ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_TEST_ACCELERATORS", os.environ.get("ENGINE_TEST_ACCELERATORS", "GPU:1"))
    cfg = {"max_steps": 20, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "precision": "fp8"}
    assert run_inprocess(make_spec("sft", tiny["student"], [tiny["sft"]], tmp_path, cfg, ingest)) == 0
    logs = "\n".join(ingest.collect("logs"))
    assert "precision: fp8 on 14 linear layers" in logs, logs[-2000:]
    losses = ingest.series("loss")
    assert 1 - mean(losses[-3:]) / mean(losses[:3]) >= 0.30, losses
