"""The GPU memory estimate a person sees before START (issue 8): on the NEW RUN form, beside the
Start button and from GET /api/training-runs/{id}/fit.

No rule of its own: the figures and the refusal come from the one fit check (training/validation.py
`fit_check`, over training/engine/fit.py), and whether activation checkpointing will be on is the
engine's own "auto" rule (fit.auto_checkpointing). This module only words the verdict and adds the
warning band: a run that fits only with checkpointing, or that fills more than TIGHT_SHARE of the
card, is "tight" — it starts, but with little room for the estimate being wrong.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from studio.errors import Finding
from training.compute import check_compute
from training.engine import fit
from training.methods import get_method
from training.methods.base import Draft
from training.validation import FitCheck, fit_check

# Above this share of the card a run that fits is still shown as a warning: the estimate is an
# estimate, and the allocator fragments (the refusal line itself is fit.FIT_SHARE, 90 %).
TIGHT_SHARE = 0.80

UNKNOWN_REASONS = {
    "cpu": "no GPU memory estimate: this run asks for the CPU",
    "generic_gpu": "no GPU memory estimate for a generic GPU:n: name the type (e.g. L4, H100:1) to see one",
    "unknown_gpu": "no GPU memory estimate: the Studio does not know how much memory a {gpu} has",
    "unknown_model": "no GPU memory estimate for this model: the Studio cannot read its config.json (an HF id it does not know, or a repo without one)",
}
ADAPTER_HINT = {"full": "a LoRA adapter (lora_rank), ", "lora": "QLoRA (load_in_4bit), "}
PHASES = {"capture": " during capture (the teacher alone, before the student trains)", "rollouts": " while generating rollouts"}


@dataclass(frozen=True)
class FitReport:
    """status: "fits" | "tight" | "too_big" | "unknown". The figures are per GPU, for the phase
    that sets the peak (`phase`), as the engine will run it (`checkpointing`)."""

    status: str
    message: str  # one sentence: the estimate and, when not plainly fitting, what it means / what to do
    total_gib: float | None = None
    gpu: str | None = None
    gpu_count: int = 0
    gpu_gib: float | None = None
    checkpointing: bool | None = None
    phase: str | None = None
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)  # part → GiB (fit.Estimate.parts)
    field: str | None = None  # the lever's field when too_big (the START 422's field)
    summary: str = ""  # "about 18.2 GiB of 24 GiB on one L4 (activation checkpointing on)"
    advice: str = ""  # when tight: why, and what leaves more room

    @property
    def labelled_breakdown(self) -> list[tuple[str, float]]:
        """(label, GiB) for the page's <details>, the parts that hold anything."""
        parts = sorted(self.breakdown.items(), key=lambda item: item[0] == "overhead")  # the fixed cost last
        return [(fit.PART_LABELS.get(key, key), gib) for key, gib in parts if gib >= 0.005]

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "total_gib": self.total_gib, "gpu": self.gpu, "gpu_count": self.gpu_count, "gpu_gib": self.gpu_gib,
                "checkpointing": self.checkpointing, "phase": self.phase, "breakdown": self.breakdown, "field": self.field,
                "message": self.message}


def fit_report(draft: Draft) -> FitReport:
    """The estimate for a draft (a run, or the NEW RUN form's values). Never raises for a config the
    validator would refuse: fit.py reads every number with the engine's default when it is unusable."""
    return report_of(fit_check(draft), draft.method, draft.config)


def form_fit_report(draft: Draft, config_box: list[Finding] | None = None) -> FitReport:
    """For the NEW RUN form while it is being filled in: its config has not been through
    validate_draft yet, so the types are checked first, and a value of the wrong type (a `.inf`
    max_length in the YAML box) gives "no estimate" and the field, never a 500. `config_box`: why
    the config box did not parse (forms.draft_of_values), which gives "no estimate" too."""
    if config_box:
        return FitReport("unknown", f"no GPU memory estimate until the config box is fixed: {config_box[0].message}", field=config_box[0].field)
    method = get_method(draft.method)
    findings = check_compute(draft.compute) + (method.check_types(draft.config) if method is not None else [])
    if findings:
        return FitReport("unknown", f"no GPU memory estimate until this is fixed: {findings[0].field}: {findings[0].message}", field=findings[0].field)
    return fit_report(draft)


def report_of(check: FitCheck, method: str, config: dict) -> FitReport:
    verdict = check.verdict
    if verdict is None:
        why = check.why or "unknown_model"
        return FitReport("unknown", UNKNOWN_REASONS[why].format(gpu=check.gpu), gpu=check.gpu, gpu_count=check.count, gpu_gib=check.card_gib)
    wanted = config.get("gradient_checkpointing", "auto")
    adapter = fit.adapter_of(config)
    card_bytes = verdict.card_bytes
    if verdict.status == "too_big":
        # The figure fit.check words its message with: without checkpointing only when it is forced off.
        checkpointing = wanted is not False
    elif verdict.status == "needs_checkpointing":
        checkpointing = True
    else:
        checkpointing = wanted if isinstance(wanted, bool) else fit.auto_checkpointing(verdict.without_checkpointing, card_bytes)
    shown = verdict.with_checkpointing if checkpointing else verdict.without_checkpointing
    gpu, card_gib = check.gpu or "GPU", check.card_gib
    where = f"on one {gpu}" if check.count <= 1 else f"on each of the {check.count} {gpu}s (each holds the whole model)"
    summary = (f"about {shown.gib:.1f} GiB of {card_gib:g} GiB {where}{PHASES.get(shown.phase, '')} "
               f"(activation checkpointing {'on' if checkpointing else 'off'})")
    base: dict[str, Any] = {"total_gib": round(shown.gib, 2), "gpu": check.gpu, "gpu_count": check.count, "gpu_gib": card_gib, "checkpointing": checkpointing,
            "phase": shown.phase, "breakdown": {key: round(value / fit.GIB, 2) for key, value in shown.parts.items() if value > 0}, "summary": summary}
    if verdict.status == "too_big":
        return FitReport("too_big", verdict.message or summary, field=verdict.field, **base)
    # Checkpointing that memory turned on (not the user's `true`) means it would not fit without it.
    lengths = "a shorter max_response_length, fewer rollouts_per_prompt" if method == "grpo" else "a shorter max_length, a smaller batch"
    room = f"{ADAPTER_HINT.get(adapter, '')}{lengths} or a bigger card leave more room"
    if checkpointing and wanted is not True:
        advice = f"tight: it fits only because activation checkpointing is on, which costs about a third more compute per step; {room}"
    elif shown.total > TIGHT_SHARE * card_bytes:
        advice = f"tight: over {TIGHT_SHARE:.0%} of the card, so an out-of-memory error is possible if the estimate is low; {room}"
    else:
        return FitReport("fits", summary, **base)
    return FitReport("tight", f"{summary} — {advice}", advice=advice, **base)
