"""What a run saves loads outside Studio with plain transformers and peft: every saved step holds the
tokenizer, a full model's config.json keeps the base's use_cache (training turns it off), and a LoRA
adapter names the base it trained over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import make_spec, run_inprocess
from .test_distill import DISTILL_CONFIG
from .test_dpo import DPO_CONFIG
from .test_grpo import GRPO_CONFIG
from .test_sft import SFT_CONFIG

TWO_STEPS = {"max_steps": 2, "save_steps": 2}
DISTILL = {**DISTILL_CONFIG, **TWO_STEPS, "distillation": {"teacher_model": None, "top_k": 8}}

# case: (method, config, dataset key)
CASES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "sft-full": ("sft", {**SFT_CONFIG, **TWO_STEPS}, "sft"),
    "dpo-lora": ("dpo", {**DPO_CONFIG, **TWO_STEPS, "per_device_train_batch_size": 4, "loss": {"type": "dpo", "dpo_beta": 0.1}}, "dpo"),
    "grpo-full": ("grpo", {**GRPO_CONFIG, **TWO_STEPS, "rollouts_per_prompt": 4}, None),
    "distill-full": ("distill", DISTILL, "distill"),
    "distill-lora": ("distill", {**DISTILL, "lora_rank": 4}, "distill"),
}


def config_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_step_loads_with_its_tokenizer_and_a_full_model_keeps_the_bases_kv_cache(tiny, tmp_path: Path, case: str) -> None:
    from transformers import AutoTokenizer

    method, config, data = CASES[case]
    if method == "distill":
        config = {**config, "distillation": {**config["distillation"], "teacher_model": tiny["teacher"]}}
    out = tmp_path / "out"
    assert run_inprocess(make_spec(method, tiny["student"], [tiny[data]] if data else [], out, config)) == 0
    base = Path(tiny["student"])
    step = out / "checkpoint-2"

    # DISTILL's steps had no tokenizer files: "Couldn't instantiate the backend tokenizer" (Try it on the step, too).
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (step / name).is_file(), sorted(p.name for p in step.iterdir())
    tokenizer = AutoTokenizer.from_pretrained(str(step))
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(str(base)).get_vocab()
    assert tokenizer.chat_template and tokenizer.chat_template == AutoTokenizer.from_pretrained(str(base)).chat_template

    assert config_of(base)["use_cache"] is True
    if "lora_rank" in config:
        adapter = json.loads((step / "adapter_config.json").read_text())
        # A local folder base: the path is all there is to name, and no revision.
        assert adapter["base_model_name_or_path"] == str(base) and adapter["revision"] is None
        assert config_of(out / "merged")["use_cache"] is True
    else:
        # Training turns the KV cache off; the saved weights are served with the base's setting.
        assert config_of(step)["use_cache"] is True
        assert config_of(out / "final")["use_cache"] is True
