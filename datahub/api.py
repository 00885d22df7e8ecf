"""/api/hub: repos, branches, tags, commits, files, downloads (a file, or a .tar of a ref's files),
dataset preview, upload sessions and deleting files (a commit, as an upload session's is).

Repos are named within the caller's current project (a token's project). Order of checks, as
everywhere: 401 → 404 (not this project's repo) → 403 (viewers cannot write) → 409 → 400.
Bodies are parsed after the permission checks (parse_body), query values by hand for the same reason.
"""
from __future__ import annotations

from django.db.models import QuerySet
from django.http import FileResponse, HttpRequest
from django.utils.http import urlencode
from ninja import Router

from datahub import archives, datasets, repos, services, storage, uploads
from datahub.models import Blob, Commit, Repo, RepoType, Tag, TreeEntry, UploadSession
from datahub.schemas import (
    MAX_FILE_SIZE,
    BranchIn,
    ChunkOut,
    CommitOut,
    DiffOut,
    FilesDeleteIn,
    PreviewOut,
    RefOut,
    RefPageOut,
    RepoIn,
    RepoOut,
    TagIn,
    TreeOut,
    UploadCommitIn,
    UploadIn,
    UploadOut,
)
from studio.api import MAX_LIMIT, MAX_OFFSET, ErrorOut, actor, body_schema, parse_body
from studio.errors import BadRequest, Finding, NotFound
from studio.parsing import ascii_int

router = Router(tags=["hub"])


def repo_or_404(request: HttpRequest, name: str, write: bool = False) -> Repo:
    who = actor(request)
    project = who.require_project()
    repo = repos.find_repo(project, name)
    if repo is None or who.membership(project) is None:
        raise NotFound(f"Project {project.slug} has no repo {name!r}.")
    if write:
        who.require_write(project)
    return repo


def query_int(request: HttpRequest, key: str, default: int | None, minimum: int = 0, maximum: int | None = None) -> int | None:
    raw = request.GET.get(key)
    if raw is None or raw == "":
        return default
    # int() also read " 1" and "٣" (studio.parsing.ascii_int says why not); a minus sign is a number out of range
    value = -magnitude if raw.startswith("-") and (magnitude := ascii_int(raw[1:])) is not None else ascii_int(raw)
    if value is None:
        raise BadRequest(f"{key} must be a whole number.", [Finding(key, f"give {key} as an integer")])
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f"between {minimum} and {maximum}" if maximum is not None else f"of {minimum} or more"
        raise BadRequest(f"{key} is out of range.", [Finding(key, f"give {key} {allowed}")])
    return value


def query_ref(request: HttpRequest, key: str = "ref") -> str | None:
    value = request.GET.get(key) or None
    if value is not None and (len(value) > 200 or not repos.NAME_RE.match(value)):
        raise BadRequest(f"{key} is not a branch, tag or commit id.", [Finding(key, "give a branch name, a tag or a commit id")])
    return value


REF_SCHEMA = {"type": "string", "maxLength": 200}


def query_doc(*params: tuple) -> dict:
    """openapi_extra naming the query values an endpoint reads by hand (query_ref, query_int,
    request.GET): ninja cannot see them, so without this /api/openapi.json leaves them out. Each is
    (name, schema, description) or, for one the endpoint refuses to go without, (…, True)."""
    return {"parameters": [{"name": name, "in": "query", "required": bool(required and required[0]), "schema": schema, "description": text}
                           for name, schema, text, *required in params]}


def files_of(entries) -> list[dict]:
    return [{"path": e.path, "size": e.blob.size, "sha256": e.blob.sha256} for e in entries]


def commit_out(c: Commit) -> dict:
    return {"id": c.pk, "parents": c.parents, "author": c.author_name, "message": c.message, "created_at": c.created_at}


def repo_out(r: Repo) -> dict:
    return {"id": r.pk, "name": r.name, "full_name": r.full_name, "type": r.type, "description": r.description,
            "default_branch": r.default_branch, "created_at": r.created_at}


# ---- repos -------------------------------------------------------------------------------------

@router.get("/repos", response=list[RepoOut], openapi_extra=query_doc(
    ("type", {"type": "string", "enum": list(RepoType.values)}, "only repos of this type")))
def list_repos(request: HttpRequest):
    project = actor(request).require_project()
    qs = Repo.objects.filter(project=project).select_related("project")
    kind = request.GET.get("type")
    if kind:
        if kind not in RepoType.values:
            raise BadRequest("Unknown repo type.", [Finding("type", f"type is one of {', '.join(RepoType.values)}")])
        qs = qs.filter(type=kind)
    return [repo_out(r) for r in qs]


@router.post("/repos", response={201: RepoOut}, openapi_extra=body_schema(RepoIn))
def create_repo(request: HttpRequest):
    who = actor(request)
    project = who.require_project()
    who.require_write(project)
    payload = parse_body(request, RepoIn)
    return 201, repo_out(services.create_repo(project, payload.name, payload.type, who.user, payload.description))


@router.get("/repos/{name}", response=RepoOut)
def get_repo(request: HttpRequest, name: str):
    return repo_out(repo_or_404(request, name))


@router.delete("/repos/{name}", response={204: None})
def delete_repo(request: HttpRequest, name: str):
    """Delete a repo: its branches, tags and commits go; blob bytes stay (shared by content with
    other repos). 409 while a live run (queued, provisioning, running) uses it."""
    repo = repo_or_404(request, name, write=True)
    services.delete_repo(repo)
    return 204, None


@router.get("/repos/{name}/branches", response=RefPageOut, openapi_extra=query_doc(
    ("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 100}, "at most this many branches"),
    ("offset", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0}, "skip this many first")))
def list_branches(request: HttpRequest, name: str):
    """The repo's branches in natural order (run-2 before run-10), a page at a time: an experiment's
    repo has a branch for each run."""
    repo = repo_or_404(request, name)
    limit = query_int(request, "limit", 100, 1, MAX_LIMIT) or 100
    offset = query_int(request, "offset", 0, 0, MAX_OFFSET) or 0
    branches = repos.branches_of(repo)
    return {"items": [{"name": b.name, "commit": b.head_id} for b in branches[offset:offset + limit]], "count": len(branches)}


@router.post("/repos/{name}/branches", response={201: RefOut}, openapi_extra=body_schema(BranchIn))
def create_branch(request: HttpRequest, name: str):
    repo = repo_or_404(request, name, write=True)
    payload = parse_body(request, BranchIn)
    branch = services.create_branch(repo, payload.name, payload.from_ref, name_field="name", from_field="from")
    return 201, {"name": branch.name, "commit": branch.head_id}


@router.delete("/repos/{name}/branches/{branch}", response={204: None})
def delete_branch(request: HttpRequest, name: str, branch: str):
    """Delete a branch; its commits stay. 409 for the default branch, for a run's branch and while
    a live run (queued, provisioning, running) names it in a `repo@branch` ref."""
    repo = repo_or_404(request, name, write=True)
    services.delete_branch(repo, branch)
    return 204, None


@router.get("/repos/{name}/tags", response=list[RefOut])
def list_tags(request: HttpRequest, name: str):
    repo = repo_or_404(request, name)
    return [{"name": t.name, "commit": t.commit_id} for t in Tag.objects.filter(repo=repo)]


@router.post("/repos/{name}/tags", response={201: RefOut}, openapi_extra=body_schema(TagIn))
def create_tag(request: HttpRequest, name: str):
    repo = repo_or_404(request, name, write=True)
    payload = parse_body(request, TagIn)
    tag = services.create_tag(repo, payload.name, payload.ref, name_field="name")
    return 201, {"name": tag.name, "commit": tag.commit_id}


@router.delete("/repos/{name}/tags/{tag}", response={204: None})
def delete_tag(request: HttpRequest, name: str, tag: str):
    """Delete a tag; the commit it named stays. 409 while a live run names it in a `repo@tag` ref."""
    repo = repo_or_404(request, name, write=True)
    services.delete_tag(repo, tag)
    return 204, None


@router.get("/repos/{name}/commits", response=list[CommitOut], openapi_extra=query_doc(
    ("ref", REF_SCHEMA, "a branch, tag or commit id (default: the default branch)"),
    ("limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}, "at most this many commits, newest first")))
def list_commits(request: HttpRequest, name: str):
    repo = repo_or_404(request, name)
    limit = query_int(request, "limit", 50, 1, 500)
    return [commit_out(c) for c in repos.history(repo, query_ref(request), limit or 50)]


@router.get("/repos/{name}/files", response=TreeOut, openapi_extra=query_doc(
    ("ref", REF_SCHEMA, "a branch, tag or commit id (default: the default branch)"),
    ("path", {"type": "string"}, "only the files under this folder")))
def list_files(request: HttpRequest, name: str):
    repo = repo_or_404(request, name)
    ref = query_ref(request) or repo.default_branch
    commit = repos.resolve(repo, ref)
    _, qs = folder_entries(repo, ref, commit, request.GET.get("path"), "list")
    return {"repo": repo.full_name, "ref": ref, "commit": commit.pk, "files": files_of(qs.select_related("blob"))}


def folder_entries(repo: Repo, ref: str, commit: Commit, prefix: str | None, verb: str) -> tuple[str, QuerySet[TreeEntry]]:
    """The folder `prefix` (a query's `path`, "" or "/" for the repo root) and the tree entries under it at
    `commit`, for the endpoints that `verb` a folder (list, archive): a 400 for a file, which is
    fetched instead, and a 404 for a folder that `ref` does not have (both said `[]` once)."""
    qs = TreeEntry.objects.filter(commit=commit)
    folder = (prefix or "").rstrip("/")
    if not folder:  # "/" is the root too, as the page's /archive/<ref>/ is
        return "", qs
    folder = repos.clean_path(folder)
    if repos.entry(commit, folder) is not None:
        # as the tree page says: a file is fetched, not listed (an empty list read as an empty folder)
        parent = folder.rpartition("/")[0]
        raise BadRequest(f"{folder} is a file at {ref}, not a folder.", [Finding("path", (
            f"{folder} is a file: fetch it with GET /api/hub/repos/{repo.name}/download?{urlencode({'path': folder, 'ref': ref})}, "
            f"or {verb} its folder with {urlencode({'path': parent}) if parent else 'no path (the repo root)'}"))])
    qs = qs.filter(repos.under(folder + "/"))
    if not qs.exists():
        # a folder is there only while it holds a file, so this one is not: an empty list read as an
        # empty folder, where the tree page and /hub's tree answer 404 (an empty repo's root stays [])
        raise NotFound(f"{repo.full_name} has no folder {folder!r} at {ref}.", [Finding("path", (
            f"give a folder that {ref} has: GET /api/hub/repos/{repo.name}/files?{urlencode({'ref': ref})} (no path) lists every file"))])
    return folder, qs


@router.delete("/repos/{name}/files", response=CommitOut, openapi_extra=body_schema(FilesDeleteIn))
def delete_files(request: HttpRequest, name: str):
    """Delete `paths` (files, or folders with every file under them) from `branch` as a new commit,
    which is returned; earlier commits keep the files. 404 naming a path the branch does not have;
    409 when `parent` is given and the branch has moved from it, and on a run's branch while the
    run exists. The message, unless given, names what was deleted."""
    repo = repo_or_404(request, name, write=True)
    payload = parse_body(request, FilesDeleteIn)
    return commit_out(services.delete_files(repo, payload.branch, payload.paths, actor(request).user, payload.message, payload.parent))


@router.get("/repos/{name}/download", openapi_extra=query_doc(
    ("path", {"type": "string"}, "the file", True),
    ("ref", REF_SCHEMA, "a branch, tag or commit id (default: the default branch)")))
def download(request: HttpRequest, name: str):
    """The file at `path` in `ref`, streamed."""
    repo = repo_or_404(request, name)
    if not request.GET.get("path"):
        raise BadRequest("path is required.", [Finding("path", "give path=<a file of the repo>, e.g. ?path=data/train.jsonl")])
    path = repos.clean_path(request.GET["path"])
    ref = query_ref(request) or repo.default_branch
    commit = repos.resolve(repo, ref)
    entry = repos.entry(commit, path)
    if entry is None and TreeEntry.objects.filter(repos.under(path + "/"), commit=commit).exists():
        # as listing a file is: a folder is listed, not fetched
        raise BadRequest(f"{path} is a folder at {ref}, not a file.", [Finding("path", (
            f"{path} is a folder: list its files with GET /api/hub/repos/{repo.name}/files?{urlencode({'path': path, 'ref': ref})}, "
            f"then download each of them"))])
    if entry is None:
        raise NotFound(f"{repo.full_name} has no file {path!r} at {commit.pk[:10]}.")
    opened = storage.open_blob(entry.blob.storage_name)
    resp = FileResponse(getattr(opened, "file", opened), as_attachment=True, filename=path.rsplit("/", 1)[-1], content_type="application/octet-stream")
    resp["Content-Length"] = str(entry.blob.size)
    resp["ETag"] = f'"{entry.blob.sha256}"'
    resp["X-Repo-Commit"] = commit.pk
    return resp


@router.get("/repos/{name}/archive", openapi_extra={**query_doc(
    ("ref", REF_SCHEMA, "a branch, tag or commit id (default: the default branch)"),
    ("path", {"type": "string"}, "only the files under this folder (default: the whole repo)")),
    "responses": {200: {"description": "The .tar, streamed", "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}}}})
def archive(request: HttpRequest, name: str):
    """The files at `ref` (under folder `path`) as one .tar, streamed whatever its size, as
    `<repo>-<ref>.tar`: each member is named by its path in the repo (datahub.archives says why tar)."""
    repo = repo_or_404(request, name)
    ref = query_ref(request) or repo.default_branch
    commit = repos.resolve(repo, ref)
    folder, entries = folder_entries(repo, ref, commit, request.GET.get("path"), "archive")
    return archives.archive_response(repo, ref, commit, folder, entries)


@router.get("/repos/{name}/diff", response=DiffOut, openapi_extra=query_doc(
    ("base", REF_SCHEMA, "the older ref (default: the default branch)"),
    ("head", REF_SCHEMA, "the newer ref (default: the default branch)")))
def diff(request: HttpRequest, name: str):
    """Files added, removed and changed between two refs (`base` → `head`)."""
    repo = repo_or_404(request, name)
    base = repos.resolve(repo, query_ref(request, "base") or repo.default_branch, field="base")
    head = repos.resolve(repo, query_ref(request, "head") or repo.default_branch, field="head")
    old, new = repos.tree(base), repos.tree(head)

    def out(paths: list[str], tree: dict[str, Blob]) -> list[dict]:
        return [{"path": p, "size": tree[p].size, "sha256": tree[p].sha256} for p in sorted(paths)]

    return {
        "base": base.pk, "head": head.pk,
        "added": out([p for p in new if p not in old], new),
        "removed": out([p for p in old if p not in new], old),
        "changed": out([p for p in new if p in old and new[p].pk != old[p].pk], new),
    }


@router.get("/repos/{name}/preview", response=PreviewOut, openapi_extra=query_doc(
    ("ref", REF_SCHEMA, "a branch, tag or commit id (default: the default branch)"),
    ("path", {"type": "string"}, "the dataset file (default: the first one found)"),
    ("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 20}, "at most this many rows"),
    ("after", {"type": "integer", "minimum": 0, "maximum": datasets.PREVIEW_AFTER_MAX, "default": 0},
     "the rows after this row number: the answer's next_after, for the next page")))
def preview(request: HttpRequest, name: str):
    """A page of a dataset file's rows (the first ones, or those after `after`) and its detected shape."""
    repo = repo_or_404(request, name)
    commit = repos.resolve(repo, query_ref(request))
    path = request.GET.get("path")
    if path:
        path = repos.clean_path(path)
    limit = query_int(request, "limit", 20, 1, 200)
    after = query_int(request, "after", 0, 0, datasets.PREVIEW_AFTER_MAX)
    return {"commit": commit.pk, **datasets.preview(commit, path, limit or 20, after or 0)}


# ---- upload sessions ---------------------------------------------------------------------------

def upload_out(session: UploadSession) -> dict:
    return {
        "id": str(session.pk), "repo": session.repo_full_name, "branch": session.branch, "state": session.state,
        "commit": session.commit_id,
        "reason": f"{uploads.aborted_detail(session)} To go on, {uploads.start_again(session)}." if session.state == UploadSession.State.ABORTED else None,
        "files": [{"index": f.index, "path": f.path, "size": f.size, "received": f.received, "complete": f.complete} for f in session.files.all()],
    }


def upload_or_404(request: HttpRequest, upload_id: str, write: bool = False) -> UploadSession:
    who = actor(request)
    session = uploads.get_upload(who.scoped_project_ids(), upload_id)
    if write:
        who.require_write(session.project)
    return session


@router.post("/repos/{name}/uploads", response={201: UploadOut, 507: ErrorOut}, openapi_extra=body_schema(UploadIn))
def create_upload(request: HttpRequest, name: str):
    """Start an upload session for `files` (path and size each; a file is at most 4 TiB) on `branch`;
    with `parent`, its commit step requires the branch to still be at that commit."""
    repo = repo_or_404(request, name, write=True)
    payload = parse_body(request, UploadIn)
    session = uploads.create_upload(repo, actor(request).user, payload.branch, [f.model_dump() for f in payload.files], payload.message, payload.parent)
    return 201, upload_out(session)


@router.get("/uploads/{upload_id}", response=UploadOut)
def get_upload(request: HttpRequest, upload_id: str):
    return upload_out(upload_or_404(request, upload_id))


@router.put("/uploads/{upload_id}/files/{index}", response={200: ChunkOut, 507: ErrorOut}, openapi_extra={
    "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
    "parameters": [{"name": "offset", "in": "query", "required": True, "schema": {"type": "integer", "minimum": 0, "maximum": MAX_FILE_SIZE}}],
})
def put_chunk(request: HttpRequest, upload_id: str, index: str):
    """Write the body at `offset` (the file's received count) of file `index`; send the chunks in order."""
    session = upload_or_404(request, upload_id, write=True)
    number = ascii_int(index)
    if number is None:
        raise NotFound(f"The upload session has no file {index!r}.")
    offset = query_int(request, "offset", None, 0, MAX_FILE_SIZE)
    if offset is None:
        raise BadRequest("offset is required.", [Finding("offset", "give offset=<bytes already received>; GET the session to see it")])
    length = ascii_int(request.META.get("CONTENT_LENGTH"))
    if length is None:  # a chunked body: Django reads none of it, and the PUT would store nothing
        raise BadRequest("The chunk has no Content-Length.", [Finding("body", "send the chunk with a Content-Length header (a Transfer-Encoding: chunked body is not read)")])
    upload = uploads.write_chunk(session, number, offset, request, length)
    return {"index": upload.index, "received": upload.received, "size": upload.size, "complete": upload.complete}


@router.post("/uploads/{upload_id}/commit", response={200: CommitOut, 507: ErrorOut}, openapi_extra=body_schema(UploadCommitIn))
def commit_upload(request: HttpRequest, upload_id: str):
    session = upload_or_404(request, upload_id, write=True)
    # the body is optional: a bare POST commits with the message given when the session was made
    payload = parse_body(request, UploadCommitIn) if request.content_type == "application/json" and request.body.strip() else UploadCommitIn()
    return commit_out(uploads.commit_upload(session, actor(request).user, payload.message))


@router.delete("/uploads/{upload_id}", response={204: None})
def abort_upload(request: HttpRequest, upload_id: str):
    uploads.abort_upload(upload_or_404(request, upload_id, write=True))
    return 204, None
