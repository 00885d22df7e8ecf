"""Celery tasks: thin wrappers over datahub.services. Each takes ids and is safe to run twice."""
from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from datahub import services


# OperationalError: a database that was busy or briefly gone (SQLite's "database is locked", a
# PostgreSQL restart); the commit is idempotent, so it is tried again rather than lost.
@shared_task(name="datahub.tasks.commit_checkpoint", acks_late=True, autoretry_for=(OSError, OperationalError), retry_backoff=10, max_retries=5)
def commit_checkpoint(checkpoint_id: int) -> str | None:
    commit = services.commit_checkpoint(checkpoint_id)
    return commit.pk if commit is not None else None
