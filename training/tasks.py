"""Celery tasks: thin wrappers over training.services. Each takes ids and is safe to run twice."""
from __future__ import annotations

from celery import shared_task

from training import services


@shared_task(name="training.tasks.dispatch_run")
def dispatch_run(run_id: int) -> bool:
    return services.dispatch(run_id)


@shared_task(name="training.tasks.stop_backend_job", soft_time_limit=120)
def stop_backend_job(run_id: int, attempt: int, job_id: str) -> None:
    services.stop_backend_job(run_id, attempt, job_id)


@shared_task(name="training.tasks.reconcile_runs", soft_time_limit=120)
def reconcile_runs() -> None:
    for run_id in services.runs_to_reconcile():
        services.reconcile_run(run_id)
    for run_id in services.runs_to_redispatch():
        services.dispatch(run_id)
