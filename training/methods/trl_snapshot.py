"""Writes trl_fields.json from the installed TRL: ``python -m training.methods.trl_snapshot``.

The web process reads that file and never imports TRL (minutes of imports, and a GPU stack it does
not need). For each field of each config class it records the value type create/PATCH can check, so
``"lr_scheduler_type": 5`` or ``"optim": "nope"`` is a 400 naming the field rather than a run that
fails after its job started. tests/test_trl_snapshot.py compares the file with the installed TRL.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any

CONFIGS = ("SFTConfig", "DPOConfig", "GRPOConfig")
FILE = Path(__file__).with_name("trl_fields.json")
# The sha256 of each chat template TRL's get_training_chat_template patches with {% generation %}
# markers (assistant-only loss), so START knows without TRL which templates without markers still train.
TEMPLATES_FILE = Path(__file__).with_name("trl_templates.json")


def field_type(annotation: Any, choices: Any = None) -> dict[str, Any]:
    """{"kind": int | number | bool | str | choice | any, "nullable", "choices"} for one annotation.

    A union of a type with ``str`` (``SchedulerType | str``) is that type's choices: TRL turns the
    string into the enum and refuses any other. Anything richer (dicts, lists, several types) is any."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    nullable = type(None) in args
    rest = [a for a in args if a is not type(None)]
    enums = [a for a in rest if isinstance(a, type) and issubclass(a, enum.Enum)]
    literal = [a for a in rest if typing.get_origin(a) is typing.Literal]
    if choices:
        values = [str(c) for c in choices]
    elif len(enums) == 1 and set(rest) <= {enums[0], str}:
        values = [str(member.value) for member in enums[0]]
    elif len(literal) == 1 and len(rest) == 1:
        values = [str(v) for v in typing.get_args(literal[0])]
    else:
        values = []
    if values and all(v == v.lower() for v in values):  # the Studio's choice keys compare in lower case
        return {"kind": "choice", "nullable": nullable, "choices": values}
    simple = {bool: "bool", int: "int", float: "number", str: "str"}
    kind = simple.get(rest[0], "any") if len(rest) == 1 and isinstance(rest[0], type) else "any"
    return {"kind": kind, "nullable": nullable}


def snapshot() -> dict[str, dict[str, dict[str, Any]]]:
    import trl

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in CONFIGS:
        cls = getattr(trl, name)
        hints = typing.get_type_hints(cls)
        out[name] = {f.name: field_type(hints[f.name], f.metadata.get("choices")) for f in sorted(dataclasses.fields(cls), key=lambda f: f.name) if f.init}
    return out


def patchable_templates() -> list[str]:
    """The hashes of the templates get_training_chat_template compares against (`if chat_template ==
    X_chat_template:`): read from its source, as TRL keeps no list of them."""
    import inspect
    import re

    from trl import chat_template_utils

    names = re.findall(r"if chat_template == (\w+):", inspect.getsource(chat_template_utils.get_training_chat_template))
    return sorted({template_hash(getattr(chat_template_utils, name)) for name in names})


def template_hash(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()


if __name__ == "__main__":
    FILE.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    TEMPLATES_FILE.write_text(json.dumps(patchable_templates(), indent=1) + "\n")
    print(f"wrote {FILE} and {TEMPLATES_FILE}")
