"""A script takes a run's outputs through the API with its token: the model repo it published
(GET .../{id}), where each saved step is on the Data Hub and its folder as one .tar (GET .../checkpoints),
the metric keys it reports (GET .../metrics) and its whole log with when each line came (GET .../logs,
.../log.txt). Checkpoints are committed by the real Data Hub service (datahub.services.commit_checkpoint)."""

from __future__ import annotations

import io
import tarfile
from datetime import datetime

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from datahub import services as hub
from datahub.models import Branch
from tests.conftest import assert_error
from training import services
from training.backends.local import run_dir
from training.models import Checkpoint, LogLine, MetricPoint, Status, TrainingRun


@pytest.fixture
def train(project, users, tmp_path, settings):
    """A completed run of `name` that saved step 1 and its final weights (step 2) in its own folder, neither committed yet."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"

    def make(name: str) -> TrainingRun:
        run = services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/my-data")
        TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
        for kind, step, folder in (("checkpoint", 1, "checkpoint-1"), ("final", 2, "final")):
            weights = run_dir(run.pk, 1) / "output" / folder
            weights.mkdir(parents=True)
            (weights / "model.safetensors").write_bytes(f"weights of step {step}".encode())
            Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=str(weights))
        return TrainingRun.objects.get(pk=run.pk)

    return make


@pytest.fixture
def trained(train) -> TrainingRun:
    return train("My SFT Run")


def commit_all(run: TrainingRun) -> None:
    for checkpoint in Checkpoint.objects.filter(run=run).order_by("step"):
        hub.commit_checkpoint(checkpoint.pk)


def members(response) -> dict[str, bytes]:
    assert response.status_code == 200, response.content
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_get_run_names_the_model_repo_it_published_and_says_once_that_was_deleted(api, trained):
    assert api.get(f"/api/training-runs/{trained.pk}").json()["published_model"] is None
    commit_all(trained)
    name = f"my-sft-run-run{trained.pk}"
    head = Branch.objects.get(repo__name=name, name="main").head_id
    assert api.get(f"/api/training-runs/{trained.pk}").json()["published_model"] == {
        "name": name,
        "full_name": f"acme/{name}",
        "commit": head,
        "deleted": False,
        "error": "",
    }
    # the name is the one the Data Hub API takes
    assert api.client.get(f"/api/hub/repos/{name}/download", {"path": "model.safetensors"}, HTTP_AUTHORIZATION=f"Bearer {api.token}").status_code == 200
    assert api.delete(f"/api/hub/repos/{name}").status_code == 204
    assert api.get(f"/api/training-runs/{trained.pk}").json()["published_model"] == {"name": name, "full_name": f"acme/{name}", "commit": None, "deleted": True, "error": ""}
    # the list's item says the same
    assert api.get("/api/training-runs").json()["items"][0]["published_model"] == {"name": name, "full_name": f"acme/{name}", "commit": None, "deleted": True, "error": ""}


def list_queries(api) -> tuple[int, dict[int, dict | None]]:
    with CaptureQueriesContext(connection) as ctx:
        body = api.get("/api/training-runs", limit=100).json()
    return len(ctx.captured_queries), {item["id"]: item["published_model"] for item in body["items"]}


def test_the_run_list_names_each_runs_published_model_as_its_detail_does_in_the_same_queries(api, project, train):
    from datahub import repos

    trainings = [train(f"run {i}") for i in range(2)]
    api.get("/api/training-runs")  # the token's last_used_at write happens once a minute: not on the pinned calls
    few, shown = list_queries(api)
    assert shown == dict.fromkeys(shown)  # nothing published yet
    published, deleted, refused, untrained = train("published"), train("deleted"), train("refused"), train("never trained")
    repos.create_repo(project, hub.model_repo_name(refused).upper(), "dataset")  # a Data Hub rule refuses its model repo (a name clash)
    for run in (published, deleted, refused, *trainings):
        commit_all(run)
    assert api.delete(f"/api/hub/repos/{hub.model_repo_name(deleted)}").status_code == 204
    Checkpoint.objects.filter(run=untrained).delete()
    queries, shown = list_queries(api)
    assert queries <= few + 2  # the heads of the published repos and their publish commits: once for the page
    for run in (published, deleted, refused, untrained, *trainings):
        assert shown[run.pk] == api.get(f"/api/training-runs/{run.pk}").json()["published_model"], run.name
    assert shown[published.pk]["commit"] and shown[deleted.pk]["deleted"] and "already has a repo" in shown[refused.pk]["error"]
    assert shown[untrained.pk] is None
    more = [train(f"more {i}") for i in range(3)]
    for run in more:
        commit_all(run)
    assert list_queries(api)[0] == queries


def test_checkpoints_name_their_data_hub_folder_and_its_archive(api, trained):
    before = api.get(f"/api/training-runs/{trained.pk}/checkpoints").json()
    assert [(c["hub_repo"], c["hub_path"], c["archive_url"]) for c in before] == [(None, None, None)] * 2  # not committed yet
    commit_all(trained)
    saved = {c["kind"]: c for c in api.get(f"/api/training-runs/{trained.pk}/checkpoints").json()}
    step, final = saved["checkpoint"], saved["final"]
    assert (step["hub_repo"], step["hub_repo_name"], step["hub_branch"], step["hub_path"]) == (
        "acme/experiment-default",
        "experiment-default",
        f"run-{trained.pk}",
        "checkpoints/step-1",
    )
    assert final["hub_path"] == "final"
    assert step["archive_url"] == f"/api/hub/repos/experiment-default/archive?ref={step['commit']}&path=checkpoints/step-1"
    assert members(api.get(step["archive_url"])) == {"checkpoints/step-1/model.safetensors": b"weights of step 1"}
    assert members(api.get(final["archive_url"])) == {"final/model.safetensors": b"weights of step 2"}
    # the experiment names the same repo: hub_repo in full, hub_repo_name as /api/hub/repos/{name} takes it
    experiment = next(e for e in api.get("/api/experiments").json() if e["slug"] == "default")
    assert (experiment["hub_repo"], experiment["hub_repo_name"]) == (step["hub_repo"], step["hub_repo_name"])
    # once the repo is deleted (with the run's branch and commits) nothing points at it any more
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    gone = api.get(f"/api/training-runs/{trained.pk}/checkpoints").json()
    assert [(c["hub_repo"], c["hub_path"], c["archive_url"]) for c in gone] == [(None, None, None)] * 2


def test_metrics_tell_a_key_the_run_never_reported_from_its_own(api, trained):
    MetricPoint.objects.bulk_create([MetricPoint(run=trained, key="loss", step=s, value=v) for s, v in ((1, 2.5), (2, 1.25))])
    body = api.get(f"/api/training-runs/{trained.pk}/metrics", keys="loss,nope").json()
    assert body == {"series": {"loss": [[1, 2.5], [2, 1.25]], "nope": []}, "known_keys": ["loss"], "unknown": ["nope"], "last_step": 2}
    assert api.get(f"/api/training-runs/{trained.pk}/metrics").json()["unknown"] == []


def test_log_lines_come_with_when_they_were_stored_and_the_whole_log_downloads_with_a_token(api, api_as, trained):
    LogLine.objects.bulk_create([LogLine(run=trained, attempt=1, line=f"line {i}") for i in range(3)])
    # to the millisecond, as the API's JSON writes times
    stored = [
        at.replace(microsecond=at.microsecond // 1000 * 1000) for at in LogLine.objects.filter(run=trained).order_by("id").values_list("created_at", flat=True)
    ]
    for query in ({}, {"after": 0}):
        body = api.get(f"/api/training-runs/{trained.pk}/logs", **query).json()
        assert body["lines"] == ["line 0", "line 1", "line 2"]
        assert [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in body["times"]] == stored
    text = api.get(f"/api/training-runs/{trained.pk}/log.txt")
    assert text.status_code == 200 and text["Content-Type"] == "text/plain; charset=utf-8"
    assert b"".join(text.streaming_content) == b"line 0\nline 1\nline 2\n"
    assert b"".join(api.get(f"/api/training-runs/{trained.pk}/log.txt", attempt=1).streaming_content) == b"line 0\nline 1\nline 2\n"
    assert_error(api.get(f"/api/training-runs/{trained.pk}/log.txt", attempt=2), 400, "attempt")
    assert_error(api.get(f"/api/training-runs/{trained.pk}/log.txt", tail=5), 400, "tail")
    assert api_as("outsider").get(f"/api/training-runs/{trained.pk}/log.txt").status_code == 404
    assert Client().get(f"/api/training-runs/{trained.pk}/log.txt").status_code == 401


def test_the_checkpoints_tab_offers_each_saved_folder_as_one_tar(trained, users):
    commit_all(trained)
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get(f"/training/runs/{trained.pk}/checkpoints/").content.decode()
    saved = {c.kind: c for c in Checkpoint.objects.filter(run=trained)}
    for kind, folder in (("checkpoint", "checkpoints/step-1"), ("final", "final")):
        link = f"/hub/acme/experiment-default/archive/{saved[kind].commit}/{folder}"
        assert f'href="{link}"' in page and "Download folder (.tar)" in page
        assert set(members(browser.get(link))) == {f"{folder}/model.safetensors"}
        # the row's Download opens the Repository tab at that folder, which offers the same .tar
        repository = browser.get(f"/training/runs/{trained.pk}/repository/", {"path": folder, "commit": saved[kind].commit}).content.decode()
        assert f'href="{link}" download data-testid="repository-archive"' in repository
