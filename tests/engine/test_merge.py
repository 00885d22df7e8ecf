"""The merge of a LoRA checkpoint (the Studio's Merge) keeps the precision the run trained in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from training.engine.merge import main, merge_device


@pytest.mark.parametrize(("precision", "cuda", "dtype"), [
    ("fp32", True, torch.float32),  # an fp32 run merged on a GPU worker: fp32, not the GPU's bf16
    ("fp32", False, torch.float32),
    ("bf16", True, torch.bfloat16),
    ("bf16", False, torch.bfloat16),  # its weights stay bf16 wherever the merge runs
    ("fp8", True, torch.bfloat16),  # fp8 and nvfp4 compute over bf16 weights
    ("nvfp4", True, torch.bfloat16),
    (None, True, torch.bfloat16),  # a caller that does not say: as the engine trains a run that does not say
    (None, False, torch.float32),
])
def test_the_merge_loads_the_base_in_the_precision_the_run_trained_in(precision: str | None, cuda: bool, dtype: torch.dtype) -> None:
    device = merge_device(precision, cuda)
    assert device.torch_dtype == dtype
    assert device.kind == ("cuda" if cuda else "cpu")


def _adapter(student: str, folder: Path) -> Path:
    """A rank-4 adapter over the tiny student whose B is not zero, so merging it changes the weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32), LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    model.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_a_merge_saves_the_base_plus_adapter_in_the_runs_precision(tiny: Any, tmp_path: Path, precision: str, dtype: torch.dtype) -> None:
    adapter = _adapter(tiny["student"], tmp_path / "adapter")
    out = tmp_path / "merged"
    assert main(["--base", tiny["student"], "--adapter", str(adapter), "--out", str(out), "--precision", precision]) == 0
    merged = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in merged.values()} == {dtype}
    if precision == "fp32":  # exactly the base plus B·A, in fp32
        base, lora = load_file(str(Path(tiny["student"]) / "model.safetensors")), load_file(str(adapter / "adapter_model.safetensors"))
        key = "model.layers.0.self_attn.q_proj.weight"
        a = lora["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
        b = lora["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
        assert torch.allclose(merged[key], base[key] + b @ a, atol=1e-6)
        assert not torch.equal(merged[key], base[key])
