"""Data Hub repositories: names and paths, repos, branches and tags, and reading what a commit holds.

- check_name / check_ref_name / clean_path: the 400s for a repo, branch or tag name and for a file path.
- create_repo / get_or_create_repo / create_branch / create_tag: new rows; a repo starts with an
  empty initial commit on `main`, and tags never move. delete_branch / delete_tag drop the ref
  and keep its commits; delete_repo drops the repo and all its commits (blobs stay).
- resolve: a branch, a tag or a commit id (prefix) → its commit, or a 404 naming the repo's refs;
  tree / entry / history read it;
  is_ancestor says whether one commit is in another's history.

Writing files is datahub.commits; `[project/]repo@ref` refs of a run are datahub.refs.
"""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
import uuid
from collections.abc import Iterable
from typing import Any, NoReturn

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Substr
from django.db.models.lookups import Exact
from django.utils import timezone

from datahub.models import NAME_PATTERN, Blob, Branch, Commit, Repo, RepoType, Tag, TreeEntry, UploadSession
from studio.errors import BadRequest, Conflict, Finding, NotFound
from studio.parsing import bidi_control, control_character, invisible

MAIN = "main"
NAME_RE = re.compile(NAME_PATTERN)
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
FULL_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MAX_PATH = 1024
# What a file a person adds may be called (clean_new_path): a folder or file name of at most 246
# bytes, and at most 1024 bytes in all, so that the path fits in PATH_MAX (4096) under a cache
# folder, whatever characters it has. 246 is NAME_MAX of ext4, xfs, btrfs and APFS (255) less the
# longest suffix huggingface_hub's download into a local_dir adds to a name, `.metadata` (9 bytes:
# it writes .cache/huggingface/download/<path>.metadata and <path>.lock beside each file, and its
# `.incomplete` files are named by a hash); a longer name fails there, or in the engine's checkout,
# with "File name too long".
HF_LONGEST_SUFFIX = ".metadata"
MAX_NAME_BYTES = 255 - len(HF_LONGEST_SUFFIX)
MAX_PATH_BYTES = 1024


class RefNotFound(NotFound):
    """A branch, tag or commit that the repo does not have (the HF API answers RevisionNotFound)."""


# ---- names and paths ---------------------------------------------------------------------------

def check_name(value: Any, field: str, what: str = "name") -> str:
    """A repo, branch or tag name, or a 400 saying which part of the rule it breaks. Beyond the
    characters, git's own ref rules: no '..' (it reads as a range), no trailing '.' or '.lock'."""
    problem = None
    if not isinstance(value, str) or not NAME_RE.match(value):
        problem = f"a {what} is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    elif ".." in value:
        problem = f"a {what} cannot contain '..', which reads as a range of commits: use a single '.' or '-'"
    elif value.endswith(".lock"):
        problem = f"a {what} cannot end in '.lock', which git keeps for its lock files: e.g. {value.removesuffix('.lock')}-lock"
    elif value.endswith("."):
        problem = f"a {what} cannot end in '.': drop the trailing dot"
    if problem:
        raise BadRequest(f"{value!r} is not a valid {what}.", [Finding(field, problem)])
    return value


# Names git reads as its own before any branch or tag (gitrevisions: HEAD, FETCH_HEAD, ORIG_HEAD,
# MERGE_HEAD…, kept in $GIT_DIR itself), and `refs`, the folder every ref is under (refs/heads/…,
# and the Hub's own refs/pr/<n> and refs/convert/… revisions): a ref of such a name reads as
# something else in git and in huggingface_hub's cache (refs/<revision>).
GIT_OWN_REF = re.compile(r"^(?:[A-Z_]*_)?HEAD\Z|^refs\Z")


def check_ref_name(value: Any, field: str, what: str) -> str:
    """A branch or tag name: check_name's rule, not a name git keeps for itself (GIT_OWN_REF), and
    not what resolve() reads as a commit id (7 to 40 lowercase hex digits, git's abbreviated ids).
    Such a name would shadow the commit it looks like, so a ref pinned to that commit would silently
    read the branch's files instead."""
    check_name(value, field, what)
    if GIT_OWN_REF.match(value):
        raise BadRequest(
            f"{value!r} is not a valid {what}: git keeps that name for itself.",
            [Finding(field, f"a {what} cannot be HEAD, a name ending in _HEAD (FETCH_HEAD, ORIG_HEAD…) or refs, which git and the Hub read as "
                            f"their own pointers: choose another name, e.g. {value.lower()}-1")],
        )
    if COMMIT_RE.match(value):
        raise BadRequest(
            f"{value!r} is not a valid {what}: it looks like a commit id.",
            [Finding(field, f"a {what} cannot be 7 to 40 hex digits (0-9, a-f), which read as a commit id: add a letter or a prefix, e.g. v{value[:12]}")],
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
    elif control_character(value) is not None:
        problem = "a path cannot contain control characters"
    elif bidi := bidi_control(value):  # "Trojan Source" (studio.parsing.BIDI_CONTROLS)
        problem = f"a path cannot contain bidirectional control characters (here U+{ord(bidi):04X}): they make a name display as something it is not"
    if problem:
        raise BadRequest(f"{value!r} is not an allowed path." if isinstance(value, str) else "The path is not allowed.", [Finding(field, problem)])
    return value


def clean_new_path(value: Any, field: str = "path") -> str:
    """The path of a file a person adds (an upload), or a 400: clean_path's rule, and what every
    checkout of the file needs: no '.git' folder or file, which git-based consumers read as their
    own, and names that fit a disk (MAX_NAME_BYTES, MAX_PATH_BYTES). Paths that name what a commit
    already holds (a download, a delete) are clean_path's alone: a file committed before this rule
    stays readable and deletable."""
    path = clean_path(value, field)
    problem = None
    size = len(path.encode())
    long = next((part for part in path.split("/") if len(part.encode()) > MAX_NAME_BYTES), None)
    if any(part.lower() == ".git" for part in path.split("/")):
        # git refuses a .git in any case in a tree it checks out (a case-insensitive disk reads .GIT as .git)
        problem = "a path cannot contain a folder or file named '.git', which git keeps for its own data: rename it, e.g. to git/"
    elif any(invisible(part) for part in path.split("/")):
        problem = "each folder or file name in a path needs a visible character: one here has only spaces or invisible formatting characters (such as U+200B or U+FEFF)"
    elif long is not None:
        problem = (f"each folder or file name in a path is at most {MAX_NAME_BYTES} bytes (UTF-8): a disk's limit of 255, less the "
                   f"{HF_LONGEST_SUFFIX} that huggingface_hub's download adds beside each file; {long[:24]}… is {len(long.encode())} bytes: shorten it")
    elif size > MAX_PATH_BYTES:
        problem = f"a path is at most {MAX_PATH_BYTES} bytes (UTF-8) in all; this one is {size} bytes: shorten it or use fewer folders"
    if problem:
        raise BadRequest(f"{path[:64]!r}{'…' if len(path) > 64 else ''} is not an allowed path.", [Finding(field, problem)])
    return path


def same_file_key(path: str) -> str:
    """What `path` is on a case-insensitive disk that normalises Unicode (macOS's APFS, Windows'
    NTFS): its NFC form, casefolded. Two paths of one key are one file there."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def same_file_clash(adding: Iterable[str], tree: Iterable[str]) -> tuple[str, str] | None:
    """The first path of `adding` and another path of `tree` (the commit's files, `adding` among them)
    that differ only in case or Unicode normalisation (same_file_key): a checkout of such a commit
    on macOS or Windows keeps one file of the two. None when there is none. Only the paths added are
    held to it, so a tree committed before this rule still takes other files."""
    keys: dict[str, list[str]] = {}
    for path in tree:
        keys.setdefault(same_file_key(path), []).append(path)
    for path in adding:
        other = next((p for p in keys.get(same_file_key(path), []) if p != path), None)
        if other is not None:
            return path, other
    return None


def same_file_problem(path: str, other: str, place: str, stored: bool = True) -> str:
    """The finding of same_file_clash, spelling both names out (they may look the same); `stored`
    when `other` is a file already committed, which the upload can replace under its exact name."""
    return (f"{path} and {other} {place} differ only in case or in how an accent is encoded ({ascii(path)}, {ascii(other)}): "
            f"a checkout on macOS or Windows would keep only one of them: rename one" + (f", or upload it as {other} to replace that file" if stored else ""))


def file_folder_clash(adding: Iterable[str], tree: Iterable[str]) -> tuple[str, str, str] | None:
    """The first path of `adding` that makes a name both a file and a folder with `tree` (the files it
    is compared with: the commit's, `adding` among them, or a branch's), names compared as a case-insensitive disk that normalises Unicode
    reads them (same_file_key; equal names included): (path, the file, the folder), where `path` is
    the file or sits under the folder. None when there is none. No checkout holds both, and an archive
    of the commit would ship both. Only the paths added are held to it (as same_file_clash).

    Two folders that differ only so (Data/a.txt beside data/b.txt) are allowed: such a disk merges
    them into one, as a git checkout on macOS does, which keeps both files; two files that then fall
    on one name are same_file_clash's. Each name's key is computed once here, so a branch of many
    files costs one pass over its paths, not one per file added."""
    tree = sorted(tree)  # the first of several clashing names is the same on every call
    files, folders = set(tree), sorted({parent for name in tree for parent in _folders_above(name)})
    file_keys: dict[str, str] = {}
    folder_keys: dict[str, str] = {}
    for name in tree:
        file_keys.setdefault(same_file_key(name), name)
    for name in folders:
        folder_keys.setdefault(same_file_key(name), name)
    exact_folders = set(folders)
    for path in adding:
        # the exact name first, so that a plain clash names the folder as stored
        if (folder := path if path in exact_folders else folder_keys.get(same_file_key(path))) is not None:
            return path, path, folder
        for parent in _folders_above(path):
            if (file := parent if parent in files else file_keys.get(same_file_key(parent))) is not None:
                return path, file, parent
    return None


def _folders_above(path: str) -> list[str]:
    """The folders `path` sits in, outermost first (a/b/c → a, a/b), by string slicing, which a tree
    of many files makes worth it (PurePosixPath.parents is some ten times slower)."""
    return [path[:i] for i, char in enumerate(path) if char == "/"]


def file_folder_problem(path: str, file: str, folder: str, place: str) -> str:
    """The finding of file_folder_clash: `file` is a file and `folder` a folder `place`, the clash
    being `path`'s; where their names differ, both are spelled out (they may look the same)."""
    same = "" if file == folder else (f" ({file} and {folder} differ only in case or in how an accent is encoded, {ascii(file)} and {ascii(folder)}: "
                                      f"a checkout on macOS or Windows reads them as one name)")
    if path == file:
        return f"{folder} is a folder {place}{same}: rename the file, or upload into the folder"
    return f"{file} is a file {place}, so {path} cannot go under it{same}: rename one of them"


# ---- repos, branches, tags ---------------------------------------------------------------------

def new_commit_id(*parts: Any) -> str:
    payload = json.dumps([*parts, timezone.now().isoformat(), uuid.uuid4().hex], default=str, sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()  # noqa: S324 - an id, not a security boundary

EXPERIMENT_PREFIX = "experiment-"


@transaction.atomic
def create_repo(project, name: str, type: str = RepoType.MODEL, user=None, description: str = "") -> Repo:
    """A repo with an empty initial commit on `main`. 409 if the project already has `name`, in any case."""
    check_name(name, "name", "repo name")
    if type not in RepoType.values:
        raise BadRequest(f"Unknown repo type {type!r}.", [Finding("type", f"type must be one of {', '.join(RepoType.values)}")])
    if name.lower().startswith(EXPERIMENT_PREFIX) and type != RepoType.EXPERIMENT:
        # An experiment's runs commit to experiment-<slug>: they would commit their models into this repo.
        raise BadRequest(f"{name!r} is an experiment's repo name.", [Finding("name", f"names starting {EXPERIMENT_PREFIX} are kept for the experiments' own repos: choose another name")])
    try:
        with transaction.atomic():
            repo = Repo.objects.create(project=project, name=name, type=type, created_by=user, description=description or "")
    except IntegrityError as exc:
        # names are unique in any case (Repo's constraints): name the repo that has this one
        existing = Repo.objects.filter(project=project, name__iexact=name).values_list("name", flat=True).first() or name
        same = "" if existing == name else f": {name!r} differs from it only in case, and the two would share a download folder on a case-insensitive disk"
        raise Conflict(f"Project {project.slug} already has a repo {existing!r}{same}.",
                       [Finding("name", f"{project.slug} already has a repo {existing}: choose another name, or use the existing repo")]) from exc
    root = Commit.objects.create(id=new_commit_id(repo.pk, "initial"), repo=repo, author=user, author_name=_author_name(user), message="Initial commit")
    Branch.objects.create(repo=repo, name=MAIN, head=root)
    return repo


def get_or_create_repo(project, name: str, type: str, user=None) -> Repo:
    repo = Repo.objects.filter(project=project, name=name).first()
    if repo is not None:
        return repo
    try:
        return create_repo(project, name, type, user)
    except Conflict:  # created concurrently, or a repo of this name in another case holds it
        repo = Repo.objects.filter(project=project, name=name).first()
        if repo is None:
            raise
        return repo


def find_repo(project, name: str) -> Repo | None:
    if "\x00" in name:
        return None  # no repo has such a name, and PostgreSQL cannot compare text with a NUL (a 500)
    return Repo.objects.filter(project=project, name=name).select_related("project").first()


def natural_key(name: str) -> list:
    """checkpoints/step-40 before step-120, run-2 before run-10: the digits in a name compare as numbers."""
    return [(0, int(part), "") if i % 2 else (1, 0, part.lower()) for i, part in enumerate(re.split(r"(\d+)", name)) if part]


def branches_of(repo: Repo) -> list[Branch]:
    """The repo's branches in natural order (an experiment's repo has one a run)."""
    return sorted(Branch.objects.filter(repo=repo), key=lambda b: natural_key(b.name))


def create_branch(repo: Repo, name: str, from_ref: str = MAIN, *, name_field: str = "branch", from_field: str = "ref",
                  exist_ok: bool = True) -> Branch:
    """Branch `name` at `from_ref`; an existing branch of that name is returned unchanged, or with
    `exist_ok` False (a person asked for a new branch) is a 409, also one made concurrently: it may
    point at another commit than `from_ref`. A finding names the caller's own key for each (the REST
    body sends them as `name` and `from`)."""
    check_ref_name(name, name_field, "branch name")
    existing = Branch.objects.filter(repo=repo, name=name).first()
    if existing is not None:
        return existing if exist_ok else _branch_exists(name, name_field)
    head = resolve(repo, from_ref, field=from_field)
    with transaction.atomic():
        lock_refs(repo)
        existing = Branch.objects.filter(repo=repo, name=name).first()
        if existing is not None:  # made concurrently
            return existing if exist_ok else _branch_exists(name, name_field)
        if Tag.objects.filter(repo=repo, name=name).exists():
            raise Conflict(f"{repo.full_name} has a tag {name!r}: a branch cannot share its name.",
                           [Finding(name_field, "choose another branch name: a tag of that name would become unreachable")])
        return Branch.objects.create(repo=repo, name=name, head=head)


def _branch_exists(name: str, name_field: str) -> NoReturn:
    raise Conflict(f"Branch {name!r} already exists.", [Finding(name_field, "choose another branch name")])


def create_tag(repo: Repo, name: str, ref: str, *, name_field: str = "tag") -> Tag:
    check_ref_name(name, name_field, "tag name")
    commit = resolve(repo, ref)
    with transaction.atomic():
        lock_refs(repo)
        if Tag.objects.filter(repo=repo, name=name).exists():
            raise Conflict(f"Tag {name!r} already exists in {repo.full_name}.", [Finding(name_field, "tags do not move: choose another name")])
        if Branch.objects.filter(repo=repo, name=name).exists():
            raise Conflict(f"{repo.full_name} has a branch {name!r}: a tag cannot share its name.",
                           [Finding(name_field, "choose another tag name: resolve reads a branch before a tag, so this tag would be unreachable")])
        return Tag.objects.create(repo=repo, name=name, commit=commit)


def delete_branch(repo: Repo, name: str) -> None:
    """Delete branch `name`; its commits stay (a ref pinned to a commit id keeps resolving).
    The default branch cannot go: a 409. Run branches are guarded by services.delete_branch."""
    with transaction.atomic():
        lock_refs(repo)
        # the branch row lock waits for a commit moving this branch (commit_blobs holds it)
        branch = Branch.objects.select_for_update().filter(repo=repo, name=name).first()
        if branch is None:
            raise RefNotFound(f"{repo.full_name} has no branch {name!r}.")
        if name == repo.default_branch:
            raise Conflict(f"{name!r} is the default branch of {repo.full_name}: it cannot be deleted.",
                           [Finding("branch", "delete another branch; the default branch is where the repo's files are read from")])
        branch.delete()


def delete_tag(repo: Repo, name: str) -> None:
    """Delete tag `name`; the commit it named stays, and can be tagged again."""
    with transaction.atomic():
        lock_refs(repo)
        deleted, _ = Tag.objects.filter(repo=repo, name=name).delete()
    if not deleted:
        raise RefNotFound(f"{repo.full_name} has no tag {name!r}.")


def delete_repo(repo: Repo) -> None:
    """Delete `repo` with its branches, tags, commits and tree entries. Its unfinished (open or
    committing) upload sessions are aborted, not deleted, so their client's next call says the repo
    was deleted rather than "no such upload session"; its finished ones go. The staged bytes of
    all of them go once the transaction commits. Blobs stay: they are content
    addressed and shared by every repo of every project, and a commit elsewhere may be reusing
    one at this moment (store_staged skips bytes already there), so removing one here could leave
    another repo's tree naming bytes that are gone. Re-uploading the same bytes reuses them;
    `manage.py hub_gc` (datahub.gc) removes those no repo uses, once past its grace period.
    Runs that use the repo are guarded by services.delete_repo."""
    from datahub.uploads import UNFINISHED, discard_staged  # uploads imports this module

    with transaction.atomic():
        lock_refs(repo)
        sessions = list(repo.uploads.values_list("pk", flat=True))
        # A committer at work sees the abort when its commit finds no branch (uploads.commit_upload).
        repo.uploads.filter(state__in=UNFINISHED).update(
            state=UploadSession.State.ABORTED, abort_reason=f"its repo {repo.full_name} was deleted"[:200], updated_at=timezone.now())
        repo.uploads.exclude(state=UploadSession.State.ABORTED).delete()
        # Refs first: they PROTECT the commits the repo's cascade deletes. Deleting a branch row
        # waits for a commit moving that branch (commit_blobs holds its row lock), so the cascade
        # below sees that commit too; a commit that comes after finds no branch (a 404).
        Tag.objects.filter(repo=repo).delete()
        Branch.objects.filter(repo=repo).delete()
        repo.delete()
        transaction.on_commit(lambda: discard_staged(sessions))


def lock_refs(repo: Repo) -> None:
    """Lock the repo row (call inside a transaction): creating or deleting a branch or a tag
    takes it, so a branch and a tag of one name cannot be made at the same time."""
    Repo.objects.select_for_update().filter(pk=repo.pk).values_list("pk", flat=True).first()


def resolve(repo: Repo, ref: str | None, *, field: str = "ref") -> Commit:
    """A branch, a tag, or a commit id (or an unambiguous prefix of 7+ hex digits) → its commit;
    `field` is the caller's name for the ref in a RefNotFound finding.
    A full 40-hex commit id of the repo wins over a branch or tag of that name (one made before
    check_ref_name refused such names): a ref pinned to a commit must always read that commit."""
    ref = ref or repo.default_branch
    # No ref has a NUL, and PostgreSQL cannot compare text with one (it was a 500).
    commit = _find_ref(repo, ref) if "\x00" not in ref else None
    if commit is None:
        raise RefNotFound(
            f"{repo.full_name} has no branch, tag or commit {ref!r}.",
            [Finding(field, f"give a branch name, a tag, or a commit id of the repo ({refs_named(repo)})")],
        )
    return commit


# How many of its branches and of its tags a ref that is not found names (an experiment repo has a branch a run).
NAMED_REFS = 10


def refs_named(repo: Repo) -> str:
    """What the repo has, for a ref it does not: its first branches and tags in natural order."""
    def first(names: list[str]) -> str:
        more = len(names) - NAMED_REFS
        return ", ".join(names[:NAMED_REFS]) + (f" and {more} more" if more > 0 else "")

    tags = sorted(Tag.objects.filter(repo=repo).values_list("name", flat=True), key=natural_key)
    return f"its branches: {first([b.name for b in branches_of(repo)])}" + (f"; its tags: {first(tags)}" if tags else "; no tags")


def _find_ref(repo: Repo, ref: str) -> Commit | None:
    if FULL_COMMIT_RE.match(ref):
        commit = Commit.objects.filter(repo=repo, pk=ref).first()
        if commit is not None:
            return commit
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
    return None


def tree(commit: Commit) -> dict[str, Blob]:
    return {e.path: e.blob for e in TreeEntry.objects.filter(commit=commit).select_related("blob")}


def entry(commit: Commit, path: str) -> TreeEntry | None:
    return TreeEntry.objects.filter(commit=commit, path=path).select_related("blob").first()


def under(folder: str) -> Q:
    """A filter for the tree entries whose path starts with `folder` ("data/"; "" for all), in the
    path's own case on every database. startswith alone is LIKE, which SQLite (the embedded default)
    compares without case: "DATA/" listed data/'s files there and an HF tree of a folder that does not
    exist was not a 404. LIKE narrows on the index; the exact comparison of the head decides."""
    if not folder:
        return Q()
    return Q(path__startswith=folder) & Q(Exact(Substr("path", 1, len(folder)), folder))


def history(repo: Repo, ref: str | None = None, limit: int = 100) -> list[Commit]:
    """First-parent history of `ref`, newest first."""
    commit: Commit | None = resolve(repo, ref)
    out: list[Commit] = []
    while commit is not None and len(out) < limit:
        out.append(commit)
        parent = commit.parents[0] if commit.parents else None
        commit = Commit.objects.filter(pk=parent).first() if parent else None
    return out



def is_ancestor(repo: Repo, commit: Commit, head_id: str) -> bool:
    """Whether `commit` is commit `head_id` of `repo` or one of its ancestors. Only the commits
    made since `commit` can lie between the two (a parent is made before its child), so only those
    are read. Clocks of two machines that disagree can only make this answer False wrongly."""
    if commit.pk == head_id:
        return True
    parents = dict(Commit.objects.filter(repo=repo, created_at__gte=commit.created_at).values_list("id", "parents"))
    seen: set[str] = set()
    todo = [head_id]
    while todo:
        current = todo.pop()
        if current == commit.pk:
            return True
        if current in seen or current not in parents:
            continue
        seen.add(current)
        todo.extend(parents[current])
    return False

# Also datahub.commits' author name: the initial commit and every later one name their author alike.
def _author_name(user) -> str:
    return getattr(user, "username", "") or "studio"
