"""The README's first command, end to end: the embedded default (SQLite, embedded redis-server,
Celery worker + beat, local backend, tiny demo models) serves the admin and the API docs and trains
a run through the REST API."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO_ROOT, free_port, listening, wait_for


def branch_folders(db: Path, branch: str) -> set[str]:
    """The folders at the head of a Data Hub branch, read straight from the embedded SQLite file."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=20) as conn:
        paths = conn.execute(
            "SELECT t.path FROM datahub_treeentry t JOIN datahub_branch b ON t.commit_id = b.head_id WHERE b.name = ?", (branch,)
        ).fetchall()
    return {str(PurePosixPath(p).parent) for (p,) in paths} | {p.split("/")[0] for (p,) in paths if "/" in p}


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
            "name": "Über embedded sft", "method": "sft", "base_model": built["student"], "dataset": built["sft"],
            "config": {"max_steps": 5, "save_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}})
        assert status == 201, run
        # The run list's search folds case for every letter on SQLite too, as on PostgreSQL (SQLite's
        # own LIKE folds ASCII only and missed "Über" for "über").
        for text in ("über", "ÜBER EMBEDDED"):
            _, found = http("GET", f"{base}/api/training-runs?search={urllib.parse.quote(text)}", token)
            assert [r["id"] for r in found["items"]] == [run["id"]], (text, found)
        # Three STARTs at once on the one SQLite file: one starts the run, the others are told it is
        # starting (409), none fails on "database is locked".
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: http("POST", f"{base}/api/training-runs/{run['id']}/start", token), range(3)))
        assert sorted(status for status, _ in answers) == [202, 409, 409], answers
        final = wait_for(lambda: (lambda r: r if r["status"] in ("completed", "failed", "cancelled") else None)(http("GET", f"{base}/api/training-runs/{run['id']}", token)[1]),
                         240, interval=1, message="the embedded run to finish")
        assert final["status"] == "completed", (final["error"], (tmp_path / "studio.log").read_text()[-3000:])
        _, metrics = http("GET", f"{base}/api/training-runs/{run['id']}/metrics?keys=loss", token)
        assert len(metrics["series"]["loss"]) == 5
        assert Path(tmp_path / "var" / "studio.sqlite3").is_file()
        # Every checkpoint the engine reported lands on the run's branch while ingest writes the same file.
        _, checkpoints = http("GET", f"{base}/api/training-runs/{run['id']}/checkpoints", token)
        assert {(c["step"], c["kind"]) for c in checkpoints} >= {(2, "checkpoint"), (4, "checkpoint"), (5, "final")}
        wanted = {"checkpoints/step-2", "checkpoints/step-4", "final"}
        wait_for(lambda: branch_folders(tmp_path / "var" / "studio.sqlite3", f"run-{run['id']}") >= wanted, 60, interval=1,
                 message=f"{sorted(wanted)} on the run's branch")
        # A folder is matched in its own case, as on PostgreSQL: SQLite's LIKE ignores case, and
        # "CHECKPOINTS/STEP-2" listed checkpoints/step-2's files.
        files = f"{base}/api/hub/repos/experiment-default/files?ref=run-{run['id']}&path="
        assert http("GET", files + "checkpoints/step-2", token)[1]["files"]
        assert http("GET", files + "CHECKPOINTS/STEP-2", token)[0] == 404  # a folder the ref does not have
        hf_tree = f"{base}/hub/api/models/demo/experiment-default/tree/run-{run['id']}/"
        assert http("GET", hf_tree + "checkpoints/step-2", token)[0] == 200
        assert http("GET", hf_tree + "CHECKPOINTS/STEP-2", token)[0] == 404

        # A worker that dies is started again, and the next run trains on the new one, from the demo's
        # Data Hub repos (bootstrapdemo commits the model and datasets there too).
        studio_log = (tmp_path / "studio.log").read_text
        worker_pid = int(re.search(r"worker started \(pid (\d+)\)", studio_log()).group(1))
        os.kill(worker_pid, signal.SIGKILL)
        wait_for(lambda: "worker exited with -9; started it again" in studio_log(), 30, message="runstudio to start the worker again")
        status, again = http("POST", f"{base}/api/training-runs", token, {
            "name": "after the worker died", "method": "sft", "base_model": "demo-student@main", "dataset": "demo-sft@main",
            "config": {"max_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}})
        assert status == 201 and http("POST", f"{base}/api/training-runs/{again['id']}/start", token)[0] == 202
        final = wait_for(lambda: (lambda r: r if r["status"] in ("completed", "failed", "cancelled") else None)(http("GET", f"{base}/api/training-runs/{again['id']}", token)[1]),
                         240, interval=1, message="the run after the restart to finish")
        assert final["status"] == "completed", (final["error"], studio_log()[-3000:])
        # Its log names the demo repos with the commits START pinned them to.
        _, logs = http("GET", f"{base}/api/training-runs/{again['id']}/logs?full=true", token)
        assert re.search(r"trains from base_model demo-student@main = demo/demo-student@[0-9a-f]{12}, dataset demo-sft@main = demo/demo-sft@[0-9a-f]{12}",
                         "\n".join(logs["lines"])), logs["lines"][:20]
    finally:
        os.killpg(studio.pid, signal.SIGINT)
        try:
            studio.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(studio.pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("stop", ["SIGTERM to runstudio", "SIGINT to its group", "SIGTERM to its group"])
def test_runstudio_stops_every_part_and_starts_none_again(embedded_env, tmp_path, stop):
    """Started in the background by a script (SIGINT ignored, as a non-interactive shell leaves it):
    a SIGTERM to runstudio alone, or a SIGINT to its whole group, stops every part, and runstudio
    does not take the parts dying of that SIGINT for crashes to mend by starting them again."""
    manage(embedded_env, "migrate", "--noinput")
    log_path = tmp_path / "studio.log"
    port = free_port()
    with log_path.open("wb") as log:
        studio = subprocess.Popen([sys.executable, "manage.py", "runstudio", "--addr", f"127.0.0.1:{port}"], cwd=REPO_ROOT,
                                  env=embedded_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: "Studio is up" in log_path.read_text(), 60, message="runstudio to start its parts")
        parts = [int(pid) for pid in re.findall(r"started \(pid (\d+)\)", log_path.read_text())]
        assert len(parts) == 5  # redis, worker, answers, beat, web
        # The parts are up, not still importing (a SIGINT there is a KeyboardInterrupt traceback): the
        # worker said ready (celery installs its own signal handlers then) and the web server answers.
        wait_for(lambda: "ready." in log_path.read_text(), 120, message="the worker to be ready")
        wait_for(lambda: listening(port), 120, message="the web server to listen")
        time.sleep(2)  # beat, which says nothing when it is up
        if stop == "SIGTERM to runstudio":
            os.kill(studio.pid, signal.SIGTERM)
        else:
            os.killpg(studio.pid, signal.SIGINT if stop == "SIGINT to its group" else signal.SIGTERM)
        studio.wait(timeout=60)
        said = log_path.read_text()
        assert "stopping" in said and "started it again" not in said, said[-2000:]
        assert "Traceback" not in said, said[-3000:]  # a part signalled twice died inside its own shutdown
        wait_for(lambda: not any(running(pid) for pid in parts), 30, message="every part to stop")
    finally:
        if studio.poll() is None:
            os.killpg(studio.pid, signal.SIGKILL)


def start_studio(env: dict, addr: str, log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen([sys.executable, "manage.py", "runstudio", "--addr", addr], cwd=REPO_ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_studio(studio: subprocess.Popen) -> None:
    if studio.poll() is None:
        os.killpg(studio.pid, signal.SIGINT)
    try:
        studio.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(studio.pid, signal.SIGKILL)


def runstudio_briefly(env: dict, *args: str) -> tuple[int, str, float]:
    """runstudio that is expected to stop by itself: its exit status, its output and how long it took.
    One that does not stop within a minute is stopped with every part it started (on the old code a
    second Studio ran on)."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "manage.py", "runstudio", *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        said, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        said, _ = proc.communicate()
    return proc.returncode, said, time.monotonic() - began


def test_a_second_runstudio_on_the_same_var_folder_refuses_and_leaves_the_first_running(embedded_env, tmp_path):
    """A second `make studio` in the same checkout started its own redis-server on the first one's
    socket path, deleted the first's socket on its way out, and the first one's restarted worker
    could not reach its broker again. The second must stop before it starts anything, and say why."""
    manage(embedded_env, "migrate", "--noinput")
    first_addr = f"127.0.0.1:{free_port()}"
    first = start_studio(embedded_env, first_addr, tmp_path / "first.log")
    try:
        wait_for(lambda: "Studio is up" in (tmp_path / "first.log").read_text(), 60, message="the first Studio to start its parts")
        sock = tmp_path / "var" / "redis.sock"
        inode = sock.stat().st_ino
        for extra in ([], ["--check-only"]):  # `make studio` checks before it migrates, and runstudio again
            code, said, took = runstudio_briefly(embedded_env, "--addr", f"127.0.0.1:{free_port()}", *extra)
            assert code != 0 and took < 10, said
            assert f"a Studio already runs from {tmp_path / 'var'} (pid {first.pid}, http://{first_addr}/)" in said, said
            assert "STUDIO_VAR_DIR" in said and "started" not in said and "Studio is up" not in said, said
        assert first.poll() is None
        assert sock.stat().st_ino == inode  # the first one's socket, not one a second redis-server made
        import redis

        assert redis.Redis(unix_socket_path=str(sock)).ping()
    finally:
        stop_studio(first)
    # The kernel drops the lock with the process: the next Studio starts, with no stale file to clear.
    again = start_studio(embedded_env, f"127.0.0.1:{free_port()}", tmp_path / "again.log")
    try:
        wait_for(lambda: "Studio is up" in (tmp_path / "again.log").read_text(), 60, message="a Studio after the first one stopped")
    finally:
        stop_studio(again)


def test_runstudio_on_a_port_in_use_says_so_before_it_starts_anything(embedded_env, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        code, said, took = runstudio_briefly(embedded_env, "--addr", addr)
    assert code != 0 and took < 10, said
    assert f"STUDIO_ADDR {addr}: the port is in use" in said, said
    assert "started" not in said and "Studio is up" not in said, said
    assert not (tmp_path / "var" / "redis.sock").exists()


def group_processes(pgid: int) -> list[int]:
    """Live processes in process group `pgid`: runstudio's parts and what they fork (the worker's pool)
    stay in the group runstudio leads, also after it died."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


def test_the_parts_of_a_runstudio_killed_with_sigkill_stop_and_one_left_running_is_named(embedded_env, tmp_path):
    """A `kill -9` leaves runstudio no moment to stop its parts: they ran on without its lock, and a
    second `make studio` started beside them (its redis-server on their socket). The parts now die
    with runstudio; one that cannot (stopped here with SIGSTOP) keeps the var folder locked, and the
    next runstudio names it instead of starting."""
    var = tmp_path / "var"
    manage(embedded_env, "migrate", "--noinput")
    studio = start_studio(embedded_env, f"127.0.0.1:{free_port()}", tmp_path / "first.log")
    try:
        wait_for(lambda: "Studio is up" in (tmp_path / "first.log").read_text(), 60, message="runstudio to start its parts")
        parts = {name: int(pid) for name, pid in re.findall(r"(\w+) started \(pid (\d+)\)", (tmp_path / "first.log").read_text())}
        assert set(parts) == {"redis", "worker", "answers", "beat", "web"}
        time.sleep(3)  # the parts are up (celery installs its own signal handlers)
        os.kill(parts["web"], signal.SIGSTOP)
        os.kill(studio.pid, signal.SIGKILL)
        studio.wait(timeout=10)
        wait_for(lambda: group_processes(studio.pid) == [parts["web"]], 60, message="every other part, and the worker's pool, to stop")
        code, said, _ = runstudio_briefly(embedded_env, "--addr", f"127.0.0.1:{free_port()}")
        assert code != 0, said
        assert f"the Studio that ran from {var} (pid {studio.pid}) is gone, but parts it started still run" in said, said
        assert f"pid {parts['web']}: " in said and "runserver" in said and f"kill {parts['web']}" in said, said
        assert "started (pid" not in said and "Studio is up" not in said, said
        os.kill(parts["web"], signal.SIGCONT)  # the SIGTERM runstudio's death sent it is delivered now
        wait_for(lambda: not group_processes(studio.pid), 60, message="the web server to stop")
    finally:
        if group_processes(studio.pid):  # the old code left every part running
            os.killpg(studio.pid, signal.SIGKILL)
    again = start_studio(embedded_env, f"127.0.0.1:{free_port()}", tmp_path / "again.log")
    try:
        wait_for(lambda: "Studio is up" in (tmp_path / "again.log").read_text(), 60, message="a Studio after the parts stopped")
    finally:
        stop_studio(again)
