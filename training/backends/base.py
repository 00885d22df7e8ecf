"""A compute backend: submit a job, poll it, stop it, read its logs. One module per backend."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from studio.errors import Finding


@dataclass
class JobSpec:
    """What a backend needs to run one attempt of a run; `as_engine_spec` is the engine's run.json."""

    run_id: int
    attempt: int
    method: str
    base_model: str
    dataset: list[dict[str, Any]]
    config: dict[str, Any]
    compute: dict[str, Any]
    ingest_url: str
    ingest_token: str
    output_dir: str = ""
    base_model_revision: str | None = None  # the pinned commit of a Data Hub base model
    resume_from: str | None = None
    cache_dir: str | None = None  # set by a backend whose disk outlives an attempt (local): the engine reuses work there
    environment: dict[str, Any] | None = None  # GRPO: the staged environment package (environments.services.job_environment)
    env: dict[str, str] = field(default_factory=dict)
    # config.eval_dataset's entries as `dataset`'s are: a pinned Data Hub ref at its commit (data_hub).
    eval_dataset: list[dict[str, Any]] = field(default_factory=list)

    def as_engine_spec(self) -> dict[str, Any]:
        spec = asdict(self)
        spec.pop("env")
        spec["ingest"] = {"url": spec.pop("ingest_url"), "token": spec.pop("ingest_token")}
        return spec


@dataclass
class PollResult:
    """state: pending | running | succeeded (see reports_undelivered) | failed | gone (the backend no longer knows the job)
    | interrupted (the machine was taken away, e.g. a spot interruption: the reconciler retries from
    the last checkpoint within the connection's budget, else fails the run with error_code).

    running means the worker's container is up. leased: whether a GPU is rented right now (cost
    accrues while it is); None leaves it to the reconciler (leased while running). gpu_type: the
    GPU the backend actually gave, for the price table when the run asked for a generic GPU:n.
    """

    state: str
    error_code: str | None = None
    message: str = ""
    log_tail: list[str] = field(default_factory=list)
    leased: bool | None = None
    gpu_type: str | None = None
    # The engine trained to its end but exited saying the Studio did not take its last reports
    # (exit code 4): they are in its spool file, which only a backend on this machine can read.
    reports_undelivered: bool = False
    # pending only: why the job waits its turn on the backend's machine (the local backend's device
    # slots), in words for the run's log. No deadline counts while it waits: it is queued, not slow.
    waiting: str = ""


class BackendError(Exception):
    """The backend could not be reached or refused the call; the caller decides whether to retry."""


class BackendUnavailable(BackendError):
    """The backend could not be reached (down, timed out): transient, the run keeps its state and the
    call is tried again later."""


class Backend:
    name: ClassVar[str]

    def check(self, project, compute: dict) -> list[Finding]:
        """Pre-start problems with this backend for this project (422 findings)."""
        return []

    def image_has(self, module: str) -> bool:
        """Whether the trainer image this backend runs ships `module`."""
        raise NotImplementedError

    def submit(self, job: JobSpec) -> str:
        """Start the job; returns the backend's job id. Raises BackendError."""
        raise NotImplementedError

    def submit_warnings(self) -> list[str]:
        """What each run's log should say about how this backend runs its jobs (a missing sandbox)."""
        return []

    def poll(self, run) -> PollResult:
        raise NotImplementedError

    def stop(self, run_id: int, attempt: int, job_id: str) -> None:
        """Abort the job and free its resources. Safe to call twice, or for a job already gone."""
        raise NotImplementedError

    def signal_stop(self, run_id: int, attempt: int, job_id: str) -> None:
        """The first, quick step of stop(), taken by STOP's own request: the engine starts to stop
        even while every worker is busy (stop(), a task, finishes the job). Default: nothing."""

    def reported_path_problem(self, run_id: int, attempt: int, path: str) -> str | None:
        """Why `path`, a checkpoint folder this attempt's engine reported, cannot be one it saved; None
        when it can be. The engine saves under its spec's output_dir, which is absolute. A backend
        whose engine runs on this machine checks that it lies inside that folder; a remote machine's
        folders cannot be checked from here, beyond their shape."""
        if not path.startswith("/") or ".." in path.split("/"):
            return f"{path} is not where an engine saves: report the absolute path of the folder, under the spec's output_dir, without .. parts"
        return None

    def logs(self, run, tail: int = 200) -> list[str]:
        return []

    def spool_file(self, run) -> Path | None:
        """The spool file of `run`'s current attempt (the reports its engine could not deliver before
        it exited) when it exists on this machine; None when there is none or it cannot be read from
        here (a remote machine's disk)."""
        return None

    def output_folder(self, run) -> str:
        """Where `run`'s current attempt left its output, in words a user can act on."""
        from training.backends.connections import OUTPUT_DIR

        return f"{OUTPUT_DIR} on the machine the {self.name} job ran on"

    def find_job(self, run_id: int, attempt: int) -> str | None:
        """The job id of this attempt if the backend already has it (a submit whose id was never
        saved), so a resubmission adopts it instead of starting a second job. None: not found, or
        the backend cannot tell."""
        return None
