"""The Data Hub repo browser: the project's repos, a repo's files at a ref, its commits and
branches, the diff of two commits' file lists, and a dataset file's preview. Served under /hub/
next to the HF-compatible API, with the Hub's own URL shapes (/hub/<project>/<repo>/tree/<rev>)."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from datahub import datasets
from datahub.models import Branch, Repo, RepoType, Tag
from datahub.repos import MAIN, clean_path, entry, history, resolve, tree
from datahub.services import MODEL_REPO_RE
from studio.errors import ApiError, BadRequest, NotFound
from studio.views import studio_page, web_actor


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


@studio_page
@require_GET
def repo_list(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).project
    kind = request.GET.get("type") if request.GET.get("type") in RepoType.values else ""
    repos = Repo.objects.filter(project=project).select_related("project") if project else Repo.objects.none()
    if kind:
        repos = repos.filter(type=kind)
    return render(request, "datahub/repos.html", {"section": "hub", "project": project, "repos": list(repos[:500]), "types": RepoType.values, "kind": kind})


@studio_page
@require_GET
def repo_tree(request: HttpRequest, namespace: str, name: str, revision: str | None = None, path: str = "") -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    revision = revision or repo.default_branch
    commit = resolve(repo, revision)
    prefix = page_path(path.strip("/")) + "/" if path.strip("/") else ""
    files, folders = [], set()
    for path_, blob in sorted(tree(commit).items()):
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
    return render(request, "datahub/repo.html", {
        "section": "hub", "repo": repo, "tab": "files", "revision": revision, "commit": commit, "prefix": prefix.rstrip("/"),
        "crumbs": crumbs, "folders": [{"path": f, "name": f.rsplit("/", 1)[-1]} for f in sorted(folders)], "files": files,
        "missing": missing, "branches": list(Branch.objects.filter(repo=repo)), "tags": list(Tag.objects.filter(repo=repo)),
    }, status=404 if missing else 200)


@studio_page
@require_GET
def repo_commits(request: HttpRequest, namespace: str, name: str, revision: str) -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    return render(request, "datahub/repo.html", {
        "section": "hub", "repo": repo, "tab": "commits", "revision": revision, "commits": history(repo, revision, 200),
        "branches": list(Branch.objects.filter(repo=repo)), "tags": list(Tag.objects.filter(repo=repo)),
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
        "section": "hub", "repo": repo, "tab": "compare", "base": base, "head": head, "diff": diff, "revision": head,
        "branches": list(Branch.objects.filter(repo=repo)), "tags": list(Tag.objects.filter(repo=repo)),
    })


@studio_page
@require_GET
def dataset_preview(request: HttpRequest, namespace: str, name: str, revision: str, path: str) -> HttpResponse:
    repo = repo_for_page(request, namespace, name)
    commit = resolve(repo, revision)
    try:
        preview = datasets.preview(commit, clean_path(path), 50)
    except ApiError as exc:
        raise NotFound(exc.detail) from exc
    return render(request, "datahub/repo.html", {
        "section": "hub", "repo": repo, "tab": "preview", "revision": revision, "commit": commit, "preview": preview,
        "shape_label": datasets.SHAPE_LABELS.get(preview["shape"], preview["shape"]),
        "branches": list(Branch.objects.filter(repo=repo)), "tags": list(Tag.objects.filter(repo=repo)),
    })


@studio_page
@require_GET
def models_page(request: HttpRequest) -> HttpResponse:
    """The project's model repos, newest first, each with its card summary from the run that made it."""
    from training.models import TrainingRun

    project = web_actor(request).project
    repos = list(Repo.objects.filter(project=project, type=RepoType.MODEL).select_related("project")[:500]) if project else []
    heads = {b.repo_id: b for b in Branch.objects.filter(repo__in=repos, name=MAIN)}
    run_ids = {r.pk: int(m.group(1)) for r in repos if (m := MODEL_REPO_RE.search(r.name))}
    runs = TrainingRun.objects.in_bulk(list(run_ids.values())) if run_ids else {}
    rows = []
    for r in repos:
        run = runs.get(run_ids.get(r.pk))
        run = run if run is not None and run.project_id == r.project_id else None
        head = heads.get(r.pk)
        rows.append({"repo": r, "run": run, "updated": head.updated_at if head else r.created_at})
    rows.sort(key=lambda row: row["updated"], reverse=True)
    return render(request, "datahub/models.html", {"section": "models", "project": project, "rows": rows})
