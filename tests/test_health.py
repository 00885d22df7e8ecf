"""/healthz (liveness: asks nothing) and /api/health (readiness: the database, Redis, a worker on each
queue, the reconciler's last pass), and the 503 that a request finding the database unreachable
answers instead of a 500.

Everything here is real: the worker is a `celery worker` subprocess with beat, Redis is the test's.
"Down" means pointed at a TCP port where nothing listens, so the client really connects and is
refused: the broker by the Celery app's broker URL (as tests/test_queue_down.py does), the database
by this thread's connection settings (Django keeps each connection's settings from its start, so a
DATABASES override would not reach it; the connection is closed first, and each query connects again).
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import OperationalError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from studio import health as studio_health
from studio.celery import app
from studio.database import database_unavailable
from tests.conftest import celery_worker, free_port, wait_for
from tests.test_openapi import assert_documented
from tests.test_queue_down import point_broker_at
from training import reconciler

CHECKS = {"database", "broker", "worker", "answers_worker", "reconciler"}


@pytest.fixture(autouse=True)
def fresh_health():
    studio_health.forget()  # an answer is kept FRESH_S: each test checks its own world


def health(client: Client) -> tuple[int, dict]:
    studio_health.forget()
    response = client.get("/api/health")
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    body = response.json()
    assert set(body) == {"status", "checks"} and set(body["checks"]) == CHECKS, body
    assert all(set(check) == {"ok", "detail"} and check["detail"] for check in body["checks"].values()), body
    return response.status_code, body


def assert_names_no_address(body: dict, *ports: int) -> None:
    """The checks say what to start or check, never where it is (an unauthenticated reader sees them)."""
    text = json.dumps(body)
    for secret in ("127.0.0.1", "localhost", "redis://", "postgres", "password", *map(str, ports)):
        assert secret not in text, (secret, text)


@pytest.fixture
def database_down(transactional_db):
    """This thread's connection pointed at a port where nothing listens: every query is refused, as
    with the database server stopped. The data made before stays; the connection is restored after."""
    kept = connection.settings_dict["PORT"]
    port = free_port()
    connection.close()
    connection.settings_dict["PORT"] = port
    try:
        yield port
    finally:
        connection.close()
        connection.settings_dict["PORT"] = kept


@pytest.fixture
def broker_down():
    kept, port = app.conf.broker_url, free_port()
    point_broker_at(f"redis://127.0.0.1:{port}/0")
    try:
        yield port
    finally:
        point_broker_at(kept)


@pytest.fixture
def no_pass_recorded():
    cache.delete(reconciler.PASS_KEY)
    yield
    cache.delete(reconciler.PASS_KEY)


# ---- /healthz ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_is_ok_without_a_query_a_session_or_a_token(client):
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert len(queries) == 0, [q["sql"] for q in queries]
    assert "sessionid" not in response.cookies and "Cookie" not in response.get("Vary", "")


def test_healthz_is_ok_with_the_database_down(client, database_down):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.head("/healthz").status_code == 200


# ---- /api/health ---------------------------------------------------------------------------------


@pytest.mark.worker
def test_health_is_ok_with_a_live_worker_and_beat(client, transactional_db, tmp_path, settings):
    """A real worker on both of the Studio's queues, with beat queueing the reconciler every second:
    its passes land under this process's cache prefix (CACHE_KEY_PREFIX carries the database's name,
    which is the test database's in the worker and not here), where the check reads them."""
    app.control.purge()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DEBUG": "1",
        "RECONCILE_INTERVAL_SECONDS": "1",
        "CACHE_KEY_PREFIX": settings.CACHE_KEY_PREFIX,
        "CELERY_QUEUE": app.conf.task_default_queue,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
    }
    cache.delete(reconciler.PASS_KEY)
    with celery_worker(env, tmp_path / "worker.log", "health", beat_schedule=tmp_path / "celerybeat-schedule"):
        wait_for(lambda: health(client)[1]["checks"]["reconciler"]["ok"], 60, message="a reconciler pass in /api/health")
        status, body = health(client)
    assert status == 200 and body["status"] == "ok", body
    queue = app.conf.task_default_queue
    assert body["checks"]["worker"]["detail"] == f"1 Celery worker answers on queue {queue}."
    assert body["checks"]["answers_worker"]["detail"] == f"1 Celery worker answers on queue {queue}-answers."
    assert body["checks"]["reconciler"]["detail"].startswith("The reconciler's last pass began ")


@pytest.mark.django_db
def test_health_without_a_worker_or_a_reconciler_pass_is_degraded_and_says_what_to_start(client, no_pass_recorded):
    queue = app.conf.task_default_queue
    assert_documented(client.get("/api/openapi.json").json(), "/api/health", "get", client.get("/api/health"))
    status, body = health(client)
    assert status == 200 and body["status"] == "degraded", body
    checks = body["checks"]
    assert checks["database"] == {"ok": True, "detail": "The database answers."}
    assert checks["broker"] == {"ok": True, "detail": "The task queue (Redis) answers."}
    assert not checks["worker"]["ok"]
    assert checks["worker"]["detail"].startswith(f"No Celery worker answers on queue {queue}: STARTs, STOPs")
    assert f"`.venv/bin/celery -A studio worker -Q {queue}`" in checks["worker"]["detail"]
    assert f"-Q {queue}-answers -c 1 -n answers@%h" in checks["answers_worker"]["detail"]
    assert not checks["reconciler"]["ok"] and checks["reconciler"]["detail"].startswith("No reconciler pass is recorded")
    assert "celery -A studio beat" in checks["reconciler"]["detail"]
    assert_names_no_address(body)


@pytest.mark.django_db
def test_health_names_a_reconciler_pass_older_than_three_intervals_as_stale(client, no_pass_recorded):
    cache.set(reconciler.PASS_KEY, timezone.now() - timedelta(seconds=600), None)
    check = health(client)[1]["checks"]["reconciler"]  # a second or two later: the workers' broadcast waits 1 s
    assert not check["ok"] and re.match(r"The reconciler's last pass began 60[0-2] s ago, though beat queues one every 15 s", check["detail"])
    cache.set(reconciler.PASS_KEY, timezone.now() - timedelta(seconds=5), None)
    check = health(client)[1]["checks"]["reconciler"]
    assert check["ok"] and re.fullmatch(r"The reconciler's last pass began [5-7] s ago \(one every 15 s\)\.", check["detail"])


@pytest.mark.django_db
def test_health_answers_asked_within_seconds_of_each_other_share_one_check(client, no_pass_recorded):
    """It takes no token: a flood of asks must not each hold a web worker for the workers' broadcast."""
    first = health(client)[1]["checks"]["reconciler"]
    assert not first["ok"]
    cache.set(reconciler.PASS_KEY, timezone.now(), None)
    began = time.monotonic()
    kept = [client.get("/api/health").json()["checks"]["reconciler"] for _ in range(5)]
    assert kept == [first] * 5 and time.monotonic() - began < studio_health.WORKER_TIMEOUT_S  # no broadcast waited on
    assert health(client)[1]["checks"]["reconciler"]["ok"]  # checked again once forgotten (FRESH_S later)


@pytest.mark.django_db
def test_health_with_the_broker_down_is_degraded_within_seconds(client, broker_down):
    began = time.monotonic()
    status, body = health(client)
    assert time.monotonic() - began < 3
    assert status == 200 and body["status"] == "degraded", body
    assert body["checks"]["database"]["ok"]
    assert not body["checks"]["broker"]["ok"] and "Start Redis" in body["checks"]["broker"]["detail"]
    assert "REDIS_URL" in body["checks"]["broker"]["detail"]
    for name in ("worker", "answers_worker", "reconciler"):
        assert not body["checks"][name]["ok"] and body["checks"][name]["detail"].startswith("Not checked: the task queue (Redis)")
    assert_names_no_address(body, broker_down)


def test_health_with_the_database_down_is_503_in_the_same_shape(client, database_down):
    spec = client.get("/api/openapi.json").json()
    assert_documented(spec, "/api/health", "get", client.get("/api/health"))
    status, body = health(client)
    assert status == 503 and body["status"] == "down", body
    assert not body["checks"]["database"]["ok"]
    assert "DATABASE_URL" in body["checks"]["database"]["detail"]
    assert body["checks"]["broker"]["ok"]
    assert_names_no_address(body, database_down)


def test_health_takes_no_token_and_refuses_unknown_query_parameters(client, db):
    assert client.get("/api/health", HTTP_AUTHORIZATION="Bearer nonsense").status_code == 200
    refused = client.get("/api/health?verbose=1")
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "verbose"


# ---- the database down: 503, not 500 -------------------------------------------------------------


def test_an_api_call_with_the_database_down_is_a_503_naming_the_database(api, database_down):
    response = api.get("/api/training-runs")
    assert response.status_code == 503, response.content[:500]
    body = response.json()
    assert body["detail"] == "The Studio cannot reach its database, so the request could not be completed."
    assert [e["field"] for e in body["errors"]] == ["database"]
    assert "DATABASE_URL" in body["errors"][0]["message"] and response["Retry-After"] == "10"
    assert_names_no_address(body, database_down)


@pytest.fixture
def logged_in(client, project, users):
    client.force_login(users["owner"])
    return client


def test_a_page_with_the_database_down_is_the_503_page(logged_in, database_down):
    response = logged_in.get("/training/")
    assert response.status_code == 503 and response["Retry-After"] == "10"
    page = response.content.decode()
    assert "The Studio cannot reach its database" in page and "reload the page in 10 s" in page.lower()


@pytest.mark.django_db
def test_a_database_error_on_a_live_connection_is_no_503():
    """A query the database refuses (here: cancelled by its statement timeout) is the request's own
    failure, a 500 with its traceback; only a connection that failed or dropped is a 503."""
    with pytest.raises(OperationalError) as refused, connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 1")
        cursor.execute("SELECT pg_sleep(1)")
    assert database_unavailable(refused.value) is None
