"""DELETE /api/training-runs/{id} and the run page's "Delete run": a run nothing needs goes with its
records and its folder; what it committed stays in the Data Hub; a run still needed is a 409 that
says why and what to do."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from django.test import Client

from datahub.commits import commit_files
from datahub.models import Branch, Commit, Repo
from datahub.services import commit_checkpoint
from studio import crypto
from studio.errors import Conflict, NotFound
from studio.models import AuditEvent
from studio.parsing import isolated
from tests.conftest import assert_error, sft_body
from training import services
from training.backends.local import run_dir
from training.models import Checkpoint, IngestBatch, LogLine, MetricPoint, Rollout, RunAttempt, Status, TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs_root(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.DATAHUB_ROOT = tmp_path / "hub"
    return settings.STUDIO_RUNS_DIR


def ended_run(api, status=Status.FAILED, committed=True, **body) -> TrainingRun:
    """A run as an attempt leaves it: its series, a checkpoint in its folder and an ended status;
    `committed`, the checkpoint is committed to the run's branch (by the task the ingest enqueues)."""
    run_id = api.post("/api/training-runs", sft_body(**body)).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=status, attempt=1, ingest_token_hash=crypto.hash_token("ing_old"))
    run = TrainingRun.objects.get(pk=run_id)
    folder = run_dir(run_id, 1) / "output" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    MetricPoint.objects.create(run=run, key="loss", step=1, value=0.5)
    LogLine.objects.create(run=run, attempt=1, line="step 1")
    Rollout.objects.create(run=run, step=1, prompt="p", completion="c", reward=1.0)
    IngestBatch.objects.create(run=run, batch_id="b1")
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=2, path=str(folder))
    if committed:
        assert commit_checkpoint(checkpoint.pk) is not None
    return run


def test_a_deleted_run_goes_with_its_records_and_folder_and_its_branch_can_go_after(api, runs_root, django_capture_on_commit_callbacks):
    run = ended_run(api)
    repo = f"experiment-{run.experiment.slug}"
    assert_error(api.delete(f"/api/hub/repos/{repo}/branches/run-{run.pk}"), 409, "branch")  # held while the run exists
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/training-runs/{run.pk}")
    assert response.status_code == 204, response.content
    assert_error(api.get(f"/api/training-runs/{run.pk}"), 404)
    for model in (MetricPoint, LogLine, Rollout, IngestBatch, Checkpoint):
        assert not model.objects.filter(run_id=run.pk).exists(), model
    assert not (runs_root / str(run.pk)).exists()
    assert run.pk not in [r["id"] for r in api.get("/api/training-runs").json()["items"]]
    event = AuditEvent.objects.get(action=AuditEvent.Action.DELETED, target_type="trainingrun", target_id=str(run.pk))
    assert event.actor_name == "owner" and event.details == {"method": "sft", "status": "failed", "attempts": 1}
    # What it committed stays in the Data Hub, and its branch is now the user's to delete.
    branch = Branch.objects.get(repo__name=repo, name=f"run-{run.pk}")
    assert branch.head.message == "Checkpoint step 2, attempt 1"
    assert api.delete(f"/api/hub/repos/{repo}/branches/run-{run.pk}").status_code == 204
    # Its old engine's token writes nothing.
    late = Client().post(f"/api/ingest/runs/{run.pk}", data={"batch_id": "b2", "metrics": []}, content_type="application/json",
                         HTTP_AUTHORIZATION="Bearer ing_old")
    assert late.status_code == 403


@pytest.mark.parametrize("status, start_requested, says", [
    (Status.PROVISIONING, False, "STOP it first"),
    (Status.RUNNING, False, "STOP it first"),
    (Status.QUEUED, True, "withdraws the START"),
])
def test_a_live_run_is_refused_with_what_to_do(api, runs_root, status, start_requested, says):
    run = ended_run(api)
    TrainingRun.objects.filter(pk=run.pk).update(status=status, start_requested_at=run.created_at if start_requested else None)
    body = assert_error(api.delete(f"/api/training-runs/{run.pk}"), 409, "status")
    assert says in body["errors"][0]["message"]
    assert TrainingRun.objects.filter(pk=run.pk).exists() and MetricPoint.objects.filter(run=run).exists()
    assert (runs_root / str(run.pk)).is_dir()
    assert not AuditEvent.objects.filter(action=AuditEvent.Action.DELETED).exists()


def test_a_never_started_run_can_be_deleted_and_frees_its_experiment_repo(api, runs_root):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    repo = f"experiment-{TrainingRun.objects.get(pk=run_id).experiment.slug}"
    assert_error(api.delete(f"/api/hub/repos/{repo}"), 409, "name")  # a queued run holds its experiment repo
    assert api.delete(f"/api/training-runs/{run_id}").status_code == 204
    assert api.delete(f"/api/hub/repos/{repo}").status_code == 204


def test_a_run_deleted_before_it_started_takes_its_empty_branch_with_it(api, runs_root):
    doomed = api.post("/api/training-runs", sft_body(name="doomed")).json()["id"]
    kept = api.post("/api/training-runs", sft_body(name="kept")).json()["id"]
    repo = Repo.objects.get(name=f"experiment-{TrainingRun.objects.get(pk=doomed).experiment.slug}")
    commits = set(Commit.objects.filter(repo=repo).values_list("pk", flat=True))
    assert set(Branch.objects.filter(repo=repo).values_list("name", flat=True)) == {"main", f"run-{doomed}", f"run-{kept}"}
    assert api.delete(f"/api/training-runs/{doomed}").status_code == 204
    assert set(Branch.objects.filter(repo=repo).values_list("name", flat=True)) == {"main", f"run-{kept}"}
    assert set(Commit.objects.filter(repo=repo).values_list("pk", flat=True)) == commits  # a branch goes, its commits stay


def test_an_ended_run_that_committed_nothing_takes_its_branch_also_after_main_moved_on(api, runs_root):
    run = ended_run(api, committed=False)
    repo = Repo.objects.get(name=f"experiment-{run.experiment.slug}")
    commit_files(repo, "main", {"NOTES.md": b"later notes"}, message="Notes")  # main moves past where run-<id> started
    assert api.delete(f"/api/training-runs/{run.pk}").status_code == 204
    assert not Branch.objects.filter(repo=repo, name=f"run-{run.pk}").exists()
    assert Branch.objects.get(repo=repo, name="main").head.message == "Notes"


def test_an_empty_run_branch_that_a_live_run_reads_stays(api, runs_root):
    run_id = api.post("/api/training-runs", sft_body(name="source")).json()["id"]
    repo = f"experiment-{TrainingRun.objects.get(pk=run_id).experiment.slug}"
    reader = api.post("/api/training-runs", sft_body(name="reader", dataset=f"{repo}@run-{run_id}"))
    assert reader.status_code == 201, reader.content
    assert api.delete(f"/api/training-runs/{run_id}").status_code == 204
    assert Branch.objects.filter(repo__name=repo, name=f"run-{run_id}").exists()


def test_a_run_another_was_resumed_from_is_refused_until_that_one_is_deleted(api, runs_root):
    parent = ended_run(api, status=Status.COMPLETED)
    child = api.post(f"/api/training-runs/{parent.pk}/checkpoints/2/resume").json()
    body = assert_error(api.delete(f"/api/training-runs/{parent.pk}"), 409, "children")
    assert f"run #{child['id']}" in body["errors"][0]["message"] and "step 2" in body["errors"][0]["message"]
    assert api.delete(f"/api/training-runs/{child['id']}").status_code == 204
    assert api.delete(f"/api/training-runs/{parent.pk}").status_code == 204


def test_a_merge_in_flight_is_refused(api, runs_root):
    from django.utils import timezone

    run = ended_run(api, status=Status.COMPLETED)
    Checkpoint.objects.filter(run=run, step=2).update(merge_requested_at=timezone.now())
    body = assert_error(api.delete(f"/api/training-runs/{run.pk}"), 409, "checkpoints")
    assert "step 2 is being merged" in body["errors"][0]["message"]


def test_a_local_engine_still_exiting_is_refused_until_it_is_gone(api, runs_root):
    run = ended_run(api, status=Status.CANCELLED)
    # A real process group that names the attempt's folder, as the runner's (a bare number could be another program's).
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir(run.pk, 1))], start_new_session=True)
    try:
        TrainingRun.objects.filter(pk=run.pk).update(backend_job_id=f"{socket.gethostname()}:{engine.pid}")
        body = assert_error(api.delete(f"/api/training-runs/{run.pk}"), 409, "status")
        assert "still exiting" in body["errors"][0]["message"]
    finally:
        engine.kill()
        engine.wait()
    assert api.delete(f"/api/training-runs/{run.pk}").status_code == 204


def test_a_run_just_stopped_is_refused_until_its_backend_stop_has_run(api, runs_root):
    # The stop task reads the run's row; deleted before it ran, a remote GPU job would never be stopped.
    run = ended_run(api, status=Status.RUNNING)
    assert api.post(f"/api/training-runs/{run.pk}/stop").status_code == 200  # its stop task is queued (on_commit never fires here)
    body = assert_error(api.delete(f"/api/training-runs/{run.pk}"), 409, "status")
    assert "still stopping on its backend: try again in a few seconds" in body["errors"][0]["message"]
    services.stop_backend_job(run.pk, 1, "")  # the task
    assert not RunAttempt.objects.filter(run=run, stop_requested_at__isnull=False).exists()
    assert api.delete(f"/api/training-runs/{run.pk}").status_code == 204


def stopped_then_running_again(api) -> TrainingRun:
    """A run whose attempt 1 was stopped (its stop task keeps asking a backend that is down) and that
    was started again: attempt 2 runs, as a START and a worker's claim leave it."""
    run = ended_run(api, status=Status.RUNNING)
    services.stop_run(run)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=2)
    return TrainingRun.objects.get(pk=run.pk)


def assert_delete_refused_as_stopping(run: TrainingRun) -> None:
    with pytest.raises(Conflict) as refused:
        services.delete_run(run)
    assert "still stopping on its backend" in refused.value.errors[0].message


def test_an_earlier_attempts_stop_still_retrying_holds_delete_and_its_end_frees_the_restarted_run(api, runs_root):
    # QA: attempt 1's stop task, ending after a restart, left the run's one mark: DELETE was a 409 for 7 hours.
    run = stopped_then_running_again(api)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)  # attempt 2 finished on its own: nothing of it to stop
    assert_delete_refused_as_stopping(run)  # attempt 1's job may still run
    services.stop_backend_job(run.pk, 1, "")  # attempt 1's task at last
    services.delete_run(run)
    assert not TrainingRun.objects.filter(pk=run.pk).exists()


def test_a_later_attempts_stop_does_not_free_a_run_whose_earlier_attempt_is_still_stopping(api, runs_root):
    run = stopped_then_running_again(api)
    services.stop_run(run)
    services.stop_backend_job(run.pk, 2, "")  # attempt 2's task is done; attempt 1's still asks its backend
    assert_delete_refused_as_stopping(run)
    services.stop_backend_job(run.pk, 1, "")
    services.delete_run(run)
    assert not TrainingRun.objects.filter(pk=run.pk).exists()


def test_who_may_delete(api, api_as, runs_root):
    run = ended_run(api)
    assert_error(api_as("viewer").delete(f"/api/training-runs/{run.pk}"), 403)
    assert_error(api_as("outsider").delete(f"/api/training-runs/{run.pk}"), 404)
    assert_error(api_as(None).delete(f"/api/training-runs/{run.pk}"), 401)
    assert TrainingRun.objects.filter(pk=run.pk).exists()
    assert api_as("member").delete(f"/api/training-runs/{run.pk}").status_code == 204
    assert_error(api.delete(f"/api/training-runs/{run.pk}"), 404)


def test_an_action_on_a_run_deleted_meanwhile_is_a_404(api, runs_root):
    run = ended_run(api)
    stale = TrainingRun.objects.get(pk=run.pk)
    services.delete_run(run)
    for action in (services.start_run, services.stop_run, services.delete_run, lambda r: services.update_run(r, {"name": "x"})):
        with pytest.raises(NotFound):
            action(stale)


# ---- the run page ------------------------------------------------------------------------------

def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_deletes_and_lands_on_the_runs_list_saying_what_stays(api, users, runs_root):
    run = ended_run(api, name="doomed run")
    client = client_for(users["owner"])
    assert 'id="delete-btn"' in client.get(f"/training/runs/{run.pk}/").content.decode()
    viewer_page = client_for(users["viewer"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert 'id="delete-btn"' not in viewer_page
    assert client_for(users["viewer"]).post(f"/training/runs/{run.pk}/delete").status_code == 403
    response = client.post(f"/training/runs/{run.pk}/delete", HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response.headers["HX-Redirect"] == "/training/"
    listing = client.get("/training/").content.decode()
    assert f"Run #{run.pk} ({isolated('doomed run')}) was deleted" in listing and f"What it committed stays on branch {isolated(f'run-{run.pk}')}" in listing
    assert not TrainingRun.objects.filter(pk=run.pk).exists()
    assert Branch.objects.filter(name=f"run-{run.pk}").exists()


def test_the_run_page_says_the_empty_branch_of_a_deleted_run_went_too(api, users, runs_root):
    run_id = api.post("/api/training-runs", sft_body(name="never started")).json()["id"]
    client = client_for(users["owner"])
    response = client.post(f"/training/runs/{run_id}/delete", HTTP_HX_REQUEST="true")
    assert response.status_code == 204
    listing = client.get("/training/").content.decode()
    assert f"Run #{run_id} ({isolated('never started')}) was deleted. It had committed nothing, so its branch {isolated(f'run-{run_id}')}" in listing
    assert not Branch.objects.filter(name=f"run-{run_id}").exists()


def test_the_run_page_shows_why_a_delete_was_refused_and_offers_none_while_live(api, users, runs_root):
    parent = ended_run(api, status=Status.COMPLETED)
    child = api.post(f"/api/training-runs/{parent.pk}/checkpoints/2/resume").json()
    client = client_for(users["owner"])
    response = client.post(f"/training/runs/{parent.pk}/delete", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and 'id="run-status"' in html and f"run #{child['id']}" in html
    assert "<code>children</code>" not in html  # the API's finding name is not a field on this page
    # Without JavaScript: back to the run page with the refusal as a message.
    followed = client.post(f"/training/runs/{parent.pk}/delete", follow=True).content.decode()
    assert "cannot be deleted yet" in followed and f"run #{child['id']}" in followed
    TrainingRun.objects.filter(pk=parent.pk).update(status=Status.RUNNING)
    assert 'id="delete-btn"' not in client.get(f"/training/runs/{parent.pk}/").content.decode()
