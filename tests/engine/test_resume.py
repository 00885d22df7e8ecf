"""Resuming from a checkpoint restores optimizer, scheduler and RNG: the result equals an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from .conftest import make_spec, run_inprocess
from .test_dpo import DPO_CONFIG
from .test_grpo import GRPO_CONFIG

CASES = {
    # LoRA adapters: the frozen base is the DPO reference, so only the adapter moves.
    "dpo": ({**DPO_CONFIG, "max_steps": 4, "save_steps": 2, "loss": {"type": "dpo", "dpo_beta": 0.1}}, "dpo"),
    # GRPO also samples: equal weights need the generation RNG restored too.
    "grpo": ({**GRPO_CONFIG, "max_steps": 4, "save_steps": 2, "rollouts_per_prompt": 4}, None),
}


@pytest.mark.parametrize("method", sorted(CASES))
def test_lora_and_sampling_methods_resume_exactly(tiny, tmp_path: Path, method: str) -> None:
    config, data = CASES[method]
    datasets = [tiny[data]] if data else []
    full = tmp_path / "full"
    assert run_inprocess(make_spec(method, tiny["student"], datasets, full, config)) == 0
    resumed = tmp_path / "resumed"
    spec = make_spec(method, tiny["student"], datasets, resumed, config, resume_from=str(full / "checkpoint-2"))
    assert run_inprocess(spec) == 0
    name = "adapter/adapter_model.safetensors" if "lora_rank" in config else "final/model.safetensors"
    a, b = load_file(str(full / name)), load_file(str(resumed / name))
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-5, worst
    mid = load_file(str(full / "checkpoint-2" / Path(name).name))
    assert any((a[k] - mid[k]).abs().max().item() > 1e-4 for k in a)  # steps 3-4 really trained
