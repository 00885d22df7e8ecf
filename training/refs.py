"""Refs (the contract): a value with `@` is a Data Hub ref `[project/]repo@ref`; otherwise an HF id,
or a local path (local backend only). `dataset` is a ref, `{ref, type}`, or a list of those."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from django.conf import settings

from studio.errors import Finding

# \Z, not $: $ also matches before a trailing newline ("org/model\n" was accepted and stored).
HUB_REF = re.compile(r"^(?:(?P<project>[a-z0-9][a-z0-9-]*)/)?(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*)@(?P<ref>[A-Za-z0-9][A-Za-z0-9._/-]*)\Z")
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")
# A relative path to a data file ("data/train.jsonl") passes for an HF id, which the engine then looked
# for on the Hub and failed on after the job started.
DATA_FILE = re.compile(r"\.(jsonl|json|csv|parquet)\Z", re.IGNORECASE)
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
    if kind == "hf" and (file := DATA_FILE.search(value)):
        return [Finding(field, f'"{value}" reads as a Hugging Face id, yet names a {file.group(1).lower()} file: give the file\'s absolute path '
                               "on the Studio's machine (local backend), or push it to the Data Hub and use repo@ref")]
    return []


EVAL_DATASET = "config.eval_dataset"  # the held-out rows' field: a dataset in the forms of `dataset`


def check_dataset(value: Any, name: str = "dataset") -> list[Finding]:
    """`value` as the field `name` (dataset, config.eval_dataset) holds a dataset: a ref, {ref, type} or a list of them."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    prefix = (lambda i: f"{name}[{i}]") if isinstance(value, list) else (lambda i: name)
    if isinstance(value, list) and not value:
        return [Finding(name, f"give at least one dataset, or leave {name.removeprefix('config.')} out")]
    findings: list[Finding] = []
    for index, item in enumerate(items):
        field = prefix(index)
        if isinstance(item, dict):
            unknown = set(item) - {"ref", "type"}
            findings += [Finding(f"{field}.{k}", "unknown key: a dataset entry has ref and type") for k in sorted(unknown)]
            findings += check_ref(f"{field}.ref", item.get("ref"))
            kind = item.get("type")
            if kind is not None and kind not in DATASET_TYPES:
                findings.append(Finding(f"{field}.type", f"type is one of {', '.join(DATASET_TYPES)} (got {json.dumps(kind)}), or leave it out"))
        else:
            findings += check_ref(field, item)
    return findings


def entry_fields(value: Any, name: str = "dataset") -> list[tuple[str, DatasetEntry]]:
    """(field, entry) of each entry of the dataset field `name`: `dataset`, or `dataset[i]` in a list."""
    return [(f"{name}[{i}]" if isinstance(value, list) else name, entry) for i, entry in enumerate(dataset_entries(value))]


def dataset_entries(value: Any) -> list[DatasetEntry]:
    """The dataset as a list of entries; assumes check_dataset passed."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [DatasetEntry(i["ref"], i.get("type")) if isinstance(i, dict) else DatasetEntry(i) for i in items]


@dataclass(frozen=True)
class Place:
    path: Path  # resolved
    what: str
    folder: bool


def studio_data() -> list[Place]:
    """The Studio's own data on this machine: every run's folder, the Data Hub's storage, uploads and
    checkouts, the database and secret files. No run may name them as a local path: a run reads
    another run's model, or a Data Hub file, only through the Data Hub, which checks the project.
    Not var/ as a whole: the demo's models and datasets, which runs name by path, lie in var/demo."""
    from datahub.checkouts import checkout_root
    from datahub.storage import hub_root

    folders = [
        (settings.STUDIO_RUNS_DIR, "run outputs, STUDIO_RUNS_DIR"),
        (hub_root(), "Data Hub storage, DATAHUB_ROOT"),
        (getattr(settings, "DATAHUB_STAGING_DIR", None) or hub_root() / "staging", "Data Hub uploads, DATAHUB_STAGING_DIR"),
        (checkout_root(), "Data Hub checkouts, DATAHUB_CHECKOUT_DIR"),
        *([(settings.MEDIA_ROOT, "uploads, MEDIA_ROOT")] if getattr(settings, "MEDIA_ROOT", "") else []),
    ]
    files = [Path(settings.VAR_DIR) / "demo-token", Path(str(settings.EMBEDDED_REDIS_SOCKET))]
    if settings.REDIS_URL.startswith(("redis+socket://", "unix://")):
        files.append(Path(settings.REDIS_URL.split("://", 1)[1].split("?", 1)[0]))
    for database in settings.DATABASES.values():
        if database["ENGINE"] == "django.db.backends.sqlite3":
            name = Path(str(database["NAME"]))
            files += [name, *(name.with_name(name.name + suffix) for suffix in ("-journal", "-wal", "-shm"))]
    files += [Path(os.environ[key]) for key in ("SECRET_KEY_FILE", "STUDIO_ENCRYPTION_KEY_FILE") if os.environ.get(key)]
    return ([Place(Path(folder).resolve(), what, True) for folder, what in folders]
            + [Place(file.resolve(), "the Studio's database and secrets", False) for file in files])


def studio_data_at(path: Path, places: list[Place] | None = None) -> tuple[str, str] | None:
    """Whether `path` (links and `..` resolved) is inside the Studio's own data (`places`, by default
    studio_data()), or holds some of it (a folder above it): ("inside" or "holds", what), else None."""
    try:
        resolved = path.expanduser().resolve()
    except (OSError, RuntimeError):  # a loop of links: nothing a run could read either
        return None
    for place in studio_data() if places is None else places:
        if resolved.is_relative_to(place.path):
            return "inside", place.what
        if place.path.is_relative_to(resolved):
            return "holds", place.what
    return None


LINKS_LOOKED_AT = 10_000  # entries of a folder looked at for links; past them the sandbox still hides the data


def studio_data_link(folder: Path, places: list[Place] | None = None) -> tuple[str, str] | None:
    """A link in `folder` (at any depth) that leads into the Studio's own data (`places`, by default
    studio_data()): (its path, what), else None. A model or dataset folder of links to another run's
    weights is that run's output too."""
    if not folder.is_dir():
        return None
    seen, places = 0, studio_data() if places is None else places
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            seen += 1
            entry = Path(root) / name
            if entry.is_symlink() and (found := studio_data_at(entry, places)) is not None:
                return str(entry), found[1]
            if seen >= LINKS_LOOKED_AT:
                return None
    return None


MODEL_INSTEAD = "a run's model is in the Data Hub as <project>/<model repo>@<commit>; use that"
DATASET_INSTEAD = "push the files to a Data Hub dataset repo and use <project>/<dataset repo>@<commit>"


class LocalRead(NamedTuple):
    field: str
    value: str
    is_model: bool

    @property
    def instead(self) -> str:
        return MODEL_INSTEAD if self.is_model else DATASET_INSTEAD


def local_reads(method: str, base_model: Any, config: dict[str, Any], datasets: list[tuple[str, Any]]) -> list[LocalRead]:
    """Each local path a run's engine reads, the one list for START's checks (validation) and the
    local backend's sandbox and submit check: the base model, a DISTILL teacher, the dataset entries
    given as (field, value), the eval dataset's entries (config.eval_dataset), and a RULER run's
    prompts. A field added to one place only would let a path past the other's check."""
    reads: list[tuple[str, Any, bool]] = [("base_model", base_model, True)]
    distillation = config.get("distillation")
    if method == "distill" and isinstance(distillation, dict):
        reads.append(("config.distillation.teacher_model", distillation.get("teacher_model"), True))
    reads += [(field, value, False) for field, value in datasets]
    held_out = config.get("eval_dataset")
    if not check_dataset(held_out, EVAL_DATASET):  # a stored run's config passed it; anything else is no path to read
        reads += [(field, entry.ref, False) for field, entry in entry_fields(held_out, EVAL_DATASET)]
    ruler = config.get("ruler_task_args") if method == "grpo" and config.get("rl_mode") == "ruler" else None
    if isinstance(ruler, dict):  # its prompts, checked row by row like a dataset's
        reads.append(("config.ruler_task_args.dataset", ruler.get("dataset"), False))
    return [LocalRead(field, value, is_model) for field, value, is_model in reads if isinstance(value, str) and ref_kind(value) == "path"]


def studio_data_problem(value: str, instead: str) -> str | None:
    """Why a run may not read the local path `value`: it is, holds or links into the Studio's own
    data (studio_data). The sentence ends with `instead` (MODEL_INSTEAD, DATASET_INSTEAD); None when it may."""
    path, places = Path(value).expanduser(), studio_data()
    found = studio_data_at(path, places)
    if found is not None:
        where, what = found
        return f"{value} {'is inside' if where == 'inside' else 'holds'} the Studio's own data ({what}): {instead}"
    link = studio_data_link(path, places)
    if link is not None:
        return f"{value} holds a link ({link[0]}) into the Studio's own data ({link[1]}): {instead}"
    return None


def inside_local_roots(path: Path) -> bool:
    """Whether runs may read `path` (settings.STUDIO_LOCAL_ROOTS; none set: anywhere), never the
    Studio's own data (studio_data_at). Links and `..` are resolved first, so neither leads out of a
    root or into that data."""
    if studio_data_at(path) is not None:
        return False
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
