"""GET /api/hub/repos/{name}/archive and the repo page's Download repo / Download folder: a ref's
files (or a folder's) as one .tar, streamed, with the bytes committed at that ref."""
from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from datahub import commits, repos, storage
from tests.conftest import assert_error

LONG_NAME = "nested/deep/ünïcode-" + "x" * 120 + ".txt"  # past ustar's 100 characters, and not ASCII


def big_file(path: Path, mib: int) -> Path:
    """A file of `mib` MiB, written a MiB at a time, each MiB different (a shifted member shows)."""
    with open(path, "wb") as out:
        for i in range(mib):
            out.write(bytes([i % 251]) * 1021 + bytes(range(256)) * 4092 + b"end")
    return path


@pytest.fixture
def history(repo, tmp_path):
    """Three commits on main, v1 tagged at the second: a file changed after v1, one deleted, one
    added, a nested folder, and weights of 3 MiB. Returns {ref: (commit, {path: bytes})}."""
    weights = big_file(tmp_path / "model.safetensors", 3)
    commits.commit_files(repo, "main", {"config.json": b'{"v": 0}'}, "first")
    v1_files = {"config.json": b'{"v": 1}', "weights/model.safetensors": weights, "nested/deep/a.txt": b"a", "nested/b.txt": b"b",
                LONG_NAME: b"long", "gone.txt": b"bye"}
    v1 = commits.commit_files(repo, "main", v1_files, "v1")
    repos.create_tag(repo, "v1", "main")
    head = commits.commit_files(repo, "main", {"config.json": b'{"v": 2}', "nested/deep/c.txt": b"c"}, "v2", delete=["gone.txt"])
    v1_bytes = {path: (weights.read_bytes() if isinstance(data, Path) else data) for path, data in v1_files.items()}
    head_bytes = {**{p: b for p, b in v1_bytes.items() if p != "gone.txt"}, "config.json": b'{"v": 2}', "nested/deep/c.txt": b"c"}
    return {"v1": (v1, v1_bytes), "main": (head, head_bytes)}


def get(client, url: str, **params):
    return client.client.get(url, params, **client._headers())


def members(response) -> dict[str, bytes]:
    """The archive's files by name, each checked to be a regular file of mode 0644."""
    body = b"".join(response.streaming_content)
    assert response["Content-Length"] == str(len(body))
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tar:
        infos = tar.getmembers()
        assert all(i.isreg() and i.mode == 0o644 for i in infos), [(i.name, i.type, oct(i.mode)) for i in infos]
        return {i.name: tar.extractfile(i).read() for i in infos}


def test_archive_at_two_refs_holds_each_refs_files_and_bytes(api, history):
    for ref, (commit, files) in history.items():
        r = get(api, "/api/hub/repos/my-model/archive", ref=ref)
        assert r.status_code == 200 and r["Content-Type"] == "application/x-tar" and r["X-Repo-Commit"] == commit.pk
        assert r["Content-Disposition"] == f'attachment; filename="my-model-{ref}.tar"'
        assert members(r) == files, ref
    # the weights above are the 3 MiB committed, not a pointer to them
    assert len(history["v1"][1]["weights/model.safetensors"]) == 3 * 1024 * 1024
    # a commit id (or its prefix) names the archive by its first 10 digits; no ref is the default branch
    v1 = history["v1"][0]
    r = get(api, "/api/hub/repos/my-model/archive", ref=v1.pk[:8])
    assert r["Content-Disposition"] == f'attachment; filename="my-model-{v1.pk[:10]}.tar"' and members(r) == history["v1"][1]
    assert members(get(api, "/api/hub/repos/my-model/archive")) == history["main"][1]


def test_archive_streams_the_weights_a_piece_at_a_time(api, history):
    r = get(api, "/api/hub/repos/my-model/archive", ref="v1")
    assert r.streaming
    sizes = [len(chunk) for chunk in r.streaming_content]
    assert max(sizes) <= storage.CHUNK_SIZE and sum(sizes) == int(r["Content-Length"]) > 3 * 1024 * 1024, sizes


def test_archive_of_a_folder_holds_only_its_files_under_their_repo_paths(api, history):
    _, files = history["main"]
    nested = {p: b for p, b in files.items() if p.startswith("nested/")}
    for path in ("nested", "nested/"):
        r = get(api, "/api/hub/repos/my-model/archive", ref="main", path=path)
        assert r["Content-Disposition"] == 'attachment; filename="my-model-main-nested.tar"'
        assert members(r) == nested
    deep = members(get(api, "/api/hub/repos/my-model/archive", ref="v1", path="nested/deep"))
    assert sorted(deep) == sorted(["nested/deep/a.txt", LONG_NAME])  # c.txt came after v1


def test_an_empty_repo_is_an_empty_archive(api, repo):
    assert members(get(api, "/api/hub/repos/my-model/archive")) == {}


def test_a_ref_the_repo_lacks_is_a_404_naming_ref_and_the_refs_it_has(api, history):
    body = assert_error(get(api, "/api/hub/repos/my-model/archive", ref="v9"), 404, "ref")
    assert "has no branch, tag or commit 'v9'" in body["detail"]
    assert "its branches: main; its tags: v1" in body["errors"][0]["message"], body
    assert_error(get(api, "/api/hub/repos/my-model/archive", ref="bad name"), 400, "ref")


def test_a_path_that_is_no_folder_is_refused_naming_path(api, history):
    body = assert_error(get(api, "/api/hub/repos/my-model/archive", ref="v1", path="nested/deep/c.txt"), 404, "path")
    assert "has no folder 'nested/deep/c.txt' at v1" in body["detail"]
    assert "/api/hub/repos/my-model/files?ref=v1 (no path) lists every file" in body["errors"][0]["message"]
    body = assert_error(get(api, "/api/hub/repos/my-model/archive", path="nested/b.txt"), 400, "path")
    message = body["errors"][0]["message"]
    assert "/api/hub/repos/my-model/download?path=nested%2Fb.txt&ref=main" in message and "archive its folder with path=nested" in message
    for path in ("../etc", "/etc", "a//b"):
        assert_error(get(api, "/api/hub/repos/my-model/archive", path=path), 400, "path")


def test_path_slash_is_the_whole_repo_as_no_path_is(api, history):
    # It was a 400 "'' is not an allowed path", while the page's /archive/<ref>/ is the whole repo.
    assert members(get(api, "/api/hub/repos/my-model/archive", path="/")) == history["main"][1]
    listed = get(api, "/api/hub/repos/my-model/files", ref="v1", path="/")
    assert listed.status_code == 200 and sorted(f["path"] for f in listed.json()["files"]) == sorted(history["v1"][1])


@pytest.mark.parametrize(("role", "status"), [("owner", 200), ("viewer", 200), ("outsider", 404), (None, 401)])
def test_archive_is_read_as_a_file_download_is(api_as, history, role, status):
    client = api_as(role)
    for url, query in (("/api/hub/repos/my-model/archive", {}), ("/api/hub/repos/my-model/download", {"path": "config.json"})):
        r = get(client, url, **query)
        assert r.status_code == status, (url, r.status_code)
    if status == 200:
        assert members(get(client, "/api/hub/repos/my-model/archive")) == history["main"][1]


def test_another_projects_repo_of_the_same_name_is_not_archived(api_as, history, other_project):
    theirs = repos.create_repo(other_project, "my-model", "model")
    commits.commit_files(theirs, "main", {"secret.txt": b"theirs"}, "theirs")
    assert members(get(api_as("owner"), "/api/hub/repos/my-model/archive")) == history["main"][1]
    assert members(get(api_as("outsider"), "/api/hub/repos/my-model/archive")) == {"secret.txt": b"theirs"}
    repos.create_repo(other_project, "only-theirs", "model")
    assert_error(get(api_as("owner"), "/api/hub/repos/only-theirs/archive"), 404)


def test_curl_with_a_token_downloads_an_archive_tar_extracts(transactional_db, live_server, history, tokens, tmp_path):
    _, files = history["v1"]
    url = f"{live_server.url}/api/hub/repos/my-model/archive?ref=v1&path=weights"
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(f'curl -sfOJ -H "Authorization: Bearer {tokens["viewer"]}" "{url}" && tar -xf my-model-v1-weights.tar',
                          shell=True, cwd=out, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [str(p.relative_to(out)) for p in sorted(out.rglob("*")) if p.is_file()] == ["my-model-v1-weights.tar", "weights/model.safetensors"]
    assert (out / "weights/model.safetensors").read_bytes() == files["weights/model.safetensors"]
    refused = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {tokens['outsider']}", url],
                             capture_output=True, text=True, timeout=60)
    assert refused.stdout == "404"


def test_repo_page_links_the_archive_of_its_ref_and_folder(browser, history):
    c = browser("viewer")
    page = c.get("/hub/acme/my-model/tree/v1").content.decode()
    assert '<a href="/hub/acme/my-model/archive/v1" download>Download repo (.tar)</a>' in page
    folder = c.get("/hub/acme/my-model/tree/v1/nested").content.decode()
    assert '<a href="/hub/acme/my-model/archive/v1/nested" download>Download folder (.tar)</a>' in folder and "Download repo" not in folder
    r = c.get("/hub/acme/my-model/archive/v1")
    assert r["Content-Disposition"] == 'attachment; filename="my-model-v1.tar"' and members(r) == history["v1"][1]
    r = c.get("/hub/acme/my-model/archive/v1/nested")
    assert r["Content-Disposition"] == 'attachment; filename="my-model-v1-nested.tar"'
    assert sorted(members(r)) == ["nested/b.txt", "nested/deep/a.txt", LONG_NAME]
    assert c.get("/hub/acme/my-model/archive/v1/nowhere").status_code == 404
    assert c.get("/hub/acme/my-model/archive/v9").status_code == 404
    assert browser("outsider").get("/hub/acme/my-model/archive/v1").status_code == 404


def test_the_archive_page_of_a_files_path_goes_to_the_files_download(browser, history):
    # It was a 404, where the API's archive says the path is a file, to fetch instead.
    c = browser("viewer")
    r = c.get("/hub/acme/my-model/archive/v1/nested/b.txt")
    assert r.status_code == 302 and r["Location"] == "/hub/acme/my-model/resolve/v1/nested/b.txt"
    assert b"".join(c.get(r["Location"]).streaming_content) == b"b"
    assert c.get("/hub/acme/my-model/archive/main/gone.txt").status_code == 404  # deleted after v1: no such file or folder
