"""The dstack backend against a real `dstack server` 0.22.5 on 127.0.0.1 (no fleets: every GPU run
finds no capacity). What the server holds is read back with dstack's own client."""
from __future__ import annotations

import json
import time

import pytest

from studio import crypto
from studio.services import delete_secret
from tests.conftest import assert_error, sft_body, wait_for
from training import reconciler, services
from training.backends import get_backend
from training.backends.base import PollResult
from training.backends.connections import ENGINE_PACKAGES, job_name
from training.backends.dstack import map_run
from training.models import Checkpoint, ErrorCode, RunAttempt, Status, TrainingRun

pytestmark = pytest.mark.django_db


def dstack_body(**compute) -> dict:
    return sft_body(compute={"backend": "dstack", "accelerators": "GPU:1", **compute})


def start(api, **compute) -> TrainingRun:
    run_id = api.post("/api/training-runs", dstack_body(**compute)).json()["id"]
    r = api.post(f"/api/training-runs/{run_id}/start")
    assert r.status_code == 202, r.content
    assert services.dispatch(run_id)  # what the dispatch_run task does after START commits
    return TrainingRun.objects.get(pk=run_id)


def reconcile_until(run: TrainingRun, predicate, timeout: float = 60, message: str = "the run's state") -> TrainingRun:
    def check():
        reconciler.reconcile_run(run.pk)
        current = TrainingRun.objects.get(pk=run.pk)
        return current if predicate(current) else None

    return wait_for(check, timeout, interval=0.5, message=message)


def server_run(dstack_api, name: str):
    return dstack_api.client.runs.get(dstack_api.project, name)


def studio_runs_on_server(dstack_api, run_id: int) -> list[str]:
    runs = dstack_api.client.runs.list(project_name=dstack_api.project, repo_id=None, limit=100)
    prefix = f"studio-r{run_id}-"
    return [r.run_spec.run_name for r in runs if r.run_spec.run_name.startswith(prefix)]


def test_gpu_run_with_no_capacity_fails_capacity_unavailable_with_dstacks_message(api, dstack_connection, dstack_api):
    run = start(api)
    assert run.status == Status.PROVISIONING and run.backend_job_id == job_name(run.pk, run.attempt)
    run = reconcile_until(run, lambda r: r.status == Status.FAILED, 60, message="dstack to fail the run")
    assert run.error["code"] == ErrorCode.CAPACITY_UNAVAILABLE == "CAPACITY_UNAVAILABLE"
    assert "No matching fleet found" in run.error["message"], run.error  # dstack's own words
    assert server_run(dstack_api, run.backend_job_id).status.value == "failed"
    # It never got a GPU, so it costs nothing.
    assert run.cost == 0 and run.gpu_leased_at is None and run.gpu_seconds == 0


def test_the_task_on_the_server_has_the_runs_resources_spot_policy_region_and_env(api, dstack_connection, dstack_api, settings):
    dstack_connection.backends = ["aws"]
    dstack_connection.retry_window_seconds = 600  # keep it pending while we read it back
    dstack_connection.save()
    run = start(api, accelerators="A100-80GB:2", spot=True, region="us-east-1")
    spec = server_run(dstack_api, run.backend_job_id).run_spec
    conf = spec.configuration
    gpu = conf.resources.gpu
    assert gpu.name == ["A100"] and gpu.count.min == gpu.count.max == 2 and str(gpu.memory.min) == "80GB"
    assert conf.spot_policy.value == "spot"
    assert conf.regions == ["us-east-1"] and [b.value for b in conf.backends] == ["aws"]
    assert conf.retry.on_events[0].value == "no-capacity" and conf.retry.duration == 600
    # SFT on two GPUs trains on both: torchrun, one engine process a GPU.
    assert conf.commands[-2:] == ["cd /workflow/studio", "python -m training.engine.launch --standalone --nproc_per_node 2 -m training.engine --spec /tmp/studio-run.json"]
    assert conf.commands[0].startswith("pip install -q torch==2.13.0 ")  # the trainer stack at the Studio's pins
    # The engine's source travels with the run, uploaded to the server from this checkout.
    assert sorted(a.path for a in spec.file_archives) == ["/workflow/studio/training/__init__.py", "/workflow/studio/training/engine"]
    env = dict(conf.env)
    assert env["STUDIO_INGEST_URL"] == f"{settings.STUDIO_PUBLIC_URL}/api/ingest/runs/{run.pk}"
    assert crypto.hash_token(env["STUDIO_INGEST_TOKEN"]) == run.ingest_token_hash  # this attempt's token
    engine_spec = json.loads(env["STUDIO_RUN_SPEC"])
    assert engine_spec["run_id"] == run.pk and engine_spec["attempt"] == run.attempt and engine_spec["method"] == "sft"
    assert engine_spec["ingest"]["token"] == env["STUDIO_INGEST_TOKEN"] and engine_spec["compute"]["accelerators"] == "A100-80GB:2"
    get_backend("dstack").stop(run.pk, run.attempt, run.backend_job_id)


def test_with_a_retry_window_the_run_stays_provisioning_and_stop_cancels_and_terminates(api, dstack_connection, dstack_api):
    dstack_connection.retry_window_seconds = 3600
    dstack_connection.save()
    run = start(api, accelerators="H100:8")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # dstack finds no capacity within a second; it must not fail the run
        reconciler.reconcile_run(run.pk)
        time.sleep(0.5)
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.error is None
    assert not server_run(dstack_api, run.backend_job_id).status.is_finished()

    r = api.post(f"/api/training-runs/{run.pk}/stop")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    services.stop_backend_job(run.pk, run.attempt, run.backend_job_id)  # what the stop_backend_job task does
    model = wait_for(lambda: (m := server_run(dstack_api, run.backend_job_id)).status.is_finished() and m, 60, message="dstack to terminate the run")
    assert model.status.value == "terminated" and model.termination_reason == "stopped_by_user"
    run.refresh_from_db()
    assert run.status == Status.CANCELLED


def test_a_lost_submit_is_adopted_not_duplicated(api, dstack_connection, dstack_api):
    """The worker died after dstack had the task but before its name was saved: the resubmission
    finds the task by its deterministic name and adopts it."""
    dstack_connection.retry_window_seconds = 600
    dstack_connection.save()
    run = start(api)
    name = run.backend_job_id
    TrainingRun.objects.filter(pk=run.pk).update(backend_job_id="", submit_started_at=run.submit_started_at.replace(year=2000))
    assert run.pk in reconciler.runs_to_resubmit()
    assert reconciler.resubmit(run.pk)
    run.refresh_from_db()
    assert run.backend_job_id == name and run.status == Status.PROVISIONING
    assert studio_runs_on_server(dstack_api, run.pk) == [name]
    assert not reconciler.resubmit(run.pk)  # nothing left to resubmit
    get_backend("dstack").stop(run.pk, run.attempt, name)


def test_a_submit_that_never_happened_is_submitted_once(api, dstack_connection, dstack_api):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.save()
    run_id = api.post("/api/training-runs", dstack_body()).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    # The claim happened (queued → provisioning, attempt 1), then the worker died before submitting.
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, start_requested_at=None,
                                                 provisioning_since="2000-01-01T00:00:00Z", submit_started_at="2000-01-01T00:00:00Z")
    assert reconciler.resubmit(run_id)
    assert not reconciler.resubmit(run_id)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.backend_job_id == job_name(run_id, 1)
    assert studio_runs_on_server(dstack_api, run_id) == [run.backend_job_id]
    get_backend("dstack").stop(run.pk, run.attempt, run.backend_job_id)


def test_a_spot_interruption_retries_from_the_last_checkpoint_within_the_budget(api, dstack_connection, dstack_api):
    dstack_connection.retry_window_seconds = 600
    dstack_connection.interruption_retries = 1
    dstack_connection.save()
    run = start(api, spot=True)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    Checkpoint.objects.create(run=run, attempt=1, step=40, path="/tmp/studio-output/checkpoint-40")
    run.refresh_from_db()
    first_job = run.backend_job_id

    reconciler.apply_poll(run, PollResult("interrupted", ErrorCode.CAPACITY_UNAVAILABLE, "dstack lost the machine (interrupted_by_no_capacity)"))
    run.refresh_from_db()
    assert run.status == Status.PROVISIONING and run.attempt == 2 and run.interruptions == 1
    assert run.backend_job_id == job_name(run.pk, 2)
    env = dict(server_run(dstack_api, run.backend_job_id).run_spec.configuration.env)
    assert json.loads(env["STUDIO_RUN_SPEC"])["resume_from"] == "/tmp/studio-output/checkpoint-40"
    assert crypto.hash_token(env["STUDIO_INGEST_TOKEN"]) == run.ingest_token_hash  # a new attempt, a new token
    assert sorted(studio_runs_on_server(dstack_api, run.pk)) == sorted([first_job, run.backend_job_id])
    # The retry is an attempt of its own, with the settings of the START it retries (the run cannot be edited meanwhile).
    assert [(a.attempt, a.config, a.compute) for a in RunAttempt.objects.filter(run=run)] == [(1, run.config, run.compute), (2, run.config, run.compute)]
    # The lost attempt ended interrupted; the retry is still going.
    assert [(a["attempt"], a["outcome"], a["ended_at"] is not None) for a in api.get(f"/api/training-runs/{run.pk}/attempts").json()] == [
        (1, "interrupted", True), (2, None, False)]

    # The budget (1) is spent: the next interruption fails the run.
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    run.refresh_from_db()
    reconciler.apply_poll(run, PollResult("interrupted", ErrorCode.CAPACITY_UNAVAILABLE, "dstack lost the machine (interrupted_by_no_capacity)"))
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "CAPACITY_UNAVAILABLE" and "budget of 1" in run.error["message"]
    assert [(a["outcome"], a["error_code"]) for a in api.get(f"/api/training-runs/{run.pk}/attempts").json()] == [
        ("interrupted", None), ("failed", "CAPACITY_UNAVAILABLE")]
    get_backend("dstack").stop(run.pk, run.attempt, run.backend_job_id)


def test_job_termination_reasons_map_to_seed_codes(api, dstack_connection, dstack_api):
    """map_run over the shape the real server returns, with the job's ending changed."""
    run = start(api)
    reconcile_until(run, lambda r: r.status == Status.FAILED, 60, message="dstack to fail the run")
    model = server_run(dstack_api, run.backend_job_id)

    def ending(reason: str, exit_status: int | None = None, run_reason: str = "job_failed"):
        changed = model.model_copy(deep=True)
        sub = changed.latest_job_submission or changed.jobs[0].job_submissions[-1]
        sub.termination_reason, sub.exit_status, sub.termination_reason_message = reason, exit_status, "details"
        changed.latest_job_submission = sub
        changed.termination_reason = run_reason
        return map_run(changed)

    assert ending("failed_to_start_due_to_no_capacity").error_code == "CAPACITY_UNAVAILABLE"
    assert "retrying" in ending("failed_to_start_due_to_no_capacity", run_reason="retry_limit_exceeded").message
    assert ending("interrupted_by_no_capacity").state == "interrupted"
    assert ending("instance_unreachable").state == "interrupted"
    assert (ending("container_exited_with_error", 1).state, ending("container_exited_with_error", 1).error_code) == ("failed", "training_error")
    assert ending("container_exited_with_error", 137).error_code == "oom"
    assert ending("creating_container_error").error_code == "provisioning_error"
    assert ending("done_by_runner", 0, "all_jobs_done").state == "succeeded"
    assert ending("terminated_by_user", None, "stopped_by_user").error_code == "provisioning_error"


# ---- pre-start checks (422, the run stays queued) ---------------------------------------------

def start_422(api, field: str, **compute) -> dict:
    run_id = api.post("/api/training-runs", dstack_body(**compute)).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, field)
    assert TrainingRun.objects.get(pk=run_id).status == Status.QUEUED
    return body


def test_start_without_a_dstack_connection_is_422(api):
    body = start_422(api, "compute.backend")
    assert "not configured" in json.dumps(body)


def test_start_without_the_token_secret_is_422(api, project, dstack_connection):
    delete_secret(project, "dstack-token")
    assert "token" in json.dumps(start_422(api, "compute.backend"))


def test_start_with_an_unreachable_server_is_422(api, dstack_connection):
    from tests.conftest import free_port

    dstack_connection.server_url = f"http://127.0.0.1:{free_port()}"
    dstack_connection.save()
    assert "cannot be reached" in json.dumps(start_422(api, "compute.backend"))


def test_start_with_a_wrong_token_is_422(api, project, dstack_connection):
    from studio.services import set_secret

    set_secret(project, "dstack-token", "not-the-token")
    assert "refused the token" in json.dumps(start_422(api, "compute.backend"))


def test_start_after_the_encryption_key_changed_is_422_naming_the_secret_to_set_again(api, dstack_connection, settings):
    # It was a 500: the token secret could not be decrypted and the ValueError escaped the check.
    settings.STUDIO_ENCRYPTION_KEY += "-rotated"
    message = json.dumps(start_422(api, "compute.backend"))
    assert "'dstack-token'" in message and "STUDIO_ENCRYPTION_KEY changed" in message and "set it again" in message


def test_the_connection_check_after_the_encryption_key_changed_records_which_secret_to_set_again(dstack_connection, settings):
    from training.backends.verify import verify_connection

    settings.STUDIO_ENCRYPTION_KEY += "-rotated"
    error = verify_connection(dstack_connection.pk)
    dstack_connection.refresh_from_db()
    assert "'dstack-token'" in error and "set it again" in error and dstack_connection.last_check_error == error


@pytest.fixture
def eager_tasks():
    """Celery runs a queued task in this process (the worker's code, without a worker subprocess)."""
    from studio.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_setting_or_deleting_a_secret_a_connection_names_checks_the_connection_again(api, project, dstack_connection, dstack_server,
                                                                                    django_capture_on_commit_callbacks, eager_tasks):
    # The admin kept showing a check's complaint after the secret it named was set: only saving the connection checked it.
    BackendConnection = type(dstack_connection)
    BackendConnection.objects.filter(pk=dstack_connection.pk).update(last_check_error="the dstack server refused the token")
    with django_capture_on_commit_callbacks(execute=True):
        assert api.put("/api/secrets/dstack-token", {"value": dstack_server.token}).status_code in (200, 204)
    dstack_connection.refresh_from_db()
    assert dstack_connection.last_check_error == "" and dstack_connection.last_checked_at is not None
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete("/api/secrets/dstack-token").status_code in (200, 204)
    dstack_connection.refresh_from_db()
    assert "credentials are not configured" in dstack_connection.last_check_error
    with django_capture_on_commit_callbacks(execute=True) as queued:
        assert api.put("/api/secrets/unrelated", {"value": "x"}).status_code in (200, 204)
    assert queued == []  # a secret no connection names checks nothing


def test_start_with_an_unknown_region_is_422(api, dstack_connection):
    dstack_connection.regions = ["us-east-1", "eu-west-1"]
    dstack_connection.save()
    assert "eu-west-1" in json.dumps(start_422(api, "compute.region", region="mars-1"))


def test_cpu_on_dstack_is_422(api, dstack_connection):
    start_422(api, "compute.accelerators", accelerators="CPU")


def test_the_jobs_install_the_trainer_stack_at_the_studios_pins():
    from pathlib import Path

    from training.backends import modal_app

    pins = {line.split("==")[0].lower(): line.strip() for line in (Path(__file__).resolve().parents[2] / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    for package in ENGINE_PACKAGES:
        assert pins[package.split("==")[0].lower()] == package, package
    assert tuple(modal_app.ENGINE_PACKAGES) == tuple(ENGINE_PACKAGES)


def test_verifying_a_connection_records_the_answer(dstack_connection):
    from training.backends.verify import verify_connection

    assert verify_connection(dstack_connection.pk) == ""
    dstack_connection.refresh_from_db()
    assert dstack_connection.last_checked_at is not None and dstack_connection.last_check_error == ""
    dstack_connection.dstack_project = "no-such-project"
    dstack_connection.save()
    error = verify_connection(dstack_connection.pk)
    dstack_connection.refresh_from_db()
    assert error and dstack_connection.last_check_error == error
