"""Two paths a case-insensitive disk that normalises Unicode (macOS, Windows) reads as one file
cannot be in one commit: its checkout would keep one of them. Stored names stay as given."""

from __future__ import annotations

import pytest

from datahub import commits, repos
from datahub.models import UploadSession
from tests.conftest import assert_error

URL = "/api/hub/repos/hub-data/uploads"
PRECOMPOSED, DECOMPOSED = "caf\u00e9/a.txt", "cafe\u0301/a.txt"


def upload(api, *paths: str):
    return api.post(URL, {"files": [{"path": path, "size": 2} for path in paths]})


def send_and_commit(api, upload_id: str, count: int):
    for index in range(count):
        api.client.put(f"/api/hub/uploads/{upload_id}/files/{index}?offset=0", data=b"ok", content_type="application/octet-stream", **api._headers())
    return api.post(f"/api/hub/uploads/{upload_id}/commit")


@pytest.mark.parametrize("paths", [(PRECOMPOSED, DECOMPOSED), ("Dir/x.txt", "dir/x.txt", "DIR/X.TXT"), ("Stra\u00dfe.txt", "STRASSE.txt")])
def test_one_upload_of_two_names_of_one_file_is_refused_naming_both(api, dataset_repo, paths):
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(upload(api, *paths), 400, "files[0].path")
    message = body["errors"][0]["message"]
    assert f"{paths[0]} and {paths[1]} in this upload differ only in case or in how an accent is encoded" in message, body
    assert ascii(paths[1]) in message and ascii(paths[0]) in message
    assert not UploadSession.objects.exists()
    assert repos.resolve(dataset_repo, "main") == head


def test_a_name_of_a_file_on_the_branch_in_another_case_or_form_is_refused(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {PRECOMPOSED: b"old", "Dir/x.txt": b"old"})
    head = repos.resolve(dataset_repo, "main")
    for path in (DECOMPOSED, "dir/x.txt", "CAF\u00c9/A.TXT"):
        body = assert_error(upload(api, "new.txt", path), 400, "files[1].path")
        assert "on branch main differ only in case" in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()
    assert repos.resolve(dataset_repo, "main") == head


def test_the_same_path_replaces_its_file_and_names_are_stored_as_given(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {DECOMPOSED: b"old", "Dir/x.txt": b"old"})
    created = upload(api, DECOMPOSED, "Dir/x.txt", "other/x.txt")
    assert created.status_code == 201, created.content
    assert send_and_commit(api, created.json()["id"], 3).status_code == 200
    tree = repos.tree(repos.resolve(dataset_repo, "main"))
    assert set(tree) == {DECOMPOSED, "Dir/x.txt", "other/x.txt"}  # the decomposed name is not normalised


def test_a_clash_committed_after_the_session_was_opened_is_refused_at_commit(api, dataset_repo):
    created = upload(api, "dir/x.txt")
    assert created.status_code == 201, created.content
    commits.commit_files(dataset_repo, "main", {"Dir/x.txt": b"theirs"})  # another client, meanwhile
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(send_and_commit(api, created.json()["id"], 1), 400, "path")
    assert "dir/x.txt and Dir/x.txt in the commit differ only in case" in body["errors"][0]["message"], body
    assert repos.resolve(dataset_repo, "main") == head
    assert UploadSession.objects.get().state == UploadSession.State.OPEN
