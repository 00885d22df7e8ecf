"""/api/hub branches and tags: names that cannot shadow a commit or each other, and deleting them."""
from __future__ import annotations

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
