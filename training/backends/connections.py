"""A project's connection to a remote backend, and what the remote backends share: the job's name,
its environment and the command that runs the engine in the job."""
from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from studio import audit
from studio.crypto import UndecryptableSecret
from studio.errors import Conflict, Finding
from studio.models import AuditEvent
from studio.services import reveal_secret, secret_exists
from training.backends.base import BackendError, JobSpec
from training.engine.launch import engine_shell_command
from training.models import ACTIVE_STATUSES, BackendConnection, Status, TrainingRun

SPEC_PATH = "/tmp/studio-run.json"
OUTPUT_DIR = "/tmp/studio-output"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Where the job finds the engine's source, uploaded from this checkout with each run (so the job
# runs the Studio's own version of the engine).
ENGINE_ROOT_IN_JOB = "/workflow/studio"
# The trainer stack at the Studio's pins (requirements.txt; a test keeps them equal), installed in
# the job unless the connection names a trainer image that already has it.
ENGINE_PACKAGES = (
    "torch==2.13.0", "transformers==5.24.0", "trl==1.16.0", "peft==0.21.2", "datasets==5.2.0",
    "accelerate==1.15.0", "tokenizers==0.23.3", "huggingface-hub==2.4.0", "safetensors==0.8.0",
    "bitsandbytes==0.50.2", "requests==2.34.2",
)


def connection_for(project, backend: str) -> BackendConnection | None:
    if project is None:
        return None
    return BackendConnection.objects.filter(project=project, backend=backend, enabled=True).first()


def runs_through(conn: BackendConnection) -> list[Finding]:
    """The project's runs whose job goes through `conn` now (provisioning or running on its backend,
    or with a START a worker is about to submit there), each a finding saying to STOP it first: while
    they run, the connection is how the Studio polls their job and stops it, so it is not deleted,
    disabled or given another backend (a job left running would still cost GPU time)."""
    live = TrainingRun.objects.filter(project_id=conn.project_id, compute__backend=conn.backend).filter(
        Q(status__in=ACTIVE_STATUSES) | Q(status=Status.QUEUED, start_requested_at__isnull=False))
    return [Finding("backend", f"run #{run.pk} ({run.name}, {run.status}) runs through this connection: STOP it first, or wait until it ends")
            for run in live.order_by("pk")]


def delete_connection(conn: BackendConnection) -> None:
    """Delete a backend connection (the admin's Delete), audited; a 409 while runs go through it."""
    with transaction.atomic():
        findings = runs_through(conn)
        if findings:
            raise Conflict(f"The {label(conn.backend)} connection of project {conn.project.slug} is in use.", findings)
        audit.record(AuditEvent.Action.DELETED, conn, name=str(conn))  # while it has its pk
        conn.delete()


def connection_of_run(run_id: int, backend: str) -> BackendConnection:
    """The connection a run's job goes through; BackendError (a provisioning_error) when missing."""
    run = TrainingRun.objects.select_related("project").get(pk=run_id)
    conn = connection_for(run.project, backend)
    if conn is None:
        raise BackendError(f"{label(backend)} is not configured for project {run.project.slug}: an owner adds a {label(backend)} connection in the admin")
    return conn


def label(backend: str) -> str:
    return {"dstack": "dstack", "modal": "Modal"}.get(backend, backend)


def secret_value(conn: BackendConnection, field: str, what: str) -> str:
    """The plaintext of the secret the connection names in `field`. Never log it."""
    name = getattr(conn, field)
    if not name or not secret_exists(conn.project, name):
        raise BackendError(
            f"{label(conn.backend)} credentials are not configured for project {conn.project.slug}: "
            f"store the {what} as a project secret and name it in the connection's {field}"
        )
    try:
        return reveal_secret(conn.project, name)
    except UndecryptableSecret as exc:
        # A BackendError: START's 422 on compute.backend and the connection check name the secret.
        raise BackendError(f"the {label(conn.backend)} connection's {what} cannot be read: {exc}") from exc


def connection_findings(project, backend: str, compute: dict, secret_fields: dict[str, str]) -> tuple[BackendConnection | None, list[Finding]]:
    """Configuration problems that need no call to the backend (422 at START)."""
    name = label(backend)
    conn = connection_for(project, backend)
    if conn is None:
        return None, [Finding("compute.backend", f"{name} is not configured for this project: use backend local, or ask an owner to connect {name} (admin → Backend connections)")]
    findings = []
    for field, what in secret_fields.items():
        secret_name = getattr(conn, field)
        if not secret_name or not secret_exists(project, secret_name):
            findings.append(Finding("compute.backend", f"the {name} connection has no {what}: store it as a project secret and name it in the connection's {field}"))
    accelerators = str(compute.get("accelerators") or "")
    if accelerators.strip().upper() == "CPU":
        findings.append(Finding("compute.accelerators", f"CPU runs only on the local backend: ask {name} for a GPU, e.g. GPU:1 or L4"))
    region = compute.get("region")
    if region and conn.regions and region not in conn.regions:
        findings.append(Finding("compute.region", f"{name} knows no region {region!r} for this project: use one of {', '.join(conn.regions)}, or leave region empty"))
    findings += report_address_findings(name, conn.server_url if backend == "dstack" else None)
    return conn, findings


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def report_address_findings(name: str, server_url: str | None) -> list[Finding]:
    """A job on another machine reports to STUDIO_PUBLIC_URL and loads Data Hub refs from it: on a
    loopback address it never reaches the Studio (the run waits for its first report, then fails on
    a lost heartbeat). A dstack server on this machine may run its jobs here too, so it passes."""
    if not is_loopback(urlsplit(settings.STUDIO_PUBLIC_URL).hostname) or (server_url and is_loopback(urlsplit(server_url).hostname)):
        return []
    return [Finding("compute.backend", f"engines report to STUDIO_PUBLIC_URL ({settings.STUDIO_PUBLIC_URL}), which a {name} job on another machine "
                                       "cannot reach: set STUDIO_PUBLIC_URL to the Studio's address as the job sees it (e.g. https://studio.example.com) and restart the Studio")]


def job_name(run_id: int, attempt: int) -> str:
    """Deterministic, so a resubmission can find a job whose id was never saved."""
    return f"studio-r{run_id}-a{attempt}"


def job_env(job: JobSpec) -> dict[str, str]:
    """The job's environment: the engine spec, the ingest URL and this attempt's token."""
    job.output_dir = job.output_dir or OUTPUT_DIR
    return {
        **job.env,
        "STUDIO_RUN_ID": str(job.run_id),
        "STUDIO_ATTEMPT": str(job.attempt),
        "STUDIO_INGEST_URL": job.ingest_url,
        "STUDIO_INGEST_TOKEN": job.ingest_token,
        "STUDIO_RUN_SPEC": json.dumps(job.as_engine_spec()),
        "PYTHONUNBUFFERED": "1",
    }


def engine_commands(conn: BackendConnection, job: JobSpec) -> list[str]:
    """Setup (the connection's commands; by default the trainer stack at the Studio's pins unless
    the connection names a trainer image), then the engine on its spec: under torchrun, one process a
    GPU, when the run trains data-parallel (training/engine/launch.py)."""
    setup = [str(c) for c in conn.setup_commands or []]
    if not setup and not conn.image:
        setup = ["pip install -q " + " ".join(ENGINE_PACKAGES)]
    return [
        *setup,
        f'printf "%s" "$STUDIO_RUN_SPEC" > {SPEC_PATH}',
        f"cd {ENGINE_ROOT_IN_JOB}",
        engine_shell_command("python", SPEC_PATH, job.method, job.compute),
    ]


def engine_files() -> list[dict[str, str]]:
    """The engine's source from this checkout, as (local path, path in the job) pairs."""
    return [
        {"local_path": str(REPO_ROOT / "training" / "__init__.py"), "path": f"{ENGINE_ROOT_IN_JOB}/training/__init__.py"},
        {"local_path": str(REPO_ROOT / "training" / "engine"), "path": f"{ENGINE_ROOT_IN_JOB}/training/engine"},
    ]
