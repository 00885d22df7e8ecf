"""DELETE /api/hub/repos/{name}: writers only; its branches, tags and commits go, its unfinished
upload sessions are aborted, blob bytes stay; a live run that uses the repo makes it a 409; finished runs still display."""
from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.test import Client

from datahub import commits, repos, storage, uploads
from datahub.models import Blob, Branch, Commit, Repo, Tag, TreeEntry, UploadSession
from datahub.services import model_repo_name
from experiments.models import Experiment
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training import services as training
from training.models import Status, TrainingRun

ROWS = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3


@pytest.fixture
def chat_data(project):
    repo = repos.create_repo(project, "chat-data", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(ROWS)}, "data")
    return repo


@pytest.fixture
def base_repo(project):
    repo = repos.create_repo(project, "base", "model")
    commits.commit_files(repo, "main", {"config.json": b'{"model_type": "llama"}'}, "weights")
    return repo


def test_delete_removes_the_repo_and_its_history_but_keeps_shared_blobs(api, project, chat_data, django_capture_on_commit_callbacks):
    repos.create_branch(chat_data, "dev", "main")
    commits.commit_files(chat_data, "dev", {"own.txt": b"only in chat-data"}, "dev file")
    repos.create_tag(chat_data, "v1", "main")
    session = uploads.create_upload(chat_data, None, "main", [{"path": "more.jsonl", "size": 3}])
    uploads.write_chunk(session, 0, 0, io.BytesIO(b"abc"), 3)
    staged = uploads.staged_path(session.pk)
    other = repos.create_repo(project, "other", "dataset")
    commits.commit_files(other, "main", {"copy.jsonl": jsonl(ROWS)}, "same bytes")
    blobs = set(Blob.objects.values_list("sha256", flat=True))
    commit_ids = list(Commit.objects.filter(repo=chat_data).values_list("pk", flat=True))

    with django_capture_on_commit_callbacks(execute=True):
        r = api.delete("/api/hub/repos/chat-data")

    assert r.status_code == 204, r.content
    assert not Repo.objects.filter(pk=chat_data.pk).exists()
    assert not Commit.objects.filter(pk__in=commit_ids).exists()
    assert not TreeEntry.objects.filter(commit_id__in=commit_ids).exists()
    assert not Branch.objects.filter(repo_id=chat_data.pk).exists() and not Tag.objects.filter(repo_id=chat_data.pk).exists()
    # the open session stays, aborted, to tell its client why (test_uploads: a session of a deleted repo)
    assert UploadSession.objects.get(pk=session.pk).state == UploadSession.State.ABORTED
    assert not staged.exists(), "the open session's staged chunks are removed"
    # blobs stay: no row or byte is garbage-collected, shared or not
    assert set(Blob.objects.values_list("sha256", flat=True)) == blobs
    assert all(storage.blob_storage().exists(Blob.objects.get(pk=sha).storage_name) for sha in blobs)
    assert_error(api.get("/api/hub/repos/chat-data"), 404)
    listed = api.get("/api/hub/repos/other/download?path=copy.jsonl")
    assert b"".join(listed.streaming_content) == jsonl(ROWS)
    # the name is free again, and the same bytes are reused rather than stored twice
    assert api.post("/api/hub/repos", {"name": "chat-data", "type": "dataset"}).status_code == 201
    again = commits.commit_files(repos.find_repo(project, "chat-data"), "main", {"train.jsonl": jsonl(ROWS)}, "again")
    assert set(Blob.objects.values_list("sha256", flat=True)) == blobs
    assert repos.entry(again, "train.jsonl").blob_id in blobs


def test_only_writers_delete_a_repo(api_as, chat_data):
    for role, status in (("viewer", 403), ("outsider", 404), (None, 401)):
        assert_error(api_as(role).delete("/api/hub/repos/chat-data"), status)
        assert Repo.objects.filter(pk=chat_data.pk).exists()
    assert api_as("member").delete("/api/hub/repos/chat-data").status_code == 204
    assert not Repo.objects.filter(pk=chat_data.pk).exists()


def test_deleting_a_repo_that_does_not_exist_is_404(api, chat_data, other_project):
    repos.create_repo(other_project, "theirs", "dataset")
    assert_error(api.delete("/api/hub/repos/nope"), 404)
    assert_error(api.delete("/api/hub/repos/theirs"), 404)  # another project's repo is not named from here
    assert Repo.objects.filter(name="theirs").exists()


def make_run(project, users, **fields) -> TrainingRun:
    body = sft_body(**fields)
    return training.create_run(project, users["owner"], name=body["name"], method=body["method"], base_model=body["base_model"],
                               dataset=body["dataset"], config=body["config"])


USES = {
    "dataset": (dict(dataset="chat-data@main"), "chat-data", "dataset"),
    "dataset entry": (dict(dataset=[{"ref": "org/other"}, {"ref": "acme/chat-data@main", "type": "chat"}]), "chat-data", "dataset[1]"),
    "base model": (dict(base_model="base@main"), "base", "base_model"),
    "experiment": ({}, "experiment-default", "experiment repo"),
}


@pytest.mark.parametrize("use", USES)
@pytest.mark.parametrize("status", [Status.QUEUED, Status.PROVISIONING, Status.RUNNING])
def test_a_live_run_using_the_repo_makes_delete_409(api, project, users, chat_data, base_repo, use, status):
    fields, name, said = USES[use]
    run = make_run(project, users, **fields)
    TrainingRun.objects.filter(pk=run.pk).update(status=status)
    body = assert_error(api.delete(f"/api/hub/repos/{name}"), 409, "name")
    message = body["errors"][0]["message"]
    assert f"run #{run.pk}" in message and said in message and "then delete the repo" in message, body
    # A queued run can be edited to name another repo, but not to leave its experiment (and so its experiment repo).
    assert ("edit the run" in message) == (status == Status.QUEUED and use != "experiment"), message
    if status == Status.QUEUED and use == "experiment":
        assert f"delete run #{run.pk} if it is not needed" in message, message
    assert Repo.objects.filter(project=project, name=name).exists()
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    assert api.delete(f"/api/hub/repos/{name}").status_code == 204


def test_teacher_pins_and_output_repo_of_a_live_run_are_in_use(api, project, users, chat_data, base_repo):
    run = make_run(project, users, name="distil me", dataset="org/data")
    teacher = repos.create_repo(project, "teacher", "model")
    pinned_only = repos.create_repo(project, "pinned-only", "dataset")
    output = repos.create_repo(project, model_repo_name(run), "model")
    TrainingRun.objects.filter(pk=run.pk).update(
        status=Status.RUNNING, config={"distillation": {"teacher_model": "teacher@main"}},
        pinned={"dataset": {"ref": "pinned-only@main", "commit": "0" * 40, "repo": pinned_only.full_name}},
    )
    for repo, said in ((teacher, "config.distillation.teacher_model"), (pinned_only, "dataset"), (output, "output model repo")):
        body = assert_error(api.delete(f"/api/hub/repos/{repo.name}"), 409, "name")
        assert said in body["errors"][0]["message"], body
    assert api.delete("/api/hub/repos/base").status_code == 204  # a repo the run does not name


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
def test_finished_run_pages_render_after_the_repos_it_used_are_deleted(api, project, users, chat_data, base_repo, status):
    run_id = api.post("/api/training-runs", sft_body(base_model="base@main", dataset="chat-data@main")).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = TrainingRun.objects.get(pk=run_id)
    pinned = run.pinned["dataset"]["commit"]
    TrainingRun.objects.filter(pk=run_id).update(status=status, start_requested_at=None)
    for name in ("chat-data", "base", "experiment-default"):
        assert api.delete(f"/api/hub/repos/{name}").status_code == 204, name

    browser = Client()
    browser.force_login(users["viewer"])
    from training.views import tabs_for

    for tab, _ in tabs_for(run):
        page = browser.get(f"/training/runs/{run_id}/{tab}/")
        assert page.status_code == 200, (tab, page.content[:300])
    assert pinned in browser.get(f"/training/runs/{run_id}/lineage/").content.decode()  # the pin is kept as lineage
    assert "chat-data@main" in browser.get(f"/training/runs/{run_id}/datasets/").content.decode()
    assert browser.get(f"/experiments/{run.experiment_id}/").status_code == 200
    assert browser.get("/models/").status_code == 200
    assert api.get(f"/api/training-runs/{run_id}").status_code == 200


HREF = re.compile(r'href="(/hub/[^"#?]*)')


def dead_hub_links(browser: Client, html: str) -> list[str]:
    """The Data Hub links on a page that do not open (each is followed)."""
    return [href for href in sorted(set(HREF.findall(html))) if browser.get(href).status_code != 200]


def test_deleting_an_experiment_repo_unlinks_it_until_the_next_run_recreates_it(api, project, users):
    first = api.post("/api/training-runs", sft_body()).json()["id"]
    run = TrainingRun.objects.select_related("experiment").get(pk=first)
    assert run.experiment.hub_repo == "acme/experiment-default"
    TrainingRun.objects.filter(pk=first).update(status=Status.COMPLETED)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204

    # one source of truth: the experiment no longer names the repo, in the list, its page and the API
    assert Experiment.objects.get(pk=run.experiment_id).hub_repo == ""
    assert api.get("/api/experiments").json()[0]["hub_repo"] == ""
    browser = Client()
    browser.force_login(users["viewer"])
    pages = ["/experiments/", f"/experiments/{run.experiment_id}/", f"/training/runs/{first}/repository/", f"/training/runs/{first}/lineage/"]
    for url in pages:
        page = browser.get(url)
        assert page.status_code == 200, url
        html = page.content.decode()
        assert not [h for h in HREF.findall(html) if "experiment-default" in h] and not dead_hub_links(browser, html), (url, dead_hub_links(browser, html))
    tab = re.sub(r"<[^>]+>", "", browser.get(f"/training/runs/{first}/repository/").content.decode())
    assert "no Data Hub repo yet" not in tab and "acme/experiment-default was deleted" in tab

    # the experiment's next run creates the repo again, as the first did
    second = api.post("/api/training-runs", sft_body(name="again")).json()["id"]
    assert Experiment.objects.get(pk=run.experiment_id).hub_repo == "acme/experiment-default"
    assert Branch.objects.filter(repo__project=project, repo__name="experiment-default", name=f"run-{second}").exists()
    listing = browser.get("/experiments/").content.decode()
    assert 'href="/hub/acme/experiment-default"' in listing and not dead_hub_links(browser, listing)
    assert f"/hub/acme/experiment-default/tree/run-{second}" in browser.get(f"/training/runs/{second}/repository/").content.decode()
    # the first run's branch went with the old repo: its page says so rather than link to it
    for tab in ("repository", "lineage"):
        html = browser.get(f"/training/runs/{first}/{tab}/").content.decode()
        assert f"run-{first}" in html and not dead_hub_links(browser, html), (tab, dead_hub_links(browser, html))
    assert f"run-{first}</code> is not in Data Hub repo" in browser.get(f"/training/runs/{first}/repository/").content.decode()


def lineage_of_run(browser: Client, run_id: int) -> tuple[str, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        page = browser.get(f"/training/runs/{run_id}/lineage/")
    assert page.status_code == 200
    return page.content.decode(), len(queries)


def test_lineage_links_only_the_refs_whose_repo_is_still_there(api, project, users, chat_data, base_repo):
    other = repos.create_repo(project, "more-data", "dataset")
    commits.commit_files(other, "main", {"train.jsonl": jsonl(ROWS)}, "data")
    one = api.post("/api/training-runs", sft_body(name="one", base_model="base@main", dataset="chat-data@main")).json()["id"]
    three = api.post("/api/training-runs", sft_body(name="three", base_model="base@main",
                                                    dataset=["chat-data@main", "more-data@main", "acme/more-data@main"])).json()["id"]
    TrainingRun.objects.filter(pk__in=[one, three]).update(status=Status.COMPLETED)
    browser = Client()
    browser.force_login(users["viewer"])
    _, before = lineage_of_run(browser, three)
    for name in ("base", "more-data"):
        assert api.delete(f"/api/hub/repos/{name}").status_code == 204

    html, queries = lineage_of_run(browser, three)
    text = re.sub(r"<[^>]+>", "", html)
    assert 'href="/hub/acme/chat-data/tree/main"' in html and not dead_hub_links(browser, html), dead_hub_links(browser, html)
    for ref in ("base@main", "more-data@main", "acme/more-data@main"):
        assert f"{ref} (deleted)" in text, ref
    assert "chat-data@main (deleted)" not in text
    # One query for all the refs' repos: three Data Hub datasets cost what one does, before and after.
    _, one_ref = lineage_of_run(browser, one)
    assert queries == before == one_ref, (queries, before, one_ref)


def test_checkpoints_tab_says_deleted_with_its_repo_not_commit_pending(api, project, users):
    """After the experiment repo went, every checkpoint read "Download: commit pending", a commit
    that can no longer come; the Repository and Lineage tabs already said "deleted with its repo"."""
    from training.models import Checkpoint

    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    run = TrainingRun.objects.get(pk=run_id)
    Checkpoint.objects.create(run=run, attempt=1, step=10, path="/ckpt/10")
    Checkpoint.objects.create(run=run, attempt=1, step=20, path="/ckpt/20")
    commits.commit_files(repos.find_repo(project, "experiment-default"), f"run-{run_id}", {"checkpoints/step-10/w.bin": b"w"}, "step 10")
    browser = Client()
    browser.force_login(users["viewer"])

    def actions() -> dict[int, str]:
        html = browser.get(f"/training/runs/{run_id}/checkpoints/").content.decode()
        rows = re.findall(r'<tr data-checkpoint="checkpoint-(\d+)">(.*?)</tr>', html, re.S)
        return {int(step): re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)) for step, row in rows}

    before = actions()
    assert "Download step 10" in before[10] and "commit pending" in before[20], before
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    after = actions()
    assert all("Download: deleted with its repo" in text and "pending" not in text for text in after.values()), after
    # a later run of the experiment makes the repo again, without this run's branch: still gone
    api.post("/api/training-runs", sft_body(name="again"))
    assert all("deleted with its repo" in text for text in actions().values()), actions()


# ---- a repo that a run's checkpoint commit or merge is still to write to ---------------------------


@pytest.fixture
def saved_step(api, settings, tmp_path):
    """A completed LoRA run of the default experiment with step 10 saved in its own output folder, not committed yet."""
    from training.backends.local import output_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", sft_body(config={"lora_rank": 8})).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED, attempt=1)
    folder = output_dir(run_id, 1) / "checkpoint-10"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"w")
    return Checkpoint.objects.create(run_id=run_id, attempt=1, step=10, path=str(folder))


def test_a_repo_with_a_merge_in_flight_or_a_checkpoint_still_to_commit_is_a_409_naming_the_run(api, project, saved_step):
    from django.utils import timezone

    from training.models import Checkpoint

    run = saved_step.run
    Checkpoint.objects.filter(pk=saved_step.pk).update(merge_requested_at=timezone.now())
    r = assert_error(api.delete("/api/hub/repos/experiment-default"), 409, "name")
    assert f"run #{run.pk}" in r["errors"][0]["message"] and "merging step 10" in r["errors"][0]["message"]
    Checkpoint.objects.filter(pk=saved_step.pk).update(merge_requested_at=None)
    r = assert_error(api.delete("/api/hub/repos/experiment-default"), 409, "name")
    assert f"run #{run.pk}" in r["errors"][0]["message"] and "still to commit" in r["errors"][0]["message"]
    assert repos.find_repo(project, "experiment-default") is not None

    Checkpoint.objects.filter(pk=saved_step.pk).update(commit="c" * 40)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204


def test_a_checkpoint_commit_after_its_repo_was_deleted_does_not_make_the_repo_again(api, project, saved_step):
    from datahub.services import commit_checkpoint
    from training.models import Checkpoint, LogLine

    run = saved_step.run
    Checkpoint.objects.filter(pk=saved_step.pk).update(commit="c" * 40)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    # reported just before the repo went; its commit task runs after
    late = Checkpoint.objects.create(run=run, attempt=1, step=10, kind="adapter", path=saved_step.path)
    assert commit_checkpoint(late.pk) is None
    assert repos.find_repo(project, "experiment-default") is None and Checkpoint.objects.get(pk=late.pk).commit == ""
    assert LogLine.objects.filter(run=run, line__contains=f"not committed: branch run-{run.pk} of acme/experiment-default was deleted with its repo").exists()


def test_a_merge_whose_repo_was_deleted_fails_saying_so_and_makes_nothing_again(api, project, saved_step):
    from django.utils import timezone

    from training import checkpoints
    from training.models import Checkpoint, LogLine

    run = saved_step.run
    Checkpoint.objects.filter(pk=saved_step.pk).update(commit="c" * 40)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    Checkpoint.objects.filter(pk=saved_step.pk).update(merge_requested_at=timezone.now())  # asked for as the repo went
    assert checkpoints.merge(saved_step.pk) is None
    assert repos.find_repo(project, "experiment-default") is None
    assert not Checkpoint.objects.filter(run=run, kind="merged").exists() and Checkpoint.objects.get(pk=saved_step.pk).merge_requested_at is None
    assert LogLine.objects.filter(run=run, line__contains="merge of step 10 failed: branch").exists()


def test_start_again_of_a_run_whose_repo_was_deleted_makes_its_repo_and_branch_again(api, project, saved_step):
    from training.models import Checkpoint

    run = saved_step.run
    Checkpoint.objects.filter(pk=saved_step.pk).update(commit="c" * 40)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.CANCELLED)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    assert api.post(f"/api/training-runs/{run.pk}/start").status_code == 202
    assert Branch.objects.filter(repo__project=project, repo__name="experiment-default", name=f"run-{run.pk}").exists()


# ---- a model repo that a run's final or merged weights are still to be published to ----------------


@pytest.fixture
def published_run(api, project, settings, tmp_path):
    """A completed full fine-tune whose attempt 1 published its final (step 10) to its model repo,
    with attempt 2's final (step 20) saved in its own output folder and not committed yet."""
    from datahub.services import create_run_branch, publish_model
    from training.backends.local import output_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED, attempt=2)
    run = TrainingRun.objects.get(pk=run_id)
    create_run_branch(run)
    finals = []
    for attempt, step in ((1, 10), (2, 20)):
        folder = output_dir(run_id, attempt) / "final"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w%d" % attempt)
        finals.append(Checkpoint.objects.create(run=run, attempt=attempt, step=step, kind="final", path=str(folder)))
    Checkpoint.objects.filter(pk=finals[0].pk).update(commit="c" * 40)
    assert publish_model(run, finals[0]) is not None
    return finals[1]


def test_a_model_repo_with_a_final_still_to_publish_is_a_409_naming_the_run(api, project, published_run):
    from training.models import Checkpoint

    run, name = published_run.run, model_repo_name(published_run.run)
    r = assert_error(api.delete(f"/api/hub/repos/{name}"), 409, "name")
    assert f"run #{run.pk}" in r["errors"][0]["message"] and "final of step 20 (attempt 2) still to publish" in r["errors"][0]["message"], r
    assert repos.find_repo(project, name) is not None

    Checkpoint.objects.filter(pk=published_run.pk).update(commit="c" * 40)
    assert api.delete(f"/api/hub/repos/{name}").status_code == 204


def test_a_final_committed_after_its_model_repo_was_deleted_does_not_make_the_repo_again(api, project, published_run):
    from datahub.services import commit_checkpoint
    from training.models import Checkpoint, LogLine

    run, name = published_run.run, model_repo_name(published_run.run)
    Checkpoint.objects.filter(pk=published_run.pk).update(created_at=Checkpoint.objects.get(pk=published_run.pk).created_at - timedelta(hours=1))
    assert api.delete(f"/api/hub/repos/{name}").status_code == 204  # its commit looked abandoned; its task retries after
    assert commit_checkpoint(published_run.pk) is not None  # still committed on the run's branch
    assert repos.find_repo(project, name) is None
    assert LogLine.objects.filter(run=run, line__contains=f"not published: model repo acme/{name} was deleted").exists()


def test_a_runs_first_final_still_makes_its_model_repo(api, project, published_run):
    from datahub.services import commit_checkpoint
    from training.models import Checkpoint

    Checkpoint.objects.filter(run=published_run.run).exclude(pk=published_run.pk).delete()
    repos.delete_repo(repos.find_repo(project, model_repo_name(published_run.run)))
    assert commit_checkpoint(published_run.pk) is not None
    assert repos.find_repo(project, model_repo_name(published_run.run)) is not None
