"""Checkpoints of a restarted run: "Start again" trains a new attempt, which saves its steps again
(other weights, in its own folder) at the same place on the run's branch. Each checkpoint keeps the
commit that holds its own files; resume and merge name the attempt; the Checkpoints tab's rows act
on their own weights. The engine is not run: its folders and reports are written as it writes them."""
from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from datahub import repos
from datahub import services as hub
from datahub.models import Commit
from tests.conftest import assert_error
from training import checkpoints, services
from training.backends.local import run_dir
from training.models import Checkpoint, RunAttempt, Status, TrainingRun

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def dpo_run(project, users, settings, tmp_path):
    """A LoRA DPO run (save_steps 5, max_steps 60) stopped in attempt 1 after step 5, then started again."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.DATAHUB_ROOT = tmp_path / "hub"
    run = services.create_run(project, users["owner"], name="dpo", method="dpo", base_model="org/base", dataset="org/prefs",
                              config={"lora_rank": 8, "loss": {"type": "dpo"}, "save_steps": 5, "max_steps": 60})
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2, status=Status.CANCELLED)
    return TrainingRun.objects.get(pk=run.pk)


def save_step(run: TrainingRun, attempt: int, step: int, files: dict[str, bytes], commit: bool = True) -> Checkpoint:
    """What an attempt's engine leaves: its step folder in the attempt's own run folder, its report, and the commit task."""
    folder = run_dir(run.pk, attempt) / "output" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    checkpoint = Checkpoint.objects.create(run=run, attempt=attempt, step=step, kind="checkpoint", path=str(folder))
    if commit:
        hub.commit_checkpoint(checkpoint.pk)
        checkpoint.refresh_from_db()
    return checkpoint


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_at(run: TrainingRun, ref: str, path: str) -> str | None:
    """The sha256 of `path` at `ref` of the run's experiment repo, None when it is not there."""
    repo = repos.find_repo(run.project, hub.experiment_repo_name(run.experiment))
    entry = repos.entry(repos.resolve(repo, ref), path)
    return entry.blob_id if entry else None


@pytest.fixture
def two_attempts(dpo_run):
    first = save_step(dpo_run, 1, 5, {WEIGHTS: b"attempt 1 weights", "optimizer.pt": b"attempt 1 optimizer"})
    second = save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2 weights"})
    return dpo_run, first, second


# ---- the commit that holds each attempt's files -----------------------------------------------------

def test_each_attempts_step_keeps_the_commit_that_holds_its_own_files(api, two_attempts):
    run, first, second = two_attempts
    assert first.commit and second.commit and first.commit != second.commit
    step = f"checkpoints/step-5/{WEIGHTS}"
    assert file_at(run, first.commit, step) == sha(b"attempt 1 weights")
    assert file_at(run, second.commit, step) == sha(b"attempt 2 weights")
    assert file_at(run, f"run-{run.pk}", step) == sha(b"attempt 2 weights")  # the branch's head: the newest attempt's
    # The folder holds attempt 2's files alone: attempt 1's optimizer is in attempt 1's commit only.
    assert file_at(run, first.commit, "checkpoints/step-5/optimizer.pt") == sha(b"attempt 1 optimizer")
    assert file_at(run, f"run-{run.pk}", "checkpoints/step-5/optimizer.pt") is None
    listed = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["attempt"], c["commit"]) for c in listed] == [(1, first.commit), (2, second.commit)]


def test_an_earlier_attempts_step_still_to_commit_is_committed_before_the_newer_attempts(dpo_run):
    first = save_step(dpo_run, 1, 5, {WEIGHTS: b"attempt 1 weights"}, commit=False)  # its commit task is still queued
    second = save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2 weights"})
    first.refresh_from_db()
    assert Commit.objects.get(pk=second.commit).parents == [first.commit]  # in the order the attempts saved them
    assert file_at(dpo_run, first.commit, f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 1 weights")
    assert hub.commit_checkpoint(first.pk).pk == first.commit  # its own task, when it comes, keeps that commit
    assert file_at(dpo_run, f"run-{dpo_run.pk}", f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 2 weights")
    assert second.commit == repos.resolve(repos.find_repo(dpo_run.project, hub.experiment_repo_name(dpo_run.experiment)), f"run-{dpo_run.pk}").pk


def test_a_late_commit_of_an_earlier_attempt_leaves_the_newer_attempts_files(dpo_run):
    first = save_step(dpo_run, 1, 5, {WEIGHTS: b"attempt 1 weights"}, commit=False)
    # Its task has not come for longer than a commit is waited for: attempt 2's task does not commit it first.
    Checkpoint.objects.filter(pk=first.pk).update(created_at=timezone.now() - hub.COMMIT_PENDING - timedelta(minutes=1))
    second = save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2 weights"})
    late = hub.commit_checkpoint(first.pk)  # it comes at last: on the commit before attempt 2's step, off the branch
    first.refresh_from_db()
    assert late.pk == first.commit and late.parents == Commit.objects.get(pk=second.commit).parents
    assert file_at(dpo_run, first.commit, f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 1 weights")
    assert file_at(dpo_run, f"run-{dpo_run.pk}", f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 2 weights")
    assert second.commit == repos.resolve(repos.find_repo(dpo_run.project, hub.experiment_repo_name(dpo_run.experiment)), f"run-{dpo_run.pk}").pk


def save_merge(run: TrainingRun, attempt: int, step: int, data: bytes) -> Checkpoint:
    """What a Merge of the attempt's step leaves (training.checkpoints._merge): the merged folder beside
    the step's in the attempt's run folder, its checkpoint row, and the commit task."""
    folder = run_dir(run.pk, attempt) / "output" / f"merged-step-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(data)
    checkpoint = Checkpoint.objects.create(run=run, attempt=attempt, step=step, kind="merged", path=str(folder), requested=True)
    hub.commit_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint


MERGED = "checkpoints/step-5/merged/model.safetensors"


def test_merges_of_the_same_step_of_two_attempts_are_each_committed(dpo_run):
    newer = save_merge(dpo_run, 2, 5, b"attempt 2 merged")
    older = save_merge(dpo_run, 1, 5, b"attempt 1 merged")  # asked for after attempt 2's
    assert file_at(dpo_run, newer.commit, MERGED) == sha(b"attempt 2 merged")
    assert file_at(dpo_run, older.commit, MERGED) == sha(b"attempt 1 merged") == file_at(dpo_run, f"run-{dpo_run.pk}", MERGED)


def test_a_merge_is_committed_with_a_message_of_its_own(two_attempts):
    run, first, second = two_attempts
    merged = save_merge(run, 2, 5, b"attempt 2 merged")
    older = save_merge(run, 1, 5, b"attempt 1 merged")  # on attempt 1's own step commit
    assert Commit.objects.get(pk=second.commit).message == "Checkpoint step 5, attempt 2"
    assert Commit.objects.get(pk=merged.commit).message == "Merged checkpoint step 5, attempt 2"
    assert Commit.objects.get(pk=older.commit).message.startswith("Merged checkpoint step 5, attempt 1, on attempt 1's own step 5")


def test_a_merge_of_an_earlier_attempts_step_is_committed_with_that_attempts_step_not_the_heads(api, two_attempts):
    run, first, second = two_attempts
    older = save_merge(run, 1, 5, b"attempt 1 merged")
    # Its commit is attempt 1's step with its merge: a download of it (or of checkpoints/step-5/) has
    # the weights that were merged beside the merge, not attempt 2's adapter that the branch has now.
    assert file_at(run, older.commit, MERGED) == sha(b"attempt 1 merged")
    assert file_at(run, older.commit, f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 1 weights")
    assert file_at(run, older.commit, "checkpoints/step-5/optimizer.pt") == sha(b"attempt 1 optimizer")
    assert Commit.objects.get(pk=older.commit).parents == [first.commit]
    # The branch's head is still attempt 2's step, with no merge of other weights beside it.
    assert repos.resolve(repos.find_repo(run.project, hub.experiment_repo_name(run.experiment)), f"run-{run.pk}").pk == second.commit
    assert file_at(run, f"run-{run.pk}", MERGED) is None
    listed = api.get(f"/api/training-runs/{run.pk}/checkpoints").json()
    assert [(c["kind"], c["attempt"], c["commit"]) for c in listed] == [("checkpoint", 1, first.commit), ("checkpoint", 2, second.commit), ("merged", 1, older.commit)]
    # The task run again (acks_late) keeps that commit and makes no other.
    commits = Commit.objects.filter(repo__project=run.project).count()
    assert hub.commit_checkpoint(older.pk).pk == older.commit and Commit.objects.filter(repo__project=run.project).count() == commits
    # Attempt 2's own merge goes on the head, beside attempt 2's step.
    newer = save_merge(run, 2, 5, b"attempt 2 merged")
    assert file_at(run, f"run-{run.pk}", MERGED) == sha(b"attempt 2 merged") == file_at(run, newer.commit, MERGED)
    assert file_at(run, newer.commit, f"checkpoints/step-5/{WEIGHTS}") == sha(b"attempt 2 weights")


# ---- resume and merge name the attempt ------------------------------------------------------------

def test_resume_takes_the_attempt_that_saved_the_step(api, two_attempts):
    run, first, second = two_attempts
    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/resume?attempt=1")
    assert r.status_code == 201, r.content
    assert r.json()["resumed_from_step"] == 5 and r.json()["resumed_from_attempt"] == 1
    child = TrainingRun.objects.get(pk=r.json()["id"])
    assert child.parent_id == run.pk and child.resume_checkpoint_id == first.pk
    # On the local backend the engine resumes from the attempt's own folder, which is still there.
    assert child.resume_checkpoint.path == str(run_dir(run.pk, 1) / "output" / "checkpoint-5")
    assert services.resume_findings(child) == []
    newest = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/resume")  # without attempt: the newest, as before
    assert newest.status_code == 201 and TrainingRun.objects.get(pk=newest.json()["id"]).resume_checkpoint_id == second.pk
    # Once the attempt's folder is gone, START of a run resumed from it says so.
    import shutil

    shutil.rmtree(run_dir(run.pk, 1))
    assert [f.field for f in services.resume_findings(child)] == ["resume_checkpoint"]


@pytest.mark.parametrize("attempt", ["3", "0", "-1", "one"])
def test_resume_from_an_attempt_that_did_not_save_the_step_is_400_naming_attempt(api, two_attempts, attempt):
    run, _, _ = two_attempts
    body = assert_error(api.post(f"/api/training-runs/{run.pk}/checkpoints/5/resume?attempt={attempt}"), 400, "attempt")
    if attempt == "3":
        assert "2 attempts, 1, 2" in body["errors"][0]["message"]
    assert not TrainingRun.objects.filter(parent=run).exists()


def test_merge_takes_the_attempt_that_saved_the_step(api, two_attempts):
    run, first, second = two_attempts
    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/merge?attempt=1")
    assert r.status_code == 202, r.content
    assert r.json() == {"run": run.pk, "step": 5, "attempt": 1, "queued": True, "notice": ""}
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.merge_requested_at is not None and second.merge_requested_at is None
    # Attempt 2's step 5 is other weights: its merge is not the one in flight.
    assert api.post(f"/api/training-runs/{run.pk}/checkpoints/5/merge?attempt=2").json()["attempt"] == 2
    assert_error(api.post(f"/api/training-runs/{run.pk}/checkpoints/5/merge?attempt=3"), 400, "attempt")
    assert_error(api.post(f"/api/training-runs/{run.pk}/checkpoints/6/merge?attempt=1"), 400, "step")


def test_a_merge_loads_the_base_in_the_precision_its_attempt_trained_in(two_attempts):
    run, first, second = two_attempts
    # Attempt 1 trained fp32 on a GPU; the run was then edited to train attempt 2 in bf16 (the default).
    RunAttempt.objects.create(run=run, attempt=1, config={**run.config, "precision": "fp32"}, compute={"backend": "local", "accelerators": "L4:1"})
    RunAttempt.objects.create(run=run, attempt=2, config=run.config, compute={"backend": "local", "accelerators": "L4:1"})
    assert checkpoints.merge_precision(first) == "fp32"
    assert checkpoints.merge_precision(second) == "bf16"
    # A CPU attempt trained in fp32 whatever its config asked for (bf16 applies on a GPU only).
    RunAttempt.objects.filter(run=run, attempt=2).update(config={**run.config, "precision": "bf16"}, compute={"backend": "local", "accelerators": "CPU"})
    assert checkpoints.merge_precision(second) == "fp32"


def test_a_merged_step_of_one_attempt_leaves_the_other_attempts_step_mergeable(api, two_attempts):
    run, first, _ = two_attempts
    Checkpoint.objects.create(run=run, attempt=1, step=5, kind="merged", path=str(Path(first.path).parent / "merged-step-5"), requested=True)
    assert api.post(f"/api/training-runs/{run.pk}/checkpoints/5/merge?attempt=1").status_code == 409
    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/5/merge")
    assert r.status_code == 202 and r.json()["attempt"] == 2
    assert Checkpoint.objects.get(run=run, attempt=2, step=5, kind="checkpoint").merge_requested_at is not None


# ---- the Checkpoints tab ------------------------------------------------------------------------

def page_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr data-checkpoint="checkpoint-5">(.*?)</tr>', html, re.S)


def test_checkpoints_tab_rows_of_two_attempts_act_on_their_own_weights(users, two_attempts):
    run, first, second = two_attempts
    client = page_client(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    rows = rows_of(html)
    assert len(rows) == 2 and rows[0] != rows[1]
    for row, mine, theirs in ((rows[0], first, second), (rows[1], second, first)):
        assert f"commit={mine.commit}" in row and theirs.commit not in row
        assert f'name="attempt" value="{mine.attempt}"' in row
        assert f"Download<span class=\"visually-hidden\"> step 5 of attempt {mine.attempt}</span>" in row
        assert f"(step 5, attempt {mine.attempt})" in row and f"Merge<span class=\"visually-hidden\"> step 5 of attempt {mine.attempt}" in row
    assert "Each attempt of this run saved its own steps" in html

    response = client.post(f"/training/runs/{run.pk}/checkpoints/5/resume", {"attempt": "1"})
    child = TrainingRun.objects.get(parent=run)
    assert response.status_code == 302 and child.resume_checkpoint_id == first.pk
    assert client.post(f"/training/runs/{run.pk}/checkpoints/5/merge", {"attempt": "1"}).status_code == 302
    assert list(Checkpoint.objects.filter(run=run, merge_requested_at__isnull=False).values_list("pk", flat=True)) == [first.pk]
    refused = client.post(f"/training/runs/{run.pk}/checkpoints/5/resume", {"attempt": "7"}, follow=True).content.decode()
    assert "Attempt 7 of run" in refused and TrainingRun.objects.filter(parent=run).count() == 1

    # Download of attempt 1's row: the repository at the commit with attempt 1's files, downloads at that commit.
    repository = client.get(f"/training/runs/{run.pk}/repository/", {"path": "checkpoints/step-5", "commit": first.commit}).content.decode()
    assert "checkpoints/step-5/optimizer.pt" in repository and f"ref={first.commit}&amp;path=checkpoints/step-5/optimizer.pt" in repository
    assert 'data-testid="repository-commit"' in repository
    head = client.get(f"/training/runs/{run.pk}/repository/", {"path": "checkpoints/step-5"}).content.decode()
    assert "checkpoints/step-5/optimizer.pt" not in head and f"ref=run-{run.pk}&amp;" in head
    unknown = client.get(f"/training/runs/{run.pk}/repository/", {"commit": "f" * 40}).content.decode()
    assert "is not a commit of" in unknown and f"ref=run-{run.pk}&amp;" in unknown


def test_a_row_committed_before_commits_were_recorded_says_a_later_attempt_replaced_its_files(users, two_attempts):
    run, first, second = two_attempts
    Checkpoint.objects.filter(run=run).update(commit="")  # recorded before the commit was kept
    html = page_client(users["owner"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    older, newer = rows_of(html)
    assert "replaced on the branch by attempt 2" in older and "?path=" not in older
    assert '?path=checkpoints/step-5"' in newer  # the head holds the newest attempt's files
    assert 'value="1"' in older  # its own weights are still on this machine: Resume and Merge use them


def test_an_interrupted_attempt_resumes_from_its_starts_own_steps_not_an_earlier_attempts(dpo_run):
    first = save_step(dpo_run, 1, 20, {WEIGHTS: b"attempt 1, step 20"}, commit=False)
    # Started again (attempt 2), then a spot interruption retried it in attempt 3.
    second = save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2, step 5"}, commit=False)
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=3, interruptions=1, status=Status.PROVISIONING)
    run = TrainingRun.objects.get(pk=dpo_run.pk)
    assert services.last_checkpoint_path(run) == second.path != first.path


def test_merge_and_resume_of_an_attempts_step_go_by_that_attempts_settings_not_the_edited_runs(api, dpo_run):
    # Attempt 1 trained a rank-8 adapter on org/base; then the run was edited into a full fine-tune of org/other.
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=1)
    services.record_attempt(TrainingRun.objects.get(pk=dpo_run.pk))
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=2)
    # PATCH refuses a DPO full fine-tune now (it needs LoRA): the edit as a run stored before that holds it.
    edited = TrainingRun.objects.get(pk=dpo_run.pk)
    TrainingRun.objects.filter(pk=dpo_run.pk).update(base_model="org/other", config={k: v for k, v in edited.config.items() if k not in ("lora_rank", "lora_alpha")})
    first = save_step(dpo_run, 1, 5, {WEIGHTS: b"attempt 1 weights"})
    # Its step is a LoRA adapter: it can be merged, into the model it was trained on.
    r = api.post(f"/api/training-runs/{dpo_run.pk}/checkpoints/5/merge?attempt=1")
    assert r.status_code == 202, r.content
    assert Checkpoint.objects.get(pk=first.pk).merge_requested_at is not None
    r = api.post(f"/api/training-runs/{dpo_run.pk}/checkpoints/5/resume?attempt=1")
    assert r.status_code == 201, r.content
    child = TrainingRun.objects.get(pk=r.json()["id"])
    assert (child.base_model, child.config["lora_rank"]) == ("org/base", 8)
    assert services.resume_findings(child) == []


def test_checkpoints_tab_offers_merge_by_each_rows_attempt_not_the_edited_run(api, users, dpo_run):
    # Attempt 1 trained a LoRA adapter; the run was then edited into a full fine-tune and trained attempt 2.
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=1)
    services.record_attempt(TrainingRun.objects.get(pk=dpo_run.pk))
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=2)
    edited = TrainingRun.objects.get(pk=dpo_run.pk)  # as stored before PATCH refused a DPO full fine-tune (it needs LoRA)
    TrainingRun.objects.filter(pk=dpo_run.pk).update(config={k: v for k, v in edited.config.items() if k not in ("lora_rank", "lora_alpha")})
    services.record_attempt(TrainingRun.objects.get(pk=dpo_run.pk))
    save_step(dpo_run, 1, 5, {WEIGHTS: b"attempt 1 adapter"})
    save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2 full weights"})
    html = page_client(users["owner"]).get(f"/training/runs/{dpo_run.pk}/checkpoints/").content.decode()
    adapter, full = rows_of(html)
    assert "Merge<span" in adapter and "Merge<span" not in full
    assert "Merge folds the LoRA checkpoint into its base" in html


def test_a_resumed_run_pins_its_base_model_where_the_checkpoints_attempt_trained_not_where_the_ref_moved(api, project, users, settings, tmp_path, tiny_models):
    from datahub.commits import commit_files
    from datahub.models import Branch

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    model = repos.create_repo(project, "student", "model")
    files = {p.name: p for p in Path(tiny_models["student"]).iterdir() if p.is_file()}
    trained_on = commit_files(model, "main", files, message="student v1").pk
    run = services.create_run(project, users["owner"], name="sft", method="sft", base_model="student@main", dataset=tiny_models["data_sft"],
                              config={"lora_rank": 4, "save_steps": 2, "max_steps": 8})
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1, status=Status.CANCELLED, pinned={"base_model": {"ref": "student@main", "commit": trained_on, "repo": model.full_name}})
    services.record_attempt(TrainingRun.objects.get(pk=run.pk))
    save_step(TrainingRun.objects.get(pk=run.pk), 1, 2, {WEIGHTS: b"adapter of student v1"})
    # main moves on: other weights under the same ref
    moved = commit_files(model, "main", {"README.md": b"student v2"}, message="v2").pk
    assert Branch.objects.get(repo=model, name="main").head_id == moved != trained_on

    r = api.post(f"/api/training-runs/{run.pk}/checkpoints/2/resume")
    assert r.status_code == 201, r.content
    child = TrainingRun.objects.get(pk=r.json()["id"])
    started = services.start_run(child)
    assert started.pinned["base_model"]["commit"] == trained_on
    # A fresh run of the same ref pins where it points now.
    fresh = services.create_run(project, users["owner"], name="fresh", method="sft", base_model="student@main", dataset=tiny_models["data_sft"], config={"max_steps": 2})
    assert services.start_run(fresh).pinned["base_model"]["commit"] == moved


def test_an_interrupted_attempt_resumes_only_from_a_saved_step_in_its_own_run_folder(dpo_run, tmp_path):
    # An engine can report any path, and the local engine reads resume_from on this machine: START's
    # resume_findings refused such a folder for a resumed run, the resubmit after an interruption did not.
    TrainingRun.objects.filter(pk=dpo_run.pk).update(attempt=2, interruptions=1, status=Status.PROVISIONING)
    saved = save_step(dpo_run, 2, 5, {WEIGHTS: b"attempt 2, step 5"}, commit=False)
    elsewhere = tmp_path / "elsewhere" / "checkpoint-10"
    elsewhere.mkdir(parents=True)
    Checkpoint.objects.create(run=dpo_run, attempt=2, step=10, kind="checkpoint", path=str(elsewhere))
    Checkpoint.objects.create(run=dpo_run, attempt=2, step=15, kind="checkpoint", path=f"{run_dir(dpo_run.pk, 2)}/output/../../../../elsewhere/checkpoint-10")
    adapter = run_dir(dpo_run.pk, 2) / "output" / "adapter"
    adapter.mkdir()
    Checkpoint.objects.create(run=dpo_run, attempt=2, step=20, kind="adapter", path=str(adapter))  # no optimizer state to resume
    run = TrainingRun.objects.get(pk=dpo_run.pk)
    assert services.last_checkpoint_path(run) == saved.path
    Checkpoint.objects.filter(pk=saved.pk).delete()
    assert services.last_checkpoint_path(run) is None
