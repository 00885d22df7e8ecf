"""Resume of a run whose base model and dataset are Data Hub refs (`repo@ref`): it uses the commits the
step's attempt trained on, whatever their branches did since. A real worker and engine, on the tiny
models in real Data Hub repos."""
from __future__ import annotations

from pathlib import Path

import pytest

from datahub.commits import commit_files
from datahub.models import Repo
from datahub.repos import create_branch, create_repo
from tests.conftest import wait_for
from training.models import MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.worker


def model_repo(project, tiny_models) -> Repo:
    repo = create_repo(project, "student", "model")
    commit_files(repo, "main", {p.name: p for p in Path(tiny_models["student"]).iterdir() if p.is_file()}, message="tiny student")
    return repo


def dataset_repo(project, tiny_models) -> Repo:
    repo = create_repo(project, "ds2", "dataset")
    commit_files(repo, "main", {"train.jsonl": Path(tiny_models["data_sft"])}, message="rows")
    return repo


def trained(api, run_id: int) -> TrainingRun:
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end")
    assert run.status == Status.COMPLETED, (run.error, list(run.log_lines.values_list("line", flat=True))[-30:])
    return run


def config(**more) -> dict:
    return {"max_steps": 4, "save_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, **more}


def test_resume_pins_data_hub_refs_at_the_commits_its_attempt_trained_on(api, project, studio_worker, tiny_models):
    model, data = model_repo(project, tiny_models), dataset_repo(project, tiny_models)
    create_branch(model, "mb", "main")
    create_branch(data, "b1", "main")
    body = {"name": "from branches", "method": "sft", "base_model": "student@mb", "dataset": "ds2@b1", "config": config()}
    parent = trained(api, api.post("/api/training-runs", body).json()["id"])
    model_commit, data_commit = parent.pinned["base_model"]["commit"], parent.pinned["dataset"]["commit"]
    # Branches a run named may go once it has ended.
    assert api.delete(f"/api/hub/repos/{model.name}/branches/mb").status_code == 204
    assert api.delete(f"/api/hub/repos/{data.name}/branches/b1").status_code == 204

    r = api.post(f"/api/training-runs/{parent.pk}/checkpoints/2/resume")
    assert r.status_code == 201, r.content
    # The child names the commits, so its refs read what its parent's attempt read, and say so.
    assert (r.json()["base_model"], r.json()["dataset"]) == (f"student@{model_commit}", f"ds2@{data_commit}")
    child_id = r.json()["id"]
    assert api.patch(f"/api/training-runs/{child_id}", {"config": {"max_steps": 4}}).status_code == 200
    child = trained(api, child_id)
    assert (child.pinned["base_model"]["commit"], child.pinned["dataset"]["commit"]) == (model_commit, data_commit)
    assert sorted(MetricPoint.objects.filter(run=child, key="loss").values_list("step", flat=True)) == [3, 4]
