"""A run's checkpoints are committed to its branch run-<id> one after another, in the order its engine
reported them (issue 5: as they arrive, in step order), though their Celery tasks run side by side
and a small step is stored sooner than a big one. A step's commit never holds a later step's files:
the tree a Download or a resumed run's Lineage pins for "step 2" has no checkpoints/step-4/.

The tasks run as the worker runs them (Task.apply), in the order a busy worker may finish them;
the last test runs them on a real 4-thread Celery worker at the same time."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from datahub import repos
from datahub import services as hub
from datahub.models import Branch, Commit
from datahub.tasks import commit_checkpoint
from tests.conftest import sft_body, wait_for
from training.backends.local import run_dir
from training.models import Checkpoint, LogLine, TrainingRun


@pytest.fixture
def run(api, settings, tmp_path):
    """An SFT run as the QA run left it (max_steps 4, save_steps 2), its attempt 1 under way."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", sft_body(config={"max_steps": 4, "save_steps": 2})).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(attempt=1, status="running")
    return TrainingRun.objects.get(pk=run_id)


def report(run: TrainingRun, step: int, kind: str = "checkpoint", size: int = 16) -> Checkpoint:
    """What the engine leaves for a saved step: its folder in the attempt's run folder, and its row
    (made by the ingest, in the order the engine reports); its commit task is run by the test."""
    folder = run_dir(run.pk, 1) / "output" / (f"checkpoint-{step}" if kind == "checkpoint" else kind)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(f"weights of {kind} {step} ".encode() * size)
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=str(folder))


def run_task(checkpoint: Checkpoint) -> Checkpoint:
    result = commit_checkpoint.apply(args=[checkpoint.pk])  # the task as the worker runs it
    assert result.successful(), result.traceback
    checkpoint.refresh_from_db()
    return checkpoint


def experiment_repo(run: TrainingRun):
    return repos.find_repo(run.project, hub.experiment_repo_name(run.experiment))


def folders_at(commit_id: str) -> set[str]:
    """The checkpoint folders of a commit (not its top-level metrics.jsonl and training_config.json)."""
    return {path.rsplit("/", 1)[0] for path in repos.tree(Commit.objects.get(pk=commit_id)) if "/" in path}


def branch_history(api, run: TrainingRun) -> list[str]:
    """The run branch's commit titles, oldest first, as GET .../commits lists them (newest first)."""
    response = api.get(f"/api/hub/repos/{hub.experiment_repo_name(run.experiment)}/commits", ref=f"run-{run.pk}")
    assert response.status_code == 200, response.content
    return [c["message"].splitlines()[0] for c in reversed(response.json())]


def test_commit_tasks_run_in_reverse_still_commit_in_step_order(api, run):
    step2, step4, final = report(run, 2, size=4096), report(run, 4), report(run, 4, "final")
    run_task(final)  # the worker finished the small ones first
    run_task(step4)
    step2 = run_task(step2)
    step4.refresh_from_db()
    final.refresh_from_db()

    assert branch_history(api, run) == ["Initial commit", "Checkpoint step 2, attempt 1", "Checkpoint step 4, attempt 1", "Checkpoint final (step 4), attempt 1"]
    assert Commit.objects.get(pk=step4.commit).parents == [step2.commit]
    assert Commit.objects.get(pk=final.commit).parents == [step4.commit]
    assert folders_at(step2.commit) == {"checkpoints/step-2"}  # no later weights in step 2's commit
    assert folders_at(step4.commit) == {"checkpoints/step-2", "checkpoints/step-4"}
    assert Branch.objects.get(repo=experiment_repo(run), name=f"run-{run.pk}").head_id == final.commit
    # Each task run again (acks_late) keeps its commit and makes none.
    commits = Commit.objects.count()
    assert [run_task(c).commit for c in (step2, step4, final)] == [step2.commit, step4.commit, final.commit]
    assert Commit.objects.count() == commits


def test_a_step_committed_after_a_later_one_goes_on_the_commit_before_it_off_the_branch(api, run):
    step2 = report(run, 2)
    step4 = report(run, 4)
    step6 = report(run, 6)
    # Step 4's own task has not come for longer than a commit is waited for (COMMIT_PENDING), so
    # step 6's task does not commit it first; when its task comes at last, step 6 is on the branch.
    Checkpoint.objects.filter(pk=step4.pk).update(created_at=timezone.now() - hub.COMMIT_PENDING - timedelta(minutes=1))
    run_task(step2)
    step6 = run_task(step6)
    step4 = run_task(step4)
    step2.refresh_from_db()

    assert Commit.objects.get(pk=step6.commit).parents == [step2.commit]
    assert Commit.objects.get(pk=step4.commit).parents == [step2.commit]  # beside step 6, not on top of it
    assert folders_at(step4.commit) == {"checkpoints/step-2", "checkpoints/step-4"}
    head = Branch.objects.get(repo=experiment_repo(run), name=f"run-{run.pk}").head_id
    assert head == step6.commit and branch_history(api, run)[-1] == "Checkpoint step 6, attempt 1"
    assert "off run-" in Commit.objects.get(pk=step4.commit).message
    assert LogLine.objects.filter(run=run, line__contains=f"step 4 of attempt 1 was committed after step 6 of attempt 1: its commit {step4.commit[:10]}").exists()


@pytest.mark.worker
def test_commit_tasks_running_at_once_on_a_worker_commit_in_step_order(transactional_db, request, api, run):
    worker = request.getfixturevalue("studio_worker")  # after `run`: the worker reads its runs folder from the same setting
    saved = [report(run, 2, size=200_000), report(run, 4, size=50_000), report(run, 6, size=5_000), report(run, 8)]
    for checkpoint in reversed(saved):  # the latest first: its small files are stored soonest
        commit_checkpoint.delay(checkpoint.pk)
    wait_for(lambda: not Checkpoint.objects.filter(run=run, commit="").exists(), 60, message=f"every checkpoint committed\n{worker.log()[-3000:]}")

    saved = list(Checkpoint.objects.filter(run=run).order_by("step"))
    assert branch_history(api, run) == ["Initial commit", *(f"Checkpoint step {c.step}, attempt 1" for c in saved)]
    for earlier, later in zip(saved, saved[1:], strict=False):
        assert Commit.objects.get(pk=later.commit).parents == [earlier.commit]
    for checkpoint in saved:
        assert max(int(folder.rsplit("-", 1)[1]) for folder in folders_at(checkpoint.commit)) == checkpoint.step
