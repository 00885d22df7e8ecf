"""The only functions that create or change Data Hub rows, and the seams the rest of Studio calls.

- provision_experiment_repo: an experiment's repo `experiment-<slug>` is created on first use.
- create_run_branch: each run is a branch `run-<id>` in its experiment's repo, made at create time.
- resolve_ref / pin_refs: `[project/]repo@ref` → a commit, pinned on the run at START.
- dataset_findings / ref_findings: the pre-start (422) checks of Data Hub refs and dataset rows.
- record_checkpoint: a reported checkpoint's directory is committed to `run-<id>` by a Celery task.

Bytes are written before the transaction that makes them visible: a blob exists before any tree
entry names it, and a commit becomes visible only when its branch head moves (under a row lock).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from datahub import storage
from datahub.models import NAME_PATTERN, Blob, Branch, Commit, Repo, RepoType, Tag, TreeEntry, blob_path
from studio.errors import BadRequest, Conflict, Finding, NotFound, Unprocessable

log = logging.getLogger(__name__)

MAIN = "main"
NAME_RE = re.compile(NAME_PATTERN)
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
HUB_REF = re.compile(r"^(?:(?P<project>[a-z0-9][a-z0-9-]*)/)?(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*)@(?P<ref>[A-Za-z0-9][A-Za-z0-9._/-]*)$")
MAX_PATH = 1024
# `builtin/<name>@<ref>` names a catalogue environment (environments app), not a project's repo.
RESERVED_NAMESPACES = frozenset({"builtin"})

FileSource = bytes | str | Path | IO[bytes]


class RefNotFound(NotFound):
    """A branch, tag or commit that the repo does not have (the HF API answers RevisionNotFound)."""


# ---- names and paths ---------------------------------------------------------------------------

def check_name(value: Any, field: str, what: str = "name") -> str:
    if not isinstance(value, str) or not NAME_RE.match(value) or value.endswith((".lock", ".")) or ".." in value:
        raise BadRequest(
            f"{value!r} is not a valid {what}.",
            [Finding(field, f"a {what} is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")],
        )
    return value


def clean_path(value: Any, field: str = "path") -> str:
    """A repo path, or a 400: relative, forward slashes, no `..`, no NUL, no empty segments."""
    problem = None
    if not isinstance(value, str) or not value:
        problem = "give a relative file path such as data/train.jsonl"
    elif "\x00" in value:
        problem = "a path cannot contain NUL bytes"
    elif "\\" in value:
        problem = "use forward slashes: backslashes are not allowed in paths"
    elif value.startswith("/") or re.match(r"^[A-Za-z]:", value):
        problem = "give a path relative to the repo root, not an absolute path"
    elif len(value) > MAX_PATH:
        problem = f"a path is at most {MAX_PATH} characters"
    elif any(part in ("", ".", "..") for part in value.split("/")):
        problem = "a path cannot contain '..', '.' or empty segments"
    elif any(ord(c) < 32 for c in value):
        problem = "a path cannot contain control characters"
    if problem:
        raise BadRequest(f"{value!r} is not an allowed path." if isinstance(value, str) else "The path is not allowed.", [Finding(field, problem)])
    return value


# ---- repos, branches, tags ---------------------------------------------------------------------

def new_commit_id(*parts: Any) -> str:
    payload = json.dumps([*parts, timezone.now().isoformat(), uuid.uuid4().hex], default=str, sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()  # noqa: S324 - an id, not a security boundary


@transaction.atomic
def create_repo(project, name: str, type: str = RepoType.MODEL, user=None, description: str = "") -> Repo:
    """A repo with an empty initial commit on `main`. 409 if the project already has `name`."""
    check_name(name, "name", "repo name")
    if type not in RepoType.values:
        raise BadRequest(f"Unknown repo type {type!r}.", [Finding("type", f"type must be one of {', '.join(RepoType.values)}")])
    try:
        with transaction.atomic():
            repo = Repo.objects.create(project=project, name=name, type=type, created_by=user, description=description or "")
    except IntegrityError as exc:
        raise Conflict(f"Project {project.slug} already has a repo {name!r}.", [Finding("name", "choose another name, or use the existing repo")]) from exc
    root = Commit.objects.create(id=new_commit_id(repo.pk, "initial"), repo=repo, author=user, author_name=_author_name(user), message="Initial commit")
    Branch.objects.create(repo=repo, name=MAIN, head=root)
    return repo


def get_or_create_repo(project, name: str, type: str, user=None) -> Repo:
    repo = Repo.objects.filter(project=project, name=name).first()
    if repo is not None:
        return repo
    try:
        return create_repo(project, name, type, user)
    except Conflict:  # created concurrently
        return Repo.objects.get(project=project, name=name)


def find_repo(project, name: str) -> Repo | None:
    return Repo.objects.filter(project=project, name=name).select_related("project").first()


def create_branch(repo: Repo, name: str, from_ref: str = MAIN) -> Branch:
    """Branch `name` at `from_ref`; an existing branch of that name is returned unchanged."""
    check_name(name, "branch", "branch name")
    existing = Branch.objects.filter(repo=repo, name=name).first()
    if existing is not None:
        return existing
    head = resolve(repo, from_ref)
    try:
        with transaction.atomic():
            return Branch.objects.create(repo=repo, name=name, head=head)
    except IntegrityError:
        return Branch.objects.get(repo=repo, name=name)


def create_tag(repo: Repo, name: str, ref: str) -> Tag:
    check_name(name, "tag", "tag name")
    commit = resolve(repo, ref)
    try:
        with transaction.atomic():
            return Tag.objects.create(repo=repo, name=name, commit=commit)
    except IntegrityError as exc:
        raise Conflict(f"Tag {name!r} already exists in {repo.full_name}.", [Finding("tag", "tags do not move: choose another name")]) from exc


def resolve(repo: Repo, ref: str | None) -> Commit:
    """A branch, a tag, or a commit id (or an unambiguous prefix of 7+ hex digits) → its commit."""
    ref = ref or repo.default_branch
    branch = Branch.objects.filter(repo=repo, name=ref).select_related("head").first()
    if branch is not None:
        return branch.head
    tag = Tag.objects.filter(repo=repo, name=ref).select_related("commit").first()
    if tag is not None:
        return tag.commit
    if COMMIT_RE.match(ref):
        found = list(Commit.objects.filter(repo=repo, id__startswith=ref)[:2])
        if len(found) == 1:
            return found[0]
    raise RefNotFound(
        f"{repo.full_name} has no branch, tag or commit {ref!r}.",
        [Finding("ref", "give a branch name, a tag, or a commit id of the repo")],
    )


def tree(commit: Commit) -> dict[str, Blob]:
    return {e.path: e.blob for e in TreeEntry.objects.filter(commit=commit).select_related("blob")}


def entry(commit: Commit, path: str) -> TreeEntry | None:
    return TreeEntry.objects.filter(commit=commit, path=path).select_related("blob").first()


def history(repo: Repo, ref: str | None = None, limit: int = 100) -> list[Commit]:
    """First-parent history of `ref`, newest first."""
    commit: Commit | None = resolve(repo, ref)
    out: list[Commit] = []
    while commit is not None and len(out) < limit:
        out.append(commit)
        parent = commit.parents[0] if commit.parents else None
        commit = Commit.objects.filter(pk=parent).first() if parent else None
    return out


# ---- blobs and commits -------------------------------------------------------------------------

def store_blob(source: FileSource) -> Blob:
    """Stream `source` (bytes, a file-like object, or a local file path) into a blob, once."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            staged = storage.stage_stream(fh)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        import io

        staged = storage.stage_stream(io.BytesIO(bytes(source)))
    else:
        staged = storage.stage_stream(source)
    return store_staged(staged.path, staged.sha256, staged.size)


def store_staged(path: Path, sha256: str, size: int) -> Blob:
    """Move a staged local file into the blob storage (or drop it when the bytes are there)."""
    blob = Blob.objects.filter(pk=sha256).first()
    if blob is not None and storage.blob_storage().exists(blob.storage_name):
        path.unlink(missing_ok=True)
        return blob
    storage.put_staged(path, blob_path(sha256))
    blob, _ = Blob.objects.get_or_create(sha256=sha256, defaults={"size": size})
    return blob


def commit_files(repo: Repo, branch: str, files: Mapping[str, FileSource] | None = None, message: str = "", author=None,
                 delete: Iterable[str] = (), create_branch_from: str | None = None, parent: str | None = None) -> Commit:
    """Commit `files` ({path: bytes | file-like | local path}) and deletions to `branch`.

    Blobs are written first, outside any transaction (slow I/O); then a short transaction locks
    the branch, builds the new tree from its head and moves the head. A commit that changes
    nothing returns the current head. `create_branch_from` makes a missing branch from that ref.
    `parent`, when given, must still be the head (optimistic concurrency, 409 otherwise).
    """
    files = dict(files or {})
    cleaned = {clean_path(p): src for p, src in files.items()}
    removed = [clean_path(p, "delete") for p in delete]
    blobs = {path: store_blob(src) for path, src in cleaned.items()}
    return commit_blobs(repo, branch, blobs, message, author, removed, create_branch_from, parent)


def commit_blobs(repo: Repo, branch: str, blobs: Mapping[str, Blob], message: str = "", author=None,
                 delete: Iterable[str] = (), create_branch_from: str | None = None, parent: str | None = None) -> Commit:
    check_name(branch, "branch", "branch name")
    if create_branch_from is not None:
        create_branch(repo, branch, create_branch_from)
    with transaction.atomic():
        # Lock the branch row alone. With a join (select_related("head")), PostgreSQL re-checks a row
        # that another commit just moved against the statement's old snapshot, where the new head
        # commit does not exist yet, and drops it: two concurrent commits to one branch (a run's
        # checkpoints) then read "no branch".
        head = Branch.objects.select_for_update().filter(repo=repo, name=branch).first()
        if head is None:
            raise RefNotFound(f"{repo.full_name} has no branch {branch!r}.", [Finding("branch", "commit to an existing branch, e.g. main")])
        if parent is not None and head.head_id != parent:
            raise Conflict(f"Branch {branch!r} moved since {parent[:10]}: it is now at {head.head_id[:10]}.", [Finding("parent", "reload the branch and commit again")])
        current = {e.path: e.blob_id for e in TreeEntry.objects.filter(commit_id=head.head_id)}
        new = dict(current)
        for path in delete:
            new.pop(path, None)
        for path, blob in blobs.items():
            new[path] = blob.pk
        folders = {str(q) for p in new for q in PurePosixPath(p).parents if str(q) != "."}
        clash = sorted(folders & set(new))
        if clash:
            # a file cannot also be a folder: `a` and `a/b` together would break every checkout
            raise BadRequest(f"{clash[0]!r} would be both a file and a folder.", [Finding("path", f"{clash[0]} is a file and a folder: rename one of them")])
        if new == current:
            return head.head
        commit = Commit.objects.create(
            id=new_commit_id(repo.pk, head.head_id, sorted(new.items()), message),
            repo=repo, parents=[head.head_id], author=author, author_name=_author_name(author),
            message=message or _default_message(blobs, delete),
        )
        TreeEntry.objects.bulk_create([TreeEntry(commit=commit, path=p, blob_id=b) for p, b in new.items()], batch_size=2000)
        head.head = commit
        head.save(update_fields=["head", "updated_at"])
        return commit


def _author_name(user) -> str:
    return getattr(user, "username", "") or "studio"


def _default_message(blobs: Mapping[str, Any], delete: Iterable[str]) -> str:
    added, removed = len(blobs), len(list(delete))
    parts = ([f"Upload {added} file(s)"] if added else []) + ([f"delete {removed} file(s)"] if removed else [])
    return ", ".join(parts) or "Empty commit"


# ---- refs: `[project/]repo@ref` ----------------------------------------------------------------

@dataclass(frozen=True)
class ResolvedRef:
    ref: str
    commit: str | None
    location: str  # what the engine loads: the HF-style repo id `<project>/<repo>` served at /hub


def parse_ref(project, value: str, field: str) -> tuple[Repo, Commit]:
    """Resolve a Data Hub ref of `project`; raises Unprocessable with one finding when it cannot."""
    match = HUB_REF.match(value or "") if isinstance(value, str) else None
    if match is None:
        raise Unprocessable(f"{value!r} is not a Data Hub ref.", [Finding(field, f'"{value}" is not a Data Hub ref: write [project/]repo@ref, e.g. my-data@main')])
    if match["project"] and match["project"] != project.slug:
        raise Unprocessable(errors=[Finding(field, f'"{value}" names project {match["project"]}: a run can only use repos of its own project ({project.slug})')])
    repo = find_repo(project, match["repo"])
    if repo is None:
        raise Unprocessable(errors=[Finding(field, f'project {project.slug} has no Data Hub repo "{match["repo"]}": create it, or fix the name')])
    try:
        return repo, resolve(repo, match["ref"])
    except RefNotFound:
        raise Unprocessable(errors=[Finding(field, f'repo {repo.full_name} has no branch, tag or commit "{match["ref"]}"')]) from None


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


def dataset_refs(dataset: Any) -> list[tuple[str, str]]:
    """(field, ref) of each dataset entry: `dataset`, `dataset.ref`, `dataset[i]` or `dataset[i].ref`."""
    if dataset is None:
        return []
    items = dataset if isinstance(dataset, list) else [dataset]
    out = []
    for i, item in enumerate(items):
        base = f"dataset[{i}]" if isinstance(dataset, list) else "dataset"
        if isinstance(item, dict) and isinstance(item.get("ref"), str):
            out.append((f"{base}.ref", item["ref"]))
        elif isinstance(item, str):
            out.append((base, item))
    return out


def ref_findings(project, base_model: str | None, config: dict | None) -> list[Finding]:
    """422 findings for the non-dataset Data Hub refs of a run (base model, teacher, environment,
    RULER dataset) that do not resolve. dataset_findings covers `dataset`."""
    findings: list[Finding] = []
    for field, value in run_refs(base_model, None, config):
        try:
            parse_ref(project, value, field)
        except Unprocessable as exc:
            findings += exc.errors
    return findings


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


def dataset_findings(project, method: str, dataset) -> list[Finding]:
    """Pre-start checks of a run's Data Hub datasets: the ref resolves, and every row has what the
    method trains on (findings name the row and field, e.g. `row 57: "chosen" is empty`)."""
    from datahub import datasets

    findings: list[Finding] = []
    for field, value in dataset_refs(dataset):
        if not is_hub_ref(value):
            continue
        try:
            repo, commit = parse_ref(project, value, field)
        except Unprocessable as exc:
            findings += exc.errors
            continue
        findings += datasets.method_findings(commit, method, field.removesuffix(".ref"))
    return findings


# ---- experiments and runs ----------------------------------------------------------------------

def experiment_repo_name(experiment) -> str:
    return f"experiment-{experiment.slug}"[:128]


def provision_experiment_repo(experiment) -> Repo:
    """Make sure `experiment` has its Data Hub repo `experiment-<slug>` and record its id."""
    repo = get_or_create_repo(experiment.project, experiment_repo_name(experiment), RepoType.EXPERIMENT)
    if experiment.hub_repo != repo.full_name:
        experiment.hub_repo = repo.full_name
        experiment.save(update_fields=["hub_repo"])
    return repo


def run_branch_name(run) -> str:
    return f"run-{run.pk}"


def run_repo(run) -> Repo:
    return provision_experiment_repo(run.experiment)


def create_run_branch(run) -> Branch:
    """Create branch `run-<id>` from main in the run's experiment repo (kept across restarts)."""
    return create_branch(run_repo(run), run_branch_name(run), MAIN)


CHECKPOINT_DIRS = {"final": "final", "merged": "merged", "adapter": "adapter"}


def checkpoint_prefix(checkpoint) -> str:
    return CHECKPOINT_DIRS.get(checkpoint.kind) or f"checkpoints/step-{checkpoint.step}"


def record_checkpoint(run, checkpoint) -> None:
    """Hand the checkpoint to a Celery task once the ingest transaction commits: hashing and
    storing a checkpoint directory is slow I/O that must not hold the engine's request."""
    from datahub.tasks import commit_checkpoint

    checkpoint_id = checkpoint.pk
    transaction.on_commit(lambda: _enqueue(commit_checkpoint, checkpoint_id))


def _enqueue(task, *args: Any) -> None:
    try:
        task.delay(*args)
    except Exception:  # noqa: BLE001 - a broker outage must not fail the engine's report
        log.exception("could not enqueue %s%r", task.name, args)


def commit_checkpoint(checkpoint_id: int) -> Commit | None:
    """Commit a checkpoint directory's files under checkpoints/step-<n>/ (or final/, merged/,
    adapter/) on the run's branch. Safe to run twice: an unchanged tree makes no commit."""
    from training.models import Checkpoint

    checkpoint = Checkpoint.objects.select_related("run", "run__experiment", "run__project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return None
    run = checkpoint.run
    root = Path(checkpoint.path)
    if not root.is_dir():
        log.warning("run %s: checkpoint %s is not a local directory (%s): not committed", run.pk, checkpoint.pk, checkpoint.path)
        return None
    prefix = checkpoint_prefix(checkpoint)
    files: dict[str, FileSource] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue  # a symlink could point anywhere on this machine
        files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path
    if checkpoint.kind == "final":
        files["metrics.jsonl"] = metrics_export(run)
    repo = run_repo(run)
    label = f"step {checkpoint.step}" if prefix.startswith("checkpoints/") else f"{checkpoint.kind} (step {checkpoint.step})"
    try:
        commit = commit_files(
            repo, run_branch_name(run), files, message=f"Checkpoint {label}, attempt {checkpoint.attempt}",
            author=run.created_by, create_branch_from=MAIN,
        )
        if checkpoint.kind in MODEL_KINDS:
            publish_model(run, checkpoint)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise  # transient I/O: the task retries
        storage_full(run, checkpoint, exc)
        return None
    return commit


MODEL_KINDS = ("final", "merged")  # a full fine-tune's final weights; a LoRA run's merged model
CARD_METRICS = ("loss", "eval_loss", "reward", "kd_loss")
MODEL_REPO_RE = re.compile(r"-run(\d+)$")


def model_repo_name(run) -> str:
    from django.utils.text import slugify

    return f"{(slugify(run.name) or 'model')[:100].strip('-_') or 'model'}-run{run.pk}"


def final_metrics(run) -> dict[str, float]:
    """The last value of each headline metric the run logged (loss, reward, kd_loss...)."""
    from training.models import MetricPoint

    out = {}
    for key in CARD_METRICS:
        point = MetricPoint.objects.filter(run=run, key=key).order_by("-step").values_list("value", flat=True).first()
        if point is not None:
            out[key] = point
    return out


def model_card(run, checkpoint) -> str:
    from django.conf import settings

    pinned = run.pinned or {}
    base = pinned.get("base_model")
    base_line = f"{run.base_model} (pinned {base['repo']}@{base['commit'][:12]})" if base else (run.base_model or "unknown")
    items = run.dataset if isinstance(run.dataset, list) else ([run.dataset] if run.dataset else [])
    data = [(i.get("ref") if isinstance(i, dict) else str(i)) for i in items]
    metrics = final_metrics(run)
    run_url = f"{getattr(settings, 'STUDIO_PUBLIC_URL', '').rstrip('/')}/training/runs/{run.pk}/"
    source = f"{run_repo(run).full_name}@{run_branch_name(run)}"
    lines = [
        "---", f"base_model: {run.base_model}", "library_name: transformers", "tags: [studio, " + run.method + "]", "---", "",
        f"# {run.name}", "", f"Fine-tuned by Studio run #{run.pk}.", "",
        f"- **Base model:** {base_line}", f"- **Method:** {run.method}",
        f"- **Datasets:** {', '.join(data) or 'none'}",
        f"- **Weights:** {checkpoint.kind} (step {checkpoint.step})",
        f"- **Run:** [{run.name}]({run_url})", f"- **Source branch:** {source}", "",
        "## Final metrics", "",
    ]
    lines += [f"- {k}: {v:.4g}" for k, v in metrics.items()] or ["No metrics logged."]
    return "\n".join(lines) + "\n"


def publish_model(run, checkpoint) -> Commit | None:
    """Commit a run's final (or merged) weights to the project's model repo `<run-name>-run<id>`
    on main with a README.md model card: the Models page entry. Safe to run twice."""
    root = Path(checkpoint.path)
    if checkpoint.kind not in MODEL_KINDS or not root.is_dir():
        return None
    files: dict[str, FileSource] = {
        path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()
    }
    files["README.md"] = model_card(run, checkpoint).encode()
    repo = get_or_create_repo(run.project, model_repo_name(run), RepoType.MODEL, run.created_by)
    summary = f"{run.method} of {run.base_model or 'unknown'} (run #{run.pk})"
    if repo.description != summary:
        Repo.objects.filter(pk=repo.pk).update(description=summary)
    return commit_files(repo, MAIN, files, message=f"Publish {checkpoint.kind} model from run #{run.pk} (step {checkpoint.step})", author=run.created_by)


def storage_full(run, checkpoint, exc: OSError) -> None:
    """The blob storage is full. Nothing of the checkpoint was committed (blobs are written before
    the commit, and a short blob is removed), so fail the run now with what to do rather than let
    it train on and lose every later checkpoint too."""
    from training.backends import get_backend
    from training.models import ACTIVE_STATUSES, ErrorCode, TrainingRun
    from training.reconciler import end_failed

    log.error("run %s: blob storage full while committing checkpoint %s: %s", run.pk, checkpoint.pk, exc)
    run = TrainingRun.objects.get(pk=run.pk)
    if run.status in ACTIVE_STATUSES:
        end_failed(run, get_backend(run.backend_name), ErrorCode.TRAINING_ERROR,
                   f"the Data Hub's blob storage is full, so the checkpoint of step {checkpoint.step} could not be stored "
                   f"({exc.strerror}): free space under the Data Hub's storage (DATAHUB_ROOT) and start the run again")


def metrics_export(run) -> bytes:
    from training.models import MetricPoint

    rows = MetricPoint.objects.filter(run=run).order_by("key", "step").values_list("key", "step", "value")
    return "".join(json.dumps({"key": k, "step": s, "value": v}) + "\n" for k, s, v in rows.iterator()).encode()


def engine_inputs(run, ingest_token: str) -> dict[str, Any]:
    """What the engine needs to load a run's pinned Data Hub refs (for training.services.job_spec):
    HF repo ids and commit revisions in place of `repo@ref`, and the environment that points
    huggingface_hub / datasets / transformers at Studio's /hub. The run's ingest token reads its
    own project's repos while the run is provisioning or running, so no user token leaves Studio.
    Refs that are not Data Hub refs pass through unchanged."""
    from django.conf import settings

    pinned = run.pinned or {}
    base = pinned.get("base_model")
    items = run.dataset if isinstance(run.dataset, list) else ([run.dataset] if run.dataset is not None else [])
    datasets_out = []
    for i, item in enumerate(items):
        field = f"dataset[{i}]" if isinstance(run.dataset, list) else "dataset"
        ref, kind = (item.get("ref"), item.get("type")) if isinstance(item, dict) else (item, None)
        pin = pinned.get(field) or pinned.get(f"{field}.ref")
        datasets_out.append({"path": pin["repo"], "type": kind, "revision": pin["commit"]} if pin else {"path": ref, "type": kind, "revision": None})
    env = {"HF_ENDPOINT": f"{settings.STUDIO_PUBLIC_URL}/hub", "HF_TOKEN": ingest_token, "HF_HUB_DISABLE_XET": "1"} if pinned else {}
    return {
        "base_model": base["repo"] if base else run.base_model,
        "base_model_revision": base["commit"] if base else None,
        "dataset": datasets_out,
        "teacher_model": pinned.get("config.distillation.teacher_model"),
        "env": env,
    }
