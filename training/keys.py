"""Typed config keys: each knows how to check a value and say what is wrong with it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from studio.errors import Finding


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Key:
    """The type of one config value. Ranges that the seeds tie to START are checked there instead."""

    kind: str  # int | number | bool | auto_bool | str | choice | block | ref | any
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    block: dict[str, Key] | None = None
    nullable: bool = False
    hint: str = ""

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
            return [Finding(path, f"must be {self.describe()}, got {json.dumps(value)[:60]}")]
        if self.minimum is not None and value < self.minimum:
            return [Finding(path, f"must be at least {self.minimum:g}, got {value}")]
        if self.kind == "block" and self.block is not None:
            return check_block(path, value, self.block)
        return []

    def describe(self) -> str:
        if self.hint:
            return self.hint
        return {
            "int": "an integer" + (f" ≥ {self.minimum:g}" if self.minimum is not None else ""),
            "number": "a number" + (f" ≥ {self.minimum:g}" if self.minimum is not None else ""),
            "bool": "true or false",
            "auto_bool": 'true, false or "auto"',
            "str": "a non-empty string",
            "choice": "one of " + ", ".join(self.choices),
            "block": "an object",
            "ref": "a dataset ref (\"repo@ref\" or an HF id)",
            "any": "any value",
        }[self.kind]


def check_block(path: str, value: dict, keys: dict[str, Key]) -> list[Finding]:
    findings: list[Finding] = []
    for name, item in value.items():
        if name not in keys:
            findings.append(Finding(f"{path}.{name}", f"unknown setting; known: {', '.join(sorted(keys))}"))
        else:
            findings.extend(keys[name].check(f"{path}.{name}", item))
    return findings


INT1 = Key("int", minimum=1)
INT0 = Key("int", minimum=0)
POSITIVE = Key("number", minimum=0, hint="a positive number")
BOOL = Key("bool")
TEXT = Key("str", nullable=True)
PRECISIONS = ("bf16", "fp16", "fp32", "fp8", "nvfp4")
