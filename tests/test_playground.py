"""POST /api/training-runs/{id}/generate and GET .../generations/{id} without a worker: what an ask is
refused with (400 naming the field, 409 saying what to do) and that a refusal stores nothing; who may
ask and see; the 20 answers a run keeps; and which device an answer gets (real slot locks)."""
from __future__ import annotations

import fcntl
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from datahub.commits import commit_files
from datahub.repos import create_repo
from tests.conftest import assert_error
from training import services
from training.backends.local_runner import take_ticket
from training.models import Checkpoint, Generation, Status, TrainingRun
from training.playground import ANSWER_TIME_LIMIT_S, KEPT_GENERATIONS, finish, generate, generation_gpu
from training.tasks import reconcile_runs

ASK = {"prompt": "What colour is the cat?", "max_new_tokens": 8, "temperature": 0}


def trained_run(project, user, runs_dir: Path, saved: tuple[tuple[str, int], ...] = (("final", 10),), base_model: str = "org/base",
                chat: bool = True) -> TrainingRun:
    """A completed run whose engine saved `saved` (kind, step) folders in its own output folder."""
    run = services.create_run(project, user, name="tried", method="sft", base_model=base_model, dataset="org/data")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    for kind, step in saved:
        folder = runs_dir / str(run.pk) / "attempt-1" / "output" / (f"checkpoint-{step}" if kind == "checkpoint" else kind)
        folder.mkdir(parents=True)
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"} if chat else {}))
        if kind == "adapter":
            (folder / "adapter_config.json").write_text("{}")
        Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=str(folder))
    return TrainingRun.objects.get(pk=run.pk)


@pytest.fixture
def runs_dir(settings, tmp_path) -> Path:
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    return settings.STUDIO_RUNS_DIR


@pytest.mark.parametrize(("body", "field", "says"), [
    ({**ASK, "max_new_tokens": 513}, "max_new_tokens", "at most 512"),
    ({**ASK, "max_new_tokens": 0}, "max_new_tokens", "at least 1"),
    ({**ASK, "max_new_tokens": "many"}, "max_new_tokens", "valid integer"),
    ({**ASK, "temperature": 2.5}, "temperature", "at most 2"),
    ({**ASK, "temperature": -0.1}, "temperature", "at least 0"),
    ({**ASK, "prompt": "   "}, "prompt", "write something"),
    ({"max_new_tokens": 8}, "prompt", "write something"),
    ({**ASK, "messages": [{"role": "user", "content": "Hi"}]}, "messages", "not both"),
    ({"messages": []}, "messages", "at least one message"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role", "'system', 'user' or 'assistant'"),
    ({**ASK, "prompt": "x" * 20_001}, "prompt", "at most 20,000 characters"),
    ({**ASK, "step": "last"}, "step", "valid integer"),
    ({**ASK, "seed": 1}, "seed", "unknown field"),
])
def test_a_bad_ask_is_a_400_naming_the_field_and_stores_nothing(api, project, users, runs_dir, body, field, says):
    run = trained_run(project, users["owner"], runs_dir)
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", body), 400, field)
    assert any(says in e["message"] for e in answer["errors"] if e["field"] == field), answer
    assert not Generation.objects.exists()


def test_a_run_without_saved_weights_is_a_409_saying_what_to_do(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=())
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", ASK), 409)
    assert "has no saved weights to try: start it and let it finish" in answer["detail"]
    assert not Generation.objects.exists()


def test_a_run_with_only_saved_steps_is_a_409_naming_them_until_it_ends(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("checkpoint", 10)))
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", ASK), 409)
    assert "no final weights yet" in answer["detail"] and "(5, 10)" in answer["detail"]
    assert api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "step": 10}).status_code == 202


@pytest.mark.parametrize(("status", "says"), [(Status.CANCELLED, "ended cancelled (stopped)"), (Status.FAILED, "ended failed")])
def test_an_ended_run_without_final_weights_is_a_409_naming_its_steps_not_a_wait(api, project, users, runs_dir, status, says):
    run = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("checkpoint", 10)))
    TrainingRun.objects.filter(pk=run.pk).update(status=status)
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", ASK), 409)
    assert answer["detail"] == (f"Run {run.pk} {says} before saving its final weights: try one of its saved steps (5, 10) with step, or Resume "
                                "from one of them (Checkpoints tab) or Start it again, and try the new run's final weights once it completes.")
    bare = trained_run(project, users["owner"], runs_dir, saved=())
    TrainingRun.objects.filter(pk=bare.pk).update(status=status)
    answer = assert_error(api.post(f"/api/training-runs/{bare.pk}/generate", ASK), 409)
    assert answer["detail"].startswith(f"Run {bare.pk} {says} before saving its final weights, and it saved no step along the way: Start it again")
    assert "wait" not in answer["detail"] and not Generation.objects.exists()
    assert "with save_steps in its config it also saves steps along the way" in answer["detail"]
    # a run that asked for saved steps but ended before its first is not told to set save_steps
    TrainingRun.objects.filter(pk=bare.pk).update(config={**bare.config, "save_steps": 4})
    answer = assert_error(api.post(f"/api/training-runs/{bare.pk}/generate", ASK), 409)
    assert "Start it again (it saves a step every 4 steps: it ended before its first), then" in answer["detail"], answer["detail"]


def test_a_step_the_run_did_not_save_is_a_400_listing_the_steps_it_did(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("final", 10)))
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "step": 7}), 400, "step")
    assert answer["errors"][0]["message"] == f"run {run.pk} saved steps 5: give one of those, or leave step out for its final weights"
    assert not Generation.objects.exists()


def test_an_ask_is_stored_queued_with_the_weights_it_names(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("adapter", 10), ("merged", 10)))
    asked = api.post(f"/api/training-runs/{run.pk}/generate", {"messages": [{"role": "user", "content": "Hi"}], "compare_base": True})
    assert asked.status_code == 202, asked.content
    body = asked.json()
    assert (body["status"], body["weights"], body["step"], body["max_new_tokens"], body["temperature"]) == ("queued", "merged", None, 128, 0.7)
    stored = Generation.objects.get(pk=body["id"])
    assert stored.messages == [{"role": "user", "content": "Hi"}] and stored.compare_base and stored.created_by == users["owner"]
    assert api.get(f"/api/training-runs/generations/{stored.pk}").json()["status"] == "queued"


def test_a_viewer_cannot_ask_and_an_outsider_sees_nothing(api, api_as, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir)
    assert_error(api_as("viewer").post(f"/api/training-runs/{run.pk}/generate", ASK), 403)
    assert_error(api_as("outsider").post(f"/api/training-runs/{run.pk}/generate", ASK), 404)
    generation_id = api_as("member").post(f"/api/training-runs/{run.pk}/generate", ASK).json()["id"]
    assert api_as("viewer").get(f"/api/training-runs/generations/{generation_id}").status_code == 200
    assert_error(api_as("outsider").get(f"/api/training-runs/generations/{generation_id}"), 404)


def test_a_remote_runs_weights_its_branch_lacks_are_a_409_naming_the_branch(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=())
    TrainingRun.objects.filter(pk=run.pk).update(compute={"backend": "dstack", "accelerators": "L4:1"})
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path="/workflow/output/final")  # a path on the job's machine
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", ASK), 409)
    assert "not on the Studio machine: its dstack job saved them on its own" in answer["detail"]
    assert f"branch run-{run.pk} of Data Hub repo experiment-" in answer["detail"] and "does not hold final/" in answer["detail"]
    assert not Generation.objects.exists()


def test_a_remote_runs_weights_in_a_deleted_commit_are_a_409_naming_it(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir, saved=())
    TrainingRun.objects.filter(pk=run.pk).update(compute={"backend": "modal", "accelerators": "L4:1"})
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path="/workflow/output/final", commit="ab" * 20)
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", ASK), 409)
    assert f"were in commit {'ab' * 6} of Data Hub repo experiment-" in answer["detail"] and "which was deleted with its repo" in answer["detail"]
    assert not Generation.objects.exists()


def test_a_data_hub_base_answers_at_its_pinned_commit_and_a_deleted_one_is_a_409_naming_it(api, project, users, runs_dir):
    repo = create_repo(project, "org-base", "model")
    pinned = commit_files(repo, "main", {"config.json": b"{}"})
    run = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("final", 10)), base_model="org-base@main")
    adapter = runs_dir / str(run.pk) / "attempt-1" / "output" / "checkpoint-5"
    (adapter / "adapter_config.json").write_text("{}")
    TrainingRun.objects.filter(pk=run.pk).update(pinned={"base_model": {"ref": "org-base@main", "commit": pinned.pk, "repo": "acme/org-base"}})
    assert api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "step": 5, "compare_base": True}).status_code == 202

    gone = "cd" * 20  # a commit that went with its deleted repo
    TrainingRun.objects.filter(pk=run.pk).update(pinned={"base_model": {"ref": "org-base@main", "commit": gone, "repo": "acme/org-base"}})
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "step": 5}), 409)
    assert f"Data Hub repo acme/org-base was deleted, and with it commit {gone[:12]}" in answer["detail"]
    assert "the LoRA adapter of step 5 has no base to go over" in answer["detail"] and "Merge this step on the Checkpoints tab" in answer["detail"]
    answer = assert_error(api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "compare_base": True}), 409)
    # the run's own weights would answer: the way out is to leave the base out, not other weights
    assert "cannot be compared with the base model's. Untick Compare with the base model" in answer["detail"], answer["detail"]
    assert Generation.objects.count() == 1  # the refusals stored nothing
    assert api.post(f"/api/training-runs/{run.pk}/generate", ASK).status_code == 202  # its final weights load alone


def test_a_run_keeps_its_newest_answers(api, project, users, runs_dir):
    run = trained_run(project, users["owner"], runs_dir)
    ids = [api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "prompt": f"ask {i}"}).json()["id"] for i in range(KEPT_GENERATIONS + 1)]
    assert sorted(Generation.objects.filter(run=run).values_list("pk", flat=True)) == ids[1:]
    assert_error(api.get(f"/api/training-runs/generations/{ids[0]}"), 404)


def hold(path: Path, holder: str):
    """A slot's lock as a training job holds it (local_runner): flocked, its holder written in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.seek(0)
    f.truncate()
    f.write(holder)
    f.flush()
    return f


def test_an_answer_takes_a_free_gpu_slot_and_runs_on_the_cpu_while_training_holds_them(project, users, runs_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the GPUs local jobs share (no GPU needed: only the slot locks are used)
    run = trained_run(project, users["owner"], runs_dir)
    generation = Generation.objects.create(run=run, max_new_tokens=8, temperature=0)
    slots = runs_dir / ".slots"
    first = hold(slots / "gpu-0.lock", "run 7 (attempt 1)")
    with generation_gpu(generation) as (visible, note):
        assert (visible, note) == ("1", "")
        assert f"Try it of run {run.pk}" in (slots / "gpu-1.lock").read_text()
        with pytest.raises(BlockingIOError):  # a training job cannot take it meanwhile
            hold(slots / "gpu-1.lock", "run 8 (attempt 1)")
    second = hold(slots / "gpu-1.lock", "run 8 (attempt 1)")  # freed when the answer is done
    with generation_gpu(generation) as (visible, note):
        assert visible == ""
        assert note == "on the CPU: every GPU of the Studio machine is taken, training holds them (run 7 (attempt 1), run 8 (attempt 1))"
    first.close(), second.close()
    _, waiter = take_ticket(slots / "queue-gpu", runs_dir / "9" / "attempt-1")  # a training job queued for a GPU: it goes first
    with generation_gpu(generation) as (visible, note):
        assert (visible, note) == ("", "on the CPU: every GPU of the Studio machine is taken, training jobs wait for them (run 9 (attempt 1))")
    waiter.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with generation_gpu(generation) as (visible, note):
        assert (visible, note) == ("", "on the CPU: the Studio machine has no GPU")


def test_an_answer_the_worker_fails_on_is_failed_not_left_generating(project, users, runs_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    run = trained_run(project, users["owner"], runs_dir)
    runs_dir.joinpath(".slots").write_text("not a folder")  # the slot locks cannot be made: the task fails
    generation = Generation.objects.create(run=run, checkpoint=run.checkpoints.get(), prompt="Hi", max_new_tokens=8, temperature=0)
    with pytest.raises(FileExistsError):
        generate(generation.pk)
    generation.refresh_from_db()
    assert generation.status == "failed" and generation.error.startswith("the worker failed while answering (FileExistsError")
    assert generation.finished_at is not None
    generate(generation.pk)  # run again (a retried task): it is no longer queued, so nothing happens


def test_the_reconciler_fails_answers_whose_worker_was_lost_and_leaves_live_ones(project, users, runs_dir):
    # A worker process killed mid-answer (or a queue that lost the task) left the tab "Generating…" for ever.
    run = trained_run(project, users["owner"], runs_dir)
    now = timezone.now()

    def answer(status: str, **times) -> Generation:
        made = Generation.objects.create(run=run, checkpoint=run.checkpoints.get(), prompt="Hi", max_new_tokens=8, temperature=0, status=status)
        Generation.objects.filter(pk=made.pk).update(**times)
        return made

    lost = answer("running", started_at=now - timedelta(seconds=ANSWER_TIME_LIMIT_S + 60))
    answering = answer("running", started_at=now - timedelta(seconds=ANSWER_TIME_LIMIT_S - 60), created_at=now - timedelta(hours=1))
    never_taken = answer("queued", created_at=now - timedelta(minutes=31))
    waiting = answer("queued", created_at=now - timedelta(minutes=5))
    reconcile_runs()  # the beat task, with its other passes
    states = {g.pk: (g.status, g.error) for g in Generation.objects.all()}
    assert states[lost.pk] == ("failed", f"the worker answering it stopped without an answer (still running after {ANSWER_TIME_LIMIT_S} s): ask again")
    # Most likely no worker serves the answers queue: the message says which worker to start.
    assert states[never_taken.pk] == ("failed", "no worker took it within 30 minutes: start the Studio's answers worker "
                                                f"(`celery -A studio worker -Q {settings.CELERY_TASK_DEFAULT_QUEUE}-answers -c 1`, as `make studio` does) "
                                                "if none runs, then ask again")
    assert states[answering.pk] == ("running", "") and states[waiting.pk] == ("queued", "")


def test_a_worker_taking_an_answer_records_when(project, users, runs_dir, monkeypatch):
    run = trained_run(project, users["owner"], runs_dir)
    generation = Generation.objects.create(run=run, checkpoint=None, prompt="Hi", max_new_tokens=8, temperature=0)
    generate(generation.pk)  # its weights are gone: failed at once, but taken first
    generation.refresh_from_db()
    assert generation.status == "failed" and generation.started_at is not None and generation.started_at <= generation.finished_at


def test_an_answer_holding_a_nul_is_stored_not_left_generating(project, users, runs_dir):
    # An untrained model's tokens decode to any bytes, a NUL among them, which PostgreSQL stores in no JSON.
    run = trained_run(project, users["owner"], runs_dir)
    generation = Generation.objects.create(run=run, checkpoint=run.checkpoints.get(), prompt="Hi", max_new_tokens=8, temperature=0)
    finish(generation, [{"model": "trained", "text": "a\x00b", "tokens": 3}], "")
    generation.refresh_from_db()
    assert generation.status == "completed" and generation.outputs == [{"model": "trained", "text": "a\ufffdb", "tokens": 3}]
