"""The Modal backend: each attempt of a run is a call of the deployed `studio-engine` app
(training/backends/modal_app.py) on the GPU the run asked for.

submit = `Function.spawn` (the call id is the job id); poll = `FunctionCall.from_id(id).get(timeout=0)`
(the builtin TimeoutError means "not finished"); STOP = `FunctionCall.cancel`; logs = the call's log
tail. Credentials are per project (token id and secret in the project's secret store).

Every Modal call runs in a Celery task, never in a web request, and under a timeout: Modal's client
retries a wrong token or an unreachable server for about a minute. So `check` (called at START)
only reads the configuration and the result of the last verification task.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import modal
import modal.config
import modal.exception

from studio.errors import Finding
from training.backends import mapping
from training.backends.base import Backend, BackendError, BackendUnavailable, JobSpec, PollResult
from training.backends.connections import connection_findings, connection_of_run, job_env, secret_value
from training.backends.modal_app import APP_NAME, FUNCTION_ON_DEMAND, FUNCTION_SPOT
from training.compute import accelerators_of
from training.models import BackendConnection, ErrorCode

log = logging.getLogger(__name__)
# Modal's names for the GPU types whose Studio spelling differs.
MODAL_GPU_NAMES = {"A100-40GB": "A100-40GB", "A100-80GB": "A100-80GB", "H100-80GB": "H100", "A10G": "A10G"}


def modal_gpu(accelerators: str | None) -> str:
    """`GPU:2` → "any:2"; `H100:8` → "H100:8"; `L4` → "L4"."""
    accel = accelerators_of({"accelerators": accelerators or "GPU:1"})
    name = "any" if accel.gpu_type is None else MODAL_GPU_NAMES.get(accel.gpu_type, accel.gpu_type)
    return name if accel.count == 1 else f"{name}:{accel.count}"


def translate(exc: BaseException) -> BackendError:
    """Modal SDK errors → BackendError (the run fails provisioning_error) or BackendUnavailable."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, modal.exception.AuthError):
        return BackendError(f"Modal refused the credentials ({exc}): check the connection's token id and secret")
    if isinstance(exc, modal.exception.NotFoundError):
        return BackendError(f"Modal has no deployed {APP_NAME} app in this workspace/environment ({exc}): deploy it with `modal deploy training/backends/modal_app.py`")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return BackendUnavailable(f"Modal did not answer in time ({str(exc) or 'timeout'})")
    if isinstance(exc, (modal.exception.ConnectionError, OSError)):
        return BackendUnavailable(f"Modal cannot be reached: {exc}")
    return BackendError(f"Modal: {type(exc).__name__}: {exc}")


def no_answer(seconds: float) -> str:
    """What a call that timed out tells an operator: what was asked, how long we waited, what to check."""
    api = " or ".join(str(modal.config.config.get("server_url") or "https://api.modal.com").split(","))
    return (f"Modal's API ({api}) did not answer within {seconds:g} s (the connection's request_timeout_seconds): "
            f"check the connection's token id and secret (wrong ones can go unanswered rather than refused), that this "
            f"machine reaches {api} (a firewall, or a proxy: HTTPS_PROXY), and Modal's status at https://status.modal.com; "
            f"on a slow network raise request_timeout_seconds")


def result_of(output: Any) -> PollResult:
    """The job body's return value ({"returncode", "signal", "log_tail"}) → a PollResult."""
    if not isinstance(output, dict):
        return mapping.provisioning_error(f"the Modal job returned {type(output).__name__}, not the engine's exit")
    return mapping.exit_result(output.get("returncode"), output.get("signal"), list(output.get("log_tail") or []))


def error_result(exc: BaseException) -> PollResult:
    """An exception from `FunctionCall.get` → a PollResult (builtin TimeoutError is handled before)."""
    if isinstance(exc, modal.exception.OutputExpiredError):
        return PollResult("gone", ErrorCode.PROVISIONING_ERROR, "Modal no longer holds this call's result (it expired)")
    if isinstance(exc, modal.exception.FunctionTimeoutError):
        return PollResult("failed", ErrorCode.TRAINING_ERROR, f"the Modal job hit its time limit: {exc}")
    if isinstance(exc, modal.exception.InputCancellation):
        return PollResult("failed", ErrorCode.TRAINING_ERROR, "the Modal call was cancelled outside the Studio")
    if isinstance(exc, modal.exception.InternalFailure):
        return PollResult("interrupted", ErrorCode.PROVISIONING_ERROR, f"Modal lost the container: {exc}")
    if isinstance(exc, MemoryError):
        return PollResult("failed", ErrorCode.OOM, "the Modal job ran out of memory: use a smaller model or batch, or more GPUs")
    return PollResult("failed", ErrorCode.TRAINING_ERROR, f"the Modal job failed: {type(exc).__name__}: {exc}")


class ModalBackend(Backend):
    name = "modal"
    SECRETS = {"token_id_secret": "Modal token id", "token_secret": "Modal token secret"}

    def check(self, project, compute: dict) -> list[Finding]:
        conn, findings = connection_findings(project, self.name, compute, self.SECRETS)
        if conn is not None and not findings and conn.last_check_error:
            findings.append(Finding("compute.backend", f"the last check of the Modal connection failed: {conn.last_check_error}"))
        return findings

    def image_has(self, module: str) -> bool:
        from training.validation import remote_image_has

        return remote_image_has(module)

    # -- the calls; each one runs under asyncio.wait_for with the connection's timeout ----------

    def run(self, conn: BackendConnection, work, timeout: float | None = None):
        """Run `await work(client)` with a Modal client for this connection, under a timeout."""
        token_id = secret_value(conn, "token_id_secret", "Modal token id")
        token_secret = secret_value(conn, "token_secret", "Modal token secret")

        async def go():
            client = await self.make_client(token_id, token_secret)
            try:
                return await work(client)
            finally:
                await client.close.aio()  # its connections and background tasks end with the call, not at exit

        seconds = timeout or conn.request_timeout_seconds
        try:
            return asyncio.run(asyncio.wait_for(go(), seconds))
        except BackendError:
            raise
        except TimeoutError as exc:
            raise BackendUnavailable(no_answer(seconds)) from exc
        except Exception as exc:  # noqa: BLE001 - every SDK failure gets a Studio meaning
            raise translate(exc) from exc

    async def make_client(self, token_id: str, token_secret: str):
        """A Modal client on the project's credentials. Tests replace this to put a narrow fake at
        the gRPC boundary (the SDK objects above it stay real)."""
        return await modal.Client.from_credentials.aio(token_id, token_secret)

    def submit(self, job: JobSpec) -> str:
        conn = connection_of_run(job.run_id, self.name)
        compute = job.compute or {}
        env = job_env(job)
        spec = job.as_engine_spec()
        function_name = FUNCTION_SPOT if compute.get("spot") else FUNCTION_ON_DEMAND
        options: dict[str, Any] = {"gpu": modal_gpu(compute.get("accelerators")), "env": {k: v for k, v in env.items() if k != "STUDIO_RUN_SPEC"}}
        if compute.get("region"):
            options["region"] = compute["region"]

        async def work(client):
            function = modal.Function.from_name(APP_NAME, function_name, environment_name=conn.modal_environment or None, client=client)
            call = await function.with_options(**options).spawn.aio(spec)
            return call.object_id

        return self.run(conn, work)

    def poll(self, run) -> PollResult:
        conn = connection_of_run(run.pk, self.name)

        async def work(client):
            call = modal.FunctionCall.from_id(run.backend_job_id, client=client)
            try:
                return result_of(await call.get.aio(timeout=0))
            except TimeoutError:
                # Not finished. Modal does not say whether it is queued or running: the engine's
                # first heartbeat tells the reconciler the worker is up.
                return PollResult("pending")
            except modal.exception.AuthError:
                raise
            except modal.exception.ConnectionError:
                raise
            except Exception as exc:  # noqa: BLE001 - the job's own failure, mapped
                return error_result(exc)

        return self.run(conn, work)

    def stop(self, run_id: int, attempt: int, job_id: str) -> None:
        conn = connection_of_run(run_id, self.name)

        async def work(client):
            await modal.FunctionCall.from_id(job_id, client=client).cancel.aio(terminate_containers=True)

        self.run(conn, work)

    def logs(self, run, tail: int = mapping.LOG_TAIL_LINES) -> list[str]:
        if not run.backend_job_id:
            return []
        try:
            conn = connection_of_run(run.pk, self.name)

            async def work(client):
                call = modal.FunctionCall.from_id(run.backend_job_id, client=client)
                lines = []
                async for entry in call.logs.tail.aio(entries=tail):
                    lines.extend(str(entry.message).splitlines())
                return lines[-tail:]

            return self.run(conn, work)
        except BackendError as exc:
            log.warning("Modal logs of run %s: %s", run.pk, exc)
            return []

    def verify(self, conn: BackendConnection) -> None:
        """One authenticated lookup of the deployed app (a Celery task calls this)."""

        async def work(client):
            function = modal.Function.from_name(APP_NAME, FUNCTION_SPOT, environment_name=conn.modal_environment or None, client=client)
            await function.hydrate.aio()

        self.run(conn, work)
