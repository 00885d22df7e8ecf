"""Shared plumbing for the benchmarks: the bench database, a gunicorn server, a Celery worker, the
machine description and percentiles. Each bench script prints ONE JSON object and exits 0.

The bench talks to its own database and Redis db/queue (defaults below; override with
DATABASE_URL / REDIS_URL / CELERY_QUEUE) so it never touches a developer's or the tests' data.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_VAR = Path(os.environ.get("BENCH_VAR_DIR", REPO_ROOT / "var" / "bench"))

DEFAULTS = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/studio_bench",
    "REDIS_URL": "redis://127.0.0.1:6379/14",
    "CELERY_QUEUE": "studio-bench",
    # Production-like: no DEBUG (Django would keep every query in memory), a real secret.
    "DEBUG": "0",
    "SECRET_KEY": "bench-" + "x" * 60,
    "STUDIO_ENCRYPTION_KEY": "bench-encryption-key",
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    "STUDIO_VAR_DIR": str(BENCH_VAR),
    "LOG_LEVEL": "WARNING",
    "STUDIO_RATELIMIT_AUTH_FAILURES": "0",
    # Plain HTTP on loopback: no redirect to HTTPS, no HSTS.
    "SECURE_SSL_REDIRECT": "0",
    "SECURE_HSTS_SECONDS": "0",
    "SESSION_COOKIE_SECURE": "0",
    "CSRF_COOKIE_SECURE": "0",
}


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in DEFAULTS.items():
        env.setdefault(key, value)
    return env


def setup_django() -> None:
    """Point this process at the bench database (created and migrated if needed) and set Django up."""
    os.environ.update({k: v for k, v in bench_env().items() if k in DEFAULTS})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    sys.path.insert(0, str(REPO_ROOT))
    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    create_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    manifest = BENCH_VAR / "staticfiles" / "staticfiles.json"
    if not manifest.is_file():
        call_command("collectstatic", verbosity=0, interactive=False)


def create_database(url: str) -> None:
    if not url.startswith(("postgres://", "postgresql://")):
        return
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def fresh_project(prefix: str, *, max_concurrent_runs: int = 100_000):
    """A new project (and owner, plan, token) for one bench run; old bench rows are left alone."""
    from django.contrib.auth import get_user_model

    from studio.services import create_api_token, create_plan, create_project

    tag = uuid.uuid4().hex[:8]
    plan = create_plan(f"bench-{prefix}", includes_training=True, max_concurrent_runs=max_concurrent_runs, max_gpus_per_run=8)
    user = get_user_model().objects.create_user(f"bench-{prefix}-{tag}", password=None)
    project = create_project(f"bench-{prefix}-{tag}", owner=user, plan=plan)
    _, token = create_api_token(user, project)
    return project, user, token


def live_run(project, user, name: str):
    """A run of `project` marked running, and the ingest token its engine would have: a bench posts
    reports as an engine does, with no engine."""
    from studio import crypto
    from training.models import Status, TrainingRun
    from training.services import create_run

    run = create_run(project, user, name=name, method="sft", base_model="org/base", dataset="org/data")
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    return run, token


def session_cookie(user) -> str:
    """A logged-in session for `user`, for the HTML pages."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]  # a session naming another backend is logged out
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return session.session_key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


class Gunicorn:
    """The web app under gunicorn with studio/gunicorn.conf.py, as production runs it."""

    def __init__(self, workers: int = 2, threads: int = 2, port: int | None = None, extra_env: dict[str, str] | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers, self.threads = workers, threads
        self.log_path = BENCH_VAR / f"gunicorn-{self.port}.log"
        env = {**bench_env(), "GUNICORN_WORKERS": str(workers), "GUNICORN_THREADS": str(threads),
               "GUNICORN_BIND": f"127.0.0.1:{self.port}", **(extra_env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "studio/gunicorn.conf.py", "studio.wsgi:application"],
            cwd=REPO_ROOT, env=env, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        wait_port(self.port, self.proc)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> Gunicorn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(sum(ms) / len(ms), 2)}


def machine() -> dict[str, Any]:
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(), "platform": platform.platform(),
    }
    try:
        from django.db import connection

        info["database"] = f"{connection.vendor} {connection.cursor().connection.info.server_version}" if connection.vendor == "postgresql" else connection.vendor
    except Exception:  # noqa: BLE001 - a description only
        pass
    return info


def emit(name: str, figures: dict[str, Any], setup: dict[str, Any], targets: dict[str, Any] | None = None) -> None:
    print(json.dumps({"bench": name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "figures": figures,
                      "targets": targets or {}, "setup": setup, "machine": machine()}, indent=2))
