"""The HF Hub-compatible read API, mounted at /hub/ (HF_ENDPOINT=http://<studio>/hub).

Repo ids are `<project-slug>/<repo-name>`; branch and tag names have no slash, so the first
segment after /resolve/ or /tree/ is the revision."""
from __future__ import annotations

from django.urls import re_path

from datahub import hf_api

REPO = r"(?P<namespace>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)"
KIND = r"(?P<kind>models|datasets)"

urlpatterns = [
    re_path(rf"^api/{KIND}/{REPO}/revision/(?P<revision>[^/]+)/?$", hf_api.repo_info, name="hub-repo-info-revision"),
    re_path(rf"^api/{KIND}/{REPO}/tree/(?P<rest>.+)$", hf_api.repo_tree, name="hub-repo-tree"),
    re_path(rf"^api/{KIND}/{REPO}/paths-info/(?P<revision>[^/]+)/?$", hf_api.paths_info, name="hub-paths-info"),
    re_path(rf"^api/{KIND}/{REPO}/?$", hf_api.repo_info, name="hub-repo-info"),
    re_path(rf"^(?P<kind>datasets)/{REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)$", hf_api.resolve_file, name="hub-resolve-dataset"),
    re_path(rf"^{REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)$", hf_api.resolve_file, name="hub-resolve"),
]
