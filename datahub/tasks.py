"""Celery tasks: thin wrappers over datahub.services. Each takes ids and is safe to run twice."""
from __future__ import annotations

from celery import shared_task

from datahub import services


@shared_task(name="datahub.tasks.commit_checkpoint", acks_late=True, autoretry_for=(OSError,), retry_backoff=10, max_retries=5)
def commit_checkpoint(checkpoint_id: int) -> str | None:
    commit = services.commit_checkpoint(checkpoint_id)
    return commit.pk if commit is not None else None
