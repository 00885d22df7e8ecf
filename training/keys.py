"""Typed config keys: each knows how to check a value and say what is wrong with it."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from studio.errors import Finding
from training.engine.spec import EVAL_SPLIT_MAX


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# What YAML (the NEW RUN form's config box) can produce that JSON cannot store: say what it is.
NON_JSON_KINDS = {"date": "a date", "datetime": "a date and time", "time": "a time", "bytes": "binary data", "set": "a set", "tuple": "a tuple"}


def json_findings(path: str, value: Any) -> list[Finding]:
    """Everything in `value` that a JSON column cannot hold: NaN and infinities (Python's json reads
    them, PostgreSQL and SQLite refuse them), and the dates, binary and sets YAML can produce."""
    if isinstance(value, float) and not math.isfinite(value):
        return [Finding(path, f"must be a finite number, got {value}: JSON has no NaN or infinity")]
    if value is None or isinstance(value, (str, int, float, bool)):
        return []
    if isinstance(value, dict):
        findings: list[Finding] = []
        for key, item in value.items():
            if not isinstance(key, str):
                findings.append(Finding(f"{path}.{key}", "setting names must be text: put the name in quotes"))
            else:
                findings.extend(json_findings(f"{path}.{key}", item))
        return findings
    if isinstance(value, list):
        return [f for i, item in enumerate(value) for f in json_findings(f"{path}[{i}]", item)]
    kind = NON_JSON_KINDS.get(type(value).__name__, f"a {type(value).__name__}")
    return [Finding(path, f"must be text, a number, true/false, a list or an object, but this is {kind}: put it in quotes if it is text")]


def limit(bound: float) -> str:
    """A bound as a message states it, exactly: 4194304, not :g's 4.1943e+06 (which reads as 4194300)."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def shown(value: Any) -> str:
    """A value as a message quotes it: JSON, cut short."""
    return json.dumps(value, default=str)[:60]


@dataclass(frozen=True)
class Key:
    """The type of one config value. Ranges that the seeds tie to START are checked there instead."""

    kind: str  # int | number | bool | auto_bool | str | choice | block | ref | any
    minimum: float | None = None
    maximum: float | None = None  # a bound against absurd values (the run would never end, or overflow), not a seed limit
    choices: tuple[str, ...] = ()
    block: dict[str, Key] | None = None
    nullable: bool = False
    hint: str = ""
    positive: bool = False  # minimum is exclusive: 0 itself is refused (a learning rate, an epoch count)

    def check(self, path: str, value: Any) -> list[Finding]:
        if value is None:
            return [] if self.nullable or self.kind == "any" else [Finding(path, f"must not be null: {self.describe()}")]
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": is_number(value),
            "bool": isinstance(value, bool),
            "auto_bool": isinstance(value, bool) or value == "auto",
            "str": isinstance(value, str) and value.strip() != "",
            "choice": isinstance(value, str) and value.lower() in self.choices,
            "block": isinstance(value, dict),
            "ref": isinstance(value, (str, dict)),
            "any": True,
        }[self.kind]
        if not ok:
            return [Finding(path, f"must be {self.describe()}, got {shown(value)}")]
        if isinstance(value, float) and not math.isfinite(value):
            return [Finding(path, f"must be a finite number, got {value}")]
        if self.positive and value <= 0:
            return [Finding(path, f"must be greater than 0, got {value}: {self.describe()}")]
        if self.minimum is not None and value < self.minimum:
            return [Finding(path, f"must be at least {limit(self.minimum)}, got {value}")]
        if self.maximum is not None and value > self.maximum:
            return [Finding(path, f"must be at most {limit(self.maximum)}, got {shown(value)}")]
        if self.kind == "block" and self.block is not None:
            return check_block(path, value, self.block)
        return []

    def normalised(self, value: Any) -> Any:
        """`value` as it is stored, once check() passed: a choice in lower case (check() takes any
        case, and the rules and the engine compare lower case), inside blocks too."""
        if self.kind == "choice" and isinstance(value, str):
            return value.lower()
        if self.kind == "block" and self.block is not None and isinstance(value, dict):
            return normalise_block(value, self.block)
        return value

    def describe(self) -> str:
        if self.hint:
            return self.hint
        return {
            "int": "an integer" + self._range(),
            "number": "a number" + self._range(),
            "bool": "true or false",
            "auto_bool": 'true, false or "auto"',
            "str": "a non-empty string",
            "choice": "one of " + ", ".join(self.choices),
            "block": "an object",
            "ref": "a dataset ref (\"repo@ref\" or an HF id)",
            "any": "any value",
        }[self.kind]

    def _range(self) -> str:
        if self.positive:  # the minimum itself is refused
            low = f" greater than {limit(self.minimum or 0)}"
            return low + (f" and at most {limit(self.maximum)}" if self.maximum is not None else "")
        if self.minimum is not None and self.maximum is not None:
            return f" from {limit(self.minimum)} to {limit(self.maximum)}"
        if self.minimum is not None:
            return f" ≥ {limit(self.minimum)}"
        return f" ≤ {limit(self.maximum)}" if self.maximum is not None else ""


def check_block(path: str, value: dict, keys: dict[str, Key]) -> list[Finding]:
    findings: list[Finding] = []
    for name, item in value.items():
        if name not in keys:
            findings.append(Finding(f"{path}.{name}", f"unknown setting; known: {', '.join(sorted(keys))}"))
        else:
            findings.extend(keys[name].check(f"{path}.{name}", item))
    return findings


def normalise_block(value: dict, keys: dict[str, Key]) -> dict:
    """A checked block with each known value as it is stored (Key.normalised)."""
    return {name: keys[name].normalised(item) if name in keys else item for name, item in value.items()}


INT1 = Key("int", minimum=1)
INT0 = Key("int", minimum=0)
NON_NEGATIVE = Key("number", minimum=0)  # "a number ≥ 0": 0 is allowed (kl_coef's default, no penalty)
BOOL = Key("bool")
TEXT = Key("str", nullable=True)
PRECISIONS = ("bf16", "fp32", "fp8", "nvfp4")  # the engine's (training/engine/spec.py): fp16 trains nowhere here

# Held-out evaluation (SFT and DPO; GRPO and DISTILL refuse them at START: training.validation.eval_findings).
EVAL_KEYS: dict[str, Key] = {
    # Rows to evaluate on, in the forms of the run's `dataset` (a ref, {ref, type}, or a list of them):
    # checked row by row, pinned at START and read by the engine as the dataset is.
    "eval_dataset": Key("any", nullable=True, hint="a dataset in the forms of `dataset`: repo@ref, an HF id, a local path, {ref, type} or a list of them"),
    # The fraction of the training rows held out instead, drawn with the run's seed before packing.
    "eval_split": Key("number", minimum=0, positive=True, maximum=EVAL_SPLIT_MAX, nullable=True,
                      hint=f"a fraction of the training rows greater than 0 and at most {EVAL_SPLIT_MAX} (e.g. 0.1)"),
    # Evaluate every N optimizer steps; default about 10 evaluations over the run, and at every save.
    "eval_steps": Key("int", minimum=1, maximum=10**8, nullable=True),
    # Rows per device in an evaluation batch (DPO: rows, two a pair); default the training batch.
    "per_device_eval_batch_size": Key("int", minimum=1, maximum=65_536, nullable=True),
}
