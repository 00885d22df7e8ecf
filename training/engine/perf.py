"""Speed-of-light figures: model FLOPs per token, the device's peak, MFU and GPU memory.

FLOPs follow the PaLM accounting (appendix B): a matmul over N weights costs 2N FLOPs per token
forward and 4N backward (2N for the activation gradient, 2N for the weight gradient, which a frozen
LoRA base skips), plus 4·L·d·s forward and 8·L·d·s backward for attention scores over a sequence
of s tokens (d = heads × head_dim). Rematerialised (checkpointed) forwards are not counted: MFU is
useful work per second, not work done.

Peaks are dense bf16 tensor-core TFLOP/s and HBM bandwidth per card, from the vendors' datasheets.
There is no MFU on the CPU: the figure would say nothing about what a GPU run costs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# (name fragment as torch.cuda.get_device_name reports it, dense bf16 TFLOP/s, HBM TB/s). First match wins,
# so the more specific names come first.
_PEAKS: list[tuple[str, float, float]] = [
    ("GB300", 2500.0, 8.0),
    ("B300", 2500.0, 8.0),
    ("GB200", 2500.0, 8.0),
    ("B200", 2250.0, 8.0),
    ("B100", 1750.0, 8.0),
    ("GH200", 989.0, 4.0),  # before "H200": "NVIDIA GH200 480GB" contains it
    ("H200", 989.0, 4.8),
    ("H100 NVL", 835.0, 3.9),
    ("H100 PCIe", 756.0, 2.0),
    ("H100", 989.0, 3.35),
    ("H800", 989.0, 3.35),
    ("H20", 148.0, 4.0),
    ("A100", 312.0, 2.0),
    ("A800", 312.0, 2.0),
    ("L40S", 362.0, 0.864),
    ("L40", 181.0, 0.864),
    ("L4", 121.0, 0.3),
    ("A10G", 70.0, 0.6),
    ("A10", 125.0, 0.6),
    ("A6000", 155.0, 0.768),
    ("RTX 4090", 165.0, 1.0),
    ("RTX 5090", 210.0, 1.8),
    ("T4", 65.0, 0.32),
    ("V100", 125.0, 0.9),
]


@dataclass(frozen=True)
class Peak:
    name: str
    tflops: float  # dense bf16
    tb_per_s: float  # HBM bandwidth


def device_peak(device_name: str | None = None) -> Peak | None:
    """The current CUDA device's peak, or None on the CPU and for cards not in the table.

    STUDIO_PEAK_TFLOPS (and STUDIO_PEAK_TBPS) override the table, for a card it does not know (or the CPU).
    """
    import torch

    override = os.environ.get("STUDIO_PEAK_TFLOPS")
    if device_name is None:
        if not torch.cuda.is_available():
            # The CPU has no table entry; an explicit override still gives it a figure (and tests a path).
            return Peak("cpu", float(override), float(os.environ.get("STUDIO_PEAK_TBPS") or 0.0)) if override else None
        device_name = torch.cuda.get_device_name()
    if override:
        return Peak(device_name, float(override), float(os.environ.get("STUDIO_PEAK_TBPS") or 0.0))
    upper = device_name.upper()
    for fragment, tflops, tbps in _PEAKS:
        if fragment.upper() in upper:
            return Peak(device_name, tflops, tbps)
    return None


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs from a model: its matmul weights and its attention size."""

    matmul_params: int  # Σ in×out over every Linear, the output projection included (tied or not)
    trainable_matmul_params: int
    layers: int
    attn_dim: int  # heads × head_dim

    # seq_len is a float: a batch of mixed lengths costs, per token, the token-weighted mean length Σs²/Σs.
    def train_flops_per_token(self, seq_len: float) -> float:
        n, t = self.matmul_params, self.trainable_matmul_params
        return 4.0 * n + 2.0 * t + 12.0 * self.layers * self.attn_dim * seq_len

    def forward_flops_per_token(self, seq_len: float) -> float:
        return 2.0 * self.matmul_params + 4.0 * self.layers * self.attn_dim * seq_len


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def shape_of(model: Any) -> Shape:
    """Count from the live module tree, so LoRA, 4-bit and tied heads are all counted as they run."""
    import torch

    total = trainable = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            size = int(module.in_features) * int(module.out_features)
            total += size
            if module.weight.requires_grad:
                trainable += size
    cfg = _text_config(model.config)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    head_dim = getattr(cfg, "head_dim", None) or (int(cfg.hidden_size) // max(heads, 1) if heads else 0)
    return Shape(total, trainable, layers, heads * int(head_dim))


def mfu(flops_per_token: float, tokens_per_s: float, peak: Peak | None) -> float | None:
    """Model FLOPs utilisation in percent of the card's dense bf16 peak; None without a peak."""
    if peak is None or peak.tflops <= 0 or tokens_per_s <= 0:
        return None
    return 100.0 * flops_per_token * tokens_per_s / (peak.tflops * 1e12)


def gpu_memory_gb() -> dict[str, float]:
    """Peak allocated and reserved GPU memory since the last reset, in GB; empty on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        "gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "gpu_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 3),
    }
