"""Upload sessions: chunked and resumable; nothing is visible until the commit step."""
from __future__ import annotations

import hashlib

import pytest

from datahub import repos, uploads
from datahub.models import UploadFile, UploadSession
from datahub.schemas import MAX_FILE_SIZE
from tests.conftest import assert_error


def put(api, upload_id, index, offset, data: bytes):
    return api.client.put(f"/api/hub/uploads/{upload_id}/files/{index}?offset={offset}", data=data,
                          content_type="application/octet-stream", HTTP_AUTHORIZATION=f"Bearer {api.token}")


def test_chunked_resumable_upload_then_commit(api, dataset_repo):
    data = b"x" * 3000 + b"y" * 2000
    body = {"files": [{"path": "data/train.jsonl", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                      {"path": "empty.txt", "size": 0}], "message": "add data"}
    r = api.post("/api/hub/repos/hub-data/uploads", body)
    assert r.status_code == 201, r.content
    upload_id = r.json()["id"]
    assert put(api, upload_id, 0, 0, data[:3000]).json()["received"] == 3000
    # a chunk at the wrong offset is a 409 that says where to resume
    assert_error(put(api, upload_id, 0, 1000, data[1000:]), 409, "offset")
    # half-finished: committing refuses and nothing is visible on the branch
    before = repos.resolve(dataset_repo, "main")
    assert_error(api.post(f"/api/hub/uploads/{upload_id}/commit"), 409, "files[0]")
    assert repos.resolve(dataset_repo, "main") == before
    assert repos.tree(before) == {}
    # resume from what the session says arrived
    received = api.get(f"/api/hub/uploads/{upload_id}").json()["files"][0]["received"]
    assert put(api, upload_id, 0, received, data[received:]).json()["complete"] is True
    assert_error(put(api, upload_id, 0, len(data), b"more"), 400, "body")
    r = api.post(f"/api/hub/uploads/{upload_id}/commit")
    assert r.status_code == 200, r.content
    commit = repos.resolve(dataset_repo, "main")
    assert r.json()["id"] == commit.pk and commit.message == "add data"
    tree = repos.tree(commit)
    assert tree["data/train.jsonl"].sha256 == hashlib.sha256(data).hexdigest() and tree["empty.txt"].size == 0
    # committing again is harmless
    assert api.post(f"/api/hub/uploads/{upload_id}/commit").json()["id"] == commit.pk
    assert UploadSession.objects.get(pk=upload_id).state == "committed"


def test_corrupted_upload_is_refused_and_resets(api, dataset_repo):
    r = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4, "sha256": "0" * 64}]})
    upload_id = r.json()["id"]
    put(api, upload_id, 0, 0, b"abcd")
    assert_error(api.post(f"/api/hub/uploads/{upload_id}/commit"), 400, "files[0].sha256")
    assert repos.tree(repos.resolve(dataset_repo, "main")) == {}
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["files"][0]["received"] == 0


def test_viewer_and_outsider_cannot_write_chunks(api, api_as, dataset_repo):
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    assert put(api_as("viewer"), upload_id, 0, 0, b"abcd").status_code == 403
    assert put(api_as("outsider"), upload_id, 0, 0, b"abcd").status_code == 404
    assert api_as("outsider").get(f"/api/hub/uploads/{upload_id}").status_code == 404
    assert api.delete(f"/api/hub/uploads/{upload_id}").status_code == 204
    assert_error(put(api, upload_id, 0, 0, b"abcd"), 409)


def test_abort_of_a_committed_upload_is_a_409_that_says_its_files_stay(api, dataset_repo):
    """DELETE on a committed session used to answer 204 and change nothing: the client was told its
    upload was aborted while its files stayed on the branch. Aborting an aborted one stays a 204."""
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    put(api, upload_id, 0, 0, b"abcd")
    commit = api.post(f"/api/hub/uploads/{upload_id}/commit").json()["id"]
    body = assert_error(api.delete(f"/api/hub/uploads/{upload_id}"), 409, "upload_id")
    assert commit[:10] in body["detail"] and "main" in body["detail"], body
    assert UploadSession.objects.get(pk=upload_id).state == "committed"
    assert "a.bin" in repos.tree(repos.resolve(dataset_repo, "main"))

    UploadSession.objects.filter(pk=upload_id).update(state=UploadSession.State.COMMITTING)  # a commit under way
    assert_error(api.delete(f"/api/hub/uploads/{upload_id}"), 409, "upload_id")
    assert UploadSession.objects.get(pk=upload_id).state == "committing"

    other = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "b.bin", "size": 4}]}).json()["id"]
    assert api.delete(f"/api/hub/uploads/{other}").status_code == 204
    assert api.delete(f"/api/hub/uploads/{other}").status_code == 204
    assert UploadSession.objects.get(pk=other).state == "aborted"


def test_a_chunk_without_content_length_is_a_400_not_an_empty_write(api, dataset_repo):
    """A chunked (Transfer-Encoding) body reaches Django with no CONTENT_LENGTH, and Django reads no
    bytes of it: the PUT answered 200 with nothing received, as if the client had sent nothing."""
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    r = api.client.put(f"/api/hub/uploads/{upload_id}/files/0?offset=0", data=b"abcd", content_type="application/octet-stream",
                       HTTP_AUTHORIZATION=f"Bearer {api.token}", HTTP_TRANSFER_ENCODING="chunked", CONTENT_LENGTH="")
    body = assert_error(r, 400, "body")
    assert "Content-Length" in body["errors"][0]["message"], body
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["files"][0]["received"] == 0
    assert put(api, upload_id, 0, 0, b"abcd").json()["complete"] is True  # the same chunk with its length


def test_upload_that_makes_a_file_also_a_folder_is_refused_at_once_naming_the_file(api, dataset_repo):
    from datahub import commits

    commits.commit_files(dataset_repo, "main", {"f": b"file", "d/x.txt": b"x"}, "seed")
    cases = [
        ([{"path": "ok.txt", "size": 1}, {"path": "f/g", "size": 1}], "files[1].path", "f is a file on branch main"),
        ([{"path": "d", "size": 1}], "files[0].path", "d is a folder on branch main"),
        ([{"path": "n/m", "size": 1}, {"path": "n", "size": 1}], "files[0].path", "n is a file in this upload"),
    ]
    for files, field, message in cases:
        body = assert_error(api.post("/api/hub/repos/hub-data/uploads", {"files": files}), 400, field)
        assert message in body["errors"][0]["message"], body
    assert not UploadSession.objects.exists()
    # replacing the file f, or adding beside it, is fine
    assert api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "f", "size": 1}, {"path": "d/y.txt", "size": 1}]}).status_code == 201


def test_negative_offset_says_the_allowed_range(api, dataset_repo):
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    body = assert_error(put(api, upload_id, 0, -1, b"abcd"), 400, "offset")
    assert body["errors"][0]["message"] == "give offset between 0 and 4398046511104"
    body = assert_error(api.get("/api/hub/repos/hub-data/commits", limit=0), 400, "limit")
    assert body["errors"][0]["message"] == "give limit between 1 and 500"


def test_a_file_index_that_is_not_ascii_digits_is_404_and_writes_nothing(api, dataset_repo):
    # "²".isdigit() is True yet int("²") raises (it was a 500); int("٠") is 0, so "٠" wrote to file 0.
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    for index in ("%C2%B2", "%D9%A0", "-0", "+0", "%200"):
        response = put(api, upload_id, index, 0, b"abcd")
        assert response.status_code == 404, (index, response.status_code, response.content[:300])
        assert "has no file" in response.json()["detail"]
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["files"][0]["received"] == 0
    assert put(api, upload_id, 0, 0, b"abcd").json()["complete"] is True


def test_a_content_length_that_is_not_ascii_digits_is_not_a_500(api, dataset_repo):
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    response = api.client.put(f"/api/hub/uploads/{upload_id}/files/0?offset=0", data=b"abcd", content_type="application/octet-stream",
                              HTTP_AUTHORIZATION=f"Bearer {api.token}", CONTENT_LENGTH="²")
    assert response.status_code < 500, response.content[:300]


@pytest.mark.parametrize("size", [2**63, 2**63 - 1, 2**64, MAX_FILE_SIZE + 1])
def test_a_file_size_over_4_tib_is_a_400_naming_it_and_stores_nothing(api, dataset_repo, size):
    """2**63 reached the INSERT and was a 500 (bigint out of range); 2**63 - 1 (8 EiB) was accepted."""
    body = assert_error(api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "ok.bin", "size": 1}, {"path": "x", "size": size}]}),
                        400, "files[1].size")
    message = body["errors"][0]["message"]
    assert "at most 4 TiB (4398046511104 bytes)" in message and "split" in message, body
    assert not UploadSession.objects.exists() and not UploadFile.objects.exists()


def test_a_file_of_exactly_4_tib_can_be_announced_and_the_limit_is_documented(api, dataset_repo):
    r = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "huge.gguf", "size": MAX_FILE_SIZE}]})
    assert r.status_code == 201, r.content
    assert UploadFile.objects.get(session_id=r.json()["id"]).size == MAX_FILE_SIZE
    spec = api.get("/api/openapi.json").json()
    body = spec["paths"]["/api/hub/repos/{name}/uploads"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["files"]["items"]["$ref"] == "#/components/schemas/UploadFileIn"
    assert spec["components"]["schemas"]["UploadFileIn"]["properties"]["size"]["maximum"] == MAX_FILE_SIZE
    put_chunk = next(op for path, ops in spec["paths"].items() if path.endswith("/files/{index}") for op in ops.values())
    assert next(p for p in put_chunk["parameters"] if p["name"] == "offset")["schema"]["maximum"] == MAX_FILE_SIZE


def test_an_offset_past_the_largest_file_is_a_400_not_a_conflict(api, dataset_repo):
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    for offset in (MAX_FILE_SIZE + 1, 2**63, 10**30):
        assert_error(put(api, upload_id, 0, offset, b"abcd"), 400, "offset")
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["files"][0]["received"] == 0


def test_a_commit_on_a_session_with_a_stale_parent_says_to_start_a_new_session(api, dataset_repo):
    """The session's parent is fixed when it is made: "reload the branch and commit again" could
    never work. The session stays open with what it received (nothing is lost)."""
    from datahub import commits

    parent = repos.resolve(dataset_repo, "main").pk
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}], "parent": parent}).json()["id"]
    put(api, upload_id, 0, 0, b"abcd")
    moved = commits.commit_files(dataset_repo, "main", {"other.txt": b"x"}, "someone else")
    body = assert_error(api.post(f"/api/hub/uploads/{upload_id}/commit"), 409, "parent")
    message = body["errors"][0]["message"]
    assert "reload the branch" not in message, body
    assert "start a new upload session (POST /api/hub/repos/hub-data/uploads)" in message and moved.pk in message, body
    assert repos.resolve(dataset_repo, "main") == moved
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["state"] == "open"
    # doing what it says works
    again = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}], "parent": moved.pk}).json()["id"]
    put(api, again, 0, 0, b"abcd")
    assert api.post(f"/api/hub/uploads/{again}/commit").status_code == 200
    assert api.delete(f"/api/hub/uploads/{upload_id}").status_code == 204


def test_a_session_of_a_deleted_repo_says_the_repo_was_deleted(api, api_as, dataset_repo, django_capture_on_commit_callbacks):
    """The session went with its repo, and the client's next call was a bare 404 "No such upload session"."""
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 4}]}).json()["id"]
    put(api, upload_id, 0, 0, b"ab")
    committed = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "b.bin", "size": 1}]}).json()["id"]
    put(api, committed, 0, 0, b"b")
    assert api.post(f"/api/hub/uploads/{committed}/commit").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete("/api/hub/repos/hub-data").status_code == 204
    assert not uploads.staged_path(upload_id).exists()

    for response in (put(api, upload_id, 0, 2, b"cd"), api.post(f"/api/hub/uploads/{upload_id}/commit")):
        body = assert_error(response, 409, "upload_id")
        assert "because its repo acme/hub-data was deleted" in body["detail"], body
        assert "POST /api/hub/repos" in body["errors"][0]["message"], body
    got = api.get(f"/api/hub/uploads/{upload_id}").json()
    assert got["state"] == "aborted" and got["repo"] == "acme/hub-data" and "acme/hub-data was deleted" in got["reason"], got
    assert api.delete(f"/api/hub/uploads/{upload_id}").status_code == 204  # aborting it again is fine
    assert api_as("outsider").get(f"/api/hub/uploads/{upload_id}").status_code == 404  # still only its project's to see
    assert api_as("viewer").delete(f"/api/hub/uploads/{upload_id}").status_code == 403
    assert_error(api.get(f"/api/hub/uploads/{committed}"), 404)  # a finished session went with the repo


def test_a_chunk_past_the_end_at_the_wrong_offset_is_told_where_to_resume(api, dataset_repo):
    """The offset is judged before the chunk's size: at offset 5 of a 3-byte file with nothing sent,
    the answer was a 400 "send at most -2 bytes at offset 5"; it is the 409 the other wrong offsets get."""
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "a.bin", "size": 3}]}).json()["id"]
    for offset in (1, 3, 4, 5, 1000):
        body = assert_error(put(api, upload_id, 0, offset, b"abc"), 409, "offset")
        assert body["errors"][0]["message"] == "use offset=0"
    assert UploadFile.objects.get(session_id=upload_id, index=0).received == 0
    # at the right offset a chunk too long for the file is still a 400 naming the body
    body = assert_error(put(api, upload_id, 0, 0, b"abcd"), 400, "body")
    assert body["errors"][0]["message"] == "send at most 3 bytes at offset 0"
    assert put(api, upload_id, 0, 0, b"abc").json()["complete"] is True
