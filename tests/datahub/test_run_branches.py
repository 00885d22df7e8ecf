"""A run's branch run-<id> in its experiment's repo: only the Studio's own checkpoint commits write
to it while the run exists (uploads are refused as deletes are), and run-<id> names are kept for
the runs, so a person cannot make the branch (or a tag of that name) before the run does."""
from __future__ import annotations

from datahub import commits, repos
from datahub.models import Branch, Repo, Tag, UploadSession
from tests.conftest import assert_error, sft_body
from training.models import TrainingRun


def put(api, upload_id, index, offset, data: bytes):
    return api.client.put(f"/api/hub/uploads/{upload_id}/files/{index}?offset={offset}", data=data,
                          content_type="application/octet-stream", HTTP_AUTHORIZATION=f"Bearer {api.token}")


def test_uploading_to_a_runs_branch_is_a_409_like_deleting_its_files_and_changes_nothing(api_as, project):
    member = api_as("member")
    run_id = member.post("/api/training-runs", sft_body()).json()["id"]
    repo = repos.find_repo(project, "experiment-default")
    commits.commit_files(repo, f"run-{run_id}", {"final/README.md": b"the run's"}, "Checkpoint final")  # the Studio's own commit
    before = repos.resolve(repo, f"run-{run_id}")
    body = assert_error(member.post("/api/hub/repos/experiment-default/uploads",
                                    {"branch": f"run-{run_id}", "files": [{"path": "final/README.md", "size": 8}]}), 409, "branch")
    assert f"run #{run_id}" in body["detail"] and "files cannot be committed to it while the run exists" in body["detail"], body
    assert body["errors"][0]["message"].endswith(f"or delete run #{run_id} first"), body
    assert not UploadSession.objects.exists()
    assert repos.resolve(repo, f"run-{run_id}") == before
    # the delete's refusal is the same rule's
    body = assert_error(member.delete("/api/hub/repos/experiment-default/files", {"branch": f"run-{run_id}", "paths": ["final/README.md"]}), 409, "branch")
    assert "its files cannot be deleted while the run exists" in body["detail"], body
    assert repos.entry(repos.resolve(repo, f"run-{run_id}"), "final/README.md").blob.size == len(b"the run's")


def test_an_upload_opened_before_its_branch_became_a_runs_is_refused_at_commit(api_as, project):
    """A run-<id> branch made before such names were kept (here by the Studio's own function) and
    an upload session opened on it while no run had that id: the run that then gets the id takes
    the branch, and the session's commit is refused."""
    member = api_as("member")
    first = member.post("/api/training-runs", sft_body()).json()["id"]
    repo = repos.find_repo(project, "experiment-default")
    repos.create_branch(repo, f"run-{first + 1}", "main")
    upload = member.post("/api/hub/repos/experiment-default/uploads", {"branch": f"run-{first + 1}", "files": [{"path": "final/README.md", "size": 8}]})
    assert upload.status_code == 201, upload.content
    assert put(member, upload.json()["id"], 0, 0, b"poisoned").json()["complete"] is True
    second = member.post("/api/training-runs", sft_body(name="next")).json()["id"]
    assert second == first + 1
    before = repos.resolve(repo, f"run-{second}")
    body = assert_error(member.post(f"/api/hub/uploads/{upload.json()['id']}/commit"), 409, "branch")
    assert f"run #{second}" in body["detail"], body
    assert repos.resolve(repo, f"run-{second}") == before
    assert repos.tree(before) == {}
    assert UploadSession.objects.get().state == UploadSession.State.OPEN


def test_run_branch_and_tag_names_are_kept_for_runs_in_an_experiment_repo(api_as, project):
    member = api_as("member")
    first = member.post("/api/training-runs", sft_body()).json()["id"]
    repo = repos.find_repo(project, "experiment-default")
    for kind in ("branches", "tags"):
        body = assert_error(member.post(f"/api/hub/repos/experiment-default/{kind}", {"name": f"run-{first + 1}"}), 400, "name")
        assert "run-<id>" in body["errors"][0]["message"] and "choose another name" in body["errors"][0]["message"], body
    assert not Branch.objects.filter(repo=repo, name=f"run-{first + 1}").exists()
    assert not Tag.objects.filter(repo=repo).exists()
    # the next run gets a branch of its own, at main
    second = member.post("/api/training-runs", sft_body(name="next")).json()["id"]
    assert repos.resolve(repo, f"run-{second}") == repos.resolve(repo, "main")
    # a tag at a run's branch, other names, and run-<id> in a repo that is not an experiment's are fine
    assert member.post("/api/hub/repos/experiment-default/tags", {"name": "best", "ref": f"run-{first}"}).status_code == 201
    assert member.post("/api/hub/repos/experiment-default/branches", {"name": f"try-run-{first}", "from": f"run-{first}"}).status_code == 201
    repos.create_repo(project, "data", "dataset")
    assert member.post("/api/hub/repos/data/branches", {"name": f"run-{first + 5}"}).status_code == 201
    assert Branch.objects.filter(repo=Repo.objects.get(project=project, name="data"), name=f"run-{first + 5}").exists()
    assert TrainingRun.objects.count() == 2
