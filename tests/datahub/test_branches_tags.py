"""/api/hub branches and tags: names that cannot shadow a commit or each other, and deleting them."""
from __future__ import annotations

import pytest

from datahub import commits, repos
from datahub.models import Branch, Tag
from tests.conftest import assert_error


def resolved(api, repo_name: str, ref: str, path: str) -> bytes:
    r = api.client.get(f"/hub/datasets/acme/{repo_name}/resolve/{ref}/{path}", **api._headers())
    assert r.status_code == 200, r.content
    return b"".join(r.streaming_content)


def test_branch_or_tag_named_like_a_commit_id_is_refused(api, dataset_repo):
    pinned = commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "pinned"}\n'}, "v1")
    commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "later"}\n'}, "v2")
    assert_error(api.post("/api/hub/repos/hub-data/branches", {"name": pinned.pk, "from": "main"}), 400, "name")
    assert_error(api.post("/api/hub/repos/hub-data/tags", {"name": pinned.pk, "ref": "main"}), 400, "name")
    assert_error(api.post("/api/hub/repos/hub-data/branches", {"name": pinned.pk[:7]}), 400, "name")  # an abbreviated id
    assert_error(api.post("/api/hub/repos/hub-data/tags", {"name": "deadbeef"}), 400, "name")
    assert not Branch.objects.filter(repo=dataset_repo, name__startswith=pinned.pk[:7]).exists()
    assert not Tag.objects.filter(repo=dataset_repo).exists()
    # names with hex and a letter, or of other lengths, are fine
    assert api.post("/api/hub/repos/hub-data/tags", {"name": "v20240101"}).status_code == 201
    assert api.post("/api/hub/repos/hub-data/branches", {"name": "abc123"}).status_code == 201
    assert resolved(api, "hub-data", pinned.pk, "train.jsonl") == b'{"text": "pinned"}\n'


def test_full_commit_id_resolves_to_the_commit_before_an_old_branch_of_that_name(api, dataset_repo):
    """A branch made before such names were refused cannot hijack the commit it is named after."""
    pinned = commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "pinned"}\n'}, "v1")
    later = commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "later"}\n'}, "v2")
    Branch.objects.create(repo=dataset_repo, name=pinned.pk, head=later)
    assert repos.resolve(dataset_repo, pinned.pk) == pinned
    assert resolved(api, "hub-data", pinned.pk, "train.jsonl") == b'{"text": "pinned"}\n'


def test_a_branch_and_a_tag_cannot_share_a_name(api, dataset_repo):
    assert api.post("/api/hub/repos/hub-data/tags", {"name": "v1", "ref": "main"}).status_code == 201
    assert_error(api.post("/api/hub/repos/hub-data/branches", {"name": "v1", "from": "main"}), 409, "name")
    assert api.post("/api/hub/repos/hub-data/branches", {"name": "dev", "from": "main"}).status_code == 201
    assert_error(api.post("/api/hub/repos/hub-data/tags", {"name": "dev", "ref": "main"}), 409, "name")
    assert set(Branch.objects.filter(repo=dataset_repo).values_list("name", flat=True)) == {"main", "dev"}
    assert set(Tag.objects.filter(repo=dataset_repo).values_list("name", flat=True)) == {"v1"}
    assert_error(api.post("/api/hub/repos/hub-data/tags", {"name": "main"}), 409, "name")


def test_a_branch_made_meanwhile_by_another_request_is_a_409_not_that_branch(api, dataset_repo, monkeypatch):
    """Two requests for branch "dev": the second passed the check for an existing branch before the
    first made it, at another commit; it was answered 201 with the first's branch."""
    first_at = commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "v1"}\n'}, "v1")
    asked_at = commits.commit_files(dataset_repo, "main", {"train.jsonl": b'{"text": "v2"}\n'}, "v2")
    resolve = repos.resolve

    def first_request_lands(repo, ref, **kwargs):  # between the second request's check and its lock
        if not Branch.objects.filter(repo=repo, name="dev").exists():
            Branch.objects.create(repo=repo, name="dev", head=first_at)
        return resolve(repo, ref, **kwargs)
    monkeypatch.setattr(repos, "resolve", first_request_lands)
    body = assert_error(api.post("/api/hub/repos/hub-data/branches", {"name": "dev", "from": asked_at.pk}), 409, "name")
    assert "already exists" in body["detail"]
    assert Branch.objects.get(repo=dataset_repo, name="dev").head_id == first_at.pk
    monkeypatch.undo()
    assert_error(api.post("/api/hub/repos/hub-data/branches", {"name": "dev", "from": "main"}), 409, "name")  # as when they come one after the other


def test_delete_branch_and_tag_keeps_their_commits(api, dataset_repo):
    repos.create_branch(dataset_repo, "dev", "main")
    dev = commits.commit_files(dataset_repo, "dev", {"train.jsonl": b'{"text": "dev"}\n'}, "on dev")
    repos.create_tag(dataset_repo, "v1", "dev")
    assert api.delete("/api/hub/repos/hub-data/tags/v1").status_code == 204
    assert api.delete("/api/hub/repos/hub-data/branches/dev").status_code == 204
    assert set(Branch.objects.filter(repo=dataset_repo).values_list("name", flat=True)) == {"main"}
    assert not Tag.objects.filter(repo=dataset_repo).exists()
    assert resolved(api, "hub-data", dev.pk, "train.jsonl") == b'{"text": "dev"}\n'  # a pin to the commit still reads it
    assert_error(api.delete("/api/hub/repos/hub-data/branches/dev"), 404)
    assert_error(api.delete("/api/hub/repos/hub-data/tags/v1"), 404)
    # the name is free again, for either kind
    assert api.post("/api/hub/repos/hub-data/tags", {"name": "dev", "ref": dev.pk}).json()["commit"] == dev.pk


def test_default_branch_cannot_be_deleted(api, dataset_repo):
    assert_error(api.delete("/api/hub/repos/hub-data/branches/main"), 409, "branch")
    assert Branch.objects.filter(repo=dataset_repo, name="main").exists()


def test_only_writers_delete_refs(api_as, dataset_repo):
    repos.create_branch(dataset_repo, "dev", "main")
    repos.create_tag(dataset_repo, "v1", "main")
    for role, status in (("viewer", 403), ("outsider", 404), (None, 401)):
        assert api_as(role).delete("/api/hub/repos/hub-data/branches/dev").status_code == status
        assert api_as(role).delete("/api/hub/repos/hub-data/tags/v1").status_code == status
    assert Branch.objects.filter(repo=dataset_repo, name="dev").exists() and Tag.objects.filter(repo=dataset_repo, name="v1").exists()
    assert api_as("member").delete("/api/hub/repos/hub-data/branches/dev").status_code == 204
    assert api_as("member").delete("/api/hub/repos/hub-data/tags/v1").status_code == 204


def test_a_runs_branch_cannot_be_deleted_while_the_run_exists(api, project):
    from tests.conftest import sft_body
    from training.models import TrainingRun

    r = api.post("/api/training-runs", sft_body())
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    repo_name = "experiment-default"
    body = assert_error(api.delete(f"/api/hub/repos/{repo_name}/branches/run-{run_id}"), 409, "branch")
    assert f"run #{run_id}" in body["detail"]
    assert Branch.objects.filter(repo__project=project, repo__name=repo_name, name=f"run-{run_id}").exists()
    # a branch that only looks like a run's (no such run) is an ordinary branch
    repo = repos.find_repo(project, repo_name)
    repos.create_branch(repo, f"run-{run_id + 1000}", "main")
    assert api.delete(f"/api/hub/repos/{repo_name}/branches/run-{run_id + 1000}").status_code == 204
    TrainingRun.objects.filter(pk=run_id).delete()
    assert api.delete(f"/api/hub/repos/{repo_name}/branches/run-{run_id}").status_code == 204


LIVE_REF_CASES = {
    "dataset": dict(dataset="hub-data@{ref}"),
    "dataset entry with project": dict(dataset=[{"ref": "acme/hub-data@{ref}", "type": "chat"}]),
    "base model": dict(base_model="hub-data@{ref}"),
}


def run_naming(project, users, **fields):
    from tests.conftest import sft_body
    from training import services as training

    body = sft_body(**fields)
    return training.create_run(project, users["owner"], name=body["name"], method=body["method"], base_model=body["base_model"],
                               dataset=body["dataset"], config=body["config"])


@pytest.mark.parametrize("kind", ["branches", "tags"])
@pytest.mark.parametrize("case", LIVE_REF_CASES)
@pytest.mark.parametrize("status", ["queued", "provisioning", "running"])
def test_a_branch_or_tag_a_live_run_names_cannot_be_deleted(api, project, users, dataset_repo, kind, case, status):
    """Deleting the repo was refused for such a run, but deleting the branch (qa-data@from-sha) went
    through and the run could no longer start."""
    from training.models import TrainingRun

    (repos.create_branch if kind == "branches" else repos.create_tag)(dataset_repo, "from-sha", "main")
    fields = {key: (value.format(ref="from-sha") if isinstance(value, str) else [{**value[0], "ref": value[0]["ref"].format(ref="from-sha")}])
              for key, value in LIVE_REF_CASES[case].items()}
    run = run_naming(project, users, **fields)
    TrainingRun.objects.filter(pk=run.pk).update(status=status)
    field = {"branches": "branch", "tags": "tag"}[kind]
    body = assert_error(api.delete(f"/api/hub/repos/hub-data/{kind}/from-sha"), 409, field)
    message = body["errors"][0]["message"]
    assert "'from-sha' of acme/hub-data is used by 1 live run" in body["detail"], body
    assert f"run #{run.pk}" in message and f"then delete the {field}" in message, body
    assert ("edit the run to use another branch, tag or commit id" in message) == (status == "queued"), message
    assert (Branch if kind == "branches" else Tag).objects.filter(repo=dataset_repo, name="from-sha").exists()
    # another ref of the same repo is not held by the run, and a finished run holds none
    (repos.create_branch if kind == "branches" else repos.create_tag)(dataset_repo, "other", "main")
    assert api.delete(f"/api/hub/repos/hub-data/{kind}/other").status_code == 204
    TrainingRun.objects.filter(pk=run.pk).update(status="completed")
    assert api.delete(f"/api/hub/repos/hub-data/{kind}/from-sha").status_code == 204


def test_a_missing_branch_or_tag_a_live_run_names_is_still_a_404(api, project, users, dataset_repo):
    run_naming(project, users, dataset="hub-data@gone")
    assert_error(api.delete("/api/hub/repos/hub-data/branches/gone"), 404)
    assert_error(api.delete("/api/hub/repos/hub-data/tags/gone"), 404)
    run_naming(project, users, dataset="hub-data@main")
    body = assert_error(api.delete("/api/hub/repos/hub-data/branches/main"), 409, "branch")
    assert "default branch" in body["detail"], body


@pytest.mark.parametrize("name", ["HEAD", "refs", "FETCH_HEAD", "ORIG_HEAD"])
def test_branch_or_tag_named_as_git_keeps_for_itself_is_refused(api, dataset_repo, name):
    for kind in ("branches", "tags"):
        body = assert_error(api.post(f"/api/hub/repos/hub-data/{kind}", {"name": name}), 400, "name")
        assert "git keeps that name for itself" in body["detail"] and f"e.g. {name.lower()}-1" in body["errors"][0]["message"], body
    assert list(Branch.objects.filter(repo=dataset_repo).values_list("name", flat=True)) == ["main"]
    assert not Tag.objects.filter(repo=dataset_repo).exists()


def test_names_like_git_s_own_but_not_them_are_fine(api, dataset_repo):
    for name in ("head", "HEADS", "refs-1", "my-refs", "AHEAD"):
        assert api.post("/api/hub/repos/hub-data/tags", {"name": name}).status_code == 201, name
    assert api.post("/api/hub/repos/hub-data/branches", {"name": "head"}).status_code == 409  # the tag of that name
    assert api.post("/api/hub/repos/hub-data/branches", {"name": "Head"}).status_code == 201
