"""/hub/: the HF Hub-compatible read API (HF_ENDPOINT=http://<studio>/hub) and, with the Hub's
own URL shapes, the repo browser pages.

Repo ids are `<project-slug>/<repo-name>`; branch and tag names have no slash, so the first
segment after /resolve/, /tree/ or /commits/ is the revision."""
from __future__ import annotations

from django.urls import re_path

from datahub import hf_api, views

app_name = "datahub"

REPO = r"(?P<namespace>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)"
KIND = r"(?P<kind>models|datasets)"
REV = r"(?P<revision>[^/]+)"

urlpatterns = [
    # the HF-compatible API
    re_path(rf"^api/{KIND}/{REPO}/revision/{REV}/?$", hf_api.repo_info, name="hub-repo-info-revision"),
    re_path(rf"^api/{KIND}/{REPO}/tree/(?P<rest>.+)$", hf_api.repo_tree, name="hub-repo-tree"),
    re_path(rf"^api/{KIND}/{REPO}/paths-info/{REV}/?$", hf_api.paths_info, name="hub-paths-info"),
    re_path(rf"^api/{KIND}/{REPO}/refs/?$", hf_api.repo_refs, name="hub-refs"),
    re_path(rf"^api/{KIND}/{REPO}/commits/{REV}/?$", hf_api.repo_commits, name="hub-commits"),
    re_path(rf"^api/{KIND}/{REPO}/?$", hf_api.repo_info, name="hub-repo-info"),
    re_path(rf"^(?P<kind>datasets)/{REPO}/resolve/{REV}/(?P<path>.+)$", hf_api.resolve_file, name="hub-resolve-dataset"),
    re_path(rf"^{REPO}/resolve/{REV}/(?P<path>.+)$", hf_api.resolve_file, name="resolve"),
    # any other Hub API call (a write, whoami, endpoints this Hub does not have): JSON saying so, not the login page
    re_path(r"^api/.*$", hf_api.not_served, name="hub-not-served"),
    # the pages
    re_path(r"^$", views.repo_list, name="repos"),
    re_path(r"^new$", views.repo_create, name="create"),
    re_path(rf"^{REPO}/upload$", views.repo_upload, name="upload"),
    re_path(rf"^{REPO}/delete$", views.repo_delete, name="delete"),
    re_path(rf"^{REPO}/branches/(?P<branch>[^/]+)/delete$", views.branch_delete, name="delete_branch"),
    re_path(rf"^{REPO}/delete/{REV}/(?P<path>.+)$", views.file_delete, name="delete_file"),
    re_path(rf"^{REPO}/?$", views.repo_tree, name="repo"),
    re_path(rf"^{REPO}/tree/{REV}/?$", views.repo_tree, name="tree"),
    re_path(rf"^{REPO}/tree/{REV}/(?P<path>.+)$", views.repo_tree, name="tree_path"),
    re_path(rf"^{REPO}/archive/{REV}/?$", views.repo_archive, name="archive"),
    re_path(rf"^{REPO}/archive/{REV}/(?P<path>.+)$", views.repo_archive, name="archive_path"),
    re_path(rf"^{REPO}/commits/{REV}/?$", views.repo_commits, name="commits"),
    # refs may hold single dots (v1.0) but never "..", so the first "..." is the separator
    re_path(rf"^{REPO}/compare/(?P<base>[^/]+?)\.\.\.(?P<head>[^/]+)$", views.repo_compare, name="compare"),
    re_path(rf"^{REPO}/preview/{REV}/(?P<path>.+)$", views.dataset_preview, name="preview"),
]
