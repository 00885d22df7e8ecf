"""Blobs and commits: the only writers of file bytes and of branch heads.

Bytes are written before the transaction that makes them visible: a blob exists before any tree
entry names it, and a commit becomes visible only when its branch head moves (under a row lock).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.db import transaction
from django.utils import timezone

from datahub import storage
from datahub.models import Blob, Branch, Commit, Repo, TreeEntry, blob_path
from datahub.repos import (
    RefNotFound,
    _author_name,
    check_name,
    clean_path,
    create_branch,
    file_folder_clash,
    file_folder_problem,
    new_commit_id,
    same_file_clash,
    same_file_problem,
)
from studio.errors import BadRequest, Conflict, Finding, NotFound, counted

FileSource = bytes | str | Path | IO[bytes]


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


def store_staged(path: Path, sha256: str, size: int, keep_on_error: bool = False) -> Blob:
    """Move a staged local file into the blob storage (or drop it when the bytes are there).
    The Blob row is made only once all its bytes are stored (storage.put_staged, `keep_on_error`).

    hub_gc (datahub.gc) may be removing these very bytes: it deletes a blob's bytes under a lock
    on its row, and a stray file's under a row of that sha256 that it inserts for the while. So
    the bytes are checked again here under the row's lock, and written again if they went; and the
    row's used_at is set, so that the collector keeps the blob for its grace period while the
    caller hashes its other files and commits (or records it on an upload file)."""
    name = blob_path(sha256)
    try:
        if not Blob.objects.filter(pk=sha256).exists():
            storage.put_staged(path, name, keep_on_error)  # slow I/O, outside the row lock
        with transaction.atomic():
            blob, created = Blob.objects.select_for_update().get_or_create(sha256=sha256, defaults={"size": size})
            if not storage.blob_storage().exists(name):
                storage.put_staged(path, name, keep_on_error)  # never stored, or the collector took them
            if not created:
                blob.used_at = timezone.now()
                blob.save(update_fields=["used_at"])
    except BaseException:
        if not keep_on_error:
            path.unlink(missing_ok=True)
        raise
    path.unlink(missing_ok=True)  # the bytes were there already
    return blob


class BranchMoved(Conflict):
    """A commit's `parent` is no longer its branch's head (optimistic concurrency)."""

    def __init__(self, branch: str, parent: str, head: str) -> None:
        super().__init__(f"Branch {branch!r} moved since {parent[:10]}: it is now at {head[:10]}.", [Finding("parent", "reload the branch and commit again")])
        self.branch, self.parent, self.head = branch, parent, head


def commit_files(repo: Repo, branch: str, files: Mapping[str, FileSource] | None = None, message: str = "", author=None,
                 delete: Iterable[str] = (), create_branch_from: str | None = None, parent: str | None = None) -> Commit:
    """Commit `files` ({path: bytes | file-like | local path}) and deletions to `branch`.

    Blobs are written first, outside any transaction (slow I/O); then a short transaction locks
    the branch, builds the new tree from its head and moves the head. A commit that changes
    nothing returns the current head. `create_branch_from` makes a missing branch from that ref.
    `parent`, when given, must still be the head (optimistic concurrency, 409 otherwise).
    `delete` names files or folders of the head, as commit_blobs says.
    """
    cleaned = {clean_path(p): src for p, src in (files or {}).items()}
    removed = [clean_path(p, "delete") for p in delete]
    return commit_blobs(repo, branch, store_blobs(cleaned), message, author, removed, create_branch_from, parent)


def store_blobs(files: Mapping[str, FileSource]) -> dict[str, Blob]:
    """{clean path: blob} of `files`, every path checked before any is stored: commit_blobs' `blobs`.
    Slow I/O: call outside a transaction."""
    cleaned = {clean_path(p): src for p, src in files.items()}
    return {path: store_blob(src) for path, src in cleaned.items()}


def commit_blobs(repo: Repo, branch: str, blobs: Mapping[str, Blob], message: str = "", author=None,
                 delete: Iterable[str] = (), create_branch_from: str | None = None, parent: str | None = None,
                 delete_field: str = "delete") -> Commit:
    """Move `branch` to a new commit: its head's tree without `delete`, with `blobs` ({path: blob}).
    Each path of `delete` is a file of the head, or a folder whose files all go; one that is neither
    is a 404 naming `<delete_field>[i]`, checked under the branch's lock (a typo or a file another
    commit removed meanwhile must not be reported deleted). The default message says what changed."""
    removing = list(delete)
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
            raise BranchMoved(branch, parent, head.head_id)
        commit = _commit_on(repo, head.head_id, blobs, message, author, removing, branch, delete_field)
        if commit is None:
            return head.head
        head.head = commit
        head.save(update_fields=["head", "updated_at"])
        return commit


def commit_files_on(repo: Repo, parent: Commit, files: Mapping[str, FileSource], message: str, author=None, delete: Iterable[str] = ()) -> Commit:
    """Commit `files` and deletions (files or folders of `parent`) on top of `parent`, a commit of
    `repo`, moving no branch: the new commit is reached by its id, as a pinned ref or a checkpoint's
    `commit` reaches it (a Merge of a step that a later attempt of the run saved again is committed on
    that step's own commit: datahub.services.commit_checkpoint). A commit that changes nothing
    returns `parent`. Blobs are written first, outside the transaction, as commit_files."""
    blobs = {clean_path(path): store_blob(src) for path, src in files.items()}
    removed = [clean_path(path, "delete") for path in delete]
    with transaction.atomic():
        return _commit_on(repo, parent.pk, blobs, message, author, removed, None, "delete") or parent


def _commit_on(repo: Repo, parent_id: str, blobs: Mapping[str, Blob], message: str, author, delete: list[str], branch: str | None,
               delete_field: str) -> Commit | None:
    """The commit whose tree is `parent_id`'s without `delete`, with `blobs`; None when that is
    `parent_id`'s tree already. Call inside a transaction (commit_blobs: holding the row lock of
    `branch`, whose head `parent_id` is; None for a commit that moves no branch)."""
    # Lock the rows of the blobs this commit adds, in one order (no deadlock between two
    # commits): hub_gc deletes a blob under its row lock after checking that no tree names it,
    # so it waits for this transaction and then sees its tree entries; a blob it took before
    # is missing here. NO KEY: the tree entries' foreign-key checks still share the rows.
    adding = {blob.pk: path for path, blob in blobs.items()}
    kept = set(Blob.objects.select_for_update(no_key=True).filter(pk__in=adding).order_by("pk").values_list("pk", flat=True))
    if gone := [path for sha, path in adding.items() if sha not in kept]:
        raise Conflict(f"The stored bytes of {gone[0]!r} were removed by the Data Hub's garbage collector (hub_gc) before this commit named them: nothing was committed.",
                       [Finding("path", f"{path}: commit it again, which stores its bytes anew") for path in gone])
    current = {e.path: e.blob_id for e in TreeEntry.objects.filter(commit_id=parent_id)}
    deleted = _deletions(current, delete, repo, branch, parent_id, delete_field)
    new = dict(current)
    for path in (file for files in deleted.values() for file in files):
        new.pop(path, None)
    for path, blob in blobs.items():
        new[path] = blob.pk
    if clash := file_folder_clash(sorted(blobs), new):
        # a file cannot also be a folder: `a` and `a/b` (or `A/b`) together would break every checkout
        raise BadRequest(f"{clash[0]!r} would make a path both a file and a folder: nothing was committed.",
                         [Finding("path", file_folder_problem(*clash, "in the commit"))])
    if same := same_file_clash(blobs, new):
        raise BadRequest(f"{same[0]!r} would clash with {same[1]!r}: nothing was committed.", [Finding("path", same_file_problem(*same, "in the commit"))])
    if new == current:
        return None
    commit = Commit.objects.create(
        id=new_commit_id(repo.pk, parent_id, sorted(new.items()), message),
        repo=repo, parents=[parent_id], author=author, author_name=_author_name(author),
        message=message or _default_message(blobs, deleted),
    )
    TreeEntry.objects.bulk_create([TreeEntry(commit=commit, path=p, blob_id=b) for p, b in new.items()], batch_size=2000)
    return commit


def _deletions(current: Mapping[str, str], delete: list[str], repo: Repo, branch: str | None, head: str, field: str) -> dict[str, list[str]]:
    """Each path of `delete` with the files of the tree `current` (commit `head`, the head of `branch`
    when it is on one) it removes: itself when it is a file, else every file under the folder it
    names; a 404 for one that is neither."""
    deleted: dict[str, list[str]] = {}
    folders: dict[str, list[str]] | None = None
    for i, path in enumerate(delete):
        if path in current:
            deleted.setdefault(path, [path])
            continue
        if folders is None:  # built once, and only when a folder is named
            folders = defaultdict(list)
            for file in current:
                for folder in PurePosixPath(file).parents:
                    if str(folder) != ".":
                        folders[str(folder)].append(file)
        if not folders.get(path):
            where, on, ref = (f"Branch {branch!r}", f"on branch {branch}", branch) if branch is not None else (f"Commit {head[:10]}", f"in commit {head[:10]}", head)
            raise NotFound(f"{where} of {repo.full_name} has no file or folder {path!r} (at commit {head[:10]}): nothing was deleted.",
                           [Finding(f"{field}[{i}]", f"{path} is not {on}: give a file or folder it has "
                                                     f"(GET /api/hub/repos/{repo.name}/files?ref={ref} lists them)")])
        deleted.setdefault(path, sorted(folders[path]))
    return deleted


def _default_message(blobs: Mapping[str, Any], deleted: Mapping[str, list[str]]) -> str:
    """The message of a commit given none: "Upload 2 files", "Delete prefs.csv and bad.jsonl",
    "Delete data/old/ (3 files)", "Upload 1 file, delete config.json"."""
    parts = [f"Upload {counted(len(blobs), 'file')}"] if blobs else []
    if deleted:
        parts.append(("delete " if parts else "Delete ") + _listed(deleted))
    return ", ".join(parts) or "Empty commit"


def _listed(deleted: Mapping[str, list[str]]) -> str:
    """What a commit deleted, as a person names it: the files, and each folder with its count (a path
    inside a folder it also deleted is in that folder's count, not named again)."""
    folders = [path for path, files in deleted.items() if files != [path]]
    names = [path if files == [path] else f"{path}/ ({counted(len(files), 'file')})" for path, files in deleted.items()
             if not any(path.startswith(folder + "/") for folder in folders)]
    if len(names) > 4:
        names = [*names[:3], f"{len(names) - 3} more"]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
