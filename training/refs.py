"""Refs (the contract): a value with `@` is a Data Hub ref `[project/]repo@ref`; otherwise an HF id,
or a local path (local backend only). `dataset` is a ref, `{ref, type}`, or a list of those."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from studio.errors import Finding

# \Z, not $: $ also matches before a trailing newline ("org/model\n" was accepted and stored).
HUB_REF = re.compile(r"^(?:(?P<project>[a-z0-9][a-z0-9-]*)/)?(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*)@(?P<ref>[A-Za-z0-9][A-Za-z0-9._/-]*)\Z")
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")
DATASET_TYPES = ("sft", "chat", "text", "prompt_completion", "preference", "prompts")


@dataclass(frozen=True)
class DatasetEntry:
    ref: str
    type: str | None = None


def ref_kind(value: str) -> str:
    """'hub', 'path' or 'hf'."""
    if "@" in value:
        return "hub"
    if value.startswith(("/", "./", "../", "~")) or Path(value).is_absolute():
        return "path"
    return "hf"


REF_MAX = 500  # as base_model's schema: a ref, an id or a path, not a document


def check_ref(field: str, value: Any) -> list[Finding]:
    if not isinstance(value, str) or not value.strip():
        return [Finding(field, "give a Data Hub ref (repo@ref), an HF id (org/name) or a local path")]
    if len(value) > REF_MAX:
        return [Finding(field, f"a ref, HF id or path has at most {REF_MAX} characters; this one has {len(value)}")]
    kind = ref_kind(value)
    if kind == "hub" and not HUB_REF.match(value):
        return [Finding(field, f'"{value}" is not a Data Hub ref: write [project/]repo@ref, e.g. my-data@main')]
    if kind == "hf" and not HF_ID.match(value):
        return [Finding(field, f'"{value}" is not an HF id (org/name), a Data Hub ref (repo@ref) or an absolute path')]
    return []


def check_dataset(value: Any) -> list[Finding]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    prefix = (lambda i: f"dataset[{i}]") if isinstance(value, list) else (lambda i: "dataset")
    if isinstance(value, list) and not value:
        return [Finding("dataset", "give at least one dataset, or leave dataset out")]
    findings: list[Finding] = []
    for index, item in enumerate(items):
        field = prefix(index)
        if isinstance(item, dict):
            unknown = set(item) - {"ref", "type"}
            findings += [Finding(f"{field}.{k}", "unknown key: a dataset entry has ref and type") for k in sorted(unknown)]
            findings += check_ref(f"{field}.ref", item.get("ref"))
            kind = item.get("type")
            if kind is not None and not (isinstance(kind, str) and kind.strip()):
                findings.append(Finding(f"{field}.type", f"type must be a string such as {', '.join(DATASET_TYPES)}"))
        else:
            findings += check_ref(field, item)
    return findings


def dataset_entries(value: Any) -> list[DatasetEntry]:
    """The dataset as a list of entries; assumes check_dataset passed."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [DatasetEntry(i["ref"], i.get("type")) if isinstance(i, dict) else DatasetEntry(i) for i in items]


def inside_local_roots(path: Path) -> bool:
    """Whether runs may read `path` (settings.STUDIO_LOCAL_ROOTS; none set: anywhere). Links and `..`
    are resolved first, so neither leads out of a root."""
    roots = settings.STUDIO_LOCAL_ROOTS
    return not roots or any(path.resolve().is_relative_to(root) for root in roots)


def local_model_dir(value: str | None) -> Path | None:
    """The directory of a locally resolvable model (a local path inside the local roots, or an HF id
    in the local cache)."""
    if not value:
        return None
    if ref_kind(value) == "path":
        path = Path(value).expanduser()
        return path if path.is_absolute() and inside_local_roots(path) and path.is_dir() else None
    if ref_kind(value) == "hf":
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(value, "config.json")
        except Exception:  # noqa: BLE001 - no cache, bad id: simply not resolvable here
            return None
        return Path(cached).parent if isinstance(cached, str) else None
    return None
