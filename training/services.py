"""The only functions that create, change, start and stop training runs.

START commits, then (on_commit) a Celery task claims the run with a conditional UPDATE
(queued → provisioning) and submits it to its backend; a second copy of the task claims nothing.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from datahub.services import create_run_branch, engine_inputs, pin_refs
from environments.services import job_environment, judge_env
from experiments.models import Experiment
from experiments.services import default_experiment, find_experiment
from studio import audit, crypto
from studio.errors import BadRequest, Conflict, Finding, PaymentRequired, Unprocessable
from studio.models import AuditEvent, Project
from training import status as status_service
from training.backends import get_backend
from training.backends.base import BackendError, BackendUnavailable, JobSpec, PollResult
from training.backends.connections import connection_for
from training.compute import accelerators_of
from training.methods.base import Draft
from training.models import (
    ACTIVE_STATUSES,
    BackendConnection,
    Checkpoint,
    ErrorCode,
    GpuPrice,
    IngestBatch,
    LogLine,
    MetricPoint,
    Rollout,
    Status,
    TrainingRun,
)
from training.validation import start_findings, validate_draft

log = logging.getLogger(__name__)
INGEST_TOKEN_PREFIX = "ing"
PATCHABLE = ("name", "base_model", "dataset", "config", "compute")


# ---- plan gating (402) -------------------------------------------------------------------------

def require_training_plan(project: Project) -> None:
    plan = project.plan
    if plan is None or not plan.includes_training:
        name = f"the {plan.name} plan" if plan else "no plan"
        raise PaymentRequired(f"Project {project.slug} is on {name}, which does not include training: upgrade in Settings → Billing.")


def require_plan_capacity(project: Project, run: TrainingRun) -> None:
    """Call while holding the project's row lock, so two STARTs cannot both take the last slot."""
    plan = project.plan
    accel = accelerators_of(run.compute)
    if accel.count > plan.max_gpus_per_run:
        raise PaymentRequired(
            f"The {plan.name} plan allows {plan.max_gpus_per_run} GPU(s) per run and this run asks for {accel.count}: upgrade in Settings → Billing.",
            [Finding("compute.accelerators", f"ask for at most {plan.max_gpus_per_run} GPU(s), or upgrade the plan")],
        )
    busy = TrainingRun.objects.filter(project=project).exclude(pk=run.pk).filter(
        status__in=ACTIVE_STATUSES
    ).count() + TrainingRun.objects.filter(project=project, status=Status.QUEUED, start_requested_at__isnull=False).exclude(pk=run.pk).count()
    if busy >= plan.max_concurrent_runs:
        raise PaymentRequired(
            f"The {plan.name} plan runs {plan.max_concurrent_runs} run(s) at once and {busy} are active: stop one, or upgrade in Settings → Billing."
        )


# ---- create / patch ----------------------------------------------------------------------------

def resolve_experiment(project: Project, key: Any) -> Experiment:
    if key is None or key == "":
        return default_experiment(project)
    experiment = find_experiment(project, key)
    if experiment is None:
        raise BadRequest(f"No experiment {key!r} in project {project.slug}.", [Finding("experiment", "name an existing experiment (id or slug), or create it with POST /api/experiments")])
    return experiment


@transaction.atomic
def create_run(project: Project, user, *, name: str, method: str, experiment: Any = None, base_model: str | None = None,
               dataset: Any = None, config: dict | None = None, compute: dict | None = None) -> TrainingRun:
    require_training_plan(project)
    draft = validate_draft(Draft(method=method, base_model=base_model, dataset=dataset, config=config or {}, compute=compute or {}, project=project))
    run = TrainingRun.objects.create(
        project=project, experiment=resolve_experiment(project, experiment), created_by=user, name=name,
        method=draft.method, base_model=draft.base_model or "", dataset=draft.dataset, config=draft.config, compute=draft.compute,
    )
    create_run_branch(run)
    audit.record(AuditEvent.Action.CREATED, run, user=user, details={"method": run.method})
    return run


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def require_patchable(run: TrainingRun) -> None:
    """409 for a run that is active, starting or completed. The API calls it before parsing the
    body too (409 comes before 400 in the contract's precedence); update_run again under the lock."""
    if run.is_active or run.status == Status.COMPLETED or (run.status == Status.QUEUED and run.start_requested_at):
        raise Conflict(f"A {run.status} run cannot be changed: stop it first, or create a new run.")


@transaction.atomic
def update_run(run: TrainingRun, patch: dict) -> TrainingRun:
    run = TrainingRun.objects.select_for_update().get(pk=run.pk)
    require_patchable(run)
    unknown = sorted(set(patch) - set(PATCHABLE))
    if unknown:
        raise BadRequest("The patch has fields that cannot be changed.", [Finding(k, f"only {', '.join(PATCHABLE)} can be patched") for k in unknown])
    name = patch.get("name", run.name)
    if "name" in patch and (not isinstance(name, str) or not name.strip() or len(name) > 200):
        raise BadRequest("The patch has invalid fields.", [Finding("name", "give a name of 1 to 200 characters")])
    draft = validate_draft(Draft(
        method=run.method,
        base_model=patch["base_model"] if "base_model" in patch else (run.base_model or None),
        dataset=patch["dataset"] if "dataset" in patch else run.dataset,
        config=merge_patch(run.config, patch["config"]) if "config" in patch else run.config,
        compute=merge_patch(run.compute, patch["compute"]) if "compute" in patch else run.compute,
        project=run.project,
    ))
    run.name, run.base_model, run.dataset, run.config, run.compute = name, draft.base_model or "", draft.dataset, draft.config, draft.compute
    run.save(update_fields=["name", "base_model", "dataset", "config", "compute"])
    audit.record(AuditEvent.Action.PATCHED, run, details={"fields": sorted(patch)})
    return run


# ---- start / stop ------------------------------------------------------------------------------

def draft_of(run: TrainingRun) -> Draft:
    return Draft(method=run.method, base_model=run.base_model or None, dataset=run.dataset, config=run.config, compute=run.compute, project=run.project)


def start_blockers(run: TrainingRun) -> list[Finding]:
    """What the Start button shows: the same findings START answers with 422."""
    return start_findings(draft_of(run))


def start_run(run: TrainingRun) -> TrainingRun:
    from training.tasks import dispatch_run

    with transaction.atomic():
        project = Project.objects.select_for_update(of=("self",)).select_related("plan").get(pk=run.project_id)
        run = TrainingRun.objects.select_for_update().get(pk=run.pk)
        run.project = project
        require_training_plan(project)
        if run.status == Status.COMPLETED:
            raise Conflict("This run has completed: create a new run to train again.")
        if run.is_active or (run.status == Status.QUEUED and run.start_requested_at):
            raise Conflict(f"This run is already {'starting' if run.status == Status.QUEUED else run.status}.")
        require_plan_capacity(project, run)
        findings = start_findings(draft_of(run))
        if findings:
            raise Unprocessable(errors=findings)
        if run.status in (Status.FAILED, Status.CANCELLED):
            wipe_attempt_data(run)
            status_service.transition(run.pk, Status.QUEUED, note="restarted")
        TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=timezone.now(), pinned=pin_refs(run))
        audit.record(AuditEvent.Action.STARTED, run, details={"previous_status": run.status})
        transaction.on_commit(lambda: dispatch_run.delay(run.pk))
    run.refresh_from_db()
    return run


def wipe_attempt_data(run: TrainingRun) -> None:
    """A restart starts clean series; committed checkpoints stay (seed 001)."""
    MetricPoint.objects.filter(run=run).delete()
    LogLine.objects.filter(run=run).delete()
    Rollout.objects.filter(run=run).delete()
    IngestBatch.objects.filter(run=run).delete()


def stop_run(run: TrainingRun) -> TrainingRun:
    from training.tasks import stop_backend_job

    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if not run.is_active:
            raise Conflict(f"Only a provisioning or running run can be stopped; this one is {run.status}.")
        run = status_service.transition(run.pk, Status.CANCELLED, note="stopped by user")
        audit.record(AuditEvent.Action.STOPPED, run, details={"attempt": run.attempt})
        TrainingRun.objects.filter(pk=run.pk).update(start_requested_at=None)
        attempt, job_id = run.attempt, run.backend_job_id
        transaction.on_commit(lambda: stop_backend_job.delay(run.pk, attempt, job_id))
    run.refresh_from_db()
    return run


# ---- dispatch (Celery) -------------------------------------------------------------------------

def job_spec(run: TrainingRun, token: str) -> JobSpec:
    """The engine's view of one attempt. Data Hub refs become their pinned commits, fetched by the
    engine from Studio's HF-compatible /hub with this attempt's token."""
    inputs = engine_inputs(run, token)
    config = run.config
    teacher = inputs["teacher_model"]
    if teacher:  # the engine loads "repo@commit" through HF_ENDPOINT like any hub id with a revision
        config = {**config, "distillation": {**config["distillation"], "teacher_model": f"{teacher['repo']}@{teacher['commit']}"}}
    return JobSpec(
        run_id=run.pk, attempt=run.attempt, method=run.method, base_model=inputs["base_model"],
        base_model_revision=inputs["base_model_revision"], dataset=inputs["dataset"], config=config, compute=run.compute,
        ingest_url=f"{settings.STUDIO_PUBLIC_URL}/api/ingest/runs/{run.pk}", ingest_token=token,
        resume_from=run.resume_checkpoint.path if run.resume_checkpoint_id else None,
        environment=job_environment(run), env={**inputs["env"], **judge_env(run)},
    )


def dispatch(run_id: int) -> bool:
    """Claim a started run and submit it. Returns False when there was nothing to claim."""
    token = crypto.new_token(INGEST_TOKEN_PREFIX)
    now = timezone.now()
    # submit_started_at is the submit's lease: if this worker dies before the backend has a job id,
    # the reconciler submits the attempt again once the lease runs out (resubmit), exactly once.
    claimed = TrainingRun.objects.filter(pk=run_id, status=Status.QUEUED, start_requested_at__isnull=False).update(
        status=Status.PROVISIONING, attempt=F("attempt") + 1, ingest_token_hash=crypto.hash_token(token),
        backend_job_id="", start_requested_at=None, last_heartbeat_at=now, poll_failures=0, next_poll_at=None,
        provisioning_since=now, worker_up_at=None, submit_started_at=now, interruptions=0,
    )
    if not claimed:
        return False
    run = TrainingRun.objects.select_related("project").get(pk=run_id)
    add_log(run, "[studio] status → provisioning: claimed by a worker")
    add_log(run, f"[studio] attempt {run.attempt}: submitting to the {run.backend_name} backend")
    submit_attempt(run, token)
    return True


def stop_backend_job(run_id: int, attempt: int, job_id: str) -> None:
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None:
        return
    backend = get_backend(run.backend_name)
    if backend is not None and job_id:
        backend.stop(run_id, attempt, job_id)
        add_log(run, f"[studio] attempt {attempt}: job {job_id} stopped")


def add_log(run: TrainingRun, line: str) -> None:
    LogLine.objects.create(run=run, attempt=run.attempt, line=line)


def fail(run: TrainingRun, code: str, message: str, log_tail: list[str] | None = None) -> None:
    try:
        status_service.transition(run.pk, Status.FAILED, attempt=run.attempt, error={"code": str(code), "message": message, "log_tail": (log_tail or [])[-200:]}, note=message)
    except status_service.IllegalTransition:
        pass  # it ended some other way meanwhile (stopped, completed)


# ---- reconciler --------------------------------------------------------------------------------
#
# Beat runs reconcile_runs every RECONCILE_INTERVAL_SECONDS. All state lives in the database, so a
# restarted worker or Redis loses nothing: each pass claims a run with a conditional UPDATE of
# next_poll_at (a short lease, so two passes never poll one run at once), polls its backend outside
# any transaction, and applies what it says through the status service.

def reconciler_setting(name: str, default: int) -> int:
    """Studio-wide defaults (studio/settings.py); a project's backend connection can override the deadlines."""
    return int(getattr(settings, name, default))


def provisioning_timeout(conn: BackendConnection | None) -> int:
    own = conn.provisioning_timeout_seconds if conn else None
    return own or reconciler_setting("STUDIO_PROVISIONING_TIMEOUT_SECONDS", 1800)


def configuring_timeout(conn: BackendConnection | None) -> int:
    own = conn.configuring_timeout_seconds if conn else None
    return own or reconciler_setting("STUDIO_CONFIGURING_TIMEOUT_SECONDS", 1800)


def backoff_seconds(failures: int) -> int:
    return min(600, 15 * 2 ** max(0, failures - 1))


def apply_poll(run: TrainingRun, result: PollResult) -> None:
    if result.state in ("pending", "running"):
        return
    if result.state == "interrupted":
        retry_after_interruption(run, result)
        return
    if result.state == "succeeded":
        if run.status == Status.RUNNING:
            try:
                status_service.transition(run.pk, Status.COMPLETED, attempt=run.attempt, note="the engine exited cleanly")
            except status_service.IllegalTransition:
                pass
        else:
            fail(run, ErrorCode.TRAINING_ERROR, "the engine exited before it reported any training step", result.log_tail)
        return
    if result.log_tail and run.backend_name != "local" and run.worker_up_at is None and run.status == Status.PROVISIONING:
        # The engine never reported (it sends its own lines through ingest): the job's own output
        # (image pull, setup, a crash before the first report) is the only log there is.
        LogLine.objects.bulk_create([LogLine(run=run, attempt=run.attempt, line=f"[{run.backend_name}] {line}") for line in result.log_tail])
    fail(run, result.error_code or ErrorCode.TRAINING_ERROR, result.message or "the job failed", result.log_tail)


def claim_for_reconcile(run_id: int, now) -> bool:
    """Conditional UPDATE: take a short lease on the run, unless another pass holds one or its
    backend is backing off."""
    lease = reconciler_setting("STUDIO_RECONCILE_LEASE_SECONDS", 120)
    return bool(
        TrainingRun.objects.filter(pk=run_id)
        .filter(Q(status__in=ACTIVE_STATUSES) | Q(gpu_leased_at__isnull=False))
        .filter(Q(next_poll_at__isnull=True) | Q(next_poll_at__lte=now))
        .update(next_poll_at=now + timedelta(seconds=lease))
    )


def reconcile_run(run_id: int) -> None:
    """Poll one active run's backend and apply what it says: end states, lost machines, the
    provisioning / configuring / heartbeat deadlines, and the GPU lease for cost."""
    now = timezone.now()
    if not claim_for_reconcile(run_id, now):
        return
    lease_value = TrainingRun.objects.filter(pk=run_id).values_list("next_poll_at", flat=True).first()
    backed_off = False
    try:
        backed_off = _reconcile(run_id, now)
    finally:
        if not backed_off:
            TrainingRun.objects.filter(pk=run_id, next_poll_at=lease_value).update(next_poll_at=None)


def _reconcile(run_id: int, now) -> bool:
    """Returns True when the backend errored and the run was backed off."""
    run = TrainingRun.objects.select_related("project").get(pk=run_id)
    if not run.is_active:
        settle_cost(run)
        return False
    backend = get_backend(run.backend_name)
    conn = connection_for(run.project, run.backend_name)
    if backend is not None and run.backend_job_id:
        try:
            result = backend.poll(run)
        except Exception as exc:  # noqa: BLE001 - back off a backend that keeps erroring; the run keeps its state
            failures = run.poll_failures + 1
            TrainingRun.objects.filter(pk=run.pk).update(poll_failures=failures, next_poll_at=now + timedelta(seconds=backoff_seconds(failures)))
            log.warning("polling run %s failed (%s in a row): %s", run.pk, failures, exc)
            if failures == 1 or failures % 10 == 0:
                add_log(run, f"[studio] the {run.backend_name} backend did not answer ({exc}); the run keeps its state and is polled again later")
            return True
        if run.poll_failures:
            TrainingRun.objects.filter(pk=run.pk).update(poll_failures=0)
        leased = result.leased if result.leased is not None else result.state == "running"
        leased = leased and not accelerators_of(run.compute).is_cpu  # a CPU run rents no GPU
        track_lease(run, leased, result.gpu_type, now)
        if result.state == "running" and run.worker_up_at is None:
            TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, worker_up_at__isnull=True).update(worker_up_at=now)
            run.worker_up_at = now
        if result.state not in ("pending", "running"):
            apply_poll(run, result)
            settle_cost(TrainingRun.objects.get(pk=run.pk))
            return False
    # The engine calling home (a heartbeat after the claim) also means the worker is up.
    if run.worker_up_at is None and run.provisioning_since and run.last_heartbeat_at and run.last_heartbeat_at > run.provisioning_since:
        TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, worker_up_at__isnull=True).update(worker_up_at=run.last_heartbeat_at)
        run.worker_up_at = run.last_heartbeat_at
    check_deadlines(run, backend, conn, now)
    return False


def check_deadlines(run: TrainingRun, backend, conn: BackendConnection | None, now) -> None:
    """seed 000: provisioning_timeout (no worker within the provisioning deadline), configuring_timeout
    (worker up, no training step within the configuring deadline), heartbeat_timeout (a worker that
    has been up goes silent)."""
    if run.status == Status.PROVISIONING and run.provisioning_since:
        if run.worker_up_at is None:
            # With a retry window dstack keeps looking for capacity that long: do not cut it short.
            limit = provisioning_timeout(conn) + (conn.retry_window_seconds if conn else 0)
            if (now - run.provisioning_since).total_seconds() > limit:
                end_failed(run, backend, ErrorCode.PROVISIONING_TIMEOUT,
                                  f"no worker was running within the provisioning deadline ({limit} s): capacity or boot was too slow; start it again, or pick another GPU type or region")
            return
        limit = configuring_timeout(conn)
        if (now - run.worker_up_at).total_seconds() > limit:
            end_failed(run, backend, ErrorCode.CONFIGURING_TIMEOUT,
                              f"the worker came up but made no training step within the configuring deadline ({limit} s): read the log tail below")
            return
    timeout = int(run.config.get("heartbeat_timeout_seconds") or 300)
    heard_from = run.status == Status.RUNNING or run.worker_up_at is not None
    if heard_from and run.last_heartbeat_at and (now - run.last_heartbeat_at).total_seconds() > timeout:
        end_failed(run, backend, ErrorCode.HEARTBEAT_TIMEOUT,
                          f"the engine sent no heartbeat for {timeout} s (heartbeat_timeout_seconds): it may have been frozen, OOM-killed or cut off")


def end_failed(run: TrainingRun, backend, code: str, message: str) -> None:
    """Fail the run with the job's log tail and stop its job (a missed deadline, a full disk)."""
    tail = []
    if backend is not None and run.backend_job_id:
        try:
            tail = backend.logs(run)
        except Exception:  # noqa: BLE001 - the tail is a courtesy
            tail = []
    fail(run, code, message, tail)
    if backend is not None and run.backend_job_id:
        try:
            backend.stop(run.pk, run.attempt, run.backend_job_id)
        except Exception as exc:  # noqa: BLE001 - the stop task tries again
            from training.tasks import stop_backend_job

            log.warning("stopping run %s after %s failed: %s", run.pk, code, exc)
            stop_backend_job.apply_async((run.pk, run.attempt, run.backend_job_id), countdown=30)
    settle_cost(TrainingRun.objects.get(pk=run.pk))


# ---- spot interruptions: retry from the last checkpoint, within the connection's budget ----------

def last_checkpoint_path(run: TrainingRun) -> str | None:
    checkpoint = Checkpoint.objects.filter(run=run).exclude(kind="final").order_by("-step", "-id").first()
    return checkpoint.path if checkpoint else None


def retry_after_interruption(run: TrainingRun, result: PollResult) -> None:
    conn = connection_for(run.project, run.backend_name)
    budget = conn.interruption_retries if conn else 0
    close_lease(run.pk, timezone.now())
    if run.interruptions >= budget:
        fail(run, result.error_code or ErrorCode.CAPACITY_UNAVAILABLE,
             f"{result.message or 'the machine was taken away'}; {run.interruptions} retr{'y' if run.interruptions == 1 else 'ies'} used of the connection's budget of {budget}",
             result.log_tail)
        return
    token = crypto.new_token(INGEST_TOKEN_PREFIX)
    now = timezone.now()
    with transaction.atomic():
        current = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if current.attempt != run.attempt or current.backend_job_id != run.backend_job_id or not current.is_active:
            return  # stopped, or another pass already retried it
        if current.status == Status.RUNNING:
            status_service.transition(run.pk, Status.PROVISIONING, note=f"{result.message}: retrying from the last checkpoint")
        TrainingRun.objects.filter(pk=run.pk).update(
            attempt=F("attempt") + 1, ingest_token_hash=crypto.hash_token(token), backend_job_id="", interruptions=F("interruptions") + 1,
            provisioning_since=now, worker_up_at=None, submit_started_at=now, last_heartbeat_at=now,
        )
    run = TrainingRun.objects.select_related("project").get(pk=run.pk)
    add_log(run, f"[studio] attempt {run.attempt}: {result.message}; retry {run.interruptions} of {budget}, from the last checkpoint")
    submit_attempt(run, token)


# ---- submits lost with a worker --------------------------------------------------------------------

def submit_lease_seconds() -> int:
    return reconciler_setting("STUDIO_SUBMIT_LEASE_SECONDS", 300)


def submit_attempt(run: TrainingRun, token: str) -> None:
    """Hand this attempt to its backend. A transient backend error leaves the run provisioning with no
    job id (resubmitted later); any other failure ends it provisioning_error."""
    backend = get_backend(run.backend_name)
    spec = job_spec(run, token)
    if run.interruptions:
        spec.resume_from = last_checkpoint_path(run)
    try:
        if backend is None:
            raise BackendError(f"unknown backend {run.backend_name!r}")
        job_id = backend.submit(spec)
    except BackendUnavailable as exc:
        failures = run.poll_failures + 1
        TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, backend_job_id="").update(
            submit_started_at=None, poll_failures=failures, next_poll_at=timezone.now() + timedelta(seconds=backoff_seconds(failures)))
        add_log(run, f"[studio] the {run.backend_name} backend is unreachable ({exc}); the submit is tried again")
        return
    except Exception as exc:  # noqa: BLE001 - any other failure to submit fails the attempt, with its reason
        log.exception("submitting run %s failed", run.pk)
        fail(run, ErrorCode.PROVISIONING_ERROR, f"the {run.backend_name} backend could not start the job: {exc}")
        return
    still_ours = TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status__in=ACTIVE_STATUSES).update(backend_job_id=job_id, poll_failures=0)
    if not still_ours:
        # STOP landed while we were submitting: abort what we just started.
        backend.stop(run.pk, run.attempt, job_id)
    else:
        add_log(run, f"[studio] submitted: job {job_id}")


def runs_to_resubmit() -> list[int]:
    """Provisioning runs whose submit was lost (the worker died between claim and submit) or failed
    transiently, and whose submit lease has run out."""
    now = timezone.now()
    stale = now - timedelta(seconds=submit_lease_seconds())
    qs = TrainingRun.objects.filter(status=Status.PROVISIONING, backend_job_id="").filter(
        Q(submit_started_at__lt=stale) | Q(submit_started_at__isnull=True)
    ).exclude(next_poll_at__gt=now)
    return list(qs.values_list("pk", flat=True)[:100])


def resubmit(run_id: int) -> bool:
    """Submit a provisioning run whose submit never happened — once: a job the lost submit did
    start is adopted (backends name jobs by run and attempt), and a conditional UPDATE of the submit
    lease lets one worker through."""
    run = TrainingRun.objects.select_related("project").filter(pk=run_id, status=Status.PROVISIONING, backend_job_id="").first()
    if run is None:
        return False
    backend = get_backend(run.backend_name)
    if backend is None:
        fail(run, ErrorCode.PROVISIONING_ERROR, f"unknown backend {run.backend_name!r}")
        return True
    now = timezone.now()
    try:
        existing = backend.find_job(run.pk, run.attempt)
    except Exception as exc:  # noqa: BLE001 - unreachable: try again later
        failures = run.poll_failures + 1
        TrainingRun.objects.filter(pk=run.pk).update(poll_failures=failures, next_poll_at=now + timedelta(seconds=backoff_seconds(failures)))
        log.warning("looking up run %s's job failed: %s", run.pk, exc)
        return False
    lease = Q(submit_started_at=run.submit_started_at) if run.submit_started_at else Q(submit_started_at__isnull=True)
    token = crypto.new_token(INGEST_TOKEN_PREFIX)
    changes: dict[str, Any] = {"submit_started_at": now}
    if existing:
        changes["backend_job_id"] = existing  # started with the token whose hash is already stored
    else:
        changes["ingest_token_hash"] = crypto.hash_token(token)
    claimed = TrainingRun.objects.filter(lease, pk=run.pk, attempt=run.attempt, status=Status.PROVISIONING, backend_job_id="").update(**changes)
    if not claimed:
        return False
    if existing:
        add_log(run, f"[studio] attempt {run.attempt}: adopted job {existing}, which a lost submit had started")
        return True
    add_log(run, f"[studio] attempt {run.attempt}: submitting again (the first submit was lost or failed)")
    submit_attempt(run, token)
    return True


# ---- cost: from "GPU leased" to the run's end, per the price table ------------------------------

def hourly_price_for(run: TrainingRun, gpu_type: str | None) -> Decimal:
    """Per hour for the whole run: per-GPU price × GPU count. A CPU run costs nothing."""
    accel = accelerators_of(run.compute)
    if accel.is_cpu:
        return Decimal("0")
    gpu = (accel.gpu_type or gpu_type or "GPU").upper()
    spot = bool((run.compute or {}).get("spot"))
    prices = {(p.backend, p.gpu_type.upper(), p.spot): p.price_per_hour for p in GpuPrice.objects.filter(backend__in=(run.backend_name, ""), gpu_type__in=(gpu, "GPU"))}
    for key in ((run.backend_name, gpu, spot), ("", gpu, spot), (run.backend_name, gpu, False), ("", gpu, False),
                (run.backend_name, "GPU", spot), ("", "GPU", spot), (run.backend_name, "GPU", False), ("", "GPU", False)):
        if key in prices:
            return prices[key] * accel.count
    return Decimal("0")


def track_lease(run: TrainingRun, leased: bool, gpu_type: str | None, now) -> None:
    if leased and run.gpu_leased_at is None:
        price = hourly_price_for(run, gpu_type)
        if TrainingRun.objects.filter(pk=run.pk, gpu_leased_at__isnull=True).update(gpu_leased_at=now, hourly_price=price):
            add_log(run, f"[studio] GPU leased{f' ({gpu_type})' if gpu_type else ''}: cost accrues at {price}/h")
        run.gpu_leased_at, run.hourly_price = now, price
    elif run.gpu_leased_at is not None:
        accrue(run.pk, now, close=not leased)


def accrue(run_id: int, until, close: bool) -> None:
    """Add the lease's time up to `until` to the run's cost; close the lease or move its mark."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run_id)
        if run.gpu_leased_at is None:
            return
        seconds = max(0.0, (until - run.gpu_leased_at).total_seconds())
        run.cost = (run.cost or Decimal("0")) + (run.hourly_price or Decimal("0")) * Decimal(seconds) / Decimal(3600)
        run.gpu_seconds += seconds
        run.gpu_leased_at = None if close else max(until, run.gpu_leased_at)
        run.save(update_fields=["cost", "gpu_seconds", "gpu_leased_at"])


def close_lease(run_id: int, until) -> None:
    accrue(run_id, until, close=True)


def settle_cost(run: TrainingRun) -> None:
    """A run that ended stops costing at its end."""
    if run.gpu_leased_at is not None and not run.is_active:
        close_lease(run.pk, run.finished_at or timezone.now())


def runs_to_reconcile() -> list[int]:
    now = timezone.now()
    qs = TrainingRun.objects.filter(Q(status__in=ACTIVE_STATUSES) | Q(gpu_leased_at__isnull=False)).exclude(next_poll_at__gt=now)
    return list(qs.values_list("pk", flat=True)[:500])


def runs_to_redispatch() -> list[int]:
    """Started runs no worker has claimed (a lost task, a worker down): dispatch them again."""
    cutoff = timezone.now() - timedelta(seconds=settings.STUDIO_REDISPATCH_AFTER_SECONDS)
    return list(TrainingRun.objects.filter(status=Status.QUEUED, start_requested_at__lt=cutoff).values_list("pk", flat=True)[:500])
