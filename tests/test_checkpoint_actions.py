"""Resume from a saved step (a child run, in lineage) and merge a LoRA checkpoint, for real."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file

from datahub.models import Branch, Commit, TreeEntry
from tests.conftest import assert_error, sft_body, wait_for
from training.models import Checkpoint, MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.worker


def train(api, body: dict) -> TrainingRun:
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end")
    assert run.status == Status.COMPLETED, run.error
    return run


def test_resume_from_a_checkpoint_continues_in_a_child_run(api, studio_worker, tiny_models):
    parent = train(api, sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                                 config={"max_steps": 6, "save_steps": 3, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}))
    assert_error(api.post(f"/api/training-runs/{parent.pk}/checkpoints/4/resume"), 400, "step")
    r = api.post(f"/api/training-runs/{parent.pk}/checkpoints/3/resume")
    assert r.status_code == 201, r.content
    child = r.json()
    assert child["parent"] == parent.pk and child["resumed_from_step"] == 3 and child["status"] == "queued"
    assert child["config"] == parent.config
    done = train_started(api, child["id"])
    steps = sorted(MetricPoint.objects.filter(run=done, key="loss").values_list("step", flat=True))
    assert steps == [4, 5, 6]  # picked up after the saved step, not from scratch


def train_started(api, run_id: int) -> TrainingRun:
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the child run to end")
    assert run.status == Status.COMPLETED, run.error
    return run


def test_merge_a_lora_checkpoint_into_the_base(api, studio_worker, tiny_models):
    run = train(api, sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                              config={"max_steps": 4, "save_steps": 2, "lora_rank": 4, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}))
    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/2/merge")
    assert r.status_code == 202, r.content
    merged = wait_for(lambda: Checkpoint.objects.filter(run=run, kind="merged", step=2).first(), 180, interval=0.5, message="the merged checkpoint")
    weights = {}
    for shard in sorted(__import__("pathlib").Path(merged.path).glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    assert weights and not any("lora" in k for k in weights)
    assert api.post(f"/api/training-runs/{run.pk}/checkpoints/2/merge").status_code == 409
    # The step-2 merge lands beside step 2 on the run's branch; merged/ and the Models page entry stay
    # the run's own result at step 4.
    branch = Branch.objects.get(repo__project=run.project, repo__name=f"experiment-{run.experiment.slug}", name=f"run-{run.pk}")
    wait_for(lambda: TreeEntry.objects.filter(commit_id=Branch.objects.get(pk=branch.pk).head_id, path__startswith="checkpoints/step-2/merged/").exists(),
             60, message="the step-2 merge on the run's branch")
    final_merged = Checkpoint.objects.get(run=run, kind="merged", step=4)

    def published() -> list[str]:
        return list(Commit.objects.filter(repo__project=run.project, repo__type="model", message__contains=f"run #{run.pk}").values_list("message", flat=True))

    wait_for(published, 60, message="the run's model on the Models page")
    assert published() == [f"Publish merged model from run #{run.pk} (step {final_merged.step})"]


def test_merge_of_a_full_finetune_is_refused(api, project):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    Checkpoint.objects.create(run_id=run_id, attempt=1, step=5, path="/x/checkpoint-5")
    assert_error(api.post(f"/api/training-runs/{run_id}/checkpoints/5/merge"), 400, "step")


@pytest.mark.django_db(transaction=True)
def test_the_merge_mark_rolls_back_with_its_request_and_expires(project, users, tmp_path):
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from training import checkpoints, services

    run = services.create_run(project, users["owner"], name="lora", method="sft", base_model="org/base", dataset="org/data", config={"lora_rank": 8})
    saved = Checkpoint.objects.create(run=run, attempt=1, step=3, path=str(tmp_path / "checkpoint-3"))
    # A request that fails after asking for the merge leaves no "Merging…" behind (nothing was queued).
    with pytest.raises(RuntimeError), transaction.atomic():
        checkpoints.request_merge(run, saved)
        raise RuntimeError("the request fails later")
    assert checkpoints.merging_steps(list(Checkpoint.objects.filter(run=run))) == set()
    checkpoints.request_merge(run, saved)
    assert checkpoints.merging_steps(list(Checkpoint.objects.filter(run=run))) == {3}
    with pytest.raises(Exception, match="is being merged"):
        checkpoints.request_merge(run, saved)
    # A merge whose task never ran stops counting after the merge timeout: it can be asked for again.
    Checkpoint.objects.filter(pk=saved.pk).update(merge_requested_at=timezone.now() - timedelta(seconds=checkpoints.MERGE_TIMEOUT_SECONDS + 601))
    assert checkpoints.merging_steps(list(Checkpoint.objects.filter(run=run))) == set()
    checkpoints.request_merge(run, saved)
