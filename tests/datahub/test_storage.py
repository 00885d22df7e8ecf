from __future__ import annotations

import io
from pathlib import Path

import pytest

from datahub import commits, repos
from datahub.models import Blob, TreeEntry
from datahub.storage import blob_storage
from studio.errors import BadRequest, Conflict


def test_identical_files_in_two_repos_share_one_blob(project, users):
    a = repos.create_repo(project, "a", "model")
    b = repos.create_repo(project, "b", "dataset")
    blobs_before = Blob.objects.count()
    payload = b"same bytes" * 1000
    ca = commits.commit_files(a, "main", {"weights.bin": payload}, "add", users["owner"])
    cb = commits.commit_files(b, "main", {"other/name.bin": io.BytesIO(payload)}, "add", users["owner"])
    ea, eb = TreeEntry.objects.get(commit=ca), TreeEntry.objects.get(commit=cb)
    assert ea.blob_id == eb.blob_id
    assert Blob.objects.count() == blobs_before + 1
    storage = blob_storage()
    on_disk = [p for p in (Path(storage.location) / "blobs").rglob("*") if p.is_file() and p.read_bytes() == payload]
    assert len(on_disk) == 1
    with storage.open(ea.blob.storage_name) as fh:
        assert fh.read() == payload


def test_commit_streams_local_file_and_keeps_history(repo, users, tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        for i in range(5):
            fh.write(bytes([i]) * (1024 * 1024))
    first = commits.commit_files(repo, "main", {"model.bin": big}, "weights", users["owner"])
    second = commits.commit_files(repo, "main", {"README.md": b"# hi"}, "readme", users["owner"])
    assert second.parents == [first.pk]
    assert set(repos.tree(second)) == {"model.bin", "README.md"}
    assert repos.tree(first)["model.bin"].size == 5 * 1024 * 1024
    assert repos.resolve(repo, "main") == second
    assert repos.resolve(repo, first.pk[:8]) == first
    # an unchanged tree makes no new commit
    assert commits.commit_files(repo, "main", {"README.md": b"# hi"}) == second


@pytest.mark.parametrize("bad", ["../etc/passwd", "/abs/path", "a/../b", "nul\x00byte", "back\\slash", "a//b", "./a", "C:/x", ""])
def test_bad_paths_are_refused_with_400(repo, bad):
    with pytest.raises(BadRequest) as exc:
        commits.commit_files(repo, "main", {bad: b"x"})
    assert exc.value.errors[0].field == "path"


def test_file_and_folder_of_the_same_name_clash(repo):
    commits.commit_files(repo, "main", {"a": b"x"})
    with pytest.raises(BadRequest):
        commits.commit_files(repo, "main", {"a/b": b"y"})


def test_branches_tags_and_refs(repo):
    commits.commit_files(repo, "main", {"x": b"1"})
    repos.create_branch(repo, "dev", "main")
    dev = commits.commit_files(repo, "dev", {"x": b"2"})
    repos.create_tag(repo, "v1", "dev")
    assert repos.resolve(repo, "v1") == dev
    assert repos.resolve(repo, "main") != dev
    with pytest.raises(Conflict):
        repos.create_tag(repo, "v1", "main")
    with pytest.raises(repos.RefNotFound):
        repos.resolve(repo, "nope")


def test_duplicate_repo_name_is_409(project, repo):
    with pytest.raises(Conflict):
        repos.create_repo(project, "my-model", "dataset")
