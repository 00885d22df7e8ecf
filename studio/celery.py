"""The Celery app. Tasks are thin wrappers over services (training/tasks.py)."""
from __future__ import annotations

import os

from celery import Celery
from celery.app.amqp import AMQP
from kombu import Connection

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")


class BrokerConnection(Connection):
    """kombu's Connection, whose default channel is closed once.

    When the broker goes away, the worker's consumer collects the connection (closing its default
    channel, then letting the transport go) and then closes it. kombu 5.7 keeps the closed channel,
    so the close closes it again: with a task running (acks_late, so its message is unacked), the
    redis channel restores that message through the transport already let go, raises
    AttributeError, and the worker stops on an "Unrecoverable error" instead of reconnecting
    (tests/backends/test_faults.py). A closed channel is forgotten here; the next use opens one."""

    def _do_close_self(self) -> None:
        try:
            super()._do_close_self()
        finally:
            self._default_channel = None


class StudioAMQP(AMQP):
    Connection = BrokerConnection


app = Celery("studio", amqp=StudioAMQP)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Try it's answers hold a worker process for minutes (ANSWER_TIME_LIMIT_S), with a model loaded by the
# generator they wait on: on the main queue two of them filled the embedded Studio's two worker slots, and
# no START was dispatched meanwhile, no STOP cleaned up, no reconciler pass ran. They go to a queue of
# their own, which a worker of its own serves (runstudio's "answers" part; README: Deploy for a team).
ANSWER_TASKS = frozenset({"training.tasks.generate_answer"})


def answers_queue() -> str:
    """The queue Try it's answers go to: CELERY_QUEUE's, with `-answers` after it (read when asked: the
    UI tests choose their queue after this module is imported)."""
    return f"{app.conf.task_default_queue}-answers"


def route_task(name: str, args, kwargs, options, task=None, **_) -> dict[str, str] | None:
    """CELERY_TASK_ROUTES' router: answers to answers_queue(), every other task to the default queue."""
    return {"queue": answers_queue()} if name in ANSWER_TASKS else None
