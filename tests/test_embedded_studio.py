"""The README's first command, end to end: the embedded default (SQLite, embedded redis-server,
Celery worker + beat, local backend, tiny demo models) serves the admin and the API docs and trains
a run through the REST API."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read().decode(), exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0, ""  # not listening yet
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


@pytest.fixture
def embedded_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "STUDIO_RUNS_DIR", "STUDIO_PUBLIC_URL")}
    env.update(DEBUG="1", STUDIO_VAR_DIR=str(tmp_path / "var"))
    return env


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_the_embedded_studio_serves_and_trains(embedded_env, tmp_path):
    manage(embedded_env, "migrate", "--noinput")
    out = manage(embedded_env, "bootstrapdemo")
    assert "admin" in out
    token = (tmp_path / "var" / "demo-token").read_text().strip()
    built = json.loads((tmp_path / "var" / "demo" / "built.json").read_text())
    assert manage(embedded_env, "bootstrapdemo").count("API token") == 0  # idempotent: no second token

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "studio.log").open("wb")
    studio = subprocess.Popen([sys.executable, "manage.py", "runstudio", "--addr", f"127.0.0.1:{port}"], cwd=REPO_ROOT, env=embedded_env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: http("GET", f"{base}/admin/login/")[0] == 200, 90, interval=0.5, message="the web server")
        assert (tmp_path / "var" / "redis.sock").exists()  # the embedded broker
        status, docs = http("GET", f"{base}/api/docs")
        assert status == 200 and "swagger" in str(docs).lower()
        assert http("GET", f"{base}/api/openapi.json")[0] == 200

        status, run = http("POST", f"{base}/api/training-runs", token, {
            "name": "embedded sft", "method": "sft", "base_model": built["student"], "dataset": built["sft"],
            "config": {"max_steps": 5, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}})
        assert status == 201, run
        assert http("POST", f"{base}/api/training-runs/{run['id']}/start", token)[0] == 202
        final = wait_for(lambda: (lambda r: r if r["status"] in ("completed", "failed", "cancelled") else None)(http("GET", f"{base}/api/training-runs/{run['id']}", token)[1]),
                         240, interval=1, message="the embedded run to finish")
        assert final["status"] == "completed", (final["error"], (tmp_path / "studio.log").read_text()[-3000:])
        _, metrics = http("GET", f"{base}/api/training-runs/{run['id']}/metrics?keys=loss", token)
        assert len(metrics["series"]["loss"]) == 5
        assert Path(tmp_path / "var" / "studio.sqlite3").is_file()
    finally:
        os.killpg(studio.pid, signal.SIGINT)
        try:
            studio.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(studio.pid, signal.SIGKILL)
