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


@pytest.mark.parametrize(("listed", "theirs", "message"), [
    ("dir/x.txt", "Dir/x.txt", "dir/x.txt and Dir/x.txt in the commit differ only in case"),
    ("readme.txt/x.txt", "Readme.TXT", "Readme.TXT is a file in the commit, so readme.txt/x.txt cannot go under it"),
    ("Readme.TXT", "readme.txt/x.txt", "readme.txt is a folder in the commit (Readme.TXT and readme.txt differ only in case"),
])
def test_a_clash_committed_after_the_session_was_opened_is_refused_at_commit(api, dataset_repo, listed, theirs, message):
    created = upload(api, listed)
    assert created.status_code == 201, created.content
    commits.commit_files(dataset_repo, "main", {theirs: b"theirs"})  # another client, meanwhile
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(send_and_commit(api, created.json()["id"], 1), 400, "path")
    assert message in body["errors"][0]["message"], body
    assert repos.resolve(dataset_repo, "main") == head
    assert set(repos.tree(head)) == {theirs}
    assert UploadSession.objects.get().state == UploadSession.State.OPEN


@pytest.mark.parametrize(("stored", "path", "message"), [
    ("Readme.TXT", "readme.txt/x.txt", "Readme.TXT is a file on branch main, so readme.txt/x.txt cannot go under it (Readme.TXT and readme.txt differ only in case"),
    ("sp ace #1%20.txt", "SP ACE #1%20.txt/y", "sp ace #1%20.txt is a file on branch main, so SP ACE #1%20.txt/y cannot go under it"),
    ("caf\u00e9", "CAFE\u0301/deep/x.txt", "caf\u00e9 is a file on branch main, so CAFE\u0301/deep/x.txt cannot go under it"),
    ("Data/a.txt", "DATA", "Data is a folder on branch main (DATA and Data differ only in case"),
    ("a/Caf\u00e9/b.txt", "A/cafe\u0301", "a/Caf\u00e9 is a folder on branch main"),
])
def test_a_file_and_a_folder_whose_names_differ_only_in_case_or_form_are_refused(api, dataset_repo, stored, path, message):
    """Readme.TXT beside readme.txt/x.txt: a macOS or Windows checkout cannot hold both (it was
    committed, and the archive shipped both)."""
    commits.commit_files(dataset_repo, "main", {stored: b"old"})
    head = repos.resolve(dataset_repo, "main")
    body = assert_error(upload(api, "new.txt", path), 400, "files[1].path")
    assert message in body["errors"][0]["message"], body
    assert "differ only in case or in how an accent is encoded" in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()
    assert repos.resolve(dataset_repo, "main") == head
    assert set(repos.tree(head)) == {stored}


@pytest.mark.parametrize(("paths", "index", "message"), [
    (("Notes", "notes/a.txt"), "files[0].path", "notes is a folder in this upload (Notes and notes differ only in case"),
    (("notes/a.txt", "Notes"), "files[0].path", "Notes is a file in this upload, so notes/a.txt cannot go under it"),
    (("x/Stra\u00dfe/a.txt", "X/STRASSE"), "files[0].path", "X/STRASSE is a file in this upload, so x/Stra\u00dfe/a.txt cannot go under it"),
])
def test_one_upload_of_a_file_and_a_folder_of_one_name_is_refused(api, dataset_repo, paths, index, message):
    body = assert_error(upload(api, *paths), 400, index)
    assert message in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()


def test_the_commit_service_refuses_a_file_beside_a_folder_of_its_name_in_another_case(dataset_repo):
    from studio.errors import BadRequest

    commits.commit_files(dataset_repo, "main", {"Data/a.txt": b"a"})
    head = repos.resolve(dataset_repo, "main")
    with pytest.raises(BadRequest) as refused:
        commits.commit_files(dataset_repo, "main", {"data": b"file"})
    assert "Data is a folder in the commit" in str(refused.value.errors[0].message)
    assert repos.resolve(dataset_repo, "main") == head


def test_folders_whose_names_differ_only_in_case_are_allowed_and_merge_on_a_case_insensitive_disk(api, dataset_repo):
    """Data/a.txt and data/b.txt are one folder holding two files on macOS (as a git checkout there
    makes them): allowed. Two files that then fall on one name are refused as before."""
    commits.commit_files(dataset_repo, "main", {"Data/a.txt": b"a"})
    created = upload(api, "data/b.txt", "DATA/sub/c.txt")
    assert created.status_code == 201, created.content
    assert send_and_commit(api, created.json()["id"], 2).status_code == 200
    assert set(repos.tree(repos.resolve(dataset_repo, "main"))) == {"Data/a.txt", "data/b.txt", "DATA/sub/c.txt"}
    body = assert_error(upload(api, "data/A.txt"), 400, "files[0].path")
    assert "data/A.txt and Data/a.txt on branch main differ only in case" in body["errors"][0]["message"], body


def test_a_clash_deep_in_a_branch_of_thousands_of_files_is_found(api, dataset_repo):
    """The clash among 1,001 paths against 4,001 files (its speed: the change's note, not a timed test)."""
    blob = commits.store_blob(b"x")  # one blob for all: the files' bytes are not what this checks
    commits.commit_blobs(dataset_repo, "main", {f"d{i % 40}/sub/f{i}.txt": blob for i in range(4000)} | {"d7/sub/Last.bin": blob})
    listed = [f"new/{i}.txt" for i in range(1000)] + ["D7/SUB/last.bin/oops.txt"]
    body = assert_error(upload(api, *listed), 400, "files[1000].path")
    assert "d7/sub/Last.bin is a file on branch main, so D7/SUB/last.bin/oops.txt cannot go under it" in body["errors"][0]["message"], body
    assert upload(api, *listed[:-1]).status_code == 201
