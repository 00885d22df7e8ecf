"""The Modal backend. Modal's cloud cannot run here (no emulator exists), so:
- a contract test pins the SDK surface the backend relies on (signatures, exception classes);
- the job body runs in-process with `.local()` and trains a tiny engine job to completion;
- status mapping runs through the real `FunctionCall` API with a narrow fake at the network
  boundary: the Modal client's gRPC stub (`FunctionGetOutputs`, `FunctionCallCancel`) answers with
  real protobuf messages. Everything above the stub is Modal's own code.
A live round trip runs only when MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are set."""
from __future__ import annotations

import inspect
import os

import modal
import modal.client
import modal.exception
import pytest
from google.protobuf import empty_pb2
from modal._serialization import serialize
from modal._utils.async_utils import synchronizer
from modal_proto import api_pb2

from studio.errors import Conflict
from studio.services import delete_secret, set_secret
from tests.conftest import assert_error, sft_body
from training import reconciler, services
from training.backends import get_backend, modal_app
from training.backends.modal import ModalBackend, modal_gpu, translate
from training.models import BackendConnection, ErrorCode, Status, TrainingRun

G = api_pb2.GenericResult


# ---- the SDK contract --------------------------------------------------------------------------

def test_the_modal_sdk_has_what_the_backend_calls():
    assert modal.__version__ == "1.6.4"
    assert [p for p in inspect.signature(modal.FunctionCall.from_id).parameters if p != "cls"] == ["function_call_id", "client"]
    get = inspect.signature(modal.FunctionCall.get).parameters
    assert "timeout" in get and "index" in get
    assert "terminate_containers" in inspect.signature(modal.FunctionCall.cancel).parameters
    from_name = inspect.signature(modal.Function.from_name).parameters
    assert {"app_name", "name", "environment_name", "client"} <= set(from_name)
    assert {"gpu", "env", "region"} <= set(inspect.signature(modal.Function.with_options).parameters)
    assert [p for p in inspect.signature(modal.Client.from_credentials).parameters if p != "cls"] == ["token_id", "token_secret"]
    for method in (modal.Function.spawn, modal.FunctionCall.get, modal.FunctionCall.cancel, modal.Client.from_credentials, modal.Function.hydrate):
        assert hasattr(method, "aio"), method
    for name in ("AuthError", "NotFoundError", "ConnectionError", "OutputExpiredError", "FunctionTimeoutError",
                 "InputCancellation", "InternalFailure", "RemoteError"):
        assert issubclass(getattr(modal.exception, name), BaseException), name
    # The unfinished-call signal is the builtin TimeoutError, not Modal's own TimeoutError.
    assert modal.exception.TimeoutError is not TimeoutError


def test_the_app_defines_a_spot_and_an_on_demand_engine_function():
    assert modal_app.app.name == "studio-engine"
    for function in (modal_app.run_engine, modal_app.run_engine_on_demand):
        assert isinstance(function, modal.Function) and hasattr(function, "local") and hasattr(function.spawn, "aio")
    assert modal_gpu("GPU:1") == "any" and modal_gpu("GPU:2") == "any:2" and modal_gpu("H100:8") == "H100:8" and modal_gpu("L4") == "L4"


def test_without_a_token_the_sdk_refuses_at_once_and_it_maps_to_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.modal.toml
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(modal.exception.AuthError) as caught:
        modal.Function.from_name(modal_app.APP_NAME, modal_app.FUNCTION_SPOT).spawn({})
    assert "Modal refused the credentials" in str(translate(caught.value))


# ---- credentials per project -------------------------------------------------------------------

@pytest.fixture
def modal_connection(db, project, settings):
    settings.STUDIO_PUBLIC_URL = "https://studio.example.com"  # where a job in Modal's cloud reports (START refuses a loopback one)
    set_secret(project, "modal-token-id", "ak-test")
    set_secret(project, "modal-token-secret", "as-test")
    return BackendConnection.objects.create(project=project, backend="modal", token_id_secret="modal-token-id", token_secret="modal-token-secret", request_timeout_seconds=5)


def modal_body(**compute) -> dict:
    return sft_body(compute={"backend": "modal", "accelerators": "GPU:1", **compute})


@pytest.mark.django_db
def test_start_without_a_modal_connection_is_422(api):
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "compute.backend")
    assert TrainingRun.objects.get(pk=run_id).status == Status.QUEUED


@pytest.mark.django_db
def test_a_run_whose_credentials_are_gone_at_dispatch_ends_provisioning_error(api, project, modal_connection):
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    delete_secret(project, "modal-token-secret")  # removed between START and the worker's submit
    services.dispatch(run_id)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.FAILED and run.error["code"] == ErrorCode.PROVISIONING_ERROR
    assert "Modal credentials are not configured for project acme" in run.error["message"], run.error


@pytest.mark.django_db
def test_start_refuses_a_loopback_report_address_a_modal_job_cannot_reach(api, modal_connection, settings):
    # The job got STUDIO_INGEST_URL and HF_ENDPOINT on 127.0.0.1, never reported, and failed on a lost heartbeat.
    settings.STUDIO_PUBLIC_URL = "http://127.0.0.1:8031"
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "compute.backend")
    assert "engines report to STUDIO_PUBLIC_URL (http://127.0.0.1:8031), which a Modal job on another machine cannot reach" in body["errors"][0]["message"]
    settings.STUDIO_PUBLIC_URL = "http://localhost:8000"
    assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "compute.backend")


@pytest.mark.django_db
def test_start_reports_the_last_failed_verification(api, modal_connection):
    modal_connection.last_check_error = "Modal refused the credentials"
    modal_connection.save()
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "compute.backend")
    assert "refused the credentials" in str(body)


@pytest.mark.django_db
def test_the_connection_check_after_the_encryption_key_changed_names_the_secret_and_start_says_it(api, modal_connection, settings):
    # The check raised a ValueError in the worker and left last_check_error stale; START then said nothing of it.
    from training.backends.verify import verify_connection

    settings.STUDIO_ENCRYPTION_KEY += "-rotated"
    error = verify_connection(modal_connection.pk)
    assert "'modal-token-id'" in error and "STUDIO_ENCRYPTION_KEY changed" in error and "set it again" in error
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "compute.backend")
    assert "'modal-token-id'" in str(body)


@pytest.mark.django_db
def test_a_connection_check_modal_does_not_answer_says_what_was_asked_how_long_and_what_to_check(modal_connection, monkeypatch):
    # It said only "Modal did not answer in time (timeout)". Modal's cloud cannot run here: make_client is the boundary.
    from training.backends.verify import verify_connection

    async def hangs(self, token_id, token_secret):
        import asyncio

        await asyncio.sleep(3600)

    monkeypatch.setattr(ModalBackend, "make_client", hangs)
    BackendConnection.objects.filter(pk=modal_connection.pk).update(request_timeout_seconds=1)
    error = verify_connection(modal_connection.pk)
    assert "api.modal.com" in error and "within 1 s" in error and "request_timeout_seconds" in error
    assert "token id and secret" in error and "HTTPS_PROXY" in error and "status.modal.com" in error
    modal_connection.refresh_from_db()
    assert modal_connection.last_check_error == error


# ---- status mapping through the real FunctionCall API, fake gRPC stub -------------------------

class FakeStub:
    """Modal's control-plane gRPC stub: the network boundary, and the only fake here."""

    def __init__(self, outputs: api_pb2.FunctionGetOutputsResponse | None = None) -> None:
        self.outputs, self.requests, self.clients = outputs, [], []

    async def FunctionGetOutputs(self, request, **kwargs):  # noqa: N802 - the RPC's name
        self.requests.append(request)
        return self.outputs

    async def FunctionCallCancel(self, request, **kwargs):  # noqa: N802
        self.requests.append(request)
        return empty_pb2.Empty()


def outputs(**result) -> api_pb2.FunctionGetOutputsResponse:
    return api_pb2.FunctionGetOutputsResponse(outputs=[api_pb2.FunctionGetOutputsItem(result=G(**result), data_format=api_pb2.DATA_FORMAT_PICKLE)])


@pytest.fixture
def fake_modal(monkeypatch):
    """Every Modal client the backend makes is a real `modal.Client` whose stub is a FakeStub."""
    stub = FakeStub()

    async def make_client(self, token_id, token_secret):
        assert (token_id, token_secret) == ("ak-test", "as-test")  # the project's own credentials
        impl = modal.client._Client("https://modal.invalid", api_pb2.CLIENT_TYPE_CLIENT, (token_id, token_secret))
        impl._control_plane_stub, impl._opened = stub, True
        stub.clients.append(impl)
        return synchronizer._translate_out(impl)

    monkeypatch.setattr(ModalBackend, "make_client", make_client)
    return stub


@pytest.fixture
def modal_run(api, modal_connection):
    run_id = api.post("/api/training-runs", modal_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING, attempt=1, backend_job_id="fc-01TEST")
    return TrainingRun.objects.get(pk=run_id)


@pytest.mark.django_db
@pytest.mark.parametrize(("answer", "state", "code"), [
    (api_pb2.FunctionGetOutputsResponse(outputs=[], num_unfinished_inputs=1), "pending", None),
    (outputs(status=G.GENERIC_STATUS_SUCCESS, data=serialize({"returncode": 0, "signal": None, "log_tail": ["done"]})), "succeeded", None),
    (outputs(status=G.GENERIC_STATUS_SUCCESS, data=serialize({"returncode": 1, "signal": None, "log_tail": ["torch.OutOfMemoryError: CUDA out of memory"]})), "failed", "oom"),
    (outputs(status=G.GENERIC_STATUS_SUCCESS, data=serialize({"returncode": 1, "signal": None, "log_tail": ["ValueError: bad"]})), "failed", "training_error"),
    (outputs(status=G.GENERIC_STATUS_SUCCESS, data=serialize({"returncode": None, "signal": 9, "log_tail": []})), "failed", "oom"),
    (outputs(status=G.GENERIC_STATUS_TIMEOUT, exception="timed out"), "failed", "training_error"),
    (outputs(status=G.GENERIC_STATUS_FAILURE, exception="boom", data=serialize(RuntimeError("boom"))), "failed", "training_error"),
    (outputs(status=G.GENERIC_STATUS_INTERNAL_FAILURE, exception="worker lost"), "interrupted", "provisioning_error"),
    (api_pb2.FunctionGetOutputsResponse(outputs=[], num_unfinished_inputs=0), "gone", "provisioning_error"),
], ids=["unfinished", "completed", "cuda-oom", "error", "sigkill", "function-timeout", "exception", "internal-failure", "expired"])
def test_poll_maps_the_function_calls_answer(fake_modal, modal_run, answer, state, code):
    fake_modal.outputs = answer
    result = get_backend("modal").poll(modal_run)
    assert (result.state, result.error_code) == (state, code), result
    request = fake_modal.requests[-1]
    assert request.function_call_id == "fc-01TEST" and request.timeout == 0  # get(timeout=0): never blocks
    assert fake_modal.clients and all(c._closed for c in fake_modal.clients)  # each call closes its client


@pytest.mark.django_db
def test_a_completed_call_completes_the_run_through_the_reconciler(fake_modal, modal_run):
    fake_modal.outputs = outputs(status=G.GENERIC_STATUS_SUCCESS, data=serialize({"returncode": 0, "signal": None, "log_tail": ["done"]}))
    reconciler.reconcile_run(modal_run.pk)
    assert TrainingRun.objects.get(pk=modal_run.pk).status == Status.COMPLETED


@pytest.mark.django_db
def test_stop_cancels_the_call_and_its_containers(fake_modal, modal_run):
    get_backend("modal").stop(modal_run.pk, modal_run.attempt, modal_run.backend_job_id)
    request = fake_modal.requests[-1]
    assert isinstance(request, api_pb2.FunctionCallCancelRequest)
    assert request.function_call_id == "fc-01TEST" and request.terminate_containers


@pytest.mark.django_db
def test_a_run_deleted_right_after_stop_waits_for_its_call_to_be_cancelled(fake_modal, modal_run):
    services.stop_run(modal_run)  # its stop task is queued (on_commit never fires here)
    with pytest.raises(Conflict) as refused:
        services.delete_run(modal_run)
    assert "still stopping on its backend" in refused.value.errors[0].message
    services.stop_backend_job(modal_run.pk, modal_run.attempt, modal_run.backend_job_id)  # the stop task, which needs the run's connection
    assert any(isinstance(r, api_pb2.FunctionCallCancelRequest) and r.function_call_id == "fc-01TEST" for r in fake_modal.requests)
    services.delete_run(modal_run)
    assert not TrainingRun.objects.filter(pk=modal_run.pk).exists()


@pytest.mark.django_db
def test_a_modal_that_does_not_answer_backs_off_and_keeps_the_run(modal_run, monkeypatch):
    async def hangs(self, token_id, token_secret):
        import asyncio

        await asyncio.sleep(3600)

    monkeypatch.setattr(ModalBackend, "make_client", hangs)
    BackendConnection.objects.filter(backend="modal").update(request_timeout_seconds=1)
    reconciler.reconcile_run(modal_run.pk)
    run = TrainingRun.objects.get(pk=modal_run.pk)
    assert run.status == Status.RUNNING and run.poll_failures == 1 and run.next_poll_at is not None
    assert modal_run.pk not in reconciler.runs_to_reconcile()  # backed off


# ---- the job body ------------------------------------------------------------------------------

def test_the_job_body_runs_a_tiny_engine_job_to_completion(tiny_models, tmp_path):
    from training.backends.modal import result_of

    spec = {
        "run_id": 1, "attempt": 1, "method": "sft", "base_model": tiny_models["student"], "base_model_revision": None,
        "dataset": [{"path": tiny_models["data_sft"], "type": None, "revision": None}],
        "config": {"max_steps": 3, "learning_rate": 1e-3, "per_device_train_batch_size": 2, "max_length": 64},
        "compute": {"backend": "modal", "accelerators": "CPU"}, "ingest": None, "output_dir": str(tmp_path / "out"), "resume_from": None,
    }
    output = modal_app.run_engine.local(spec)
    assert output["returncode"] == 0, output["log_tail"][-30:]
    assert result_of(output).state == "succeeded"
    assert (tmp_path / "out").is_dir()


def test_the_job_body_runs_sft_on_several_gpus_under_torchrun(tiny_models, tmp_path, monkeypatch):
    assert modal_app.engine_argv("/s.json", {"method": "dpo", "compute": {"accelerators": "H100:8"}})[1:6] == [
        "-m", "training.engine.launch", "--standalone", "--nproc_per_node", "8"]
    monkeypatch.setenv("STUDIO_ENGINE_CPU_PROCESSES", "2")  # two CPU processes stand in for two GPUs
    spec = {
        "run_id": 1, "attempt": 1, "method": "sft", "base_model": tiny_models["student"], "base_model_revision": None,
        "dataset": [{"path": tiny_models["data_sft"], "type": None, "revision": None}],
        "config": {"max_steps": 2, "per_device_train_batch_size": 2, "max_length": 64},
        "compute": {"backend": "modal", "accelerators": "CPU"}, "ingest": None, "output_dir": str(tmp_path / "out"), "resume_from": None,
    }
    output = modal_app.run_engine.local(spec)
    assert output["returncode"] == 0, output["log_tail"][-30:]
    assert sum(line.startswith("data parallel: world size 2") for line in output["log_tail"]) == 1


# ---- live (only with credentials) --------------------------------------------------------------

@pytest.mark.skipif(not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")), reason="no Modal credentials (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET)")
@pytest.mark.django_db
def test_live_round_trip_on_modal(api, project):
    set_secret(project, "modal-token-id", os.environ["MODAL_TOKEN_ID"])
    set_secret(project, "modal-token-secret", os.environ["MODAL_TOKEN_SECRET"])
    BackendConnection.objects.create(project=project, backend="modal", token_id_secret="modal-token-id", token_secret="modal-token-secret",
                                     modal_environment=os.environ.get("MODAL_ENVIRONMENT", ""), request_timeout_seconds=60)
    run_id = api.post("/api/training-runs", modal_body(accelerators="T4")).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    services.dispatch(run_id)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.backend_job_id.startswith("fc-"), run.error
    assert get_backend("modal").poll(run).state in ("pending", "failed", "succeeded")
    get_backend("modal").stop(run.pk, run.attempt, run.backend_job_id)


@pytest.mark.parametrize(("public", "server", "refused"), [
    ("http://127.0.0.1:8000", "https://sky.dstack.ai", True),  # a cloud dstack's jobs cannot call back to this machine's loopback
    ("http://127.0.0.1:8000", "http://127.0.0.1:3000", False),  # a dstack server on this machine may run its jobs here too
    ("https://studio.example.com", "https://sky.dstack.ai", False),
    ("http://[::1]:8000", None, True),
])
def test_a_loopback_report_address_is_refused_unless_the_jobs_run_on_this_machine(settings, public, server, refused):
    from training.backends.connections import report_address_findings

    settings.STUDIO_PUBLIC_URL = public
    assert bool(report_address_findings("dstack" if server else "Modal", server)) is refused
