"""A Studio whose var/ (its STUDIO_RUNS_DIR) was moved or copied to another place: another checkout,
or README's production layout. Checkpoints were recorded with absolute paths of the old place; they
are found under the current STUDIO_RUNS_DIR by their part below `<run>/attempt-<n>/output/`, and still
only inside their run's own folder. Resume, merge, their commits and a spool delivered late read the
new place, never the old one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from datahub import repos
from datahub import services as hub
from datahub.models import Branch, TreeEntry
from tests.conftest import assert_error, sft_body, wait_for
from training import services
from training.backends.local import LocalBackend, checkpoint_dir, output_dir, shown_path
from training.models import Checkpoint, MetricPoint, Status, TrainingRun

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def moved(project, users, settings, tmp_path):
    """A stopped LoRA run whose attempt 1 saved step 5 under /…/old/var/runs, then that var/ was copied
    to /…/new/var (the current STUDIO_RUNS_DIR); the old place is still there, with other files."""
    old, new = tmp_path / "old" / "var" / "runs", tmp_path / "new" / "var" / "runs"
    settings.STUDIO_RUNS_DIR = old
    settings.DATAHUB_ROOT = tmp_path / "hub"
    run = services.create_run(project, users["owner"], name="lora", method="sft", base_model="org/base", dataset="org/data",
                              config={"lora_rank": 8, "save_steps": 5, "max_steps": 60})
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1, status=Status.CANCELLED)
    folder = output_dir(run.pk, 1) / "checkpoint-5"
    folder.mkdir(parents=True)
    (folder / WEIGHTS).write_bytes(b"step 5 weights")
    saved = Checkpoint.objects.create(run=run, attempt=1, step=5, kind="checkpoint", path=str(folder))
    shutil.copytree(old, new)
    (folder / WEIGHTS).write_bytes(b"the old place's files, which the new Studio must never read")
    settings.STUDIO_RUNS_DIR = new
    return TrainingRun.objects.get(pk=run.pk), saved, new / str(run.pk) / "attempt-1" / "output" / "checkpoint-5"


def test_a_checkpoint_recorded_under_the_old_runs_dir_is_read_from_the_current_one(moved):
    run, saved, here = moved
    assert saved.path != str(here)
    assert checkpoint_dir(saved) == here.resolve()
    assert shown_path(saved) == str(here)
    TrainingRun.objects.filter(pk=run.pk).update(interruptions=1)
    assert services.last_checkpoint_path(TrainingRun.objects.get(pk=run.pk)) == str(here.resolve())
    assert services.resume_path(saved, "local") == str(here.resolve())
    # A remote engine's path is its own machine's: as it reported it.
    assert services.resume_path(saved, "dstack") == saved.path


def test_a_resumed_run_of_a_moved_step_starts_and_reads_the_new_place(api, moved):
    run, saved, here = moved
    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/resume")
    assert r.status_code == 201, r.content
    child = TrainingRun.objects.get(pk=r.json()["id"])
    assert services.resume_findings(child) == []  # was: "not a checkpoint folder of that run on this machine (<old place>)"
    assert services.job_spec(child, "token").resume_from == str(here.resolve())
    assert api.post(f"/api/training-runs/{child.pk}/start").status_code == 202, "START of the resumed run"
    listed = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [c["path"] for c in listed] == [str(here)]


def test_a_moved_step_is_committed_from_the_new_place(moved):
    run, saved, here = moved
    hub.commit_checkpoint(saved.pk)
    saved.refresh_from_db()
    assert saved.commit
    repo = repos.find_repo(run.project, hub.experiment_repo_name(run.experiment))
    entry = repos.entry(repos.resolve(repo, saved.commit), f"checkpoints/step-5/{WEIGHTS}")
    assert entry is not None and entry.blob.size == len(b"step 5 weights")


def test_a_moved_final_is_published_from_the_new_place(moved):
    run, _, here = moved
    final = here.parent / "final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"final weights")
    recorded = str(final).replace(str(here.parents[3]), "/srv/elsewhere/var/runs")  # the old place, gone
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=60, kind="final", path=recorded)
    assert hub.publish_model(run, checkpoint) is not None


@pytest.mark.parametrize("where", ["dotdot", "another run", "another attempt", "the output folder", "link", "relative"])
def test_a_moved_checkpoint_is_still_read_only_inside_its_own_run_folder(api, moved, where, tmp_path):
    run, saved, here = moved
    old_output = Path(saved.path).parent
    outside = tmp_path / "outside" / "checkpoint-5"
    outside.mkdir(parents=True)
    for attempt_output in (output_dir(run.pk + 1, 1), output_dir(run.pk, 2)):
        (attempt_output / "checkpoint-5").mkdir(parents=True)
    (here.parent / "checkpoint-6").symlink_to(outside)
    path = {"dotdot": f"{old_output}/../../../../../outside/checkpoint-5",
            "another run": str(old_output.parents[1] / str(run.pk + 1) / "attempt-1" / "output" / "checkpoint-5"),
            "another attempt": str(old_output.parents[0] / "attempt-2" / "output" / "checkpoint-5"),
            "the output folder": str(old_output), "link": str(old_output / "checkpoint-6"),
            "relative": f"{run.pk}/attempt-1/output/checkpoint-5"}[where]
    Checkpoint.objects.filter(pk=saved.pk).update(path=path)
    saved.refresh_from_db()
    assert checkpoint_dir(saved) is None
    child = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/resume").json()["id"]
    assert_error(api.post(f"/api/training-runs/{child}/start"), 422, "resume_checkpoint")
    assert LocalBackend().reported_path_problem(run.pk, 1, path) is not None


def test_a_spool_written_before_the_move_is_accepted_with_the_new_place(moved):
    # An engine that could not deliver before the Studio stopped left its reports in its spool file,
    # with the old place's paths; the reconciler delivers them after the move.
    run, saved, here = moved
    assert LocalBackend().reported_path_problem(run.pk, 1, saved.path) is None


# ---- the real engine and merge ------------------------------------------------------------------

def train(api, run_id: int) -> TrainingRun:
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end")
    assert run.status == Status.COMPLETED, run.error
    return run


@pytest.mark.worker
def test_after_the_runs_dir_moved_a_step_is_resumed_and_merged_from_the_new_place(api, studio_worker, tiny_models):
    parent_id = api.post("/api/training-runs", sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"], config={
        "max_steps": 6, "save_steps": 3, "lora_rank": 4, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64})).json()["id"]
    parent = train(api, parent_id)
    # The runs were recorded in another var/ (/srv/studio/var/runs, gone) and moved here: the worker's STUDIO_RUNS_DIR.
    runs = str(studio_worker.runs_dir)
    for c in Checkpoint.objects.filter(run=parent):
        Checkpoint.objects.filter(pk=c.pk).update(path=c.path.replace(runs, "/srv/studio/var/runs", 1))
    assert Checkpoint.objects.filter(run=parent, step=3, path__startswith="/srv/studio/var/runs/").exists()

    r = api.post(f"/api/training-runs/{parent.pk}/checkpoints/3/resume")
    assert r.status_code == 201, r.content
    child = train(api, r.json()["id"])
    assert sorted(MetricPoint.objects.filter(run=child, key="loss").values_list("step", flat=True)) == [4, 5, 6]  # resumed, not from scratch
    spec = json.loads((studio_worker.runs_dir / str(child.pk) / "attempt-1" / "spec.json").read_text())
    assert spec["resume_from"] == str((studio_worker.runs_dir / str(parent.pk) / "attempt-1" / "output" / "checkpoint-3").resolve())

    assert api.post(f"/api/training-runs/{parent.pk}/checkpoints/3/merge").status_code == 202
    merged = wait_for(lambda: Checkpoint.objects.filter(run=parent, kind="merged", step=3).first(), 180, interval=0.5, message="the merged checkpoint")
    assert Path(merged.path).is_relative_to(studio_worker.runs_dir.resolve())
    weights: dict = {}
    for shard in sorted(Path(merged.path).glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    assert weights and not any("lora" in k for k in weights)
    branch = Branch.objects.get(repo__project=parent.project, repo__name=f"experiment-{parent.experiment.slug}", name=f"run-{parent.pk}")
    wait_for(lambda: TreeEntry.objects.filter(commit_id=Branch.objects.get(pk=branch.pk).head_id, path__startswith="checkpoints/step-3/merged/").exists(),
             60, message="the step-3 merge on the run's branch")
