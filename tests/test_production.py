"""Production settings and hardening: `check --deploy` clean, gunicorn + whitenoise serving hashed
static files, HTTPS redirect with the ingest path exempt, secure cookies and headers, CSRF on every
form and HTMX request, rate limits on token failures, and the audit log the services write."""
from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from django.test import Client

from studio import crypto
from studio.models import AuditEvent
from tests.conftest import REPO_ROOT, assert_error, free_port, listening, sft_body, wait_for
from training.models import LogLine, Status, TrainingRun


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Not inherited: what a test process may set that a deployment must not (Playwright's tests set
    # DJANGO_ALLOW_ASYNC_UNSAFE, which `check --deploy` rightly reports as async.E001).
    dropped = ("DEBUG", "SECRET_KEY", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), STUDIO_ENCRYPTION_KEY=secrets.token_urlsafe(32),
        STUDIO_VAR_DIR=str(tmp_path / "var"), ALLOWED_HOSTS="127.0.0.1,localhost", LOG_LEVEL="WARNING", **extra,
    )
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_check_deploy_is_clean_with_debug_off_and_a_real_secret(tmp_path):
    done = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout, done.stdout


def test_debug_off_without_a_secret_refuses_to_start(tmp_path):
    env = production_env(tmp_path)
    env.pop("SECRET_KEY")
    done = manage(env, "check")
    assert done.returncode != 0 and "SECRET_KEY is not set" in done.stderr


@pytest.fixture(scope="module")
def gunicorn_server(tmp_path_factory, django_db_setup):
    """collectstatic, then the app under gunicorn with studio/gunicorn.conf.py and DEBUG=0, on the
    test database (it only reads there)."""
    from django.db import connection

    tmp_path = tmp_path_factory.mktemp("prod")
    env = production_env(tmp_path)
    db = connection.settings_dict
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    collected = manage(env, "collectstatic", "--noinput")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    manifest = tmp_path / "var" / "staticfiles" / "staticfiles.json"
    assert manifest.is_file()
    port = free_port()
    env.update(GUNICORN_BIND=f"127.0.0.1:{port}", GUNICORN_WORKERS="1", GUNICORN_THREADS="2")
    log = (tmp_path / "gunicorn.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "studio/gunicorn.conf.py", "studio.wsgi:application"],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gunicorn.log").read_text()
            time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}", manifest
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_whitenoise_serves_hashed_static_files_with_long_caching(gunicorn_server):
    import json

    url, manifest = gunicorn_server
    paths = json.loads(manifest.read_text())["paths"]
    name, hashed = next((k, v) for k, v in paths.items() if k.endswith(".js"))
    https = {"X-Forwarded-Proto": "https"}
    response = requests.get(f"{url}/static/{hashed}", headers=https, timeout=10)
    assert response.status_code == 200 and len(response.content) > 0
    assert "max-age=315360000" in response.headers.get("Cache-Control", ""), response.headers
    assert requests.get(f"{url}/static/{hashed}", headers={**https, "Accept-Encoding": "gzip"}, timeout=10).headers.get("Content-Encoding") in ("gzip", "br", None)


def test_plain_http_redirects_to_https_but_ingest_is_exempt(gunicorn_server):
    url, _ = gunicorn_server
    page = requests.get(f"{url}/login/", allow_redirects=False, timeout=10)
    assert page.status_code == 301 and page.headers["Location"].startswith("https://")
    # Engines of the local backend report over loopback HTTP: a redirect would lose the POST.
    ingest = requests.post(f"{url}/api/ingest/runs/1", json={"batch_id": "x"}, headers={"Authorization": "Bearer nope"}, allow_redirects=False, timeout=10)
    assert ingest.status_code in (401, 403), ingest.status_code
    assert set(ingest.json()) == {"detail", "errors"}


def test_health_probes_answer_over_plain_http(gunicorn_server):
    """A load balancer or Kubernetes asks gunicorn itself, over plain HTTP: a 301 would read as down."""
    url, _ = gunicorn_server
    assert requests.get(f"{url}/healthz", allow_redirects=False, timeout=10).json() == {"status": "ok"}
    ready = requests.get(f"{url}/api/health", allow_redirects=False, timeout=10)
    assert ready.status_code == 200 and ready.json()["checks"]["database"]["ok"], ready.content[:500]


def test_https_pages_send_hsts_secure_cookies_and_csrf(gunicorn_server):
    url, _ = gunicorn_server
    page = requests.get(f"{url}/login/", headers={"X-Forwarded-Proto": "https"}, allow_redirects=False, timeout=10)
    assert page.status_code == 200, page.status_code
    assert "max-age=31536000" in page.headers.get("Strict-Transport-Security", "")
    assert page.headers.get("X-Frame-Options") == "DENY"
    assert page.headers.get("X-Content-Type-Options") == "nosniff"
    cookie = next(c for c in page.cookies if c.name == "csrftoken")
    assert cookie.secure, "the CSRF cookie must be Secure in production"
    assert 'name="csrfmiddlewaretoken"' in page.text


def test_session_cookie_is_secure_and_httponly_in_production(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings as s; "
         "print(s.SESSION_COOKIE_SECURE, s.SESSION_COOKIE_HTTPONLY, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.STUDIO_RATELIMIT_AUTH_FAILURES > 0)"],
        cwd=REPO_ROOT, env={**production_env(tmp_path), "DJANGO_SETTINGS_MODULE": "studio.settings"}, capture_output=True, text=True, timeout=60,
    )
    assert done.stdout.split() == ["True"] * 5, done.stdout + done.stderr


@pytest.mark.parametrize("redirect, line, status", [
    ("", "but it redirects every page to https://", 301),
    ("0", "Studio is up: http://", 200),
])
def test_runstudio_with_debug_off_says_whether_its_plain_http_address_serves_pages(tmp_path, django_db_setup, redirect, line, status):
    """runserver speaks plain HTTP only: with SECURE_SSL_REDIRECT on (the DEBUG=0 default) its
    address answers every page with a redirect to https, and runstudio must not call it up."""
    from django.db import connection

    env = production_env(tmp_path, SECURE_SSL_REDIRECT=redirect)
    db = connection.settings_dict
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    collected = manage(env, "collectstatic", "--noinput")  # without it every page is a 500 when DEBUG=0
    assert collected.returncode == 0, collected.stdout + collected.stderr
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log_path = tmp_path / "runstudio.log"
    with log_path.open("wb") as log:
        studio = subprocess.Popen([sys.executable, "manage.py", "runstudio", "--addr", addr], cwd=REPO_ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "Studio is up" in log_path.read_text(), 60, message="runstudio to start its parts")
        up = next(text for text in log_path.read_text().splitlines() if "Studio is up" in text)
        assert line in up, up
        wait_for(lambda: listening(port), 30, message="runserver to listen")
        assert requests.get(f"http://{addr}/login/", allow_redirects=False, timeout=10).status_code == status
    finally:
        studio.terminate()
        studio.wait(timeout=30)


# ---- CSRF on every form and HTMX request ---------------------------------------------------------

TEMPLATES = REPO_ROOT / "templates"


def test_every_post_form_in_the_templates_carries_the_csrf_token():
    missing = []
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        for form in re.finditer(r"<form\b[^>]*>(.*?)</form>", text, re.S | re.I):
            if re.search(r'method\s*=\s*["\']?post', form.group(0)[:300], re.I) and "{% csrf_token %}" not in form.group(1):
                missing.append(f"{path.relative_to(REPO_ROOT)}: {form.group(0)[:80]}")
    assert not missing, missing


def test_htmx_requests_send_the_csrf_token_from_the_body():
    base = (TEMPLATES / "base.html").read_text()
    assert re.search(r"<body[^>]*hx-headers='\{\"X-CSRFToken\": \"\{\{ csrf_token \}\}\"\}'", base), "base.html <body> must carry hx-headers with X-CSRFToken"


def test_a_page_post_without_the_csrf_token_is_refused(users, project, api):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(users["owner"])
    assert browser.post(f"/training/runs/{run_id}/start").status_code == 403
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    # The same POST with the token the page hands out (hx-headers) goes through the CSRF check.
    browser.get("/training/")
    token = browser.cookies["csrftoken"].value
    assert browser.post(f"/training/runs/{run_id}/start", HTTP_X_CSRFTOKEN=token).status_code != 403


def test_an_api_write_with_a_session_but_no_csrf_token_is_403(users, project):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(users["owner"])
    assert_error(browser.post("/api/training-runs", data=sft_body(), content_type="application/json"), 403)
    assert not TrainingRun.objects.exists()


# ---- rate limits on token failures ---------------------------------------------------------------

@pytest.fixture
def limited(settings):
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 3
    settings.STUDIO_RATELIMIT_WINDOW_SECONDS = 60
    # A fresh address per test: the counters live in the shared Redis, outside the test transaction.
    return f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250 + 1}"


def test_bad_tokens_from_one_address_are_limited_with_429_and_valid_ones_still_work(limited, tokens, project):
    client = Client(REMOTE_ADDR=limited)
    for _ in range(3):
        assert_error(client.get("/api/training-runs", HTTP_AUTHORIZATION="Bearer stu_wrong"), 401)
    response = client.get("/api/training-runs", HTTP_AUTHORIZATION="Bearer stu_wrong")
    body = assert_error(response, 429)
    retry_after = response.headers.get("Retry-After", "")
    assert retry_after.isdecimal() and int(retry_after) > 0 and f"try again in {retry_after} s" in body["detail"]
    assert_error(client.get("/api/training-runs", HTTP_AUTHORIZATION="Bearer"), 429)
    # Behind a proxy every user has its address: one user's typos used to lock out everyone's valid tokens.
    assert client.get("/api/training-runs", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}").status_code == 200
    assert_error(client.get("/api/training-runs", HTTP_AUTHORIZATION="Bearer stu_wrong"), 429)
    # Another address is not affected.
    assert Client(REMOTE_ADDR=limited + "0").get("/api/training-runs", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}").status_code == 200


def test_bad_tokens_on_the_hub_are_limited_with_429_and_retry_after(limited, project):
    client = Client(REMOTE_ADDR=limited)
    for _ in range(3):
        assert client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer stu_wrong").status_code == 401
    response = client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer stu_wrong")
    assert response.status_code == 429 and response.headers.get("Retry-After", "").isdecimal()


def test_good_tokens_do_not_count_against_the_limit(limited, tokens, project):
    client = Client(REMOTE_ADDR=limited)
    for _ in range(10):
        assert client.get("/api/training-runs", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}").status_code == 200


def test_bad_ingest_tokens_are_limited_too(limited, api):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    client = Client(REMOTE_ADDR=limited)
    for _ in range(3):
        assert_error(client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": "b"}, content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_guess"), 403)
    response = client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": "b"}, content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_guess")
    assert_error(response, 429)
    assert response.headers.get("Retry-After", "").isdecimal()


def test_an_engine_with_its_valid_ingest_token_is_not_locked_out_by_another_engines_bad_ones(limited, api):
    # Every local engine reports from 127.0.0.1: one stale engine's 403s used to make all the others' reports 429s.
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status="running", attempt=1, ingest_token_hash=crypto.hash_token("ing_valid"))
    client = Client(REMOTE_ADDR=limited)
    for status in (403, 403, 403, 429):
        assert_error(client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": "b"}, content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_stale"), status)
    r = client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": "b1", "logs": ["hello"]}, content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_valid")
    assert r.status_code == 200, r.content
    assert list(LogLine.objects.filter(run_id=run_id).values_list("line", flat=True)) == ["hello"]


def test_the_limit_is_off_when_set_to_zero(settings, project):
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 0
    client = Client(REMOTE_ADDR="10.255.255.254")
    for _ in range(30):
        assert client.get("/api/training-runs", HTTP_AUTHORIZATION="Bearer stu_wrong").status_code == 401


# ---- the audit log -------------------------------------------------------------------------------

def test_create_patch_start_stop_are_audited_with_who_and_how(api, tokens, users, project):
    run_id = api.post("/api/training-runs", sft_body(name="audited")).json()["id"]
    assert api.patch(f"/api/training-runs/{run_id}", {"name": "audited 2", "config": {"max_steps": 5}}).status_code == 200
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING, start_requested_at=None)
    assert api.post(f"/api/training-runs/{run_id}/stop").status_code == 200
    events = list(AuditEvent.objects.filter(target_type="trainingrun", target_id=str(run_id)).order_by("id"))
    assert [e.action for e in events] == ["created", "patched", "started", "stopped"]
    for event in events:
        assert event.actor == users["owner"] and event.actor_name == "owner"
        assert event.project == project and event.project_slug == "acme"
        assert event.via.startswith("token stu") or event.via.startswith("token "), event.via
        assert event.ip == "127.0.0.1" and event.created_at
    assert events[1].details == {"fields": ["config", "name"]} and events[0].target_name == "audited"


def test_a_refused_change_leaves_no_audit_event(api_as, api, project):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    before = AuditEvent.objects.count()
    assert_error(api_as("viewer").post(f"/api/training-runs/{run_id}/start"), 403)
    assert_error(api.post(f"/api/training-runs/{run_id}/stop"), 409)
    assert AuditEvent.objects.count() == before


def test_a_page_action_is_audited_as_the_session_user(users, project, api):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    browser = Client()
    browser.force_login(users["member"])
    browser.post(f"/training/runs/{run_id}/start")
    event = AuditEvent.objects.filter(target_id=str(run_id), action="started").get()
    assert event.actor == users["member"] and event.via == "session"
