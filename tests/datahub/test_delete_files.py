"""DELETE /api/hub/repos/{name}/files: files or folders leave a branch as a new commit (earlier
commits keep them), so a file that a run must not train on can be taken out of its dataset."""
from __future__ import annotations

import pytest

from datahub import commits, repos
from datahub.models import Commit
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training.models import Status, TrainingRun

CHAT = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
PREFS_CSV = b"prompt,chosen,rejected\nq,a,b\nq2,c,d\n"
BAD_JSONL = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": \n'
URL = "/api/hub/repos/qa-data/files"


@pytest.fixture
def qa_data(project):
    """The QA report's repo: chat rows, preference rows and a broken file, all on main."""
    repo = repos.create_repo(project, "qa-data", "dataset")
    commits.commit_files(repo, "main", {"chat.jsonl": jsonl(CHAT), "prefs.csv": PREFS_CSV, "bad.jsonl": BAD_JSONL,
                                        "data/old/a.jsonl": jsonl(CHAT), "data/old/b.jsonl": jsonl(CHAT), "data/keep.jsonl": jsonl(CHAT)}, "data")
    return repo


def head(repo) -> Commit:
    return repos.resolve(repo, "main")


def test_delete_files_commits_their_removal_naming_them_and_earlier_commits_keep_them(api_as, users, qa_data):
    before = head(qa_data)
    r = api_as("member").delete(URL, {"branch": "main", "paths": ["prefs.csv", "bad.jsonl"]})
    assert r.status_code == 200, r.content
    after = head(qa_data)
    assert r.json()["id"] == after.pk and r.json()["parents"] == [before.pk]
    assert (after.message, after.author) == ("Delete prefs.csv and bad.jsonl", users["member"])
    assert set(repos.tree(after)) == {"chat.jsonl", "data/old/a.jsonl", "data/old/b.jsonl", "data/keep.jsonl"}
    assert {"prefs.csv", "bad.jsonl"} <= set(repos.tree(repos.resolve(qa_data, before.pk)))  # a pin to the old commit still reads them

    # a folder, with or without its trailing slash, takes every file under it and nothing beside it
    r = api_as("owner").delete(URL, {"paths": ["data/old/", "data/old/a.jsonl"]})  # a file inside it is counted once
    assert r.status_code == 200, r.content
    assert head(qa_data).message == "Delete data/old/ (2 files)"
    assert set(repos.tree(head(qa_data))) == {"chat.jsonl", "data/keep.jsonl"}
    r = api_as("owner").delete(URL, {"paths": ["data"], "message": "Drop the data folder"})
    assert r.status_code == 200 and head(qa_data).message == "Drop the data folder"
    assert set(repos.tree(head(qa_data))) == {"chat.jsonl"}


def test_deleting_a_path_the_branch_does_not_have_is_a_404_naming_it_and_deletes_nothing(api, qa_data):
    repos.create_branch(qa_data, "dev", "main")
    commits.commit_files(qa_data, "dev", {"dev-only.jsonl": jsonl(CHAT)}, "dev file")
    before, count = head(qa_data), Commit.objects.filter(repo=qa_data).count()
    for paths, field, name in ((["prefs.csv", "nope.csv"], "paths[1]", "nope.csv"),
                               (["data/ol"], "paths[0]", "data/ol"),  # a prefix of a folder is not the folder
                               (["dev-only.jsonl"], "paths[0]", "dev-only.jsonl")):  # on another branch only
        body = assert_error(api.delete(URL, {"branch": "main", "paths": paths}), 404, field)
        assert f"{name!r}" in body["detail"] and "nothing was deleted" in body["detail"], body
        assert f"{name} is not on branch main" in body["errors"][0]["message"], body
    assert head(qa_data) == before and Commit.objects.filter(repo=qa_data).count() == count
    assert "prefs.csv" in repos.tree(head(qa_data))


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"paths": []}, 400, "paths"),
    ({}, 400, "paths"),
    ({"paths": ["../prefs.csv"]}, 400, "paths[0]"),
    ({"paths": ["prefs.csv", "/etc/passwd"]}, 400, "paths[1]"),
    ({"paths": ["prefs.csv"], "branch": "no such"}, 400, "branch"),
    ({"paths": ["prefs.csv"], "parent": "abc"}, 400, "parent"),
    ({"paths": ["prefs.csv"], "ref": "main"}, 400, "ref"),
    ({"paths": ["prefs.csv"], "branch": "gone"}, 404, "branch"),
    ({"paths": ["prefs.csv"], "branch": "v1"}, 404, "branch"),  # a tag never moves: files are deleted from a branch
])
def test_bad_delete_bodies_name_the_field_and_delete_nothing(api, qa_data, body, status, field):
    repos.create_tag(qa_data, "v1", "main")
    before = head(qa_data)
    assert_error(api.delete(URL, body), status, field)
    assert head(qa_data) == before and Commit.objects.filter(repo=qa_data).count() == 2


def test_with_a_parent_the_branch_must_still_be_there(api, qa_data):
    seen = head(qa_data)
    moved = commits.commit_files(qa_data, "main", {"more.jsonl": jsonl(CHAT)}, "someone else's commit")
    body = assert_error(api.delete(URL, {"paths": ["prefs.csv"], "parent": seen.pk}), 409, "parent")
    assert f"moved since {seen.pk[:10]}" in body["detail"], body
    assert head(qa_data) == moved and "prefs.csv" in repos.tree(moved)
    r = api.delete(URL, {"paths": ["prefs.csv"], "parent": moved.pk})
    assert r.status_code == 200 and head(qa_data).parents == [moved.pk] and "prefs.csv" not in repos.tree(head(qa_data))


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("outsider", 404), (None, 401)])
def test_only_writers_of_the_project_delete_files(api_as, qa_data, role, status):
    before = head(qa_data)
    assert_error(api_as(role).delete(URL, {"paths": ["prefs.csv"]}), status)
    assert_error(api_as(role).delete(URL, {"paths": "not a list"}), status)  # refused before the body is read
    assert head(qa_data) == before


def test_a_runs_branch_keeps_its_files_while_the_run_exists(api, project):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    repo = repos.find_repo(project, "experiment-default")
    commits.commit_files(repo, f"run-{run_id}", {"checkpoints/step-10/w.bin": b"w"}, "Checkpoint step 10")
    before = repos.resolve(repo, f"run-{run_id}")
    url = "/api/hub/repos/experiment-default/files"
    body = assert_error(api.delete(url, {"branch": f"run-{run_id}", "paths": ["checkpoints"]}), 409, "branch")
    assert f"run #{run_id}" in body["detail"] and "its files cannot be deleted while the run exists" in body["detail"], body
    assert body["errors"][0]["message"] == f"keep them, or delete run #{run_id} first"
    assert repos.resolve(repo, f"run-{run_id}") == before
    TrainingRun.objects.filter(pk=run_id).delete()
    assert api.delete(url, {"branch": f"run-{run_id}", "paths": ["checkpoints"]}).status_code == 200
    assert repos.tree(repos.resolve(repo, f"run-{run_id}")) == {}


def test_deleting_the_files_start_refused_lets_the_queued_run_start_and_a_started_run_keeps_its_pin(api, qa_data):
    """The QA report: START refused a run on qa-data@main for prefs.csv's rows, and nothing could
    take prefs.csv off main. A queued run naming the branch does not hold it (START pins a commit)."""
    running = api.post("/api/training-runs", sft_body(name="started", dataset="qa-data@main")).json()["id"]
    TrainingRun.objects.filter(pk=running).update(status=Status.RUNNING, pinned={"dataset": {"ref": "qa-data@main", "commit": head(qa_data).pk, "repo": "acme/qa-data"}})
    run_id = api.post("/api/training-runs", sft_body(dataset="qa-data@main")).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    said = [e["message"] for e in body["errors"] if e["field"] == "dataset"]
    assert any(m.startswith("prefs.csv rows look like prompt/chosen/rejected") and m.endswith(
        "SFT trains on chat messages (messages) or prompt/completion or plain text (text) rows: delete prefs.csv from the branch "
        "(its Delete on the repo's Files tab, or DELETE /api/hub/repos/qa-data/files) or move it to another branch or repo") for m in said), said
    assert any(m.startswith("bad.jsonl row 2: not valid JSON") for m in said), said

    r = api.delete(URL, {"branch": "main", "paths": ["prefs.csv", "bad.jsonl"]})
    assert r.status_code == 200, r.content
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    assert TrainingRun.objects.get(pk=run_id).pinned["dataset"]["commit"] == r.json()["id"] == head(qa_data).pk
    pinned = TrainingRun.objects.get(pk=running).pinned["dataset"]["commit"]
    assert "prefs.csv" in repos.tree(repos.resolve(qa_data, pinned))  # the started run still reads what it started with


def test_the_hf_api_stays_read_only_and_says_where_deletes_go(client, qa_data, tokens):
    r = client.post("/hub/api/datasets/acme/qa-data/commit/main", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}")
    assert r.status_code == 405 and "DELETE /api/hub/repos/<name>/files" in r.json()["error"]
    assert "prefs.csv" in repos.tree(head(qa_data))


def test_a_single_file_of_the_wrong_shape_says_which_data_or_method_fits(api, project):
    repo = repos.create_repo(project, "prefs-only", "dataset")
    commits.commit_files(repo, "main", {"prefs.jsonl": jsonl([{"prompt": "q", "chosen": "a", "rejected": "b"}])}, "prefs")
    run_id = api.post("/api/training-runs", sft_body(dataset="prefs-only@main")).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert any(e["message"].endswith("rows: give a dataset of such rows, or train on these rows with DPO or GRPO") for e in body["errors"]), body


def test_openapi_documents_the_body_and_the_commit_it_returns(api, qa_data):
    from tests.test_openapi import assert_documented

    spec = api.client.get("/api/openapi.json").json()
    operation = spec["paths"]["/api/hub/repos/{name}/files"]["delete"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"branch", "paths", "message", "parent"} and body["required"] == ["paths"], body
    assert_documented(spec, "/api/hub/repos/{name}/files", "delete", api.delete(URL, {"paths": ["prefs.csv"]}))
    assert_documented(spec, "/api/hub/repos/{name}/files", "delete", api.delete(URL, {"paths": ["prefs.csv"]}))  # the 404
