"""Celery tasks of the studio app: thin wrappers over studio.webhooks, each safe to run twice."""

from __future__ import annotations

from celery import shared_task

from studio import webhooks
from studio.queue import send


@shared_task(name="studio.tasks.deliver_webhook", soft_time_limit=30, time_limit=webhooks.TRY_TIME_LIMIT_S)
def deliver_webhook(delivery_id: int, tries_made: int | None = None) -> None:
    """The delivery's try after `tries_made` tries (None, as in a task queued before tasks named it:
    whichever is next); the next (after a non-2xx answer or a connection error) is queued with its
    countdown. A broker down by then leaves it recorded as failed, with its tries."""
    next_try = webhooks.attempt_delivery(delivery_id, tries_made)
    if next_try is not None and not send(deliver_webhook, delivery_id, next_try.tries_made, countdown=next_try.delay_s):
        webhooks.record_unsent(delivery_id)
