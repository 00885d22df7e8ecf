"""datahub.checkouts: a commit's files (or a folder's) as a folder on this machine, cached by commit,
written whole or not at all, and the least recently used dropped past DATAHUB_CHECKOUT_MAX_BYTES
unless in use. Real blob storage and database."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from datahub.checkouts import TMP_PREFIX, checked_out, checkout_name
from datahub.commits import commit_files


@pytest.fixture(autouse=True)
def checkout_dir(settings, tmp_path) -> Path:
    settings.DATAHUB_CHECKOUT_DIR = tmp_path / "checkouts"
    settings.DATAHUB_CHECKOUT_MAX_BYTES = 10**9
    return settings.DATAHUB_CHECKOUT_DIR


def files_in(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_commit_is_checked_out_whole_or_one_folder_and_reused(repo, checkout_dir):
    first = commit_files(repo, "main", {"config.json": b"{}", "final/model.bin": b"w" * 3000, "final/sub/tok.json": b"t"})
    commit_files(repo, "main", {"config.json": b'{"changed": 1}'})  # the branch moves on: the checkout keeps its commit's files

    with checked_out(first.pk) as whole:
        assert whole == checkout_dir / first.pk
        assert files_in(whole) == {"config.json": b"{}", "final/model.bin": b"w" * 3000, "final/sub/tok.json": b"t"}
    with checked_out(first.pk, "final") as folder:
        assert folder == checkout_dir / checkout_name(first.pk, "final") and folder != whole
        assert files_in(folder) == {"model.bin": b"w" * 3000, "sub/tok.json": b"t"}
        written = (folder / "model.bin").stat().st_ino
    with checked_out(first.pk, "final") as again:  # reused, not written again
        assert (again / "model.bin").stat().st_ino == written
    assert not [p for p in checkout_dir.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_a_folder_the_commit_lacks_is_file_not_found_and_leaves_nothing(repo, checkout_dir):
    commit = commit_files(repo, "main", {"config.json": b"{}"})
    with pytest.raises(FileNotFoundError, match="has no files under final/"), checked_out(commit.pk, "final"):
        pass
    assert not any(p.is_dir() for p in checkout_dir.iterdir())


def test_past_the_limit_the_least_recently_used_go_but_not_one_in_use(repo, checkout_dir, settings):
    settings.DATAHUB_CHECKOUT_MAX_BYTES = 2500
    a = commit_files(repo, "main", {"a.bin": b"a" * 1000})
    b = commit_files(repo, "main", {"b.bin": b"b" * 1000}, delete=["a.bin"])  # each commit 1000 bytes
    c = commit_files(repo, "main", {"c.bin": b"c" * 1000}, delete=["b.bin"])
    with checked_out(a.pk, "") as folder_a:
        os.utime(folder_a, (1, 1))  # long ago: the least recently used
    with checked_out(b.pk), checked_out(c.pk):  # three in the cache, one over the limit: a goes
        pass
    assert sorted(p.name for p in checkout_dir.iterdir() if p.is_dir()) == sorted([b.pk, c.pk])

    with checked_out(b.pk) as in_use:
        os.utime(in_use, (1, 1))
        with checked_out(a.pk):  # b is the oldest, but an answer reads it: c goes instead
            assert sorted(p.name for p in checkout_dir.iterdir() if p.is_dir()) == sorted([a.pk, b.pk])
        assert files_in(in_use) == {"b.bin": b"b" * 1000}
