"""Fixtures for the remote backends: a real `dstack server` (own virtualenv, temp home, spare port),
a project connected to it, and a spare redis-server for restart tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from studio.services import set_secret
from training.models import BackendConnection

REPO_ROOT = Path(__file__).resolve().parents[2]
DSTACK_VENV = Path(os.environ.get("STUDIO_DSTACK_VENV", REPO_ROOT / "var" / "dstack-venv"))


def spare_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    port = spare_port()
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
