"""Try it on weights that live in the Data Hub, for real: a LoRA step over a Data Hub base model (as
the demo's `demo-student@main`), and a dstack or Modal run's weights, which are only on its run's
branch. A real Celery worker checks their commit out (datahub.checkouts) and the engine's generator
answers from that folder (CPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from datahub.checkouts import checkout_name
from datahub.commits import commit_files
from datahub.models import Repo
from datahub.repos import create_repo
from datahub.services import create_run_branch, run_branch_name
from tests.test_local_training import FAST, run_to_the_end
from tests.test_playground_answers import CHAT, answered
from training import services
from training.models import Checkpoint, Status, TrainingRun

pytestmark = pytest.mark.worker


@pytest.fixture
def checkout_dir(tmp_path, settings, monkeypatch) -> Path:
    """The checkouts' folder, for this test and its worker (ask for it before studio_worker, which
    copies the environment)."""
    folder = tmp_path / "checkouts"
    monkeypatch.setenv("DATAHUB_CHECKOUT_DIR", str(folder))
    settings.DATAHUB_CHECKOUT_DIR = folder
    return folder


def model_files(folder: str, prefix: str = "") -> dict[str, Path]:
    return {f"{prefix}{p.name}": p for p in Path(folder).iterdir() if p.is_file()}


def test_a_lora_step_over_a_data_hub_base_answers_beside_that_base_at_its_pinned_commit(api, project, checkout_dir, studio_worker, tiny_models):
    repo = create_repo(project, "demo-student", "model")
    commit_files(repo, "main", model_files(tiny_models["student"]), message="tiny student")
    run = run_to_the_end(
        api,
        {
            "name": "lora on the hub",
            "method": "sft",
            "base_model": "demo-student@main",
            "dataset": tiny_models["data_sft"],
            "config": {**FAST, "max_steps": 4, "save_steps": 2, "lora_rank": 4},
        },
    )
    pinned = run.pinned["base_model"]["commit"]
    # main moves on once the run has trained: Try it loads the commit the run trained from, not main's head.
    commit_files(repo, "main", {"config.json": b"not a model any more"}, message="broken")

    asked = api.post(f"/api/training-runs/{run.pk}/generate", {"messages": CHAT, "step": 2, "max_new_tokens": 8, "temperature": 0, "compare_base": True})
    assert asked.status_code == 202, asked.content
    assert asked.json()["weights"] == "checkpoint"
    done = answered(api, asked.json()["id"])
    assert done["status"] == "completed" and done["error"] == "", done
    trained, base = done["outputs"]
    assert (trained["model"], base["model"]) == ("trained", "base")
    for output in (trained, base):
        assert 1 <= output["tokens"] <= 8 and isinstance(output["text"], str) and output["device"] == "cpu", output
    assert (checkout_dir / pinned / "config.json").is_file()  # the base, checked out at its pinned commit and kept for the next ask
    assert sorted(p.name for p in checkout_dir.iterdir() if p.is_dir()) == [pinned]


def remote_run(project, user, backend: str) -> TrainingRun:
    """A run whose job ran on `backend`: it ended, and its weights are only where that job put them."""
    run = services.create_run(project, user, name=f"on {backend}", method="sft", base_model="org/base", dataset="org/data")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1, compute={"backend": backend, "accelerators": "L4:1"})
    create_run_branch(run)
    return TrainingRun.objects.get(pk=run.pk)


def test_a_remote_runs_weights_answer_from_its_data_hub_branch(api, project, users, checkout_dir, studio_worker, tiny_models):
    run = remote_run(project, users["owner"], "dstack")
    repo = Repo.objects.get(project=project, name=f"experiment-{run.experiment.slug}")
    branch = run_branch_name(run)
    # As the job left them: step 5's files in the commit its checkpoint recorded, since deleted from the
    # branch's head; the final weights at the head, with no commit recorded.
    step_five = commit_files(repo, branch, model_files(tiny_models["student"], "checkpoints/step-5/"), message="step 5")
    commit_files(repo, branch, model_files(tiny_models["student"], "final/"), delete=["checkpoints/step-5"], message="final")
    Checkpoint.objects.create(run=run, attempt=1, step=5, kind="checkpoint", path="/workflow/output/checkpoint-5", commit=step_five.pk)
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path="/workflow/output/final")

    for ask in ({}, {"step": 5}):
        asked = api.post(f"/api/training-runs/{run.pk}/generate", {"prompt": "What colour is the cat?", "max_new_tokens": 4, "temperature": 0, **ask})
        assert asked.status_code == 202, asked.content
        done = answered(api, asked.json()["id"])
        assert done["status"] == "completed" and done["error"] == "", done
        [output] = done["outputs"]
        assert output["model"] == "trained" and 1 <= output["tokens"] <= 4, output
    assert (checkout_dir / checkout_name(step_five.pk, "checkpoints/step-5") / "config.json").is_file()
