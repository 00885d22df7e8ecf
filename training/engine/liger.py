"""When liger kernels may run: the one rule, shared by Studio's validation and the engine.

Seed 002: liger is single-GPU only, cannot be combined with use_unsloth, has no kernels for
GPT-NeoX/Pythia, and computes wrong log-probs on Gemma 2, Cohere and Granite. We refuse the wrong-log-prob
families rather than warn: the run would finish and look healthy while training on wrong numbers, and
liger is only an optimisation, so turning it off costs the user nothing but speed.

This module imports no torch at import time: the web process imports it for validation.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import Any

# model_type (config.json) → (family as users name it, why, markers in a hub id that name the family).
REFUSED_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpt_neox": ("GPT-NeoX/Pythia", "liger has no kernels for it", ("pythia", "gpt-neox", "gpt_neox", "neox")),
    "gemma2": ("Gemma 2", "liger computes wrong log-probs on it", ("gemma-2", "gemma2", "gemma_2")),
    "cohere": ("Cohere", "liger computes wrong log-probs on it", ("cohere", "command-r", "c4ai", "aya-")),
    "cohere2": ("Cohere", "liger computes wrong log-probs on it", ()),
    "granite": ("Granite", "liger computes wrong log-probs on it", ("granite",)),
    "granitemoe": ("Granite", "liger computes wrong log-probs on it", ()),
    "granitemoeshared": ("Granite", "liger computes wrong log-probs on it", ()),
    "granitemoehybrid": ("Granite", "liger computes wrong log-probs on it", ()),
}


def refusal(model_type: str | None = None, model_name: str | None = None) -> str | None:
    """Why liger must not run on this model (a sentence), or None. The model type wins when known;
    otherwise the hub id / path is matched against the family markers."""
    if model_type:
        hit = REFUSED_FAMILIES.get(model_type.lower())
        return f"{hit[1]} ({hit[0]} models)" if hit else None
    name = (model_name or "").lower()
    for family, why, markers in REFUSED_FAMILIES.values():
        if any(m in name for m in markers):
            return f"{why} ({family} models)"
    return None


def _model_type(base_model: str, revision: str | None) -> str | None:
    try:
        from transformers import AutoConfig

        from .modeling import _split_ref

        name, rev = _split_ref(base_model, revision)
        return str(AutoConfig.from_pretrained(name, revision=rev).model_type)
    except Exception:  # noqa: BLE001 - an unreadable config means "unknown": the caller turns liger off
        return None


def engine_choice(spec: Any, device_kind: str) -> tuple[bool, str]:
    """(use liger?, one line saying why) for a run that asked for `use_liger`.

    Capability decides, never a crash: off without CUDA, without the liger_kernel package, with more than
    one training process, or on a model type liger does not patch (or patches wrongly)."""
    if device_kind != "cuda":  # before reading the model's config: the CPU answer needs no file
        return choice(None, spec.base_model, device_kind)
    return choice(_model_type(spec.base_model, spec.base_model_revision), spec.base_model, device_kind)


def choice(model_type: str | None, model_name: str, device_kind: str) -> tuple[bool, str]:
    """engine_choice for a model whose type is known (a DISTILL teacher already loaded, say)."""
    if device_kind != "cuda":
        return False, "liger: off (no CUDA device; liger's kernels are GPU-only)"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False, "liger: off (liger kernels are single-GPU and this run has several processes)"
    if importlib.util.find_spec("liger_kernel") is None:
        return False, "liger: off (the liger_kernel package is not installed in this image; see requirements-gpu.txt)"
    why = refusal(model_type, model_name)
    if why:
        return False, f"liger: off ({why})"
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception as exc:  # noqa: BLE001 - a broken install (triton mismatch) must not fail the run
        return False, f"liger: off (liger_kernel failed to import: {type(exc).__name__}: {exc})"
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return False, f"liger: off (liger has no kernels for model type {model_type!r})"
    return True, f"liger: on (model type {model_type})"


def fuse_for_inference(model: Any, device_kind: str) -> tuple[bool, str]:
    """liger's fused RMSNorm, SwiGLU and RoPE kernels in a loaded model's forward (a DISTILL teacher's
    capture), where `choice` allows them; never its fused cross-entropy, so the forward still returns
    logits. (applied?, one line saying why)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    on, why = choice(model_type, str(getattr(getattr(model, "config", None), "_name_or_path", "")), device_kind)
    if not on:
        return False, why
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    apply = MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]
    wanted = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False, "fused_linear_cross_entropy": False}
    accepted = inspect.signature(apply).parameters
    apply(model=model, **{k: v for k, v in wanted.items() if k in accepted})
    return True, why
