"""The health of what the Studio needs: its database, the task queue (Redis, Celery's broker), a
Celery worker on each of its queues, and the reconciler's periodic passes. `/api/health` reports
them (studio.health_api); `/healthz` (studio.views.healthz) checks none of them.

Each check is bounded: the broker gets BROKER_TIMEOUT_S to connect, the workers WORKER_TIMEOUT_S to
answer, and the workers and the reconciler (whose last pass is kept in Redis) are not asked while
Redis cannot be reached, so a probe has its answer within a few seconds at worst. The sentences say
what to start or check, and never name a URL, a host or a password."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from studio.celery import answers_queue, app
from studio.database import UNREACHABLE_ADVICE
from studio.errors import counted
from training import reconciler

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 1.0
WORKER_TIMEOUT_S = 1.0
FRESH_S = 5.0  # an answer is reused this long: /api/health takes no token, and each check costs up to seconds


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Health:
    status: str  # "ok", "degraded" (the database answers, something else does not) or "down" (no database)
    checks: dict[str, Check]

    @property
    def http_status(self) -> int:
        return 503 if self.status == "down" else 200

    def body(self) -> dict:
        return {"status": self.status, "checks": {name: asdict(check) for name, check in self.checks.items()}}


REDIS_DOWN = Check(
    False,
    "Not checked: the task queue (Redis) cannot be reached, and both the workers and the reconciler's "
    "last pass are asked through it. Start Redis first (see broker).",
)


def check_database() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (OperationalError, InterfaceError) as exc:
        log.warning("health: the database cannot be reached: %s", exc)
        return Check(False, f"The database cannot be reached: every page and API call answers 503 until it does; {UNREACHABLE_ADVICE}.")
    return Check(True, "The database answers.")


def check_broker() -> Check:
    transport = {"socket_connect_timeout": BROKER_TIMEOUT_S, "socket_timeout": BROKER_TIMEOUT_S}
    try:
        with app.connection_for_write(transport_options=transport) as broker:
            broker.ensure_connection(max_retries=0)
    except BrokerError as exc:
        log.warning("health: the task queue cannot be reached: %s", exc)
        return Check(
            False,
            f"The task queue (Redis) did not answer within {BROKER_TIMEOUT_S:g} s: STARTs and STOPs are stored "
            "and sent once it is back. Start Redis (make studio starts its own), or check REDIS_URL.",
        )
    return Check(True, "The task queue (Redis) answers.")


def workers_by_queue() -> Counter[str]:
    """How many workers consume each queue, from those that answer a broadcast within WORKER_TIMEOUT_S
    (the broadcast waits that long for every answer)."""
    replies = app.control.inspect(timeout=WORKER_TIMEOUT_S).active_queues() or {}
    return Counter(queue["name"] for queues in replies.values() for queue in queues)


def check_workers(workers: Counter[str], queue: str, waiting: str, start: str) -> Check:
    n = workers[queue]
    if n:
        return Check(True, f"{counted(n, 'Celery worker')} {'answers' if n == 1 else 'answer'} on queue {queue}.")
    return Check(
        False,
        f"No Celery worker answers on queue {queue}: {waiting} wait until one does. "
        f"Start it with `.venv/bin/celery -A studio worker -Q {queue}{start}` (make studio starts it).",
    )


def check_reconciler(now: datetime) -> Check:
    interval = float(settings.CELERY_BEAT_SCHEDULE["reconcile-runs"]["schedule"])
    start = (
        f"check that exactly one beat runs (`.venv/bin/celery -A studio beat`; make studio starts it) and that a "
        f"worker serves queue {app.conf.task_default_queue}"
    )
    try:
        last = reconciler.last_pass_at()
    except RedisError as exc:
        log.warning("health: the reconciler's last pass cannot be read: %s", exc)
        return Check(False, "The reconciler's last pass cannot be read: it is kept in Redis, which did not answer; check REDIS_URL.")
    if last is None:
        return Check(False, f"No reconciler pass is recorded (beat queues one every {interval:g} s): until one runs, runs do not move on; {start}.")
    age = (now - last).total_seconds()
    if age > reconciler.pass_gap_seconds():
        return Check(
            False, f"The reconciler's last pass began {age:.0f} s ago, though beat queues one every {interval:g} s: runs do not move on meanwhile; {start}."
        )
    return Check(True, f"The reconciler's last pass began {age:.0f} s ago (one every {interval:g} s).")


_last: tuple[float, Health] | None = None
_lock = threading.Lock()


def health() -> Health:
    """The Studio's health, checked at most once every FRESH_S per process: a probe, or anyone (it
    takes no token), asking many times at once waits for one check and shares its answer, rather than
    each holding a web worker for a broadcast to the Celery workers."""
    global _last
    with _lock:
        if _last is not None and time.monotonic() - _last[0] < FRESH_S:
            return _last[1]
        found = check_all()
        _last = (time.monotonic(), found)
        return found


def forget() -> None:
    """Drop the kept answer: the next health() checks again."""
    global _last
    with _lock:
        _last = None


def check_all() -> Health:
    checks = {"database": check_database(), "broker": check_broker()}
    if checks["broker"].ok:
        workers = workers_by_queue()
        checks["worker"] = check_workers(workers, app.conf.task_default_queue, "STARTs, STOPs and the reconciler's passes", "")
        checks["answers_worker"] = check_workers(workers, answers_queue(), "Try it's answers", " -c 1 -n answers@%h")
        checks["reconciler"] = check_reconciler(timezone.now())
    else:
        checks.update(dict.fromkeys(("worker", "answers_worker", "reconciler"), REDIS_DOWN))
    status = "down" if not checks["database"].ok else "ok" if all(c.ok for c in checks.values()) else "degraded"
    return Health(status, checks)
