"""Paths a person uploads must be paths every checkout can write: huggingface_hub's download and
the engine's fetch of the repo put each file on a disk under its own name."""
from __future__ import annotations

import pytest

from datahub import commits, repos
from datahub.models import UploadFile, UploadSession
from tests.conftest import assert_error

URL = "/api/hub/repos/hub-data/uploads"


def put(api, upload_id, index, offset, data: bytes):
    return api.client.put(f"/api/hub/uploads/{upload_id}/files/{index}?offset={offset}", data=data,
                          content_type="application/octet-stream", HTTP_AUTHORIZATION=f"Bearer {api.token}")


@pytest.mark.parametrize(("path", "says"), [
    ("x" * 300 + ".txt", "each folder or file name in a path is at most 246 bytes"),
    ("x" * 247, "is 247 bytes"),  # fits a disk, but not huggingface_hub's <name>.metadata beside it
    ("data/" + "x" * 251 + ".txt", "less the .metadata that huggingface_hub's download adds"),  # 255 bytes
    ("data/" + "é" * 128 + ".jsonl", "is 262 bytes"),  # 135 characters, but 262 bytes in UTF-8
    ("d" * 247 + "/train.jsonl", "at most 246 bytes"),  # a folder's name too
    ("/".join(["é" * 100] * 6) + "/f", "a path is at most 1024 bytes (UTF-8) in all"),  # 607 characters, 1207 bytes
])
def test_a_path_no_disk_can_hold_is_refused_at_upload_naming_it(api, dataset_repo, path, says):
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(api.post(URL, {"files": [{"path": "ok.jsonl", "size": 1}, {"path": path, "size": 1}]}), 400, "files[1].path")
    assert says in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()
    assert repos.resolve(dataset_repo, "main") == head


def test_names_up_to_246_bytes_upload(api, dataset_repo):
    path = "d" * 246 + "/" + "é" * 122 + "xx"  # 246 bytes each
    upload = api.post(URL, {"files": [{"path": path, "size": 2}]})
    assert upload.status_code == 201, upload.content
    assert put(api, upload.json()["id"], 0, 0, b"ok").json()["complete"] is True
    assert api.post(f"/api/hub/uploads/{upload.json()['id']}/commit").status_code == 200
    assert set(repos.tree(repos.resolve(dataset_repo, "main"))) == {path}


def test_a_session_opened_before_the_rule_is_refused_at_commit(api, dataset_repo):
    upload_id = api.post(URL, {"files": [{"path": "short.txt", "size": 2}]}).json()["id"]
    UploadFile.objects.filter(session_id=upload_id).update(path="x" * 300 + ".txt")  # as an older Studio accepted it
    assert put(api, upload_id, 0, 0, b"ok").json()["complete"] is True
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(api.post(f"/api/hub/uploads/{upload_id}/commit"), 400, "files[0].path")
    assert "at most 246 bytes" in body["errors"][0]["message"], body
    assert repos.resolve(dataset_repo, "main") == head
    assert UploadSession.objects.get().state == UploadSession.State.OPEN


def test_a_file_committed_before_the_rule_can_still_be_read_and_deleted(api, dataset_repo):
    long = "x" * 300 + ".txt"
    commits.commit_files(dataset_repo, "main", {long: b"old", "keep.txt": b"k"})  # the Studio's own commits do not take the rule
    response = api.client.get("/api/hub/repos/hub-data/download", {"path": long}, **api._headers())
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"old"
    assert api.delete("/api/hub/repos/hub-data/files", {"paths": [long]}).status_code == 200
    assert set(repos.tree(repos.resolve(dataset_repo, "main"))) == {"keep.txt"}


@pytest.mark.parametrize("path", [".git/good_sft.jsonl", "data/.git/config", ".GIT/x.jsonl", "d/.Git"])
def test_a_git_folder_or_file_is_refused_at_upload_as_dot_dot_is(api, dataset_repo, path):
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(api.post(URL, {"files": [{"path": path, "size": 1}]}), 400, "files[0].path")
    assert "a path cannot contain a folder or file named '.git'" in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()
    assert repos.resolve(dataset_repo, "main") == head
    # names that only start or end like it are fine
    assert api.post(URL, {"files": [{"path": ".gitignore", "size": 1}, {"path": "x.git/a", "size": 1}, {"path": "git/a", "size": 1}]}).status_code == 201


def test_a_name_of_246_bytes_downloads_with_huggingface_hub_into_a_local_dir(transactional_db, live_server, api, dataset_repo, tokens, tmp_path):
    """The longest name an upload takes is one huggingface_hub can write with its <name>.metadata and
    <name>.lock beside it (under local_dir/.cache/huggingface/download/); 247 bytes and more fail there."""
    from huggingface_hub import snapshot_download

    name = "n" * 240 + ".jsonl"
    upload = api.post(URL, {"files": [{"path": name, "size": 2}]})
    assert upload.status_code == 201, upload.content
    assert put(api, upload.json()["id"], 0, 0, b"ok").json()["complete"] is True
    assert api.post(f"/api/hub/uploads/{upload.json()['id']}/commit").status_code == 200
    folder = snapshot_download("acme/hub-data", repo_type="dataset", endpoint=f"{live_server.url}/hub", token=tokens["owner"], local_dir=tmp_path / "local")
    assert (tmp_path / "local" / name).read_bytes() == b"ok" and folder == str(tmp_path / "local")
