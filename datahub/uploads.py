"""Upload sessions (the write path of the Data Hub API): create a session naming the files and
their sizes → PUT each file's bytes in chunks at explicit offsets (resumable: GET the session to
see what arrived) → commit. Chunks are staged on local disk; nothing is visible in any commit
until the commit step, which refuses while any file is incomplete. upload_files runs the same
steps in one call for the repo page's Upload files form.

Every chunk and every state change sets the session's updated_at (its last activity): `manage.py
hub_gc` aborts an open or committing session idle for --upload-days (expire_upload).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import IO

from django.db import transaction
from django.utils import timezone

from datahub import commits, repos, services, storage
from datahub.models import Commit, Repo, TreeEntry, UploadFile, UploadSession
from studio import audit
from studio.errors import BadRequest, Conflict, Finding, InsufficientStorage, NotFound
from studio.models import AuditEvent

UNFINISHED = (UploadSession.State.OPEN, UploadSession.State.COMMITTING)


def uploads_dir() -> Path:
    return storage.staging_dir() / "uploads"


def staged_path(session_id) -> Path:
    return uploads_dir() / str(session_id)


def session_dir(session: UploadSession) -> Path:
    path = staged_path(session.pk)
    path.mkdir(parents=True, exist_ok=True)
    return path


def discard_staged(session_ids: Iterable) -> None:
    """Remove what these sessions staged (a committed, aborted or deleted session's chunks)."""
    for session_id in session_ids:
        shutil.rmtree(staged_path(session_id), ignore_errors=True)


def part_path(session: UploadSession, index: int) -> Path:
    return session_dir(session) / f"{index}.part"


@transaction.atomic
def create_upload(repo: Repo, user, branch: str, files: list[dict], message: str = "", parent: str | None = None) -> UploadSession:
    repos.check_name(branch, "branch", "branch name")
    if not repo.branches.filter(name=branch).exists():
        raise BadRequest(f"{repo.full_name} has no branch {branch!r}.", [Finding("branch", "upload to an existing branch, or create it first")])
    refuse_run_branch(repo, branch)
    seen: set[str] = set()
    rows = []
    for i, f in enumerate(files):
        path = repos.clean_new_path(f["path"], f"files[{i}].path")
        if path in seen:
            raise BadRequest(f"{path!r} is listed twice.", [Finding(f"files[{i}].path", "list each path once")])
        seen.add(path)
        rows.append((i, path, f["size"], f.get("sha256") or ""))
    check_file_folder_clash(repo, branch, [(i, p) for i, p, _, _ in rows])
    with transaction.atomic():  # no session without its staging folder
        session = UploadSession.objects.create(project_id=repo.project_id, repo=repo, repo_name=repo.name, branch=branch, created_by=user,
                                               message=message or "", parent=parent or "")
        UploadFile.objects.bulk_create([UploadFile(session=session, index=i, path=p, size=s, sha256=h) for i, p, s, h in rows])
        try:
            session_dir(session)
        except OSError as exc:
            if not storage.disk_full(exc):
                raise
            raise storage.disk_full_error(exc, "files", "create the upload session again") from exc
    return session


def refuse_run_branch(repo: Repo, branch: str) -> None:
    """A 409 for an upload to a run's branch while the run exists: only the Studio's own checkpoint
    commits write there (services.refuse_run_branch, the rule deleting its files follows too)."""
    services.refuse_run_branch(repo, branch, "files cannot be committed to it", f"upload to another branch (one made from {branch} "
                               f"with POST /api/hub/repos/{repo.name}/branches {{\"name\": \"my-{branch}\", \"from\": \"{branch}\"}} starts with its files)")


def check_file_folder_clash(repo: Repo, branch: str, paths: list[tuple[int, str]]) -> None:
    """400 naming files[i].path when a listed path would be a file and a folder at once, with the
    branch's files or with another listed path: found now, before any byte is sent, rather than
    when the commit step builds the tree (commit_blobs checks again, as the branch may move)."""
    head = repo.branches.filter(name=branch).values_list("head_id", flat=True).first()
    on_branch = sorted(TreeEntry.objects.filter(commit_id=head).values_list("path", flat=True))  # once, however many files are listed
    ordered = [p for _, p in paths]
    index = {p: i for i, p in paths}
    for others, place in ((on_branch, f"on branch {branch}"), (ordered, "in this upload")):
        if clash := repos.file_folder_clash(ordered, others):
            raise BadRequest(f"{clash[0]!r} would make a path both a file and a folder.",
                             [Finding(f"files[{index[clash[0]]}].path", repos.file_folder_problem(*clash, place))])
    # Two names one case-insensitive disk reads as one file (same_file_clash), here rather than at the commit
    for others, seen_in, stored in ((ordered, "in this upload", False), (on_branch, f"on branch {branch}", True)):
        if same := repos.same_file_clash(ordered, others):
            raise BadRequest(f"{same[0]!r} would clash with {same[1]!r}.", [Finding(f"files[{index[same[0]]}].path", repos.same_file_problem(*same, seen_in, stored))])


def get_upload(repo_ids: list[int] | None, upload_id: str) -> UploadSession:
    try:
        key = uuid.UUID(str(upload_id))
    except ValueError:
        raise NotFound("No such upload session.") from None
    # project, not repo: a session of a deleted repo is kept (aborted) to tell its client why
    session = UploadSession.objects.select_related("project", "repo").filter(pk=key).first()
    if session is None or (repo_ids is not None and session.project_id not in repo_ids):
        raise NotFound("No such upload session.")
    return session


def write_chunk(session: UploadSession, index: int, offset: int, stream: IO[bytes], length: int | None) -> UploadFile:
    """Append the request body to file `index` at `offset` (which must equal what has arrived).
    The row lock serialises two clients writing the same file. A full disk is a 507, and the
    file is cut back to `offset`: the client sends the chunk again once space is freed.

    The body is read into a temp file first, outside any transaction: on SQLite a
    transaction holds the database's one write lock, and a chunk coming over a slow link held it
    from every other writer (engines' ingest included) for as long as its bytes took."""
    row = UploadFile.objects.filter(session=session, index=index).values_list("size", "received").first()
    if row is None:
        raise NotFound(f"The upload session has no file {index}.")
    size, received = row
    # Before the body is read (and again under the lock): a chunk at the wrong offset is told where to
    # resume. Judged first by its size, one past the file's end got "send at most -2 bytes".
    _refuse_out_of_turn(session, index, offset, received)
    # A temp file of the staging dir's kind (hub_gc removes one a crash left), not in the session's
    # folder, which would bring back the folder of a session aborted meanwhile.
    fd, name = tempfile.mkstemp(dir=storage.staging_dir(), prefix="blob-", suffix=".chunk")
    os.close(fd)
    incoming = Path(name)
    try:
        try:
            arrived = _write_part(incoming, index, offset, stream, length, size, at=0)
        except OSError as exc:
            if not storage.disk_full(exc):
                raise
            raise storage.disk_full_error(exc, "body", f"send this chunk again at offset {offset} (the upload session keeps what arrived before it)") from exc
        with open(incoming, "rb") as body:
            return _append_chunk(session, index, offset, body, arrived)
    finally:
        incoming.unlink(missing_ok=True)


def _append_chunk(session: UploadSession, index: int, offset: int, stream: IO[bytes], length: int) -> UploadFile:
    with transaction.atomic():
        upload = UploadFile.objects.select_for_update().filter(session=session, index=index).first()
        if upload is None:
            raise NotFound(f"The upload session has no file {index}.")
        session = UploadSession.objects.get(pk=session.pk)
        _refuse_out_of_turn(session, index, offset, upload.received)
        part = part_path(session, index)
        try:
            written = _write_part(part, index, offset, stream, length, upload.size)
        except OSError as exc:
            if not storage.disk_full(exc):
                raise
            if part.exists():
                os.truncate(part, offset)  # give back what this chunk took: the file is as it was before it
            raise storage.disk_full_error(exc, "body", f"send this chunk again at offset {offset} (the upload session keeps what arrived before it)") from exc
        upload.received = offset + written
        upload.save(update_fields=["received"])
        # The chunk is activity (hub_gc aborts idle sessions). Touched last, so the session row is
        # locked only until this commits (chunks of other files go on in parallel); if the session
        # was aborted or expired while the bytes came, this rolls `received` back and says so.
        if not UploadSession.objects.filter(pk=session.pk, state=UploadSession.State.OPEN).update(updated_at=timezone.now()):
            raise not_open(UploadSession.objects.get(pk=session.pk))
        return upload


def _refuse_out_of_turn(session: UploadSession, index: int, offset: int, received: int) -> None:
    """The 409 for a chunk the session cannot take now: it is no longer open, or `offset` is not
    where file `index` goes on (`received`, the bytes that arrived so far)."""
    if session.state != UploadSession.State.OPEN:
        raise not_open(session)
    if offset != received:
        raise Conflict(f"File {index} has {received} bytes so far: send the next chunk at offset {received}.",
                       [Finding("offset", f"use offset={received}")])


def _write_part(part: Path, index: int, offset: int, stream: IO[bytes], length: int | None, size: int, at: int | None = None) -> int:
    """Write `stream`, the bytes of file `index` from `offset`, into `part` at `at` (default `offset`:
    the staged file; 0 for a spooled chunk), dropping what lay beyond it; the bytes written."""
    written = 0
    at = offset if at is None else at
    with open(part, "r+b" if part.exists() else "wb") as out:
        out.seek(at)
        out.truncate()
        while True:
            want = storage.CHUNK_SIZE if length is None else min(storage.CHUNK_SIZE, length - written)
            if want <= 0:
                break
            chunk = stream.read(want)
            if not chunk:
                break
            if offset + written + len(chunk) > size:
                out.truncate(at)
                raise BadRequest(
                    f"File {index} is {size} bytes and this chunk goes past its end.",
                    [Finding("body", f"send at most {size - offset} bytes at offset {offset}")],
                )
            out.write(chunk)
            written += len(chunk)
    return written


def commit_upload(session: UploadSession, user, message: str | None = None) -> Commit:
    """Hash every staged file into a blob, then commit them all at once. The session is claimed
    (open → committing) so two commit requests do not both work; the hashing runs outside any
    transaction. Committing a committed session returns its commit (a retry is harmless).
    A full blob storage is a 507 that leaves the session open with its staged files: a blob is
    recorded only once all its bytes are stored, so committing again after space is freed works."""
    with transaction.atomic():
        session = UploadSession.objects.select_for_update(of=("self",)).select_related("repo", "project").get(pk=session.pk)
        if session.state == UploadSession.State.COMMITTED and session.commit_id:
            return session.commit
        if session.state != UploadSession.State.OPEN:
            raise not_open(session)
        # again: a run may have taken the branch since the session was opened (one made before
        # run-<id> names were kept for the runs)
        refuse_run_branch(session.repo, session.branch)
        files = list(session.files.all())
        for f in files:  # a session opened before a path rule was added is held to it too
            repos.clean_new_path(f.path, f"files[{f.index}].path")
        missing = [f for f in files if not f.complete]
        if missing:
            raise Conflict(
                "The upload is not complete: nothing was committed.",
                [Finding(f"files[{f.index}]", f"{f.path} has {f.received} of {f.size} bytes: send the rest, then commit") for f in missing],
            )
        UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.COMMITTING, updated_at=timezone.now())
    try:
        blobs = {f.path: _blob_of(session, f) for f in files}
        commit = commits.commit_blobs(session.repo, session.branch, blobs, message or session.message, user, parent=session.parent or None)
    except BaseException as exc:
        # Only from committing: a session that hub_gc expired, or whose repo was deleted, meanwhile
        # stays aborted (its staged files are gone), and its client is told that instead.
        reopened = UploadSession.objects.filter(pk=session.pk, state=UploadSession.State.COMMITTING).update(state=UploadSession.State.OPEN, updated_at=timezone.now())
        if not reopened and isinstance(exc, Exception):
            raise not_open(UploadSession.objects.select_related("project", "repo").get(pk=session.pk)) from exc
        if storage.disk_full(exc):
            raise storage.disk_full_error(exc, "files", "commit this upload session again (it is still open, with every file it received)") from exc
        if isinstance(exc, commits.BranchMoved):
            # The session's parent is fixed when it is made, so committing it again cannot succeed.
            raise Conflict(f"{exc.detail} This upload session was made for parent {exc.parent[:10]}, which cannot change: nothing was committed.",
                           [Finding("parent", f"start a new upload session (POST /api/hub/repos/{session.repo_name}/uploads) with "
                                              f"\"parent\": \"{exc.head}\" (the branch's head now) or no parent, send the files to it and commit "
                                              f"it; then DELETE this one (/api/hub/uploads/{session.pk})")]) from exc
        raise
    with transaction.atomic():
        UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.COMMITTED, commit=commit, updated_at=timezone.now())
        audit.record(AuditEvent.Action.UPLOADED, session.repo, project=session.project, user=user,
                     details=services.commit_details(session.branch, commit, [f.path for f in files]))
    discard_staged([session.pk])
    return commit


def _blob_of(session: UploadSession, f: UploadFile):
    """The stored blob of a complete staged file (stored once: a retried commit reuses it)."""
    if f.blob_id:
        return f.blob
    part = part_path(session, f.index)
    if f.size == 0 and not part.exists():
        part.write_bytes(b"")
    sha256, size = storage.hash_file(part)
    if f.sha256 and f.sha256 != sha256:
        UploadFile.objects.filter(pk=f.pk).update(received=0)
        part.unlink(missing_ok=True)
        raise BadRequest(f"{f.path} arrived with sha256 {sha256}, not the {f.sha256} announced.",
                         [Finding(f"files[{f.index}].sha256", "the bytes were corrupted on the way: upload this file again from offset 0")])
    blob = commits.store_staged(part, sha256, size, keep_on_error=True)
    UploadFile.objects.filter(pk=f.pk).update(blob=blob)
    UploadSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())  # a committer at work is active
    return blob


def upload_files(repo: Repo, user, branch: str, files: list[tuple[str, int, IO[bytes]]], message: str = "") -> Commit:
    """The session path in one call, for a caller that already holds every file's bytes (the repo
    page's Upload files form): create_upload → each file written at offset 0 → commit_upload.
    `files` is (path, size, stream) each. Refusals are those of the steps, naming files[i].path,
    branch or path; on any error the session is aborted, so nothing is committed or left staged
    (and a full disk's 507 says to upload again, not to resume the session)."""
    session = create_upload(repo, user, branch, [{"path": path, "size": size} for path, size, _ in files], message)
    try:
        for index, (_, size, stream) in enumerate(files):
            write_chunk(session, index, 0, stream, size)
        return commit_upload(session, user)
    except InsufficientStorage as exc:
        _abort(session.pk, state=UploadSession.State.OPEN)
        raise storage.disk_full_error(exc.__cause__, "files", "upload the files again") from exc.__cause__
    except BaseException:
        _abort(session.pk, state=UploadSession.State.OPEN)
        raise


def abort_upload(session: UploadSession) -> None:
    """Abort an open session (the API's DELETE); an aborted one stays so, and a DELETE sent again is
    fine. A session that is committed, or being committed, is a 409: its files are (or are about to
    be) on the branch, and a 204 would tell the client they are not."""
    if _abort(session.pk, state=UploadSession.State.OPEN):
        return
    session.refresh_from_db(fields=["state", "commit"])
    if session.state == UploadSession.State.COMMITTED:
        raise Conflict(f"This upload session is already committed, as {session.commit_id[:10]} on branch {session.branch}: there is nothing to abort.",
                       [Finding("upload_id", "its files stay on the branch: to change them, commit again (a new upload session)")])
    if session.state == UploadSession.State.COMMITTING:
        raise Conflict("This upload session is being committed: it can no longer be aborted.",
                       [Finding("upload_id", "wait for the commit: GET the session shows it when it is done")])


def expire_upload(session_id, idle_since: datetime, reason: str) -> bool:
    """Abort an open or committing session with no activity since `idle_since` (hub_gc), as
    abort_upload does, noting `reason` for its client. A committing session that idle lost its
    committer (commit_upload touches the session for each file it stores): the blobs it stored are
    then named by no unfinished upload, and hub_gc's grace period applies to them. The conditional
    update is the claim: a chunk or a commit step that touched the session meanwhile keeps it."""
    return _abort(session_id, reason, state__in=UNFINISHED, updated_at__lt=idle_since)


def _abort(session_id, reason: str = "", **only_if) -> bool:
    """Mark the session aborted when it matches `only_if`, and discard what it staged."""
    with transaction.atomic():
        updated = UploadSession.objects.filter(pk=session_id, **only_if).update(
            state=UploadSession.State.ABORTED, abort_reason=reason, updated_at=timezone.now())
    if updated:
        discard_staged([session_id])
    return bool(updated)


def not_open(session: UploadSession) -> Conflict:
    """The 409 for a chunk or a commit sent to a session that is no longer open."""
    if session.state == UploadSession.State.COMMITTING:
        return Conflict("This upload session is being committed: wait for it (GET the session shows its commit when it is done).")
    if session.state == UploadSession.State.COMMITTED:
        return Conflict("This upload session is committed: start a new upload session to change the repo again.")
    return Conflict(aborted_detail(session), [Finding("upload_id", start_again(session))])


def aborted_detail(session: UploadSession) -> str:
    because = f" because {session.abort_reason}" if session.abort_reason else ""
    return f"This upload session was aborted{because}: nothing of it was committed, and the bytes it received are gone."


def start_again(session: UploadSession) -> str:
    if session.repo_id is None:
        return (f"create the repo again if it is still wanted (POST /api/hub/repos with name {session.repo_name}), then start a new "
                f"upload session (POST /api/hub/repos/{session.repo_name}/uploads) and send the files again")
    return f"start a new upload session (POST /api/hub/repos/{session.repo_name}/uploads) and send the files again"
