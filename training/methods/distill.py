from __future__ import annotations

from typing import Any

from studio.errors import Finding
from training.methods.base import BOOL, Draft, Key, TrainingMethod, is_number
from training.methods.sft import entry_type_findings

DEFAULTS = {"top_k": 64, "temperature": 1.0, "kd_weight": 0.5}
MAX_TOP_K = 1024
# The ranges are range_findings' (which checks them, defaults applied); a hint states them in the type error.
DISTILL_KEYS = {
    "teacher_model": Key("str"),
    "top_k": Key("int", hint=f"an integer from 1 to {MAX_TOP_K} (default 64)"),
    "temperature": Key("number", hint="a number greater than 0 (default 1.0)"),
    "kd_weight": Key("number", hint="a number ≥ 0 (default 0.5)"),
    "ce_weight": Key("number", hint="a number ≥ 0 (default 1 − kd_weight)"),
}


def top_k_finding(top_k: Any) -> Finding | None:
    """The one top_k rule: create's (and START's) finding, and NEW RUN's storage estimate shows it too."""
    if isinstance(top_k, int) and 1 <= top_k <= MAX_TOP_K:
        return None
    return Finding("config.distillation.top_k", f"top_k must be an integer from 1 to {MAX_TOP_K} (default 64), got {top_k}")


def zero_weights_findings(block: dict) -> list[Finding]:
    """The loss is kd_weight × KD + ce_weight × CE: with both 0 the run would train on nothing.
    `block` has its defaults applied (ce_weight 1 − kd_weight), so only both set to 0 are refused."""
    kd, ce = block.get("kd_weight"), block.get("ce_weight")
    if not (is_number(kd) and is_number(ce) and kd == 0 and ce == 0):
        return []
    why = ("kd_weight and ce_weight are both 0, so the loss is 0 and the run would train on nothing: give at least one "
           "a weight above 0 (kd_weight 1 with ce_weight 0 for pure distillation)")
    return [Finding("config.distillation.kd_weight", why), Finding("config.distillation.ce_weight", why)]


def range_findings(block: dict) -> list[Finding]:
    """The distillation block's value ranges, on the block with its defaults applied (ce_weight's
    follows kd_weight). One rule, two callers: create and PATCH (400), and START for stored runs (422)."""
    findings = []
    top_k = top_k_finding(block.get("top_k"))
    if top_k is not None:
        findings.append(top_k)
    temperature = block.get("temperature")
    if not (is_number(temperature) and temperature > 0):
        findings.append(Finding("config.distillation.temperature", f"temperature must be greater than 0 (default 1.0), got {temperature}"))
    kd = block.get("kd_weight")
    if not (is_number(kd) and kd >= 0):
        findings.append(Finding("config.distillation.kd_weight", f"kd_weight must be 0 or more (default 0.5), got {kd}"))
    ce = block.get("ce_weight")
    if ce is None:
        if is_number(kd) and kd > 1:
            findings.append(Finding("config.distillation.ce_weight", f"with kd_weight {kd} > 1 the default 1 − kd_weight is negative: set ce_weight (0 for pure distillation)"))
    elif not (is_number(ce) and ce >= 0):
        findings.append(Finding("config.distillation.ce_weight", f"ce_weight must be 0 or more, got {ce}"))
    return findings + zero_weights_findings(block)


class Distill(TrainingMethod):
    """SFT config plus a `distillation:` block naming the teacher; capture, then train."""

    name = "distill"
    label = "DISTILL"
    trl_config = "SFTConfig"
    keys = {"distillation": Key("block", block=DISTILL_KEYS), "packing": BOOL}

    def create_findings(self, draft: Draft) -> list[Finding]:
        block = draft.config.get("distillation")
        if not isinstance(block, dict) or not isinstance(block.get("teacher_model"), str) or not block["teacher_model"].strip():
            return [Finding("config.distillation.teacher_model", 'DISTILL needs a distillation block naming the teacher, e.g. {"distillation": {"teacher_model": "Qwen/Qwen3-1.7B"}}')]
        return range_findings(self.apply_defaults(draft.config)["distillation"])

    def apply_defaults(self, config: dict) -> dict:
        config = super().apply_defaults(config)
        block = config.get("distillation")
        if isinstance(block, dict):
            block = {**DEFAULTS, **block}
            kd = block["kd_weight"]
            # ce_weight defaults to 1 − kd_weight; above 1 there is no sensible default (start asks for it).
            if "ce_weight" not in block and is_number(kd) and 0 <= kd <= 1:
                block["ce_weight"] = round(1 - kd, 10)
            config["distillation"] = block
        return config

    def start_findings(self, draft: Draft) -> list[Finding]:
        # Create and PATCH refuse these (400); a run stored before they did may still hold one.
        block = draft.config.get("distillation")
        return range_findings(block if isinstance(block, dict) else {}) + entry_type_findings(draft, self.label)
