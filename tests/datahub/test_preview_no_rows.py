"""The preview of a dataset file without a single row says what START says of it (one rule:
datasets.no_rows), instead of "an unknown shape" and nothing else."""
from __future__ import annotations

from datahub import commits, repos
from tests.conftest import sft_body

TODO = "has no rows: add rows to it, or train on a dataset that has some"


def test_an_empty_files_preview_says_what_start_says(api, browser, project):
    repo = repos.create_repo(project, "blank", "dataset")
    commits.commit_files(repo, "main", {"data/empty.jsonl": b""}, "an empty file")
    page = browser("viewer").get("/hub/acme/blank/preview/main/data/empty.jsonl").content.decode()
    assert f'<p class="error" role="alert" data-testid="no-rows">data/empty.jsonl {TODO}.</p>' in page

    run = api.post("/api/training-runs", sft_body(dataset="blank@main")).json()
    refused = api.post(f"/api/training-runs/{run['id']}/start")
    assert refused.status_code == 422
    assert {"field": "dataset", "message": f"data/empty.jsonl {TODO}"} in refused.json()["errors"]


def test_a_file_with_rows_has_no_such_line(api, browser, project):
    repo = repos.create_repo(project, "full", "dataset")
    commits.commit_files(repo, "main", {"rows.jsonl": b'{"prompt": "q", "completion": "a"}\n', "empty.jsonl": b""}, "two files")
    c = browser("viewer")
    assert 'data-testid="no-rows"' not in c.get("/hub/acme/full/preview/main/rows.jsonl").content.decode()
    assert f"empty.jsonl {TODO}." in c.get("/hub/acme/full/preview/main/empty.jsonl").content.decode()
    # START names the empty file of the two the same way.
    run = api.post("/api/training-runs", sft_body(dataset="full@main")).json()
    errors = api.post(f"/api/training-runs/{run['id']}/start").json()["errors"]
    assert {"field": "dataset", "message": f"empty.jsonl {TODO}"} in errors, errors
