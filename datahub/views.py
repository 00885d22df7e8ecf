"""The Data Hub repo browser: the project's repos, a repo's files at a ref (and their .tar), its
commits and branches, the diff of two commits' file lists, and a dataset file's preview. Served under /hub/
next to the HF-compatible API, with the Hub's own URL shapes (/hub/<project>/<repo>/tree/<rev>).

Writers also get five forms, each the API's own path: New repo (RepoIn, services.create_repo),
Upload files (UploadIn, uploads.upload_files: the upload-session steps), a file's Delete
(FilesDeleteIn, services.delete_files), a branch's Delete (services.delete_branch) and Delete of
the repo (services.delete_repo). A refused form answers 303 to its page, which shows the findings
beside their fields once (studio.views.refuse_form: a reload never sends the form again); an htmx
Delete gets its table back with the refusal's status. Readers see no form and get a 403 for a POST."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import BadRequest as InvalidPage
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from datahub import archives, commits, datasets, services, uploads
from datahub.models import Branch, Commit, Repo, RepoType, Tag, TreeEntry
from datahub.repos import MAIN, branches_of, clean_path, entry, history, natural_key, resolve, tree, under
from datahub.schemas import FilesDeleteIn, RepoIn, UploadIn
from datahub.services import publishing_runs
from studio.api import validate_data
from studio.errors import ApiError, BadRequest, Finding, NotFound, counted
from studio.parsing import ascii_int, isolated
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor


def repo_for_page(request: HttpRequest, namespace: str, name: str) -> Repo:
    actor = web_actor(request)
    repo = Repo.objects.select_related("project").filter(project__slug=namespace, name=name).first()
    if repo is None or actor.membership(repo.project) is None:
        raise NotFound(f"No repo {namespace}/{name}.")
    return repo


def page_path(path: str) -> str:
    """A file or folder path from a page's URL. One that clean_path refuses (`..`, a NUL) cannot
    name anything in any repo, so the page is a 404 rather than a 400 to a person's link."""
    try:
        return clean_path(path)
    except BadRequest as exc:
        raise NotFound(f"{path!r} is not a path in a repo: {exc.errors[0].message}.") from exc


def form_errors(exc: ApiError, fields: set[str], relabel: Callable[[Finding], Finding] = lambda f: f) -> dict[str, list[str]]:
    """A refusal's findings keyed by the form field they show beside (`relabel` turns the API's
    field paths into the form's); the rest go above the form ("general"), with the refusal's
    sentence when no finding has a field of its own."""
    errors = errors_by_field([relabel(f) for f in exc.errors], fields | {"general"})
    if not set(errors) - {"general"}:
        errors.setdefault("general", []).insert(0, exc.detail)
    return errors


def repo_page(request: HttpRequest, namespace: str, name: str, **rest: str) -> str:
    """A repo's page: where a GET of one of its forms' action URLs goes (form_action)."""
    return reverse("datahub:repo", kwargs={"namespace": namespace, "name": name})


def list_context(request: HttpRequest, form: dict | None = None) -> dict:
    actor = web_actor(request)
    project = actor.project
    kind = request.GET.get("type") if request.GET.get("type") in RepoType.values else ""
    repos = Repo.objects.filter(project=project).select_related("project") if project else Repo.objects.none()
    if kind:
        repos = repos.filter(type=kind)
    return {"section": "hub", "project": project, "repos": list(repos[:500]), "types": RepoType.values, "kind": kind,
            "writable": project is not None and actor.can_write(project), "form": form or {"values": {"type": RepoType.DATASET}, "errors": {}}}


@studio_page
@require_GET
def repo_list(request: HttpRequest) -> HttpResponse:
    return render(request, "datahub/repos.html", list_context(request, refused_forms(request).get("new_repo")))


NEW_REPO_FIELDS = {"name", "type"}


@studio_page
@form_action("datahub:repos")
def repo_create(request: HttpRequest) -> HttpResponse:
    """New repo: RepoIn and services.create_repo, as POST /api/hub/repos."""
    actor = web_actor(request)
    project = actor.require_writable_project()
    values = {"name": request.POST.get("name", "").strip(), "type": request.POST.get("type", "")}
    try:
        payload = validate_data(RepoIn, values)
        repo = services.create_repo(project, payload.name, payload.type, request.user, payload.description)
    except ApiError as exc:
        return refuse_form(request, reverse("datahub:repos"), "new_repo", form_errors(exc, NEW_REPO_FIELDS), values)
    messages.success(request, f"Created {repo.type} repo {isolated(repo.full_name)}: upload its files below.")
    return redirect("datahub:repo", repo.project.slug, repo.name)


@studio_page
@require_GET
def repo_tree(request: HttpRequest, namespace: str, name: str, revision: str | None = None, path: str = "") -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    context = tree_context(request, repo, revision or repo.default_branch, path, **refused_forms(request))
    return render(request, "datahub/repo.html", context, status=404 if context["missing"] else 200)


def model_folder(commit) -> str:
    """The folder of an experiment branch that from_pretrained loads (its model sits below the root:
    final/, merged/ or adapter/), or "" when the commit has none."""
    paths = set(tree(commit))
    return next((folder for folder in ("final", "merged", "adapter")
                 if f"{folder}/config.json" in paths or f"{folder}/adapter_config.json" in paths), "")


# An experiment's repo has a branch a run: 650 runs made a 612 KB page with each branch on it 11 times.
# The page's head names the first few; the Branches table shows a page of them (?branches=N).
HEAD_BRANCHES = 10
BRANCHES_PER_PAGE = 50


def repo_context(request: HttpRequest, repo: Repo) -> dict:
    """What every page of a repo shows around its tab. The header's project and role are the
    repo's project's, as a run page's are (studio_ui.nav_state reads `project`), not the session's:
    the person may hold another role there. `elsewhere` is the session's current project when the
    repo is not of it: a run uses only its own project's repos, so the page says which runs can use
    this one. With the page head's branches and tags (refs_context)."""
    current = web_actor(request).project
    elsewhere = current if current is not None and current.pk != repo.project_id else None
    return {"section": "hub", "repo": repo, "project": repo.project, "elsewhere": elsewhere, **refs_context(request, repo)}


def refs_context(request: HttpRequest, repo: Repo) -> dict:
    """The page head's branches and tags, and the Branches table's page, in natural order (run-2 before run-10)."""
    branches = branches_of(repo)
    return {"all_branches": branches, "branches": branches[:HEAD_BRANCHES], "branches_more": max(len(branches) - HEAD_BRANCHES, 0),
            "branch_page": Paginator(branches, BRANCHES_PER_PAGE).get_page(request.GET.get("branches")), "tags": list(Tag.objects.filter(repo=repo))}


def tree_context(request: HttpRequest, repo: Repo, revision: str, path: str = "", **forms: dict) -> dict:
    """The Files tab at `revision` (under folder `path`), with the writer's Upload and Delete forms
    (`forms` gives a refused one its values and findings). Files have a Delete on a branch only:
    a tag or a commit never changes."""
    commit = resolve(repo, revision)
    prefix = page_path(path.strip("/")) + "/" if path.strip("/") else ""
    files, folders = [], set()
    for path_, blob in sorted(tree(commit).items(), key=lambda item: natural_key(item[0])):
        if not path_.startswith(prefix):
            continue
        rest = path_[len(prefix):]
        if "/" in rest:
            folders.add(prefix + rest.split("/", 1)[0])
        else:
            files.append({"path": path_, "name": rest, "size": blob.size, "sha256": blob.sha256, "previewable": datasets.is_data_path(path_)})
    crumbs = []
    parts = prefix.strip("/").split("/") if prefix else []
    for i, part in enumerate(parts):
        crumbs.append({"name": part, "path": "/".join(parts[: i + 1])})
    missing = ""
    if prefix and not files and not folders:
        # a folder exists only while it holds files: nothing under the path means it is not on this ref
        folder = prefix.rstrip("/")
        missing = (f"{folder} is a file, not a folder, on {revision}: download it from the folder above."
                   if entry(commit, folder) is not None else
                   f"{folder} is not on {revision} (commit {commit.pk[:10]}): pick another branch or tag, or go back to the repo root.")
    page = repo_context(request, repo)
    names = [b.name for b in page["all_branches"]]
    writable = web_actor(request).can_write(repo.project)
    # A run's branch takes its run's checkpoints alone: an upload to it is a 409 (services.refuse_run_branch).
    runs = services.branch_runs(repo, names) if repo.type == RepoType.EXPERIMENT else {}
    uploadable = [name for name in names if name not in runs]
    upload = {"values": {"branch": revision if revision in uploadable else repo.default_branch, "folder": prefix.rstrip("/")}, "errors": {}}
    return {
        "tab": "files", "revision": revision, "commit": commit, "prefix": prefix.rstrip("/"),
        "model_folder": model_folder(commit) if repo.type == RepoType.EXPERIMENT else "",
        "crumbs": crumbs, "folders": [{"path": f, "name": f.rsplit("/", 1)[-1]} for f in sorted(folders, key=natural_key)], "files": files,
        "missing": missing, **page,
        "writable": writable, "branch_names": uploadable, "files_deletable": writable and revision in names,
        "files_help": f"One or more files, committed together; at most {settings.DATA_UPLOAD_MAX_NUMBER_FILES} at a time (the upload API takes more).",
        "max_files": settings.DATA_UPLOAD_MAX_NUMBER_FILES,
        "confirm_help": f"Type {repo.name} exactly.",
        "trained_from": services.trained_from_note(repo) if writable else "",
        "upload": forms.get("upload") or upload, "delete": forms.get("delete") or {"values": {}, "errors": {}},
        "branch_delete": forms.get("branch_delete") or {"errors": {}}, "file_delete": forms.get("file_delete") or {"errors": {}},
    }


@studio_page
@require_GET
def repo_archive(request: HttpRequest, namespace: str, name: str, revision: str, path: str = "") -> HttpResponse:
    """Download repo (.tar) / Download folder: the .tar of the Files tab's ref (under its folder), as
    GET /api/hub/repos/{name}/archive answers it, for whoever may read the page: a repo of any of
    the person's projects, not only the session's current one, which the API reads. A file's path
    goes to the file's download (the API's 400 says to fetch it instead; this page said 404)."""
    repo = repo_for_page(request, namespace, name)
    commit = resolve(repo, revision)
    folder = page_path(path.strip("/")) if path.strip("/") else ""
    if folder and entry(commit, folder) is not None:
        return redirect(file_download_url(repo, revision, folder))
    entries = TreeEntry.objects.filter(under(f"{folder}/" if folder else ""), commit=commit)
    if folder and not entries.exists():
        raise NotFound(f"{folder} is not a folder on {revision} (commit {commit.pk[:10]}): pick another branch or tag, or download the whole repo.")
    return archives.archive_response(repo, revision, commit, folder, entries)


def file_download_url(repo: Repo, revision: str, path: str) -> str:
    """The file's Download link on the Files tab: its HF Hub resolve URL (a dataset's under /datasets/)."""
    if repo.type == RepoType.DATASET:
        return reverse("datahub:hub-resolve-dataset", kwargs={"kind": "datasets", "namespace": repo.project.slug, "name": repo.name, "revision": revision, "path": path})
    return reverse("datahub:resolve", args=[repo.project.slug, repo.name, revision, path])


UPLOAD_FIELDS = {"files", "folder", "branch", "message"}
FILE_FIELD = re.compile(r"^files\[(\d+)\]")


def upload_payload(values: dict[str, str], paths: list[str], chosen: list) -> UploadIn:
    """The form as the API's upload body, checked by UploadIn (paths, sizes, branch, message)."""
    if not chosen:
        raise BadRequest("No files were chosen.", [Finding("files", "choose one or more files to upload")])
    if values["folder"]:
        clean_path(values["folder"], "folder")
    files = [{"path": path, "size": upload.size} for path, upload in zip(paths, chosen, strict=True)]
    return validate_data(UploadIn, {"branch": values["branch"], "message": values["message"], "files": files})


# What a browser writes for a quote, CR and LF in a file name it sends (the HTML standard's form encoding)
BROWSER_ESCAPES = ("%22", "%0A", "%0D")


def chosen_name(upload) -> str:
    """The name of a chosen file as the browser sent it (studio.middleware.NameKeepingParser keeps
    it: Django's `name` unescapes, shortens and cuts it), or a 400 on `files` where the exact name
    cannot be known: one holding %22, %0A or %0D, which is also how a browser sends a quote or a line
    break. A page must not commit a name its user did not choose."""
    name = getattr(upload, "given_name", None)
    if name is None:
        raise BadRequest("A file's name could not be read.", [Finding("files", f"{upload.name}: send the form again, or upload it with the API")])
    if any(escape in name.upper() for escape in BROWSER_ESCAPES):
        raise BadRequest(f"{name!r} cannot be told from another name.", [Finding("files", f"{name}: browsers send a quote or a line break in a file name as "
                                                                                          "%22, %0A or %0D, so this name may not be the file's own: rename "
                                                                                          "the file, or upload it with the API (POST /api/hub/repos/<name>/uploads)")])
    return name


@studio_page
@form_action(repo_page)
def repo_upload(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    """Upload files: the form's files (under an optional folder) become one commit on the chosen
    branch through the API's upload-session steps (uploads.upload_files), validated by UploadIn."""
    repo = repo_for_page(request, namespace, name)
    web_actor(request).require_write(repo.project)
    chosen = request.FILES.getlist("files")
    values = {"folder": request.POST.get("folder", "").strip().rstrip("/"), "branch": request.POST.get("branch", ""), "message": request.POST.get("message", "")}
    paths: list[str] = []
    try:
        paths = [f"{values['folder']}/{name}" if values["folder"] else name for name in map(chosen_name, chosen)]
        payload = upload_payload(values, paths, chosen)
        commit = uploads.upload_files(repo, request.user, payload.branch, [(f.path, f.size, upload) for f, upload in zip(payload.files, chosen, strict=True)], payload.message)
    except ApiError as exc:
        def relabel(finding: Finding) -> Finding:  # files[i].path → the Files field, saying which file
            match = FILE_FIELD.match(finding.field)
            if match and int(match[1]) < len(paths):
                return Finding("files", f"{paths[int(match[1])]}: {finding.message}")
            return Finding("files", finding.message) if finding.field == "path" else finding

        branch = values["branch"] if values["branch"] in repo.branches.values_list("name", flat=True) else repo.default_branch
        # The page comes back scrolled to the top, and the form's findings may be far below it.
        messages.error(request, "Nothing was committed: see Upload files below.")
        return refuse_form(request, tree_url(repo, branch), "upload", form_errors(exc, UPLOAD_FIELDS, relabel), values)
    messages.success(request, f"Committed {counted(len(chosen), 'file')} to {isolated(payload.branch)} as {commit.pk[:10]}.")
    return redirect(tree_url(repo, payload.branch, values["folder"]))


@studio_page
@form_action("datahub:repo")
def repo_delete(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    """Delete, once the repo's name is typed to confirm: services.delete_repo, as the API's DELETE."""
    repo = repo_for_page(request, namespace, name)
    web_actor(request).require_write(repo.project)
    confirm = request.POST.get("confirm", "").strip()
    try:
        if confirm != repo.name:
            raise BadRequest("The repo was not deleted.", [Finding("confirm", f"type {repo.name} to confirm: deleting removes every branch, tag and commit, and cannot be undone")])
        services.delete_repo(repo)
    except ApiError as exc:
        # a 409's findings name the API's path parameter, `name`: here they are about the repo as a whole
        errors = form_errors(exc, {"confirm"}, lambda f: Finding("general", f.message) if f.field == "name" else f)
        messages.error(request, f"{isolated(repo.full_name)} was not deleted: see Delete this repo below.")
        return refuse_form(request, reverse("datahub:repo", args=[repo.project.slug, repo.name]), "delete", errors, {"confirm": confirm})
    messages.success(request, f"Deleted {isolated(repo.full_name)} with its branches, tags and commits.")
    return redirect("datahub:repos")


@studio_page
@form_action(repo_page)
def branch_delete(request: HttpRequest, namespace: str, name: str, branch: str) -> HttpResponse:
    """A branch's Delete (it asks first: hx-confirm): services.delete_branch, as the API's DELETE,
    with its refusals (the default branch, a run's branch, a branch a live run names) shown above
    the Branches table; htmx swaps that table alone."""
    repo = repo_for_page(request, namespace, name)
    web_actor(request).require_write(repo.project)
    try:
        services.delete_branch(repo, branch)
    except ApiError as exc:
        if isinstance(exc, NotFound):
            raise
        # the findings name the API's path parameter, `branch`: here the table as a whole shows them
        errors = form_errors(exc, set(), lambda f: Finding("general", f.message))
        if request.htmx:
            context = tree_context(request, repo, repo.default_branch, branch_delete={"errors": errors})
            return render(request, "datahub/repo.html#branches", context, status=exc.status)
        messages.error(request, f"Branch {isolated(branch)} was not deleted: see Branches below.")
        return refuse_form(request, reverse("datahub:repo", args=[repo.project.slug, repo.name]), "branch_delete", errors)
    messages.success(request, f"Deleted branch {isolated(branch)} of {isolated(repo.full_name)}: its commits stay readable by commit id.")
    if request.htmx:
        response = HttpResponse(status=204)
        response.headers["HX-Redirect"] = reverse("datahub:repo", args=[repo.project.slug, repo.name])
        return response
    return redirect("datahub:repo", repo.project.slug, repo.name)


@studio_page
@form_action(repo_page)
def file_delete(request: HttpRequest, namespace: str, name: str, revision: str, path: str) -> HttpResponse:
    """A file's Delete on the Files table (it asks first: hx-confirm): services.delete_files on
    branch `revision`, checked by FilesDeleteIn as the API's DELETE. The form sends the commit the
    page showed as `parent`, so a branch that moved since is a 409 rather than a file deleted from a
    tree the person did not see. Refusals show above the Files table at the branch's head; htmx
    swaps that table, and the page's head line and Branches table out of band (they show heads).
    Done, the page shows the branch's new head at the file's folder (or the nearest one left)."""
    repo = repo_for_page(request, namespace, name)
    web_actor(request).require_write(repo.project)
    path = page_path(path)
    folder = path.rpartition("/")[0]
    try:
        payload = validate_data(FilesDeleteIn, {"branch": revision, "paths": [path], "parent": request.POST.get("parent") or None})
        commit = services.delete_files(repo, payload.branch, payload.paths, request.user, payload.message, payload.parent)
    except NotFound as exc:
        return file_not_found(request, repo, revision, folder, path, exc)
    except ApiError as exc:
        # the findings name the API's fields (branch, paths[0], parent): here the table as a whole shows
        # them; a moved branch's "reload" is done, as the table comes back at the branch's head
        moved = isinstance(exc, commits.BranchMoved)
        again = "the table below now shows the branch as it is: delete the file again if it should still go"
        errors = form_errors(exc, set(), lambda f: Finding("general", again if moved else f.message))
        if request.htmx:
            context = tree_context(request, repo, revision, folder, file_delete={"errors": errors})
            return render(request, "datahub/repo.html#files", {**context, "oob": True}, status=exc.status)
        messages.error(request, f"{isolated(path)} was not deleted: see Files below.")
        return refuse_form(request, tree_url(repo, revision, folder), "file_delete", errors)
    messages.success(request, f"Deleted {isolated(path)} from branch {isolated(revision)} as commit {commit.pk[:10]}: earlier commits keep it.")
    url = tree_url(repo, revision, folder_left(commit, folder))
    if request.htmx:
        response = HttpResponse(status=204)
        response.headers["HX-Redirect"] = url
        return response
    return redirect(url)


def file_not_found(request: HttpRequest, repo: Repo, revision: str, folder: str, path: str, exc: NotFound) -> HttpResponse:
    """A file's Delete that found no such file on the branch, or no branch `revision` any more (it
    was deleted since the page was read): a 404 whose page shows, with why above Files, the branch
    at its head, or the repo's default branch once the branch is gone. htmx swaps no 404 (the
    htmx-config in base.html), so an htmx Delete is sent to that page (HX-Redirect) with why as its
    message."""
    if Branch.objects.filter(repo=repo, name=revision).exists():
        shown, said = revision, f"{exc.detail} Files below show branch {isolated(revision)} as it is now."
    else:
        shown, folder = repo.default_branch, ""
        said = (f"{isolated(path)} was not deleted: {isolated(repo.full_name)} has no branch {isolated(repr(revision))} (a tag never changes, and a deleted branch is gone). "
                f"Files below show the default branch, {isolated(repo.default_branch)}: pick a branch above and delete the file there if it should still go.")
    url = tree_url(repo, shown, folder_left(resolve(repo, shown), folder))
    if request.htmx:
        messages.error(request, said)
        response = HttpResponse(status=404)
        response.headers["HX-Redirect"] = url
        return response
    return refuse_form(request, url, "file_delete", {"general": [said]})


def tree_url(repo: Repo, revision: str, folder: str = "") -> str:
    """The Files page of `repo` at `revision`, in `folder` ("" for the root)."""
    if folder:
        return reverse("datahub:tree_path", args=[repo.project.slug, repo.name, revision, folder])
    return reverse("datahub:tree", args=[repo.project.slug, repo.name, revision])


def folder_left(commit: Commit, folder: str) -> str:
    """`folder`, or the nearest folder above it that still holds files at `commit` ("" for the
    root): a folder exists only while it holds files, and the page of one that went is a 404."""
    while folder and not TreeEntry.objects.filter(under(folder + "/"), commit=commit).exists():
        folder = folder.rpartition("/")[0]
    return folder


@studio_page
@require_GET
def repo_commits(request: HttpRequest, namespace: str, name: str, revision: str) -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    return render(request, "datahub/repo.html", {
        "tab": "commits", "revision": revision, "commits": history(repo, revision, 200), **repo_context(request, repo),
    })


@studio_page
@require_GET
def repo_compare(request: HttpRequest, namespace: str, name: str, base: str, head: str) -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    old, new = tree(resolve(repo, base)), tree(resolve(repo, head))
    diff = {
        "added": sorted(p for p in new if p not in old),
        "removed": sorted(p for p in old if p not in new),
        "changed": sorted(p for p in new if p in old and new[p].pk != old[p].pk),
    }
    return render(request, "datahub/repo.html", {
        "tab": "compare", "base": base, "head": head, "diff": diff, "revision": head, **repo_context(request, repo),
    })


def preview_cells(preview: dict) -> list[tuple[int, list[str], list[tuple[Any, list[str]]]]]:
    """Each previewed row as the page shows it: its number, what was cut from the row itself, and
    for each column its value and what the preview cut short there (the cell shows only its start,
    which hides the marker at a cut string's end)."""
    def note(cut: dict, column: str = "") -> str:
        inner = cut["field"][len(column):].lstrip(".")
        size = f'{cut["characters"]:,} characters' if "characters" in cut else f'{cut["items"]:,} items'
        return f"{inner + ': ' if inner else ''}cut for the preview, {size} in all"

    out = []
    for number, row in zip(preview["row_numbers"], preview["rows"], strict=True):
        cuts = [c for c in preview["cut"] if c["row"] == number]
        cells = []
        for column in preview["columns"]:
            mine = [c for c in cuts if c["field"] == column or c["field"].startswith((f"{column}.", f"{column}["))]
            cells.append((row.get(column) if isinstance(row, dict) else None, [note(c, column) for c in mine]))
        out.append((number, [note(c) for c in cuts if c["field"] == ""], cells))
    return out


PREVIEW_PAGE_ROWS = 50


@studio_page
@require_GET
def dataset_preview(request: HttpRequest, namespace: str, name: str, revision: str, path: str) -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    commit = resolve(repo, revision)
    after = ascii_int(request.GET.get("after", "0") or "0")
    if after is None or not 0 <= after <= datasets.PREVIEW_AFTER_MAX:
        raise InvalidPage(f"after is a row number from 0 to {datasets.PREVIEW_AFTER_MAX}")  # the 400 page (handler400)
    try:
        preview = datasets.preview(commit, clean_path(path), PREVIEW_PAGE_ROWS, after)
    except ApiError as exc:
        raise NotFound(exc.detail) from exc
    return render(request, "datahub/repo.html", {
        "tab": "preview", "revision": revision, "commit": commit, "preview": preview, "after": after,
        "shape_label": datasets.SHAPE_LABELS.get(preview["shape"], preview["shape"]),
        "preview_rows": preview_cells(preview),
        # The rows between the table's first and last that it lacks: those that could not be read (said above).
        "unread": [p["row"] for p in preview["problems"] if preview["row_numbers"] and preview["row_numbers"][0] < p["row"] < preview["row_numbers"][-1]
                   and p["row"] not in preview["row_numbers"]],
        # A file without a single row: START's own sentence, naming the file (as START does in a dataset of several).
        "no_rows": "" if preview["rows"] or preview["problems"] or after else datasets.no_rows(f"{preview['path']} "),
        **repo_context(request, repo),
    })


@studio_page
@require_GET
def models_page(request: HttpRequest) -> HttpResponse:
    """The project's model repos, newest first, each with its card summary from the run that made it."""
    from training.models import TrainingRun

    project = web_actor(request).project
    repos = list(Repo.objects.filter(project=project, type=RepoType.MODEL).select_related("project")[:500]) if project else []
    heads = {b.repo_id: b for b in Branch.objects.filter(repo__in=repos, name=MAIN)}
    run_ids = publishing_runs(repos)  # a repo merely named like a run's is not that run's model
    runs = TrainingRun.objects.in_bulk(list(run_ids.values())) if run_ids else {}
    rows = []
    for r in repos:
        run = runs.get(run_ids.get(r.pk))
        run = run if run is not None and run.project_id == r.project_id else None
        head = heads.get(r.pk)
        rows.append({"repo": r, "run": run, "updated": head.updated_at if head else r.created_at})
    rows.sort(key=lambda row: row["updated"], reverse=True)
    return render(request, "datahub/models.html", {"section": "models", "project": project, "rows": rows})
