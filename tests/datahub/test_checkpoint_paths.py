"""An engine reports checkpoint paths over ingest, and a remote engine runs code its project controls:
the ingest refuses a path outside that run attempt's own output folder on this machine, and Studio
commits (and merges next to) only a folder inside it, never another run's or project's files or the
rest of the machine."""
from __future__ import annotations

import pytest

from datahub import repos
from datahub.models import Repo, TreeEntry
from datahub.services import commit_checkpoint
from studio import crypto
from tests.conftest import sft_body
from training import checkpoints
from training.backends.local import run_dir
from training.models import Checkpoint, LogLine, TrainingRun


@pytest.fixture
def reporting_run(api, settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", sft_body(config={"lora_rank": 8})).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(ingest_token_hash=crypto.hash_token("ing_test"), attempt=1)
    return TrainingRun.objects.get(pk=run_id)


@pytest.fixture
def elsewhere(tmp_path):
    """A folder on the Studio machine outside the run's folder (another run's output, /etc, ...)."""
    folder = tmp_path / "elsewhere" / "checkpoint-1"
    folder.mkdir(parents=True)
    (folder / "secret.txt").write_text("another project's weights")
    return folder


def report(api, run, django_capture_on_commit_callbacks, batch_id: str, path: str, kind: str = "checkpoint", status: int = 200):
    with django_capture_on_commit_callbacks(execute=True):
        r = api.client.post(f"/api/ingest/runs/{run.pk}", data={"batch_id": batch_id, "checkpoints": [{"step": 1, "path": path, "kind": kind}]},
                            content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_test")
    assert r.status_code == status, r.content
    return r


def committed_paths() -> set[str]:
    return set(TreeEntry.objects.values_list("path", flat=True))


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_a_reported_path_outside_the_runs_folder_is_refused_and_not_committed(api, reporting_run, elsewhere, eager_celery, django_capture_on_commit_callbacks, how):
    own = run_dir(reporting_run.pk, 1) / "output"
    own.mkdir(parents=True)
    if how == "absolute":
        path = str(elsewhere)
    elif how == "dotdot":
        path = f"{own}/../../../../elsewhere/checkpoint-1"
    else:
        (own / "checkpoint-1").symlink_to(elsewhere)
        path = str(own / "checkpoint-1")
    r = report(api, reporting_run, django_capture_on_commit_callbacks, "b1", path, status=400)
    assert [e["field"] for e in r.json()["errors"]] == ["checkpoints[0].path"]
    assert not Checkpoint.objects.filter(run=reporting_run).exists()
    assert not any(p.endswith("secret.txt") for p in committed_paths())
    # A checkpoint row that got in another way (reported before the ingest checked) is still not committed.
    saved = Checkpoint.objects.create(run=reporting_run, attempt=1, step=1, path=path)
    assert commit_checkpoint(saved.pk) is None
    assert not any(p.endswith("secret.txt") for p in committed_paths())


def test_another_runs_output_is_refused(api, reporting_run, eager_celery, django_capture_on_commit_callbacks):
    other = api.post("/api/training-runs", sft_body()).json()["id"]
    theirs = run_dir(other, 1) / "output" / "checkpoint-1"
    theirs.mkdir(parents=True)
    (theirs / "model.safetensors").write_bytes(b"their weights")
    report(api, reporting_run, django_capture_on_commit_callbacks, "b1", str(theirs), status=400)
    assert not Checkpoint.objects.filter(run=reporting_run).exists()
    assert "checkpoints/step-1/model.safetensors" not in committed_paths()


def test_the_runs_own_checkpoint_is_still_committed(api, reporting_run, eager_celery, django_capture_on_commit_callbacks):
    own = run_dir(reporting_run.pk, 1) / "output" / "checkpoint-1"
    own.mkdir(parents=True)
    (own / "model.safetensors").write_bytes(b"w")
    report(api, reporting_run, django_capture_on_commit_callbacks, "b1", str(own))
    repo = Repo.objects.get(project=reporting_run.project, name="experiment-default")
    assert "checkpoints/step-1/model.safetensors" in repos.tree(repos.resolve(repo, f"run-{reporting_run.pk}"))


def test_a_merge_of_a_checkpoint_outside_the_runs_folder_runs_nothing_and_writes_nothing(reporting_run, elsewhere):
    saved = Checkpoint.objects.create(run=reporting_run, attempt=1, step=1, kind="checkpoint", path=str(elsewhere))
    assert checkpoints.merge(saved.pk) is None
    assert not (elsewhere.parent / "merged-step-1").exists()
    assert not Checkpoint.objects.filter(run=reporting_run, kind="merged").exists()
    assert LogLine.objects.filter(run=reporting_run, line__contains="not a folder in the run's own folder").exists()
