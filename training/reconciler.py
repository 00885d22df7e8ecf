"""The reconciler: Celery beat runs training.tasks.reconcile_runs every RECONCILE_INTERVAL_SECONDS,
and each pass polls every active run's backend, resubmits lost submits and re-dispatches lost starts.

All state lives in the database, so a restarted worker or Redis loses nothing: each pass claims a run
with a conditional UPDATE of next_poll_at (a short lease, so two passes never poll one run at once),
polls its backend outside any transaction, and applies what it says through the status service:
end states, lost machines (spot interruptions are retried from the last checkpoint within the
connection's budget), the provisioning / configuring / heartbeat deadlines, back-off for a backend
that keeps erroring, and the GPU lease that the run's cost accrues from.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from studio import crypto
from training import status as status_service
from training.backends import get_backend
from training.backends.base import PollResult
from training.backends.connections import connection_for
from training.compute import accelerators_of
from training.engine.spec import heartbeat_timeout
from training.models import ACTIVE_STATUSES, AttemptOutcome, BackendConnection, ErrorCode, GpuPrice, LogLine, RunAttempt, Status, TrainingRun, clip_log_line
from training.services import INGEST_TOKEN_PREFIX, add_log, backoff_seconds, fail, mark_stopping, record_attempt, submit_attempt

log = logging.getLogger(__name__)


# ---- settings and what each pass picks up ------------------------------------------------------

def reconciler_setting(name: str, default: int) -> int:
    """Studio-wide defaults (studio/settings.py); a project's backend connection can override the deadlines."""
    return int(getattr(settings, name, default))


def provisioning_timeout(conn: BackendConnection | None) -> int:
    own = conn.provisioning_timeout_seconds if conn else None
    return own or reconciler_setting("STUDIO_PROVISIONING_TIMEOUT_SECONDS", 1800)


def configuring_timeout(conn: BackendConnection | None) -> int:
    own = conn.configuring_timeout_seconds if conn else None
    return own or reconciler_setting("STUDIO_CONFIGURING_TIMEOUT_SECONDS", 1800)


def submit_lease_seconds() -> int:
    return reconciler_setting("STUDIO_SUBMIT_LEASE_SECONDS", 300)


def runs_to_reconcile() -> list[int]:
    now = timezone.now()
    qs = TrainingRun.objects.filter(Q(status__in=ACTIVE_STATUSES) | Q(gpu_leased_at__isnull=False)).exclude(next_poll_at__gt=now)
    return list(qs.values_list("pk", flat=True)[:500])


def runs_to_resubmit() -> list[int]:
    """Provisioning runs whose submit was lost (the worker died between claim and submit) or failed
    transiently, and whose submit lease has run out; and running ones whose job id was lost (the
    engine started and reported, but the worker died before it saved the id), to adopt their job."""
    now = timezone.now()
    stale = now - timedelta(seconds=submit_lease_seconds())
    qs = TrainingRun.objects.filter(status__in=(Status.PROVISIONING, Status.RUNNING), backend_job_id="").filter(
        Q(submit_started_at__lt=stale) | Q(submit_started_at__isnull=True)
    ).exclude(next_poll_at__gt=now)
    return list(qs.values_list("pk", flat=True)[:100])


def runs_to_redispatch() -> list[int]:
    """Started runs no worker has claimed (a lost task, a worker down): dispatch them again."""
    cutoff = timezone.now() - timedelta(seconds=settings.STUDIO_REDISPATCH_AFTER_SECONDS)
    return list(TrainingRun.objects.filter(status=Status.QUEUED, start_requested_at__lt=cutoff).values_list("pk", flat=True)[:500])


def stops_to_resend() -> list[int]:
    """Attempts whose STOP could not send its stop_backend_job task (the broker was down): send it now."""
    return list(RunAttempt.objects.filter(unsent_stop_job__isnull=False).values_list("pk", flat=True)[:100])


# ---- poll one run ------------------------------------------------------------------------------

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


PASS_KEY, RESUMED_KEY = "reconciler:last-pass", "reconciler:resumed-at"


def pass_gap_seconds() -> float:
    """How long without a periodic pass means the passes stopped (three beat intervals): beat, the
    worker or Redis was down, not a pass that merely ran late."""
    return 3 * float(settings.CELERY_BEAT_SCHEDULE["reconcile-runs"]["schedule"])


def last_pass_at():
    """When the last periodic pass began, or None when none is recorded (raises when Redis, which
    keeps it, cannot be reached)."""
    return cache.get(PASS_KEY)


def passes_resumed_at(now=None):
    """When the periodic passes resumed after a gap of over three intervals, or now if that cannot be
    read: the Studio (web, beat, worker or Redis) was down, so an engine's reports could not land;
    a heartbeat deadline counts from then. Without it a Studio down for longer than
    heartbeat_timeout_seconds failed, and killed, every run that kept training through the outage."""
    now = now or timezone.now()
    try:
        last, resumed = last_pass_at(), cache.get(RESUMED_KEY)
        if last is None or resumed is None or (now - last).total_seconds() > pass_gap_seconds():
            resumed = now
            cache.set(RESUMED_KEY, resumed, None)
        cache.set(PASS_KEY, now, None)
        return resumed
    except Exception:  # noqa: BLE001 - Redis down: no silence can be told apart from the outage
        return now


def reconcile_run(run_id: int, silence_from=None) -> None:
    """Poll one active run's backend and apply what it says: end states, lost machines, the
    provisioning / configuring / heartbeat deadlines, and the GPU lease for cost. `silence_from`
    (passes_resumed_at, for the periodic pass): no heartbeat deadline counts silence before it."""
    now = timezone.now()
    if not claim_for_reconcile(run_id, now):
        return
    lease_value = TrainingRun.objects.filter(pk=run_id).values_list("next_poll_at", flat=True).first()
    backed_off = False
    try:
        backed_off = _reconcile(run_id, now, silence_from)
    finally:
        if not backed_off:
            TrainingRun.objects.filter(pk=run_id, next_poll_at=lease_value).update(next_poll_at=None)


def _reconcile(run_id: int, now, silence_from=None) -> bool:
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
        if result.state == "pending" and result.waiting:
            # Its turn on the machine has not come (the local backend's device slots): it is queued,
            # not slow, so no provisioning deadline counts, and it rents nothing (pending is not leased).
            note_waiting(run, result.waiting)
            return False
        if result.state == "running" and run.worker_up_at is None:
            TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, worker_up_at__isnull=True).update(worker_up_at=now)
            run.worker_up_at = now
        if result.state not in ("pending", "running"):
            # The reports the engine could not deliver before it exited come first: the status they
            # end with (and its checkpoints, metrics and final model) is the run's, not the exit's.
            # Re-read: a run the spool ended is no longer running, and the exit changes nothing of it.
            deliver_spool(run, backend)
            apply_poll(TrainingRun.objects.select_related("project").get(pk=run.pk), result)
            settle_cost(TrainingRun.objects.get(pk=run.pk))
            return False
    # The engine calling home (a heartbeat after the claim) also means the worker is up.
    if run.worker_up_at is None and run.provisioning_since and run.last_heartbeat_at and run.last_heartbeat_at > run.provisioning_since:
        TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, worker_up_at__isnull=True).update(worker_up_at=run.last_heartbeat_at)
        run.worker_up_at = run.last_heartbeat_at
    check_deadlines(run, backend, conn, now, silence_from)
    return False


def note_waiting(run: TrainingRun, waiting: str) -> None:
    """Say in the run's log why its job waits, once, and again when that changes (other holders)."""
    line = f"[studio] the job {waiting}"
    last = LogLine.objects.filter(run=run, attempt=run.attempt, line__startswith="[studio] the job waits").order_by("-id").values_list("line", flat=True).first()
    if last != line:
        add_log(run, line)


def deliver_spool(run: TrainingRun, backend) -> None:
    """Apply the reports the engine of `run`'s current attempt spooled because the Studio did not take
    them before it exited (an outage longer than its final drain), through ingest's own checks, and say
    so on the run. Call once its job has ended. The file is renamed after, so it is delivered once."""
    from training.ingest import deliver_spooled

    path = backend.spool_file(run) if backend is not None else None
    if path is None:
        return
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        add_log(run, f"[studio] the engine's undelivered reports in {path} could not be read ({exc}): the metrics, checkpoints and "
                     "final model it reported after the outage are missing here; its output is in that folder")
        return
    outcome = deliver_spooled(run, lines)
    add_log(run, f"[studio] {outcome.delivered} report batch{'' if outcome.delivered == 1 else 'es'} the engine could not deliver during a "
                 f"Studio outage {'was' if outcome.delivered == 1 else 'were'} delivered from {path}"
                 + (f" ({outcome.duplicates} had already arrived)" if outcome.duplicates else ""))
    for problem in outcome.problems:
        add_log(run, f"[studio] {path.name}: {problem}")
    try:
        path.rename(path.with_name(path.name + ".delivered"))
    except OSError as exc:  # delivering it again applies nothing twice (batch ids): only a repeated log line
        log.warning("run %s: could not rename the delivered spool file %s: %s", run.pk, path, exc)


def apply_poll(run: TrainingRun, result: PollResult) -> None:
    if result.state in ("pending", "running"):
        return
    if result.state == "interrupted":
        retry_after_interruption(run, result)
        return
    if result.state == "succeeded":
        # An engine that delivered its "completed" ended the run before its job did; one still active
        # here did not: its end status (and what it reported after the outage) never reached the Studio.
        backend = get_backend(run.backend_name)
        where = backend.output_folder(run) if backend is not None else "the engine's output folder"
        lost = (f"the engine trained to its end, but its last reports did not reach the Studio (exit code 4): metrics, checkpoints and the final "
                f"model it reported after that are missing here; they are in {where} (undelivered-reports.jsonl lists them)"
                if result.reports_undelivered else
                f"the engine exited cleanly, but its final report never reached the Studio: metrics, checkpoints and the final model it reported "
                f"last may be missing here; its output is in {where}")
        if run.status == Status.RUNNING:
            try:
                status_service.transition(run.pk, Status.COMPLETED, attempt=run.attempt, note=lost)
            except status_service.IllegalTransition:
                pass
        elif result.reports_undelivered:
            fail(run, ErrorCode.TRAINING_ERROR, f"none of the engine's reports reached the Studio, though it trained to its end (exit code 4): "
                                                f"its output is in {where} (undelivered-reports.jsonl lists what it reported)", result.log_tail)
        else:
            fail(run, ErrorCode.TRAINING_ERROR, "the engine exited before it reported that it started the run", result.log_tail)
        return
    if result.state == "gone":
        # The backend lost track of the job (the local runner killed, say), not necessarily all of it:
        # the engine may still train in the job's process group. Fail the run and stop the rest.
        end_failed(run, get_backend(run.backend_name), result.error_code or ErrorCode.TRAINING_ERROR, result.message or "the job is gone", result.log_tail)
        return
    if result.log_tail and run.backend_name != "local" and run.worker_up_at is None and run.status == Status.PROVISIONING:
        # The engine never reported (it sends its own lines through ingest): the job's own output
        # (image pull, setup, a crash before the first report) is the only log there is.
        LogLine.objects.bulk_create([LogLine(run=run, attempt=run.attempt, line=clip_log_line(f"[{run.backend_name}] {line}")) for line in result.log_tail])
    fail(run, result.error_code or ErrorCode.TRAINING_ERROR, result.message or "the job failed", result.log_tail)


# ---- deadlines: provisioning, configuring, heartbeat -------------------------------------------

def check_deadlines(run: TrainingRun, backend, conn: BackendConnection | None, now, silence_from=None) -> None:
    """seed 000: provisioning_timeout (no worker within the provisioning deadline), configuring_timeout
    (worker up, its engine not started within the configuring deadline: the engine reports running as
    it starts, before it loads the model, so image pulls and installs count here and a long model load
    or first step counts under the heartbeat), heartbeat_timeout (a worker that has been up goes silent)."""
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
                              f"the worker came up but its engine did not start the run within the configuring deadline ({limit} s): read the log tail below")
            return
    timeout = heartbeat_timeout(run.config)
    heard_from = run.status == Status.RUNNING or run.worker_up_at is not None
    silent_since = max(run.last_heartbeat_at, silence_from) if run.last_heartbeat_at and silence_from else run.last_heartbeat_at
    if run.status == Status.PROVISIONING and run.worker_up_at and silent_since:
        # Not reported yet: silence counts from when the engine started, with the whole startup grace a
        # run has at submit. A local job that waited for its slots longer than the deadline still has
        # its submit time as last heartbeat, and was failed the moment its engine started.
        silent_since = max(silent_since, run.worker_up_at)
    if heard_from and silent_since and (now - silent_since).total_seconds() > timeout:
        end_failed(run, backend, ErrorCode.HEARTBEAT_TIMEOUT,
                          f"the engine sent no heartbeat for {timeout} s (heartbeat_timeout_seconds): it may have been frozen, OOM-killed or cut off")


def end_failed(run: TrainingRun, backend, code: str, message: str, tail: list[str] | None = None) -> None:
    """Fail the run with the job's log tail and stop its job (a missed deadline, a full disk)."""
    if tail is None and backend is not None and run.backend_job_id:
        try:
            tail = backend.logs(run)
        except Exception:  # noqa: BLE001 - the tail is a courtesy
            tail = []
    fail(run, code, message, tail or [])
    if backend is not None and run.backend_job_id:
        try:
            backend.stop(run.pk, run.attempt, run.backend_job_id)
        except Exception as exc:  # noqa: BLE001 - the stop task tries again
            from training.tasks import stop_backend_job

            log.warning("stopping run %s after %s failed: %s", run.pk, code, exc)
            mark_stopping(run)  # a DELETE waits for the task
            stop_backend_job.apply_async((run.pk, run.attempt, run.backend_job_id), countdown=30)
    settle_cost(TrainingRun.objects.get(pk=run.pk))


# ---- spot interruptions: retry from the last checkpoint, within the connection's budget --------

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
        status_service.end_attempt(run.pk, current.attempt, AttemptOutcome.INTERRUPTED, now)
        TrainingRun.objects.filter(pk=run.pk).update(
            attempt=F("attempt") + 1, ingest_token_hash=crypto.hash_token(token), backend_job_id="", interruptions=F("interruptions") + 1,
            provisioning_since=now, worker_up_at=None, submit_started_at=now, last_heartbeat_at=now,
        )
        run = TrainingRun.objects.select_related("project").get(pk=run.pk)
        record_attempt(run)
    add_log(run, f"[studio] attempt {run.attempt}: {result.message}; retry {run.interruptions} of {budget}, from the last checkpoint")
    submit_attempt(run, token)


# ---- submits lost with a worker ----------------------------------------------------------------

def resubmit(run_id: int) -> bool:
    """Submit a provisioning run whose submit never happened — once: a job the lost submit did
    start is adopted (backends name jobs by run and attempt), and a conditional UPDATE of the submit
    lease lets one worker through. A running run without a job id is only adopted, never submitted
    again: its engine trains and reports already."""
    run = TrainingRun.objects.select_related("project").filter(pk=run_id, status__in=(Status.PROVISIONING, Status.RUNNING), backend_job_id="").first()
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
    if run.status == Status.RUNNING and not existing:
        return False  # it trains and reports, somewhere this backend cannot name: its heartbeat deadline watches it
    lease = Q(submit_started_at=run.submit_started_at) if run.submit_started_at else Q(submit_started_at__isnull=True)
    token = crypto.new_token(INGEST_TOKEN_PREFIX)
    changes: dict[str, Any] = {"submit_started_at": now}
    if existing:
        changes["backend_job_id"] = existing  # started with the token whose hash is already stored
    else:
        changes["ingest_token_hash"] = crypto.hash_token(token)
    claimed = TrainingRun.objects.filter(lease, pk=run.pk, attempt=run.attempt, status=run.status, backend_job_id="").update(**changes)
    if not claimed:
        return False
    if existing:
        add_log(run, f"[studio] attempt {run.attempt}: adopted job {existing}, which a lost submit had started")
        return True
    add_log(run, f"[studio] attempt {run.attempt}: submitting again (the first submit was lost or failed)")
    submit_attempt(run, token)
    return True


# ---- cost: from "GPU leased" to the run's end, per the price table -----------------------------

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
