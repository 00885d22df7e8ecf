"""Sending a Celery task once a transaction commits, without failing a request whose change is done.

With the broker (Redis) unreachable, `task.delay` raises after the commit: the START, STOP or ask is
stored and something retries it (the reconciler), so the request answers what happened instead of a 500.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)


class Sending:
    """A task handed to the broker after the commit: `unsent` is True once that failed."""

    unsent = False


def send(task: Any, *args: Any, countdown: float | None = None) -> bool:
    """task.delay(*args), or after `countdown` seconds; False (logged) when the broker cannot be reached."""
    try:
        task.apply_async(args, countdown=countdown) if countdown is not None else task.delay(*args)
    except OperationalError as exc:
        log.warning("could not send %s%r to the task queue: %s", task.name, args, exc)
        return False
    return True


def send_after_commit(task: Any, *args: Any, on_unsent: Callable[[], None] | None = None) -> Sending:
    """Send task(*args) once the current transaction commits. Read `.unsent` after the outermost
    atomic block has ended; `on_unsent` runs (in its own transaction) when the send failed."""
    sending = Sending()

    def deliver() -> None:
        if not send(task, *args):
            sending.unsent = True
            if on_unsent is not None:
                on_unsent()

    transaction.on_commit(deliver)
    return sending
