"""Shared fixtures: a project on a training plan with three personas and an outsider, each with a
token, and an API client that speaks JSON with a bearer token."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from studio.services import add_member, create_api_token, create_plan, create_project


@dataclass
class Api:
    client: Client
    token: str | None

    def _headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None, **query: Any):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        kwargs: dict[str, Any] = dict(self._headers())
        if method in ("get", "delete") and query:
            return getattr(self.client, method)(path, query, **kwargs)
        if data is not None:
            kwargs.update(data=data, content_type="application/json")
        return getattr(self.client, method)(path, **kwargs)

    def get(self, path: str, **query: Any):
        return self.call("get", path, **query)

    def post(self, path: str, body: Any = None, raw: bytes | None = None):
        return self.call("post", path, body, raw)

    def patch(self, path: str, body: Any = None, raw: bytes | None = None):
        return self.call("patch", path, body, raw)

    def put(self, path: str, body: Any = None):
        return self.call("put", path, body)

    def delete(self, path: str, body: Any = None):
        return self.call("delete", path, body)


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """PBKDF2 costs ~0.4 s a user; tests make many users and test nothing about hashing cost."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def team_plan(db):
    return create_plan("team", includes_training=True, max_concurrent_runs=2, max_gpus_per_run=8)


@pytest.fixture
def free_plan(db):
    return create_plan("free", includes_training=False, max_concurrent_runs=0, max_gpus_per_run=0)


@pytest.fixture
def users(db):
    User = get_user_model()
    return {name: User.objects.create_user(name, f"{name}@example.com", "pw") for name in ("owner", "member", "viewer", "outsider")}


@pytest.fixture
def project(users, team_plan):
    project = create_project("acme", owner=users["owner"], plan=team_plan)
    add_member(project, users["member"], "member")
    add_member(project, users["viewer"], "viewer")
    return project


@pytest.fixture
def other_project(users, team_plan):
    return create_project("globex", owner=users["outsider"], plan=team_plan)


@pytest.fixture
def tokens(project, other_project, users):
    out = {role: create_api_token(users[role], project)[1] for role in ("owner", "member", "viewer")}
    out["outsider"] = create_api_token(users["outsider"], other_project)[1]
    return out


@pytest.fixture
def root(db) -> Client:
    """A superuser's logged-in client: the Django admin (/admin/)."""
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def api(tokens) -> Api:
    """The owner's client."""
    return Api(Client(), tokens["owner"])


@pytest.fixture
def api_as(tokens):
    def make(role: str | None) -> Api:
        return Api(Client(), tokens[role] if role else None)

    return make


@pytest.fixture
def tiny_local_model(tmp_path):
    """A directory that looks like a local model (for refs that must resolve); no weights needed."""
    path = tmp_path / "tiny-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return str(path)


def sft_body(**overrides: Any) -> dict:
    body = {"name": "sft run", "method": "sft", "base_model": "org/base", "dataset": "org/my-data", "config": {}, "compute": {}}
    body.update(overrides)
    return body


def assert_error(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert isinstance(body.get("detail"), str) and body["detail"], body
    assert isinstance(body.get("errors"), list), body
    if field is not None:
        fields = [e["field"] for e in body["errors"]]
        assert field in fields, (field, body)
        for err in body["errors"]:
            assert err["message"], body
    return body


def refused_form_page(client, url: str, data: dict, form_page: str) -> str:
    """A plain form's refused POST: a 303 to the form's page (a reload of it is a GET, which sends
    nothing again), and the HTML of that page, which shows the refusal."""
    response = client.post(url, data)
    assert response.status_code == 303 and response["Location"] == form_page, (response.status_code, response.get("Location"), response.content[:2000])
    page = client.get(form_page)
    assert page.status_code == 200, page.content[:2000]
    return page.content.decode()


# ---- a real Celery worker against the test database --------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Worker:
    proc: subprocess.Popen
    log_path: Path
    runs_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(size, name, inodes) mounts a real filesystem of `size` ("1m") at tmp_path/name, a
    tmpfs (root can mount here), so a test fills a disk for real (or runs out of its `inodes`, where
    a new folder fails as on a full ext4 disk); unmounted afterwards. Skips where mounting is not
    allowed."""
    mounts: list[Path] = []

    def mount(size: str, name: str = "disk", inodes: int | None = None) -> Path:
        path = tmp_path / name
        path.mkdir()
        options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here to fill a disk for real: {done.stderr.strip()}")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_disk(mount: Path) -> Path:
    """Write a file on `mount` until its filesystem is full; delete the file to free the space."""
    import errno

    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while out.write(b"\0" * 65536):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def shell_project(name: str) -> str:
    """The first lines of a `manage.py shell -c` script that builds a Studio in another process (on a
    SQLite file the test made): a plan with training, a user, the project it owns and its API token,
    as `plan`, `user`, `project` and `token`, all named `name`."""
    return f"""
import json
from django.contrib.auth import get_user_model
from studio.services import create_api_token, create_plan, create_project
plan = create_plan({name!r}, includes_training=True, max_concurrent_runs=10, max_gpus_per_run=8)
user = get_user_model().objects.create_user({name!r}, password=None)
project = create_project({name!r}, owner=user, plan=plan)
_, token = create_api_token(user, project)
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server the test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, server: subprocess.Popen | None = None, log: Path | None = None) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`. `server`: the process the test started
    to listen there; one that exited fails the wait at once (with the end of `log`), not at its timeout."""
    if server is not None and server.poll() is not None:
        said = f":\n{log.read_text(errors='replace')[-3000:]}" if log is not None else ""
        raise AssertionError(f"the server exited with {server.returncode} before it listened on {port}{said}")
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")


@pytest.fixture
def studio_worker(transactional_db, live_server, tmp_path, settings):
    """A real `celery worker` (with beat) subprocess on the test database; engines it starts
    report to `live_server`. Runs are kept under tmp_path/runs."""
    from django.db import connection

    from studio.celery import app

    app.control.purge()
    runs_dir = tmp_path / "runs"
    settings.STUDIO_RUNS_DIR = runs_dir
    settings.STUDIO_PUBLIC_URL = live_server.url
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "STUDIO_PUBLIC_URL": live_server.url,
        "STUDIO_RUNS_DIR": str(runs_dir),
        "CELERY_QUEUE": app.conf.task_default_queue,
        "STUDIO_STOP_GRACE_SECONDS": "5",
        "RECONCILE_INTERVAL_SECONDS": "3",
        "DEBUG": "1",
    }
    log_path = tmp_path / "worker.log"
    # Beat too, as in `make studio`: the reconciler settles what no report did (an engine that
    # exited, a lost heartbeat) the same way it does in production.
    with celery_worker(env, log_path, "test", beat_schedule=tmp_path / "celerybeat-schedule") as proc:
        yield Worker(proc, log_path, runs_dir)


@contextlib.contextmanager
def celery_worker(env: dict[str, str], log_path: Path, name: str, beat_schedule: Path | None = None):
    """A real `celery worker` subprocess on the test queue, yielded once it is ready, stopped after. It
    answers Try it too (their own queue, which a worker of its own serves in a Studio: one process here
    is quicker to start, and its 4 threads leave the other tasks room)."""
    from studio.celery import answers_queue, app

    args = [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", f"{app.conf.task_default_queue},{answers_queue()}", "--pool", "threads",
            "-c", "4", "--loglevel", "INFO", "-n", f"{name}-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle"]
    if beat_schedule is not None:
        args += ["-B", "-s", str(beat_schedule)]
    with log_path.open("wb") as log:
        # Its own process group: `-B` runs beat in a child process, which a killed worker would leave
        # behind, publishing reconcile passes into the test queue for whatever worker comes next.
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "ready." in log_path.read_text(errors="replace") or proc.poll() is not None, 60,
                 message="the Celery worker to be ready")
        assert proc.poll() is None, log_path.read_text(errors="replace")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the worker left of its group (the beat child); engines run in their own


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """A tiny student and teacher sharing one tokenizer, plus demo datasets, built offline once."""
    from training.engine.tiny import build_demo_datasets, build_tiny_models

    out = tmp_path_factory.mktemp("tiny")
    return {**build_tiny_models(out / "models"), **{f"data_{k}": v for k, v in build_demo_datasets(out / "data").items()}}
