"""A run's Data Hub refs, `[project/]repo@ref`: found in a run's fields, checked before START,
pinned to commit ids at START, and turned into what the engine loads.

- parse_ref / resolve_ref: `[project/]repo@ref` → a repo and a commit of the run's own project.
- run_refs / dataset_refs: every Data Hub ref a run names, with its field path.
- ref_findings / dataset_findings / ruler_dataset_findings: the pre-start (422) checks of the refs and
  of dataset rows.
- pin_refs: the refs resolved to commits at START; engine_inputs: what the engine loads from them.
- refs_at_pins: a run's refs written at the commits an attempt pinned (a resumed run's own).
- gone_pins / pin_deleted: pinned commits that went with their deleted repo, and how to say so.
- trained_from: a run's inputs as its log names them, each ref with its pinned commit.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from datahub.models import Commit, Repo, RepoType, TreeEntry
from datahub.repos import RefNotFound, find_repo, resolve
from studio.errors import Finding, Unprocessable
from training.refs import EVAL_DATASET, HUB_REF  # one grammar for [project/]repo@ref, shared with the create-time type check

# `builtin/<name>@<ref>` names a catalogue environment (environments app), not a project's repo.
RESERVED_NAMESPACES = frozenset({"builtin"})


# ---- refs: `[project/]repo@ref` ----------------------------------------------------------------

@dataclass(frozen=True)
class ResolvedRef:
    ref: str
    commit: str | None
    location: str  # what the engine loads: the HF-style repo id `<project>/<repo>` served at /hub


def parse_ref(project, value: str, field: str, pin: dict | None = None) -> tuple[Repo, Commit]:
    """Resolve a Data Hub ref of `project`; raises Unprocessable with one finding when it cannot.
    `pin` (pin_refs' {"ref", "commit", "repo"}) is the commit the run's field was pinned to before:
    when its repo was deleted since, the finding says so rather than "create it, or fix the name"."""
    match = HUB_REF.match(value or "") if isinstance(value, str) else None
    if match is None:
        raise Unprocessable(f"{value!r} is not a Data Hub ref.", [Finding(field, f'"{value}" is not a Data Hub ref: write [project/]repo@ref, e.g. my-data@main')])
    if match["project"] and match["project"] != project.slug:
        raise Unprocessable(errors=[Finding(field, f'"{value}" names project {match["project"]}: a run can only use repos of its own project ({project.slug})')])
    repo = find_repo(project, match["repo"])
    commit = resolved(repo, match["ref"]) if repo is not None else None
    if repo is not None and commit is not None:
        return repo, commit
    if pin is not None and pin.get("repo") == f"{project.slug}/{match['repo']}" and gone_pins({field: pin}):
        thing = PINNED_THINGS.get(re.sub(r"\[\d+\]", "", field.removesuffix(".ref")), "repo")
        raise Unprocessable(errors=[Finding(field, f"{pin_deleted(pin, repo is not None)}: those files are gone for good. "
                                                   f"Train from another {thing} instead: set {field.removesuffix('.ref')} to one, or create a new run")])
    if repo is None:
        raise Unprocessable(errors=[Finding(field, f'project {project.slug} has no Data Hub repo "{match["repo"]}": create it, or fix the name')])
    raise Unprocessable(errors=[Finding(field, f'repo {repo.full_name} has no branch, tag or commit "{match["ref"]}"')])


def resolved(repo: Repo, ref: str) -> Commit | None:
    """resolve, with None for a ref the repo does not have."""
    try:
        return resolve(repo, ref)
    except RefNotFound:
        return None


# What a pinned field holds, for a finding that says it is gone: base_model, dataset, dataset[1], ...
PINNED_THINGS = {"base_model": "base model", "dataset": "dataset", EVAL_DATASET: "eval dataset", "config.distillation.teacher_model": "teacher model",
                 "config.environment_id": "environment", "config.ruler_task_args.dataset": "dataset"}


def gone_pins(pinned: dict | None) -> dict[str, dict]:
    """The pins of `pinned` (pin_refs' {field: {"ref", "commit", "repo"}}) whose commit is no longer in
    the repo it was pinned from. Commits go only with their repo, and a repo made since under the
    deleted one's name holds none of them: such a pin's files were deleted with its repo. One query."""
    pins = {field: pin for field, pin in (pinned or {}).items() if isinstance(pin, dict) and pin.get("commit") and pin.get("repo")}
    if not pins:
        return {}
    held = {(pk, f"{slug}/{name}") for pk, slug, name in
            Commit.objects.filter(pk__in=[pin["commit"] for pin in pins.values()]).values_list("pk", "repo__project__slug", "repo__name")}
    return {field: pin for field, pin in pins.items() if (pin["commit"], pin["repo"]) not in held}


def pin_deleted(pin: dict, name_reused: bool = False) -> str:
    """What went with a pin's repo (gone_pins), for a finding or a log line; `name_reused`: a new
    repo has that name now, without the commit."""
    again = ", and the repo of that name now is a new one, without it" if name_reused else ""
    return f"Data Hub repo {pin['repo']} was deleted, and with it commit {pin['commit'][:12]}, which {pin['ref']} was pinned to{again}"


def resolve_ref(project, value: str) -> ResolvedRef | None:
    """A Data Hub ref → its commit and the repo id the engine loads; None when it does not resolve."""
    try:
        repo, commit = parse_ref(project, value, "ref")
    except Unprocessable:
        return None
    return ResolvedRef(ref=value, commit=commit.pk, location=repo.full_name)


def is_hub_ref(value: Any) -> bool:
    return isinstance(value, str) and "@" in value and value.split("/", 1)[0] not in RESERVED_NAMESPACES


def run_refs(base_model: str | None, dataset: Any, config: dict | None) -> list[tuple[str, str]]:
    """(field, value) of every Data Hub ref a run names."""
    out = [(f, v) for f, v in _run_refs(base_model, dataset, config) if is_hub_ref(v)]
    return out


def _run_refs(base_model: str | None, dataset: Any, config: dict | None) -> list[tuple[str, str]]:
    config = config if isinstance(config, dict) else {}
    out: list[tuple[str, str]] = []
    if isinstance(base_model, str) and "@" in base_model:
        out.append(("base_model", base_model))
    out += [(f, v) for f, v in dataset_refs(dataset) if "@" in v]
    out += [(f, v) for f, v in dataset_refs(config.get("eval_dataset"), EVAL_DATASET) if "@" in v]
    teacher = (config.get("distillation") or {}).get("teacher_model") if isinstance(config.get("distillation"), dict) else None
    if isinstance(teacher, str) and "@" in teacher:
        out.append(("config.distillation.teacher_model", teacher))
    env = config.get("environment_id")
    if isinstance(env, str) and "@" in env:
        out.append(("config.environment_id", env))
    ruler = config.get("ruler_task_args")
    if isinstance(ruler, dict) and isinstance(ruler.get("dataset"), str) and "@" in ruler["dataset"]:
        out.append(("config.ruler_task_args.dataset", ruler["dataset"]))
    return out


def dataset_refs(dataset: Any, name: str = "dataset") -> list[tuple[str, str]]:
    """(field, ref) of each entry of the dataset field `name` (dataset, config.eval_dataset):
    `dataset`, `dataset.ref`, `dataset[i]` or `dataset[i].ref`."""
    if dataset is None:
        return []
    items = dataset if isinstance(dataset, list) else [dataset]
    out = []
    for i, item in enumerate(items):
        base = f"{name}[{i}]" if isinstance(dataset, list) else name
        if isinstance(item, dict) and isinstance(item.get("ref"), str):
            out.append((f"{base}.ref", item["ref"]))
        elif isinstance(item, str):
            out.append((base, item))
    return out


def ref_findings(project, base_model: str | None, config: dict | None, pinned: dict | None = None) -> list[Finding]:
    """422 findings for the non-dataset Data Hub refs of a run (base model, teacher, environment,
    RULER dataset) that do not resolve; `pinned`: the commits they were pinned to before (parse_ref).
    dataset_findings covers `dataset` and the eval dataset, ruler_dataset_findings the RULER dataset's rows."""
    findings: list[Finding] = []
    for field, value in run_refs(base_model, None, config):
        if field.startswith(EVAL_DATASET):
            continue
        try:
            repo, commit = parse_ref(project, value, field, (pinned or {}).get(field))
        except Unprocessable as exc:
            findings += exc.errors
            continue
        if field in MODEL_FIELDS and not TreeEntry.objects.filter(commit=commit, path="config.json").exists():
            findings.append(Finding(field, f"{value} has no config.json at its root: {model_instead(repo, value)}"))
        if field in DATASET_FIELDS:
            findings += not_a_dataset_repo(repo, value, field)
    return findings


def model_instead(repo: Repo, value: str) -> str:
    """What to load instead of a model ref without a model at its root. A run's branch takes only its
    run's checkpoints (datahub.services.refuse_run_branch: an upload is a 409), in folders: the run's
    published model repo is the model it made (never its folder in STUDIO_RUNS_DIR, which a run may
    not name: training.refs.studio_data)."""
    from datahub import services

    run = services.branch_run(repo, value.partition("@")[2]) if repo.type == RepoType.EXPERIMENT else None
    if run is None:
        return f"push the folder save_pretrained wrote (config, weights and tokenizer) to {repo.name}"
    published = next(iter(services.published_repos(run)), None)
    model = f"{published.name}@main, the model repo it published" if published else "the model repo it publishes when it completes (on the Models page)"
    return f"it is run #{run.pk}'s branch, which holds that run's checkpoints in folders and takes no uploads: train from {model}"


MODEL_FIELDS = ("base_model", "config.distillation.teacher_model")  # refs the engine loads as a model
DATASET_FIELDS = ("config.ruler_task_args.dataset",)  # refs, beside `dataset`'s, that the engine loads as a dataset


def not_a_dataset_repo(repo: Repo, value: str, field: str) -> list[Finding]:
    """A dataset ref must name a dataset repo. The engine fetches a Data Hub dataset from /hub as a
    dataset, and /hub, as the Hub does, serves only dataset repos as datasets (a model repo there is a
    404): a run on another type's repo would pass START and fail only once its job had started."""
    if repo.type == RepoType.DATASET:
        return []
    return [Finding(field, f'{value} names {repo.full_name}, a {repo.type} repo, and a run trains only on a dataset repo\'s files: '
                           'push the data files to a dataset repo (type "dataset" in POST /api/hub/repos, or the Data Hub\'s New repo) '
                           'and use its repo@ref')]


def pin_refs(run) -> dict:
    """At START: resolve the run's Data Hub refs to commit ids, as {field: {"ref", "commit", "repo"}}
    where field is base_model, dataset / dataset[i], config.distillation.teacher_model,
    config.environment_id or config.ruler_task_args.dataset, and repo is the HF-style repo id the
    engine loads from HF_ENDPOINT=<studio>/hub at that commit.
    A ref that does not resolve is a 422 (start_findings should have caught it already)."""
    pinned: dict[str, dict] = {}
    findings: list[Finding] = []
    for field, value in run_refs(run.base_model, run.dataset, run.config):
        try:
            repo, commit = parse_ref(run.project, value, field)
        except Unprocessable as exc:
            findings += exc.errors
            continue
        # keyed by the field path, without dataset entries' ".ref": base_model, dataset, dataset[1], ...
        pinned[field.removesuffix(".ref")] = {"ref": value, "commit": commit.pk, "repo": repo.full_name}
    if findings:
        raise Unprocessable(errors=findings)
    return pinned


FIELD_PART = re.compile(r"([A-Za-z_]+)|\[(\d+)\]")


def at_commit(value: str, commit: str) -> str:
    """`[project/]repo@ref` as `[project/]repo@<commit id>`: the same repo, read at that commit
    however its branches move or whether they are still there (resolve reads a full commit id first)."""
    return f"{value.partition('@')[0]}@{commit}"


def refs_at_pins(fields: dict[str, Any], pinned: dict) -> dict[str, Any]:
    """`fields` (base_model, dataset and config, as a run or one of its attempts has them) with each
    Data Hub ref that `pinned` (pin_refs of those same values) pinned written at its commit (at_commit).
    A ref that `pinned` has not, or pinned from another value, stays as it is."""
    out = copy.deepcopy(fields)
    for field, value in run_refs(out.get("base_model"), out.get("dataset"), out.get("config")):
        pin = pinned.get(field.removesuffix(".ref"))
        if isinstance(pin, dict) and pin.get("ref") == value and pin.get("commit"):
            _set_field(out, field, at_commit(value, pin["commit"]))
    return out


def _set_field(fields: dict[str, Any], path: str, value: str) -> None:
    """Set the value at a field path of run_refs (`base_model`, `dataset[1].ref`, `config.environment_id`)."""
    keys: list[str | int] = [name or int(index) for name, index in FIELD_PART.findall(path)]
    holder: Any = fields
    for key in keys[:-1]:
        holder = holder[key]
    holder[keys[-1]] = value


def dataset_findings(project, method: str, dataset, needs=None, notices: list[Finding] | None = None,
                     checks: list | None = None, system_prompt: bool = False, pinned: dict | None = None, name: str = "dataset") -> list[Finding]:
    """Pre-start checks of a run's Data Hub datasets: the ref resolves to a dataset repo, and every row has what the
    method trains on, and what `needs` (datasets.RowNeeds) adds (findings name the file, row and field,
    e.g. `train.jsonl row 57: "chosen" is empty`). What was not checked (datasets.RowsCheck.notices) goes to `notices`,
    each entry's check to `checks` (its field and datasets.RowsCheck). `system_prompt`: the run sets one.
    `pinned`: the commits the entries were pinned to before (parse_ref). `name`: the field that holds
    the dataset (dataset, config.eval_dataset), which the findings name."""
    from datahub import datasets

    findings: list[Finding] = []
    for field, value in dataset_refs(dataset, name):
        if not is_hub_ref(value):
            continue
        try:
            repo, commit = parse_ref(project, value, field, (pinned or {}).get(field.removesuffix(".ref")))
        except Unprocessable as exc:
            findings += exc.errors
            continue
        wrong_type = not_a_dataset_repo(repo, value, field)
        if wrong_type:
            findings += wrong_type
            continue
        check = datasets.method_check(commit, method, field.removesuffix(".ref"), needs, system_prompt)
        findings += check.findings
        if notices is not None:
            notices += check.notices
        if checks is not None:
            checks.append((field.removesuffix(".ref"), check))
    return findings


def ruler_dataset_findings(project, value: Any, notices: list[Finding] | None = None) -> list[Finding]:
    """A RULER run's prompts (`config.ruler_task_args.dataset`) given as a Data Hub ref: its rows,
    checked as the engine's RULER loader reads them (datasets.RULER), as a local path's are. A ref
    that does not resolve is ref_findings' finding, not one of these."""
    from datahub import datasets

    field = "config.ruler_task_args.dataset"
    if not is_hub_ref(value):
        return []
    try:
        repo, commit = parse_ref(project, value, field)
    except Unprocessable:
        return []
    if repo.type != RepoType.DATASET:  # ref_findings' not_a_dataset_repo says so
        return []
    check = datasets.method_check(commit, datasets.RULER, field)
    if notices is not None:
        notices += check.notices
    return check.findings


def engine_inputs(run, ingest_token: str) -> dict[str, Any]:
    """What the engine needs to load a run's pinned Data Hub refs (for training.services.job_spec):
    HF repo ids and commit revisions in place of `repo@ref`, and the environment that points
    huggingface_hub / datasets / transformers at Studio's /hub. The run's ingest token reads its
    own project's repos while the run is provisioning or running, so no user token leaves Studio.
    Refs that are not Data Hub refs pass through unchanged."""
    pinned = run.pinned or {}
    base = pinned.get("base_model")
    env = hub_env(ingest_token) if pinned else {}
    return {
        "base_model": base["repo"] if base else run.base_model,
        "base_model_revision": base["commit"] if base else None,
        "dataset": engine_datasets(run.dataset, pinned),
        "eval_dataset": engine_datasets((run.config or {}).get("eval_dataset"), pinned, EVAL_DATASET),
        "teacher_model": pinned.get("config.distillation.teacher_model"),
        "env": env,
    }


def engine_datasets(value: Any, pinned: dict, name: str = "dataset") -> list[dict[str, Any]]:
    """The entries of the dataset field `name` as the engine's spec lists them: a pinned Data Hub ref
    as its repo at its commit, anything else as it is."""
    items = value if isinstance(value, list) else ([value] if value is not None else [])
    out = []
    for i, item in enumerate(items):
        field = f"{name}[{i}]" if isinstance(value, list) else name
        ref, kind = (item.get("ref"), item.get("type")) if isinstance(item, dict) else (item, None)
        pin = pinned.get(field) or pinned.get(f"{field}.ref")
        # data_hub: the engine trains on every data file of the commit, the files START checked.
        out.append({"path": pin["repo"], "type": kind, "revision": pin["commit"], "data_hub": True} if pin
                   else {"path": ref, "type": kind, "revision": None})
    return out


def trained_from(base_model: str | None, dataset: Any, config: dict | None, pinned: dict | None) -> str:
    """A run's base model, datasets and teacher as its log names them: each Data Hub ref with the
    repo and short commit START pinned it to (`base_model chain-dpo@v1 = demo/chain-dpo@002e8003a1b2`),
    as the environment's line names the package it staged; an HF id or a local path as it is."""
    teacher = (config or {}).get("distillation") if isinstance((config or {}).get("distillation"), dict) else None
    fields = [("base_model", base_model), *dataset_refs(dataset), *dataset_refs((config or {}).get("eval_dataset"), EVAL_DATASET),
              ("config.distillation.teacher_model", (teacher or {}).get("teacher_model"))]
    parts = []
    for field, value in fields:
        if not value:
            continue
        pin = (pinned or {}).get(field.removesuffix(".ref"))
        at = f" = {pin['repo']}@{pin['commit'][:12]}" if isinstance(pin, dict) and pin.get("ref") == value and pin.get("commit") else ""
        parts.append(f"{field.removesuffix('.ref')} {value}{at}")
    return ", ".join(parts)


def hub_env(token: str) -> dict[str, str]:
    """The environment that points huggingface_hub / datasets / transformers at Studio's /hub, reading
    with `token` (a run's ingest token, or a merge's: training.checkpoints)."""
    from django.conf import settings

    return {"HF_ENDPOINT": f"{settings.STUDIO_PUBLIC_URL}/hub", "HF_TOKEN": token, "HF_HUB_DISABLE_XET": "1"}
