"""The dstack backend: each attempt of a run is a dstack Task on the project's dstack server.

It talks to the server through dstack's Python API (the client-only `dstack` package, which
co-installs with the Studio's pins; the server itself lives in its own virtualenv). The task runs the
engine on its spec (passed in the environment with the ingest URL and this attempt's token), asks
for the run's accelerators, spot policy and region, and — when the connection sets a retry window —
tells dstack to keep retrying while no capacity is found.

Every call has a timeout (the dstack client sets none) and runs in a Celery task, except `check`,
which makes one short call from START to tell the user that the server cannot be reached.
"""
from __future__ import annotations

import base64
import logging
import re
from typing import Any

import requests
from dstack.api import GPU, Client, ClientError, Resources, Task
from dstack.api.server import APIClient

from studio.errors import Finding
from training.backends import mapping
from training.backends.base import Backend, BackendError, BackendUnavailable, JobSpec, PollResult
from training.backends.connections import (
    connection_findings,
    connection_of_run,
    engine_commands,
    engine_files,
    job_env,
    job_name,
    secret_value,
)
from training.compute import Accelerators, accelerators_of
from training.models import BackendConnection, ErrorCode

log = logging.getLogger(__name__)
CHECK_TIMEOUT_SECONDS = 3
GPU_MEMORY_SUFFIX = re.compile(r"^(?P<name>.+?)-(?P<memory>\d+GB)$", re.IGNORECASE)
# Job termination reasons (dstack's JobTerminationReason values) and what they mean for a run.
INTERRUPTIONS = {"interrupted_by_no_capacity", "instance_unreachable", "instance_access_revoked"}
PROVISIONING_FAILURES = {
    "waiting_instance_limit_exceeded", "waiting_runner_limit_exceeded", "volume_error", "gateway_error",
    "creating_container_error", "executor_error", "ports_binding_failed",
}
STOPPED_UPSTREAM = {"stopped_by_user", "aborted_by_user"}
LEASED_JOB_STATUSES = {"provisioning", "pulling", "running"}


class _TimeoutAPIClient(APIClient):
    """dstack's low-level client with a timeout on every request (it has none of its own)."""

    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        super().__init__(base_url, token)
        self._timeout = timeout

    def _request(self, path: str, body=None, raise_for_status: bool = True, method: str = "POST", **kwargs):
        kwargs.setdefault("timeout", self._timeout)
        return super()._request(path, body, raise_for_status, method, **kwargs)


def client_for(conn: BackendConnection, timeout: float | None = None) -> Client:
    token = secret_value(conn, "token_secret", "dstack token")
    api = _TimeoutAPIClient(conn.server_url, token, timeout or conn.request_timeout_seconds)
    return Client(api_client=api, project_name=conn.dstack_project or "main")


def translate(exc: Exception, conn: BackendConnection) -> BackendError:
    """dstack client and transport errors → BackendUnavailable (transient) or BackendError."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, requests.exceptions.RequestException) or "Failed to connect" in str(exc):
        return BackendUnavailable(f"the dstack server at {conn.server_url} cannot be reached: {exc}")
    if isinstance(exc, ClientError) and "denied" in str(exc):
        return BackendError(f"the dstack server at {conn.server_url} refused the token: check the connection's token secret")
    return BackendError(f"dstack: {exc}")


def gpu_spec(accel: Accelerators) -> GPU | None:
    """`GPU:2` → any 2 GPUs; `H100:8` → 8 H100; `A100-80GB:2` → 2 A100 with 80GB each."""
    if accel.is_cpu:
        return None
    if accel.gpu_type is None:
        return GPU(count=accel.count)
    match = GPU_MEMORY_SUFFIX.match(accel.gpu_type)
    if match:
        return GPU(name=[match["name"]], memory=match["memory"], count=accel.count)
    return GPU(name=[accel.gpu_type], count=accel.count)


def task_for(job: JobSpec, conn: BackendConnection) -> Task:
    compute = job.compute or {}
    fields: dict[str, Any] = {
        "name": job_name(job.run_id, job.attempt),
        "commands": engine_commands(conn, job),
        "files": engine_files(),
        "env": job_env(job),
        "resources": Resources(gpu=gpu_spec(accelerators_of(compute))),
        "spot_policy": "spot" if compute.get("spot") else "on-demand",
    }
    if compute.get("region"):
        fields["regions"] = [compute["region"]]
    if conn.backends:
        fields["backends"] = list(conn.backends)
    if conn.image:
        fields["image"] = conn.image
    if conn.retry_window_seconds:
        # dstack keeps the run pending and tries again while no offer fits, up to the window.
        fields["retry"] = {"on_events": ["no-capacity"], "duration": int(conn.retry_window_seconds)}
    return Task(**fields)


def latest_submission(run):
    if run.latest_job_submission is not None:
        return run.latest_job_submission
    if run.jobs and run.jobs[0].job_submissions:
        return run.jobs[0].job_submissions[-1]
    return None


def map_run(run) -> PollResult:
    """dstack's run and job status → a PollResult (without the log tail; poll adds it)."""
    status = str(getattr(run.status, "value", run.status))
    sub = latest_submission(run)
    job_status = str(getattr(sub.status, "value", sub.status)) if sub else ""
    provisioning = sub.job_provisioning_data if sub else None
    leased = provisioning is not None and job_status in LEASED_JOB_STATUSES
    gpu_type = None
    if provisioning is not None and provisioning.instance_type.resources.gpus:
        gpu_type = provisioning.instance_type.resources.gpus[0].name.upper()
    if status not in ("terminated", "failed", "done"):
        # Still active (pending, submitted, provisioning, running, terminating). A job that found no
        # capacity shows it at once, but with a retry window the run itself stays pending.
        state = "running" if job_status == "running" else "pending"
        return PollResult(state, leased=leased, gpu_type=gpu_type, message=(sub.termination_reason_message or "") if sub else "")
    reason = (sub.termination_reason or "") if sub else ""
    message = ((sub.termination_reason_message or sub.error or "") if sub else "") or run.status_message or ""
    run_reason = run.termination_reason or ""
    if status == "done" or reason == "done_by_runner":
        return PollResult("succeeded", leased=False, gpu_type=gpu_type)
    if run_reason in STOPPED_UPSTREAM or reason in ("terminated_by_user", "aborted_by_user"):
        return mapping.provisioning_error("the dstack run was stopped outside the Studio (on the dstack server)")
    if reason == "failed_to_start_due_to_no_capacity":
        retried = " (after retrying for the connection's retry window)" if run_reason == "retry_limit_exceeded" else ""
        return mapping.capacity_unavailable(f"dstack found no capacity for this run{retried}: {message or 'no offer matched'}")
    if reason in INTERRUPTIONS:
        code = ErrorCode.CAPACITY_UNAVAILABLE if reason == "interrupted_by_no_capacity" else ErrorCode.PROVISIONING_ERROR
        return PollResult("interrupted", code, f"dstack lost the machine ({reason}): {message}".rstrip(": "), leased=False, gpu_type=gpu_type)
    if reason == "container_exited_with_error":
        exit_status = sub.exit_status if sub and sub.exit_status is not None else 1
        return mapping.exit_result(exit_status, None, [])
    if reason == "max_duration_exceeded":
        return PollResult("failed", ErrorCode.TRAINING_ERROR, "the dstack run exceeded its max_duration")
    if reason in PROVISIONING_FAILURES or not reason:
        detail = f"{reason}: {message}" if reason else (message or run_reason or "failed")
        return mapping.provisioning_error(f"dstack could not run the job ({detail})")
    return mapping.provisioning_error(f"dstack ended the job ({reason}: {message})".replace(": )", ")"))


def reachability_findings(conn: BackendConnection) -> list[Finding]:
    """One request from START, with a short timeout and no retries (dstack's client retries a
    refused connection three times a second apart): the same endpoint as the client's
    `projects.get`, POST /api/projects/{project}/get, which checks the token and the project."""
    try:
        token = secret_value(conn, "token_secret", "dstack token")
        project = conn.dstack_project or "main"
        response = requests.post(f"{conn.server_url.rstrip('/')}/api/projects/{project}/get",
                                 headers={"Authorization": f"Bearer {token}"}, timeout=CHECK_TIMEOUT_SECONDS)
    except BackendError as exc:
        return [Finding("compute.backend", str(exc))]
    except requests.exceptions.RequestException as exc:
        return [Finding("compute.backend", f"the dstack server at {conn.server_url} cannot be reached ({type(exc).__name__}): try again when it is up, or use another backend")]
    if response.status_code in (401, 403):
        return [Finding("compute.backend", f"the dstack server at {conn.server_url} refused the token: an owner checks the connection's token secret")]
    if response.status_code != 200:
        return [Finding("compute.backend", f"the dstack server at {conn.server_url} has no project {project!r} for this token (HTTP {response.status_code}): an owner checks the connection")]
    return []


class DstackBackend(Backend):
    name = "dstack"
    SECRETS = {"token_secret": "dstack token"}

    def check(self, project, compute: dict) -> list[Finding]:
        conn, findings = connection_findings(project, self.name, compute, self.SECRETS)
        if conn is None or findings:
            return findings
        if not conn.server_url:
            return [Finding("compute.backend", "the dstack connection has no server URL: an owner sets it in the admin")]
        return reachability_findings(conn)

    def image_has(self, module: str) -> bool:
        from training.validation import remote_image_has

        return remote_image_has(module)

    def verify(self, conn: BackendConnection) -> None:
        try:
            client_for(conn).client.projects.get(conn.dstack_project or "main")
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, conn) from exc

    def _conn(self, run_id: int) -> BackendConnection:
        return connection_of_run(run_id, self.name)

    def submit(self, job: JobSpec) -> str:
        conn = self._conn(job.run_id)
        task = task_for(job, conn)
        try:
            client = client_for(conn)
            run = client.runs.apply_configuration(task, reserve_ports=False)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, conn) from exc
        return run.name

    def _get(self, conn: BackendConnection, name: str):
        """The server's RunModel, or None when it has no run by that name."""
        try:
            return client_for(conn).client.runs.get(conn.dstack_project or "main", name)
        except ClientError as exc:
            if getattr(exc, "code", None) == "resource_not_exists":
                return None
            raise translate(exc, conn) from exc
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, conn) from exc

    def poll(self, run) -> PollResult:
        conn = self._conn(run.pk)
        model = self._get(conn, run.backend_job_id)
        if model is None:
            return PollResult("gone", ErrorCode.PROVISIONING_ERROR, f"the dstack server has no run {run.backend_job_id} any more")
        result = map_run(model)
        if result.state in ("failed", "succeeded", "interrupted"):
            tail = self._tail(conn, model)
            result.log_tail = tail
            if result.state == "failed" and result.error_code == ErrorCode.TRAINING_ERROR and mapping.oom_in(tail):
                result = mapping.exit_result(1, None, tail)
        return result

    def stop(self, run_id: int, attempt: int, job_id: str) -> None:
        conn = self._conn(run_id)
        try:
            run = client_for(conn).runs.get(job_id)
            if run is not None and not run.status.is_finished():
                run.stop()
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, conn) from exc

    def find_job(self, run_id: int, attempt: int) -> str | None:
        conn = self._conn(run_id)
        name = job_name(run_id, attempt)
        return name if self._get(conn, name) is not None else None

    def logs(self, run, tail: int = mapping.LOG_TAIL_LINES) -> list[str]:
        if not run.backend_job_id:
            return []
        try:
            conn = self._conn(run.pk)
            model = self._get(conn, run.backend_job_id)
            return self._tail(conn, model, tail) if model is not None else []
        except BackendError as exc:
            log.warning("dstack logs of run %s: %s", run.pk, exc)
            return []

    def _tail(self, conn: BackendConnection, model, n: int = mapping.LOG_TAIL_LINES) -> list[str]:
        """The job's last n log lines (dstack's logs/poll, newest first, then reversed)."""
        from dstack._internal.server.schemas.logs import PollLogsRequest

        sub = latest_submission(model)
        if sub is None:
            return []
        try:
            resp = client_for(conn).client.logs.poll(
                conn.dstack_project or "main",
                PollLogsRequest(run_name=model.run_spec.run_name, job_submission_id=sub.id, descending=True, limit=min(n, 1000)),
            )
        except Exception as exc:  # noqa: BLE001 - logs are best effort; the state is what matters
            log.warning("dstack logs of %s: %s", model.run_spec.run_name, exc)
            return []
        text = "".join(base64.b64decode(entry.message).decode(errors="replace") for entry in reversed(resp.logs))
        return text.splitlines()[-n:]
