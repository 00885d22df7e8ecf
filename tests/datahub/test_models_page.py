"""The Models page: a run's final weights land in a project model repo with a model card, and
/models/ lists it for members only. Publishing twice makes no second commit."""
from __future__ import annotations

import pytest
from django.test import Client

from datahub import repos, services, storage
from datahub.models import Commit, Repo, blob_path
from training import services as training
from training.backends.local import run_dir
from training.models import Checkpoint, MetricPoint


@pytest.fixture
def final_checkpoint(project, users, tmp_path, settings):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = training.create_run(project, users["owner"], name="My SFT Run", method="sft", base_model="org/base", dataset="org/my-data")
    weights = run_dir(run.pk, 1) / "output" / "final"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"model_type": "llama"}')
    (weights / "model.safetensors").write_bytes(b"tiny weights")
    run.status = "completed"
    run.save(update_fields=["status"])
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=v) for s, v in ((1, 2.5), (2, 1.25))])
    return Checkpoint.objects.create(run=run, attempt=1, step=2, kind="final", path=str(weights))


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_final_checkpoint_publishes_a_model_repo_with_a_card(project, final_checkpoint):
    run = final_checkpoint.run
    services.commit_checkpoint(final_checkpoint.pk)
    repo = Repo.objects.get(project=project, name=f"my-sft-run-run{run.pk}")
    assert repo.type == "model"
    files = repos.tree(repos.resolve(repo, "main"))
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    card = _read(repo, "README.md")
    assert "org/base" in card and "sft" in card and f"/training/runs/{run.pk}/" in card
    assert f"run-{run.pk}" in card and "loss: 1.25" in card
    # the run's own branch still gets the checkpoint
    assert "final/model.safetensors" in repos.tree(repos.resolve(services.run_repo(run), f"run-{run.pk}"))


def _read(repo, path: str) -> str:
    blob = repos.tree(repos.resolve(repo, "main"))[path]
    with storage.open_blob(blob_path(blob.sha256)) as fh:
        return fh.read().decode()


def test_publishing_twice_makes_no_second_commit(project, final_checkpoint):
    services.commit_checkpoint(final_checkpoint.pk)
    repo = Repo.objects.get(project=project, name=f"my-sft-run-run{final_checkpoint.run.pk}")
    head = repos.resolve(repo, "main")
    count = Commit.objects.filter(repo=repo).count()
    services.commit_checkpoint(final_checkpoint.pk)
    assert repos.resolve(repo, "main").pk == head.pk
    assert Commit.objects.filter(repo=repo).count() == count


def test_step_checkpoints_do_not_publish(project, final_checkpoint):
    Checkpoint.objects.filter(pk=final_checkpoint.pk).update(kind="checkpoint")
    services.commit_checkpoint(final_checkpoint.pk)
    assert not Repo.objects.filter(project=project, type="model").exists()


def test_models_page_lists_the_model_for_members_only(project, users, final_checkpoint):
    run = final_checkpoint.run
    services.commit_checkpoint(final_checkpoint.pk)
    name = f"my-sft-run-run{run.pk}"
    page = browser(users["viewer"]).get("/models/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"acme/{name}" in html and f"/hub/acme/{name}" in html
    assert "org/base" in html and f"/training/runs/{run.pk}/" in html
    assert "<td>SFT</td>" in html  # the method as every other page names it (it said "sft")
    outsider = browser(users["outsider"]).get("/models/").content.decode()
    assert name not in outsider
    assert browser(users["outsider"]).get(f"/hub/acme/{name}").status_code == 404
    assert Client().get("/models/").status_code == 302


def test_a_merge_of_the_newest_step_of_a_run_still_training_lands_beside_that_step(project, users, final_checkpoint):
    # By the step alone, a Merge of step 100 while 100 was the newest read as the run's own result:
    # it went into merged/ (overwritten at the end), onto the Models page, and its Download never worked.
    run = final_checkpoint.run
    Checkpoint.objects.filter(pk=final_checkpoint.pk).delete()
    run.status = "running"
    run.save(update_fields=["status"])
    step = run_dir(run.pk, 1) / "output" / "checkpoint-100"
    merged_dir = run_dir(run.pk, 1) / "output" / "merged-step-100"
    for folder in (step, merged_dir):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
    Checkpoint.objects.create(run=run, attempt=1, step=100, kind="checkpoint", path=str(step))
    merged = Checkpoint.objects.create(run=run, attempt=1, step=100, kind="merged", path=str(merged_dir), requested=True)
    services.commit_checkpoint(merged.pk)
    files = repos.tree(repos.resolve(repos.find_repo(project, "experiment-default"), f"run-{run.pk}"))
    assert "checkpoints/step-100/merged/config.json" in files and not any(path.startswith("merged/") for path in files)
    assert not Repo.objects.filter(project=project, type="model").exists()
    page = browser(users["owner"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    assert "commit pending" not in page and "checkpoints/step-100/merged" in page
    # The engine's own merge at the run's last step is still the run's result.
    final = Checkpoint.objects.create(run=run, attempt=1, step=100, kind="merged", path=str(merged_dir))
    services.commit_checkpoint(final.pk)
    assert "merged/config.json" in repos.tree(repos.resolve(repos.find_repo(project, "experiment-default"), f"run-{run.pk}"))
    assert Repo.objects.filter(project=project, type="model").exists()


def test_a_lora_runs_adapter_commit_carries_its_metrics_as_a_full_finetunes_final_does(project, final_checkpoint):
    # metrics.jsonl came only with a "final" checkpoint: LoRA runs (adapter + merged) never had one.
    Checkpoint.objects.filter(pk=final_checkpoint.pk).update(kind="adapter")
    services.commit_checkpoint(final_checkpoint.pk)
    run = final_checkpoint.run
    files = repos.tree(repos.resolve(repos.find_repo(project, "experiment-default"), f"run-{run.pk}"))
    assert "adapter/model.safetensors" in files and "metrics.jsonl" in files


def test_a_model_repo_only_named_like_a_runs_is_not_paired_with_it(project, users, final_checkpoint):
    # QA: `notes-run<id>`, made by hand, was listed as run <id>'s model (and linked from its Overview).
    run = final_checkpoint.run
    repos.create_repo(project, f"notes-run{run.pk}", "model", users["owner"])
    html = browser(users["owner"]).get("/models/").content.decode()
    assert f"acme/notes-run{run.pk}" in html and f"/training/runs/{run.pk}/" not in html
    services.commit_checkpoint(final_checkpoint.pk)  # the run's own publish: paired by its commit
    html = browser(users["owner"]).get("/models/").content.decode()
    assert html.count(f'href="/training/runs/{run.pk}/"') == 1
    assert services.published_repos(run) == [Repo.objects.get(project=project, name=f"my-sft-run-run{run.pk}")]
