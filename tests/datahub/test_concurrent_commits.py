"""Concurrent commits to one branch (a run's checkpoints arrive together) all land, in some order."""
from __future__ import annotations

import threading

from django.db import connection

from datahub.commits import commit_files
from datahub.models import Branch, TreeEntry
from datahub.repos import create_repo


def test_concurrent_commits_to_one_branch_all_land(transactional_db, project):
    repo = create_repo(project, "busy", "model")
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def commit(i: int) -> None:
        try:
            barrier.wait()
            commit_files(repo, "main", {f"step-{i}/weights.bin": bytes([i]) * 1000}, message=f"step {i}")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    head = Branch.objects.get(repo=repo, name="main").head_id
    assert sorted(TreeEntry.objects.filter(commit_id=head).values_list("path", flat=True)) == [f"step-{i}/weights.bin" for i in range(4)]
