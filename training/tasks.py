"""Celery tasks: thin wrappers over training.services and training.reconciler. Each takes ids and
is safe to run twice.

Every call to a remote backend (dstack, Modal) happens in one of these tasks, never in a web request,
and has a time limit: a wrong Modal token can hang a call for about a minute.
"""
from __future__ import annotations

import logging
from functools import partial

from celery import shared_task
from celery.signals import worker_ready

from studio import webhooks
from training import playground, reconciler, services
from training.backends.base import BackendUnavailable

log = logging.getLogger(__name__)


@worker_ready.connect
def warn_if_engines_run_unsandboxed(**_) -> None:
    """Once, at worker start: a local engine without a sandbox can read the Studio's files."""
    from training.backends.local import sandbox_warning

    if warning := sandbox_warning():
        log.warning("local backend: %s", warning)


@shared_task(name="training.tasks.dispatch_run", soft_time_limit=150, time_limit=180)
def dispatch_run(run_id: int) -> bool:
    return services.dispatch(run_id)


@shared_task(name="training.tasks.stop_backend_job", bind=True, soft_time_limit=120, time_limit=150,
             autoretry_for=(BackendUnavailable,), retry_backoff=15, retry_backoff_max=600, max_retries=40)
def stop_backend_job(self, run_id: int, attempt: int, job_id: str) -> None:
    # A backend that is down is asked again with back-off until it answers: STOP must reach it.
    services.stop_backend_job(run_id, attempt, job_id)


@shared_task(name="training.tasks.reconcile_runs", soft_time_limit=240, time_limit=300)
def reconcile_runs() -> None:
    silence_from = reconciler.passes_resumed_at()
    for step, run_ids in ((partial(reconciler.reconcile_run, silence_from=silence_from), reconciler.runs_to_reconcile()),
                          (reconciler.resubmit, reconciler.runs_to_resubmit()),
                          (services.dispatch, reconciler.runs_to_redispatch()),
                          (services.resend_stop, reconciler.stops_to_resend()),
                          (webhooks.resend, webhooks.deliveries_to_resend())):
        for run_id in run_ids:
            try:
                step(run_id)
            except Exception:  # noqa: BLE001 - one run's trouble must not starve the others
                log.exception("%s(%s) failed", getattr(step, "__name__", "reconcile_run"), run_id)
    playground.fail_lost_answers()


@shared_task(name="training.tasks.verify_backend_connection", soft_time_limit=90, time_limit=120)
def verify_backend_connection(connection_id: int) -> str:
    """Check a backend connection's credentials with one real call; the result is shown at START."""
    from training.backends.verify import verify_connection

    return verify_connection(connection_id)


# acks_late + reject_on_worker_lost: a merge lost with its worker process runs again on another one,
# rather than leaving the step marked "Merging…" until the mark expires (an hour later).
@shared_task(name="training.tasks.merge_checkpoint", soft_time_limit=3700, acks_late=True, reject_on_worker_lost=True)
def merge_checkpoint(checkpoint_id: int) -> None:
    from training.checkpoints import merge

    merge(checkpoint_id)


# Two generator processes at most (the run's weights, then its base), each stopped at its timeout.
@shared_task(name="training.tasks.generate_answer", soft_time_limit=playground.ANSWER_TIME_LIMIT_S - 30, time_limit=playground.ANSWER_TIME_LIMIT_S)
def generate_answer(generation_id: int) -> None:
    playground.generate(generation_id)
