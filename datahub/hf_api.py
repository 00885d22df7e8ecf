"""Enough of the Hugging Face Hub's HTTP protocol for `huggingface_hub` (snapshot_download,
hf_hub_download, HfFileSystem) and `transformers` from_pretrained to read Data Hub repos, with
HF_ENDPOINT=http://<studio>/hub and a Studio token (Authorization: Bearer).

The repo id is `<project-slug>/<repo-name>`. Reads only: writes go through Studio's API. A caller
who cannot see the project gets RepoNotFound (404), exactly like a repo that does not exist.
What huggingface_hub 2.4 reads (file_download.get_hf_file_metadata, hf_api.model_info /
list_repo_tree / get_paths_info): X-Repo-Commit, X-Linked-Etag / ETag, X-Linked-Size /
Content-Length on a HEAD of /resolve/, X-Error-Code on 404s, and Range on GETs (resumes, HfFileSystem).
"""
from __future__ import annotations

import base64
import bisect
import json
import re
from dataclasses import dataclass
from datetime import UTC

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.csrf import csrf_exempt

from datahub import repos, storage
from datahub.models import Branch, Commit, Repo, RepoType, Tag, TreeEntry
from studio import crypto
from studio.auth import StudioAuth
from studio.errors import TOKENS_PAGE, ApiError, BadRequest, Finding, NotFound, Unauthorized
from studio.ratelimit import refuse_bad_credentials

LFS_POINTER_SIZE = 134
# Entries per tree page unless settings.DATAHUB_TREE_PAGE_SIZE says otherwise: what the Hub serves.
TREE_PAGE_SIZE = 1000
RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class Reader:
    project_ids: frozenset[int]
    # A run's ingest token: the (repo id, commit) pairs its run pinned at START, and nothing else of
    # its project (the token lives in the compute job's environment, which runs its environment's
    # code). None: a member's token or session, which reads its projects whole.
    pins: frozenset[tuple[str, str]] | None = None

    def may_read(self, repo: Repo, commit: Commit | None = None) -> bool:
        if repo.project_id not in self.project_ids:
            return False
        if self.pins is None:
            return True
        return any(name == repo.full_name and (commit is None or commit.pk == pinned) for name, pinned in self.pins)


class HubError(Exception):
    def __init__(self, status: int, code: str | None, detail: str, commit: str | None = None, message_header: str | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.commit, self.message_header = status, code, detail, commit, message_header

    def response(self) -> HttpResponse:
        resp = JsonResponse({"detail": self.detail, "errors": [], "error": self.detail}, status=self.status)
        if self.code:
            resp["X-Error-Code"] = self.code
        if self.message_header:
            resp["X-Error-Message"] = self.message_header
        if self.commit:
            resp["X-Repo-Commit"] = self.commit
        return resp


def hub_view(methods: list[str]):
    def decorate(view):
        @csrf_exempt
        def wrapped(request: HttpRequest, *args, **kwargs):
            if request.method not in methods and not (request.method == "HEAD" and "GET" in methods):  # HEAD reads as GET (the server drops the body)
                # JSON, as the Hub's own errors (require_http_methods' 405 had no body)
                resp = HubError(405, None, f"{request.method} is not served here: {READ_ONLY}", message_header=READ_ONLY).response()
                resp["Allow"] = ", ".join(methods)
                return resp
            try:
                return view(request, *args, **kwargs)
            except HubError as exc:
                return exc.response()
            except ApiError as exc:
                return JsonResponse(exc.body(), status=exc.status, headers=exc.headers())

        wrapped.__name__ = view.__name__
        wrapped.__doc__ = view.__doc__
        return wrapped

    return decorate


# ---- who is reading ----------------------------------------------------------------------------

def reader_for(request: HttpRequest) -> Reader:
    """A Studio API token or browser session (its projects), or a run's ingest token (read access
    to that run's project, so a remote engine can fetch its base model and datasets)."""
    from training.services import INGEST_TOKEN_PREFIX, MERGE_TOKEN_PREFIX

    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip().startswith(f"{INGEST_TOKEN_PREFIX}_"):
        # Not an API token, so StudioAuth would refuse it and count a failure against the
        # engine's address each file it downloads.
        return ingest_reader(request, token.strip())
    if scheme.lower() == "bearer" and token.strip().startswith(f"{MERGE_TOKEN_PREFIX}_"):
        return merge_reader(request, token.strip())
    try:
        actor = StudioAuth()(request) if request.method in ("GET", "HEAD", "OPTIONS") or header else None
    except Unauthorized as exc:
        raise HubError(401, None, exc.detail, message_header="Invalid credentials in Authorization header") from None
    if actor is not None:
        return Reader(frozenset(actor.scoped_project_ids()))
    raise HubError(401, None, f"Authentication required: set HF_TOKEN to a Studio API token (make one in {TOKENS_PAGE}).")


def ingest_reader(request: HttpRequest, token: str) -> Reader:
    from training.models import ACTIVE_STATUSES, TrainingRun

    found = TrainingRun.objects.filter(ingest_token_hash=crypto.hash_token(token), status__in=ACTIVE_STATUSES).values_list("project_id", "pinned").first()
    if found is None:  # 429 instead for an address that keeps sending bad tokens (studio/ratelimit.py)
        refuse_bad_credentials(request, HubError(401, None, "This run ingest token is not valid, or its run is no longer provisioning or running: start the run again for a new one.",
                                                 message_header="Invalid credentials in Authorization header"))
    project_id, pinned = found
    pins = frozenset((pin["repo"], pin["commit"]) for pin in (pinned or {}).values() if isinstance(pin, dict) and "repo" in pin and "commit" in pin)
    return Reader(frozenset({project_id}), pins)


def merge_reader(request: HttpRequest, token: str) -> Reader:
    """A checkpoint merge's token (training.checkpoints.merge_base): the commit of the base model
    that the step's attempt trained on, and nothing else, while the merge runs."""
    from training.checkpoints import merge_mark_expired
    from training.models import Checkpoint
    from training.services import attempt_pinned

    checkpoint = Checkpoint.objects.select_related("run").filter(merge_token_hash=crypto.hash_token(token), merge_requested_at__gt=merge_mark_expired()).first()
    if checkpoint is None:
        refuse_bad_credentials(request, HubError(401, None, "This merge token is not valid, or its merge has ended: merge the checkpoint again for a new one.",
                                                 message_header="Invalid credentials in Authorization header"))
    pin = attempt_pinned(checkpoint.run, checkpoint.attempt).get("base_model")
    return Reader(frozenset({checkpoint.run.project_id}), frozenset({(pin["repo"], pin["commit"])} if pin else ()))


def repo_for(request: HttpRequest, namespace: str, name: str, kind: str = "models") -> tuple[Repo, Reader]:
    """The repo, as the Hub serves it under `kind`: datasets under /datasets, the rest (models,
    experiments' models, environment packages) under /models; the other kind is a 404, as on the Hub."""
    reader = reader_for(request)
    repo = Repo.objects.select_related("project").filter(project__slug=namespace, name=name).first()
    if repo is None or not reader.may_read(repo) or (kind == "datasets") != (repo.type == RepoType.DATASET):
        raise HubError(404, "RepoNotFound", f"Repository {namespace}/{name} not found.")
    return repo, reader


def commit_for(reader: Reader, repo: Repo, revision: str | None) -> Commit:
    try:
        commit = repos.resolve(repo, revision or repo.default_branch)
    except NotFound:
        commit = None
    if commit is None or not reader.may_read(repo, commit):
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    return commit


# ---- JSON shapes -------------------------------------------------------------------------------

def file_json(entry: TreeEntry) -> dict:
    blob = entry.blob
    return {
        "type": "file",
        "oid": blob.sha256,
        "size": blob.size,
        "path": entry.path,
        "lfs": {"oid": blob.sha256, "size": blob.size, "pointerSize": LFS_POINTER_SIZE},
    }


def folder_json(path: str) -> dict:
    return {"type": "directory", "oid": "0" * 40, "size": 0, "path": path}


def hf_date(value) -> str:
    """The Hub's timestamp format, which huggingface_hub parses strictly: 2024-11-16T00:27:02.123Z."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def repo_json(repo: Repo, commit: Commit) -> dict:
    entries = TreeEntry.objects.filter(commit=commit).select_related("blob").order_by("path")
    return {
        "_id": str(repo.pk),
        "id": repo.full_name,
        "modelId": repo.full_name,
        "author": repo.project.slug,
        "sha": commit.pk,
        "lastModified": hf_date(commit.created_at),
        "createdAt": hf_date(repo.created_at),
        "private": True,
        "gated": False,
        "disabled": False,
        "tags": [repo.type],
        "cardData": {},
        "siblings": [
            {"rfilename": e.path, "size": e.blob.size, "blobId": e.blob.sha256,
             "lfs": {"sha256": e.blob.sha256, "size": e.blob.size, "pointerSize": LFS_POINTER_SIZE}}
            for e in entries
        ],
    }


# ---- endpoints ---------------------------------------------------------------------------------

@hub_view(["GET"])
def repo_info(request: HttpRequest, kind: str, namespace: str, name: str, revision: str | None = None):
    """GET /api/{models,datasets}/{ns}/{name}[/revision/{rev}] → the repo at a commit."""
    repo, reader = repo_for(request, namespace, name, kind)
    return JsonResponse(repo_json(repo, commit_for(reader, repo, revision)))


@hub_view(["GET"])
def repo_refs(request: HttpRequest, kind: str, namespace: str, name: str):
    """GET /api/{kind}/{ns}/{name}/refs → its branches and tags (huggingface_hub's list_repo_refs)."""
    repo, reader = repo_for(request, namespace, name, kind)
    if reader.pins is not None:
        raise HubError(404, "RepoNotFound", f"Repository {namespace}/{name} not found.")  # an engine reads pinned commits, not refs
    return JsonResponse({
        "branches": [{"name": b.name, "ref": f"refs/heads/{b.name}", "targetCommit": b.head_id} for b in Branch.objects.filter(repo=repo)],
        "tags": [{"name": t.name, "ref": f"refs/tags/{t.name}", "targetCommit": t.commit_id} for t in Tag.objects.filter(repo=repo)],
        "converts": [],
        "pullRequests": [],
    })


COMMITS_LISTED = 1000  # the newest commits of a ref that list_repo_commits gets, in one page


@hub_view(["GET"])
def repo_commits(request: HttpRequest, kind: str, namespace: str, name: str, revision: str):
    """GET /api/{kind}/{ns}/{name}/commits/{rev} → the ref's first-parent history, newest first
    (huggingface_hub's list_repo_commits)."""
    repo, reader = repo_for(request, namespace, name, kind)
    commit_for(reader, repo, revision)  # the Hub's RevisionNotFound for a ref that is not there
    return JsonResponse([
        {"id": c.pk, "title": (c.message.splitlines() or [""])[0], "message": c.message,
         "authors": [{"user": c.author_name or "studio"}], "date": hf_date(c.created_at)}
        for c in repos.history(repo, revision, COMMITS_LISTED)
    ], safe=False)


@hub_view(["GET"])
def repo_tree(request: HttpRequest, kind: str, namespace: str, name: str, rest: str):
    """GET /api/{kind}/{ns}/{name}/tree/{rev}[/{path}]?recursive=1[&cursor=...] → one page of files
    and folders, sorted by path, and a `Link: <...>; rel="next"` header while more remain (the Hub's
    cursor pagination, which huggingface_hub's list_repo_tree and HfFileSystem follow)."""
    repo, reader = repo_for(request, namespace, name, kind)
    revision, _, path = rest.partition("/")
    cursor = request.GET.get("cursor")
    # A cursor pins the commit the first page listed, so a branch that moves between two pages
    # cannot mix two trees into one listing.
    commit, after = decode_cursor(reader, repo, cursor) if cursor is not None else (commit_for(reader, repo, revision), None)
    prefix = repos.clean_path(path.rstrip("/")) + "/" if path.strip("/") else ""
    recursive = request.GET.get("recursive", "").lower() in ("1", "true")
    # Paths only for the whole listing (folders are derived from them); blobs only for the page.
    paths = list(TreeEntry.objects.filter(repos.under(prefix), commit=commit).values_list("path", flat=True))
    if prefix and not paths:
        raise HubError(404, "EntryNotFound", f"{path} does not exist at {commit.pk}", commit=commit.pk)
    items = sorted(tree_items(paths, prefix, recursive))  # Python's order, not the database collation's
    start = bisect.bisect_right(items, after) if after else 0
    page = items[start:start + tree_page_size()]
    entries = {e.path: e for e in TreeEntry.objects.filter(commit=commit, path__in=[p for p, kind in page if kind == "file"]).select_related("blob")}
    resp = JsonResponse([file_json(entries[p]) if kind == "file" else folder_json(p) for p, kind in page], safe=False)
    resp["X-Repo-Commit"] = commit.pk
    if start + len(page) < len(items):
        query = request.GET.copy()
        query["cursor"] = encode_cursor(commit.pk, page[-1])
        # Absolute: huggingface_hub requests the next link as it is, with no base URL to resolve it.
        resp["Link"] = f'<{request.build_absolute_uri(f"{request.path}?{query.urlencode()}")}>; rel="next"'
    return resp


def tree_items(paths: list[str], prefix: str, recursive: bool) -> set[tuple[str, str]]:
    """(path, "file" | "directory") for what a tree listing under `prefix` shows."""
    items: set[tuple[str, str]] = set()
    for full in paths:
        parts = full[len(prefix):].split("/")
        if recursive:
            items.update((prefix + "/".join(parts[:depth]), "directory") for depth in range(1, len(parts)))
            items.add((full, "file"))
        elif len(parts) == 1:
            items.add((full, "file"))
        else:
            items.add((prefix + parts[0], "directory"))
    return items


def tree_page_size() -> int:
    return max(1, int(getattr(settings, "DATAHUB_TREE_PAGE_SIZE", TREE_PAGE_SIZE)))


def encode_cursor(commit_id: str, after: tuple[str, str]) -> str:
    """Opaque to clients: the listed commit and the last (path, kind) served."""
    raw = json.dumps([commit_id, *after], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(reader: Reader, repo: Repo, value: str) -> tuple[Commit, tuple[str, str]]:
    bad = BadRequest(f"The tree listing's cursor {value[:80]!r} is not valid.", [Finding(
        "cursor", 'pass the cursor from the previous page\'s Link: <...>; rel="next" header unchanged, or leave it out to list from the start')])
    try:
        data = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except ValueError:  # bad base64 (binascii.Error), bad UTF-8, bad JSON
        raise bad from None
    if not (isinstance(data, list) and len(data) == 3 and all(isinstance(x, str) for x in data) and data[2] in ("file", "directory")):
        raise bad
    commit = Commit.objects.filter(repo=repo, pk=data[0]).first()
    if commit is None or not reader.may_read(repo, commit):  # another repo's cursor, or a made-up commit
        raise bad
    return commit, (data[1], data[2])


@hub_view(["POST"])
def paths_info(request: HttpRequest, kind: str, namespace: str, name: str, revision: str):
    """POST /api/{kind}/{ns}/{name}/paths-info/{rev} (form: paths=..., expand=...)."""
    repo, reader = repo_for(request, namespace, name, kind)
    commit = commit_for(reader, repo, revision)
    out = []
    for raw in requested_paths(request):
        path = repos.clean_path(raw.strip("/"), "paths")
        entry = repos.entry(commit, path)
        if entry is not None:
            out.append(file_json(entry))
        elif TreeEntry.objects.filter(repos.under(path + "/"), commit=commit).exists():
            out.append(folder_json(path))
    return JsonResponse(out, safe=False)


def requested_paths(request: HttpRequest) -> list[str]:
    """The `paths` of a paths-info request: form fields as huggingface_hub sends them
    (paths=a&paths=b), or a JSON object {"paths": [...]}."""
    if request.content_type != "application/json":
        return request.POST.getlist("paths")
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise BadRequest("The body is not valid JSON.", [Finding("paths", 'send {"paths": ["config.json", ...]}, or the form field paths=...')]) from None
    paths = body.get("paths", []) if isinstance(body, dict) else None
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise BadRequest("paths must be a list of file paths.", [Finding("paths", 'a list of file paths (strings): send {"paths": ["config.json", "data/train.jsonl"]}')])
    return paths


@hub_view(["GET", "HEAD"])
def resolve_file(request: HttpRequest, namespace: str, name: str, revision: str, path: str, kind: str = "models"):
    """GET|HEAD /{ns}/{name}/resolve/{rev}/{path} (and /datasets/...): the file's bytes, streamed."""
    repo, reader = repo_for(request, namespace, name, kind)
    path = repos.clean_path(path)
    commit = commit_for(reader, repo, revision)
    entry = repos.entry(commit, path)
    if entry is None:
        raise HubError(404, "EntryNotFound", f"{path} does not exist at {repo.full_name}@{commit.pk}", commit=commit.pk)
    return file_response(request, entry, commit)


def file_response(request: HttpRequest, entry: TreeEntry, commit: Commit) -> HttpResponse:
    blob = entry.blob
    size = blob.size
    start, end = 0, size - 1
    status = 200
    range_header = request.headers.get("Range", "")
    match = RANGE_RE.match(range_header.strip()) if range_header else None
    if match and (match[1] or match[2]):
        if match[1]:
            start = int(match[1])
            end = min(int(match[2]), size - 1) if match[2] else size - 1
        else:
            start, end = max(0, size - int(match[2])), size - 1
        if start >= size or start > end:
            resp = HttpResponse(status=416)
            resp["Content-Range"] = f"bytes */{size}"
            return resp
        status = 206
    length = end - start + 1 if size else 0
    if request.method == "HEAD":
        resp = HttpResponse(status=status)
    elif status == 206:
        resp = StreamingHttpResponse(storage.iter_range(_raw(storage.open_blob(blob.storage_name)), start, length), status=206)
    else:
        resp = FileResponse(_raw(storage.open_blob(blob.storage_name)), content_type="application/octet-stream")
    resp["Content-Type"] = "application/octet-stream"
    resp["Content-Length"] = str(length)
    if status == 206:
        resp["Content-Range"] = f"bytes {start}-{end}/{size}"
    resp["Accept-Ranges"] = "bytes"
    resp["ETag"] = f'"{blob.sha256}"'
    resp["X-Linked-Etag"] = f'"{blob.sha256}"'
    resp["X-Linked-Size"] = str(size)
    resp["X-Repo-Commit"] = commit.pk
    # quotes escaped, and filename*=utf-8'' for non-ASCII names (RFC 6266)
    resp["Content-Disposition"] = content_disposition_header(False, entry.path.rsplit("/", 1)[-1])
    return resp


def _raw(opened):
    """The plain file under Django's File wrapper, so the WSGI server can use sendfile."""
    return getattr(opened, "file", opened)


READ_ONLY = ("The Studio's Data Hub speaks the Hugging Face Hub's read API only (downloads, listings, refs). "
             "To write, use the Studio's REST API: POST /api/hub/repos to create a repo, POST /api/hub/repos/<name>/uploads "
             "to upload files, DELETE /api/hub/repos/<name>/files to delete files, POST /api/hub/repos/<name>/branches and /tags "
             "for refs (see /api/docs), or the repo page's Upload and Delete.")


@csrf_exempt
def not_served(request: HttpRequest, **kwargs) -> HttpResponse:
    """Any other Hub API call (a huggingface_hub write: create_repo, upload_folder, create_branch;
    whoami): a bare 404 read as "repository not found"; this says what the Hub here does and does not."""
    return HubError(405 if request.method != "GET" else 404, None, READ_ONLY, message_header=READ_ONLY).response()
