"""Merge and resume of a run whose base model and dataset are Data Hub refs (`repo@ref`): both use the
commits the step's attempt trained on, through Studio's /hub, whatever its branches and tags did
since. A real worker and engine, on the tiny models in real Data Hub repos."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from datahub.commits import commit_files
from datahub.models import Branch, Repo
from datahub.repos import create_branch, create_repo, create_tag
from tests.conftest import wait_for
from training.models import Checkpoint, MetricPoint, Status, TrainingRun

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


def test_merge_loads_a_data_hub_base_at_the_commit_its_attempt_trained_on(api, project, studio_worker, tiny_models):
    from transformers import AutoModelForCausalLM

    model = model_repo(project, tiny_models)
    create_tag(model, "v1", "main")
    body = {"name": "lora on v1", "method": "sft", "base_model": "student@v1", "dataset": tiny_models["data_sft"], "config": config(lora_rank=4)}
    run = trained(api, api.post("/api/training-runs", body).json()["id"])
    assert run.pinned["base_model"]["commit"] == Branch.objects.get(repo=model, name="main").head_id
    # Each adapter names its base as peft outside Studio loads it (HF_ENDPOINT=<studio>/hub): the repo id at the
    # pinned commit. It wrote "revision": null, so AutoPeftModelForCausalLM loaded the branch head, or huggingface.co's repo.
    for kind in ("checkpoint", "adapter"):
        folder = Path(Checkpoint.objects.get(run=run, kind=kind, step=4 if kind == "adapter" else 2).path)
        adapter = json.loads((folder / "adapter_config.json").read_text())
        assert (adapter["base_model_name_or_path"], adapter["revision"]) == (f"{project.slug}/student", run.pinned["base_model"]["commit"]), kind
    # The tag goes once the run has ended: the merge needs the commit, not the tag.
    assert api.delete(f"/api/hub/repos/{model.name}/tags/v1").status_code == 204

    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/2/merge")
    assert r.status_code == 202, r.content
    wait_for(lambda: Checkpoint.objects.filter(run=run, kind="merged", step=2).exists() or Checkpoint.objects.filter(run=run, step=2, merge_requested_at__isnull=True).exists(),
             180, interval=0.5, message="the merge to end")
    merged = Checkpoint.objects.filter(run=run, kind="merged", step=2).first()
    assert merged is not None, [line for line in run.log_lines.values_list("line", flat=True) if "merge" in line]
    weights: dict = {}
    for shard in sorted(Path(merged.path).glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    assert weights and not any("lora" in k for k in weights)
    assert AutoModelForCausalLM.from_pretrained(merged.path).config.vocab_size > 0
    # The merge's token reads the hub only while its merge runs.
    assert Checkpoint.objects.get(run=run, kind="checkpoint", step=2, attempt=merged.attempt).merge_token_hash == ""


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
