"""The QA's chain in a browser: a model repo that an ended run trained from is deleted from its page,
which first names that run; the run's Checkpoints tab then disables Resume from here and Merge with
why, and its Start again says the pinned weights were deleted, instead of sending the user in circles."""
from __future__ import annotations

import re

from playwright.sync_api import expect

from datahub import commits, repos
from datahub.refs import pin_refs
from training import services
from training.models import Checkpoint, Status, TrainingRun


def test_deleting_a_repo_an_ended_run_trained_from_is_explained_before_and_after(owner_page, project, users, settings, tmp_path):
    settings.DATAHUB_ROOT = tmp_path / "hub"
    model = repos.create_repo(project, "chain-dpo-run2", "model")
    commits.commit_files(model, "main", {"config.json": b'{"model_type": "llama"}'}, "weights")
    run = services.create_run(project, users["owner"], name="dpo from published", method="sft", base_model="chain-dpo-run2@main",
                              dataset="org/data", config={"save_steps": 5, "lora_rank": 4})
    TrainingRun.objects.filter(pk=run.pk).update(pinned=pin_refs(run), attempt=1, status=Status.CANCELLED)
    run.refresh_from_db()
    services.record_attempt(run)
    Checkpoint.objects.create(run=run, attempt=1, step=5, kind="checkpoint", path="/out/checkpoint-5")
    commit = run.pinned["base_model"]["commit"][:12]
    page = owner_page

    page.goto("/hub/acme/chain-dpo-run2")
    warning = page.get_by_test_id("delete-trained-from")
    expect(warning).to_contain_text(f"#{run.pk} (dpo from published, cancelled)")
    expect(warning).to_contain_text("Start again and Resume from here stop working")
    page.get_by_label("Type the repo name to confirm").fill("chain-dpo-run2")
    page.get_by_role("button", name="Delete this repo").click()
    expect(page.get_by_text("Deleted")).to_be_visible()

    page.goto(f"/training/runs/{run.pk}/checkpoints/")
    resume = page.get_by_role("button", name="Resume from here (step 5)")
    expect(resume).to_be_disabled()
    expect(resume).to_have_accessible_description(re.compile(f"acme/chain-dpo-run2 was deleted, and with it commit {commit}"))
    merge = page.get_by_role("button", name="Merge step 5")
    expect(merge).to_be_disabled()
    expect(merge).to_have_accessible_description(re.compile("the base the adapter was trained on is gone"))
    page.shot("deleted-base-checkpoints")

    page.goto(f"/training/runs/{run.pk}/")
    expect(page.locator("#start-blockers")).to_contain_text(f"commit {commit}")
    expect(page.locator("#start-blockers")).not_to_contain_text("create it, or fix the name")
    assert TrainingRun.objects.count() == 1
