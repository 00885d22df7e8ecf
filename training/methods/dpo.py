from __future__ import annotations

from studio.errors import Finding
from training.methods.base import BOOL, Draft, Key, TrainingMethod, is_number, lora_enabled, shown
from training.refs import dataset_entries

LOSS_KEYS = {
    "type": Key("choice", choices=("dpo",)),
    "dpo_beta": Key("number", hint="a number > 0"),
    "reference_free": BOOL,
    "target_margin": Key("number", minimum=0),  # the engine refuses a negative margin (training/engine/spec.py)
    "length_norm": BOOL,
    "span_mask": BOOL,
}
DEFAULT_DPO_BETA = 0.1
# Seed 001: the batch is even. Left blank it was the engine's 1, which START let through while it refused
# an explicit 1; stored as a default, the run shows what it trains with and START checks that.
DEFAULT_DPO_BATCH = 2


def even_batch_options(batch: int) -> str:
    return " or ".join(str(option) for option in (batch + 1, batch - 1) if option >= 2)


def config_findings(config: dict) -> list[Finding]:
    """Seed 001's constraints that the run's config alone decides (LoRA, even batches, target_margin
    with reference_free) and dpo_beta's range. Each mirrors the trainer, so a run that breaks one can
    never train: one rule, two callers, create and PATCH (400) and START for a run stored before (422)."""
    loss = config.get("loss")
    loss = loss if isinstance(loss, dict) else {}
    findings = []
    if not lora_enabled(config):
        findings.append(Finding("config.lora_rank", "DPO scores each pair against the frozen base, so it needs LoRA: set lora_rank (e.g. 16). For a full fine-tune use SFT."))
    for key in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        batch = config.get(key)
        if isinstance(batch, int) and batch % 2:
            findings.append(Finding(f"config.{key}", f"a chosen/rejected pair is two rows, so the batch must be even: use {even_batch_options(batch)}"))
    if loss.get("target_margin") is not None and loss.get("reference_free") is not True:
        findings.append(Finding("config.loss.target_margin", "target_margin is defined on the reference-free score: also set reference_free: true, or remove target_margin"))
    beta = loss.get("dpo_beta")
    if beta is not None and not (is_number(beta) and beta > 0):
        findings.append(Finding("config.loss.dpo_beta", f"dpo_beta must be greater than 0 (e.g. 0.1), got {shown(beta)}"))
    return findings


class DPO(TrainingMethod):
    """SFT config plus a `loss: {type: dpo}` block over {prompt, chosen, rejected} rows."""

    name = "dpo"
    label = "DPO"
    trl_config = "DPOConfig"
    trl_aliases = {"beta": "loss.dpo_beta"}
    keys = {"loss": Key("block", block=LOSS_KEYS)}

    def create_findings(self, draft: Draft) -> list[Finding]:
        loss = draft.config.get("loss")
        if not isinstance(loss, dict) or loss.get("type") != "dpo":
            return [Finding("config.loss.type", 'DPO needs a loss block with type "dpo", e.g. {"loss": {"type": "dpo", "dpo_beta": 0.1}}')]
        return config_findings(draft.config)

    def apply_defaults(self, config: dict) -> dict:
        config = super().apply_defaults({"per_device_train_batch_size": DEFAULT_DPO_BATCH, **config})
        if isinstance(config.get("loss"), dict):
            config["loss"] = {"dpo_beta": DEFAULT_DPO_BETA, **config["loss"]}
        return config

    def start_findings(self, draft: Draft) -> list[Finding]:
        findings = config_findings(draft.config)  # again: create and PATCH refuse them, and a run stored before they did may hold one
        for index, entry in enumerate(dataset_entries(draft.dataset)):
            if entry.type not in (None, "preference"):
                findings.append(Finding(f"dataset[{index}].type", f'DPO reads preference rows: set type to "preference" or leave it out (got "{entry.type}")'))
        return findings
