"""The local backend's sandbox (STUDIO_LOCAL_SANDBOX): an environment package that any project member can
upload runs inside the engine, as the Studio's OS user. Through the API with a real worker, a fork of
the catalogue calculator whose __init__.py reads another run's spec (its ingest token), the database
file and every process's /proc/<pid>/environ (the worker's holds the database URL) reads none of them,
and the run completes. The launcher alone: as root and as an unprivileged user (user namespaces)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from datahub.commits import commit_files
from datahub.models import Repo
from tests.conftest import REPO_ROOT, assert_error, wait_for
from tests.environments.test_runs import FAST, logs, start_and_wait
from training.backends.base import BackendError, JobSpec
from training.models import Status

# Runs at the top of the package's __init__.py: everything it could read lands in its output folder.
PROBE = '''
import glob as _glob, json as _json, os as _os, sys as _sys
def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None
_spec = _sys.argv[_sys.argv.index("--spec") + 1]
_seen = {{"other_spec": _read({other_spec!r}), "database": _read({database!r}), "own_spec": _read(_spec) is not None,
          "environ": [p for p in _glob.glob("/proc/[0-9]*/environ") if {canary!r} in (_read(p) or "")],
          "runs": sorted(_glob.glob({runs!r} + "/*"))}}
_out = _json.loads(open(_spec).read())["output_dir"]
_os.makedirs(_out, exist_ok=True)
open(_os.path.join(_out, "probe.json"), "w").write(_json.dumps(_seen))
'''


@pytest.mark.worker
def test_an_uploaded_environment_reads_no_other_runs_spec_no_database_and_no_worker_environ(
        transactional_db, request, api, project, tiny_models, tmp_path, settings, monkeypatch):
    var = tmp_path / "var"
    settings.DATAHUB_ROOT = var / "hub"
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("STUDIO_VAR_DIR", str(var))  # the worker's var/: SQLite file, Data Hub, demo models
    monkeypatch.setenv("DATAHUB_ROOT", str(var / "hub"))
    monkeypatch.setenv("STUDIO_SANDBOX_TEST_CANARY", canary)  # in the worker's environ, never the engine's
    database = var / "studio.sqlite3"
    var.mkdir()
    database.write_text("SQLite format 3 -- project A's encrypted secrets")
    shutil.copytree(tiny_models["student"], var / "demo" / "tiny-student")  # the demo model lives under var/
    runs = tmp_path / "runs"
    other_spec = runs / "990" / "attempt-1" / "spec.json"
    other_spec.parent.mkdir(parents=True)
    other_spec.write_text('{"ingest": {"token": "ing_project-a-run-token"}}')
    worker = request.getfixturevalue("studio_worker")
    assert worker.runs_dir == runs

    fork = api.post("/api/environments/fork", {"catalogue": "calculator", "name": "calc-plus"})
    assert fork.status_code == 201, fork.content
    source = (REPO_ROOT / "environments/catalogue/calculator/__init__.py").read_text()
    future = "from __future__ import annotations\n"
    evil = source.replace(future, future + PROBE.format(other_spec=str(other_spec), database=str(database), canary=canary, runs=str(runs)), 1)
    commit_files(Repo.objects.get(project=project, name="calc-plus"), "main", {"__init__.py": evil.encode()})

    run = start_and_wait(api, {"name": "calc", "method": "grpo", "base_model": str(var / "demo" / "tiny-student"),
                               "config": {**FAST, "environment_id": "calc-plus@main"}})
    assert run.status == Status.COMPLETED, (run.error, logs(run)[-40:])
    seen = json.loads((runs / str(run.pk) / "attempt-1" / "output" / "probe.json").read_text())
    assert seen["own_spec"] is True
    assert seen["other_spec"] is None and seen["database"] is None, seen
    assert seen["environ"] == [], seen
    assert seen["runs"] == [str(runs / str(run.pk))], seen
    assert not any("not isolated" in line for line in logs(run))


# ---- the launcher, as root and as an unprivileged user ------------------------------------------

ENGINE = '''
import json, os, subprocess, sys
def read(path):
    try:
        return open(path).read()
    except OSError:
        return None
def write(path):
    try:
        open(path, "w").write("x")
        return True
    except OSError:
        return False
folder = sys.argv[1]
print(json.dumps({"secret": read(folder + "/var/studio.sqlite3"), "key": read(folder + "/key"),
                  "other_spec": read(folder + "/runs/2/attempt-1/spec.json"), "model": read(folder + "/var/demo/model/config.json"),
                  "write_run": write(folder + "/runs/1/attempt-1/out"), "write_model": write(folder + "/var/demo/model/x"),
                  "write_code": write(folder + "/checkout/code/x"), "code": read(folder + "/checkout/code/engine.py"),
                  "studio_env": read(folder + "/checkout/studio.env"), "link": read(folder + "/checkout/venv/marker"),
                  "environ": [p for p in os.listdir("/proc") if p.isdigit() and "CANARY" in (read(f"/proc/{p}/environ") or "")],
                  "umount": subprocess.run(["umount", folder + "/var"], capture_output=True).returncode}), flush=True)
sys.exit(int(sys.argv[2]))
'''


def as_user(user: str) -> list[str]:
    """The command prefix that runs as `user` and the Python it can run (this one may lie under root's home)."""
    import pwd

    if user == "root":
        return [sys.executable]
    return ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups", "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable]


@pytest.fixture(params=["root", "nobody"])
def sandbox_user(request) -> list[str]:
    """Runs the launcher as root (no user namespace) and as an unprivileged user (a user namespace)."""
    if os.getuid() != 0:
        pytest.skip("switching users needs root")
    command = as_user(request.param)
    if request.param != "root":
        probe = subprocess.run([*command, "-m", "training.backends.sandbox", "--probe"], cwd=REPO_ROOT, capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"{request.param} cannot run Python from this checkout or make a user namespace here: {probe.stderr[-300:]}")
    return command


@pytest.fixture
def world_readable_tmp():
    folder = Path(tempfile.mkdtemp(prefix="studio-sandbox-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_launcher_hides_the_plans_folders_and_binds_back_only_what_the_run_reads(sandbox_user, world_readable_tmp, monkeypatch):
    folder = world_readable_tmp
    engine_env = dict(os.environ)
    monkeypatch.setenv("STUDIO_SANDBOX_TEST_CANARY", "1")  # this process's environ only
    for path, text in {"var/studio.sqlite3": "secret", "var/demo/model/config.json": "{}", "key": "k",
                       "runs/2/attempt-1/spec.json": "token", "runs/1/attempt-1/spec.json": "mine", "checkout/code/engine.py": "code",
                       "checkout/studio.env": "SECRET_KEY=x", "elsewhere/venv/marker": "venv"}.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    (folder / "checkout" / "venv").symlink_to(folder / "elsewhere" / "venv")  # as a .venv that links elsewhere
    subprocess.run(["chmod", "-R", "a+rwX", str(folder)], check=True)
    plan = folder / "plan.json"
    plan.write_text(json.dumps({
        "hide": [str(folder / "var"), str(folder / "runs"), str(folder / "checkout")], "hide_files": [str(folder / "key")],
        "read_write": [str(folder / "runs/1")], "read_only": [str(folder / "var/demo/model"), str(folder / "checkout/code"), str(folder / "checkout/venv")],
        "cwd": str(REPO_ROOT), "pid_file": str(folder / "runs/1/attempt-1/engine.pid")}))
    done = subprocess.run([*sandbox_user, "-m", "training.backends.sandbox", str(plan), "--", sandbox_user[-1], "-c", ENGINE, str(folder), "3"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=engine_env)
    assert done.returncode == 3, done.stderr  # the engine's own exit code
    seen = json.loads(done.stdout)
    assert seen["secret"] is None and seen["key"] in (None, "") and seen["other_spec"] is None, seen
    assert seen["model"] == "{}" and seen["write_run"] is True, seen
    assert seen["write_model"] is False and seen["write_code"] is False, seen
    assert seen["code"] == "code" and seen["link"] == "venv" and seen["studio_env"] is None, seen
    assert seen["environ"] == [] and seen["umount"] != 0, seen
    assert (folder / "runs/1/attempt-1/out").read_text() == "x"  # written through to the real folder
    assert int((folder / "runs/1/attempt-1/engine.pid").read_text()) > 0


def test_the_launcher_mirrors_an_engine_killed_by_a_signal(world_readable_tmp):
    plan = world_readable_tmp / "plan.json"
    plan.write_text(json.dumps({"hide": [str(world_readable_tmp)]}))
    done = subprocess.run([sys.executable, "-m", "training.backends.sandbox", str(plan), "--", "sh", "-c", "kill -9 $$"], cwd=REPO_ROOT, timeout=60)
    assert done.returncode == -9


def test_a_process_the_engine_left_behind_in_a_session_of_its_own_ends_with_it(world_readable_tmp):
    # Out of reach of STOP's signal to the process group; not of the PID namespace's end.
    plan = world_readable_tmp / "plan.json"
    plan.write_text(json.dumps({"hide": [str(world_readable_tmp)]}))
    marker = f"left-behind-{uuid.uuid4().hex}"
    daemon = f"import time; time.sleep(300)  # {marker}"
    done = subprocess.run([sys.executable, "-m", "training.backends.sandbox", str(plan), "--", "sh", "-c", f"setsid {sys.executable} -c '{daemon}' & sleep 1"],
                          cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0

    def left() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(entry.name)
            except OSError:
                continue
        return found

    wait_for(lambda: not left(), 10, message="the left-behind process to end")


# ---- STUDIO_LOCAL_SANDBOX where the kernel refuses namespaces ----------------------------------
# A kernel without user namespaces cannot be had on this machine: only the probe's answer is replaced.

def job() -> JobSpec:
    return JobSpec(run_id=8, attempt=1, method="sft", base_model="org/none", dataset=[], config={}, compute={},
                   ingest_url="http://127.0.0.1:9/none", ingest_token="ing_x")


@pytest.fixture
def no_namespaces(monkeypatch):
    from training.backends import local

    monkeypatch.setattr(local, "sandbox_problem", lambda: "unshare: Operation not permitted")


def test_required_refuses_start_when_the_kernel_cannot_sandbox(api, no_namespaces, settings, tiny_models, tmp_path):
    from training.backends.local import LocalBackend

    settings.STUDIO_LOCAL_SANDBOX = "required"
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = api.post("/api/training-runs", {"name": "s", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
                                          "config": {"max_steps": 1}}).json()
    body = assert_error(api.post(f"/api/training-runs/{run['id']}/start"), 422, "compute.backend")
    assert "STUDIO_LOCAL_SANDBOX=required" in json.dumps(body)
    with pytest.raises(BackendError, match="STUDIO_LOCAL_SANDBOX=required"):
        LocalBackend().submit(job())
    assert not (tmp_path / "runs" / "8" / "attempt-1" / "runner.pid").exists()


def test_auto_runs_unsandboxed_with_a_warning_when_the_kernel_cannot(no_namespaces, settings, tmp_path):
    from training.backends.local import LocalBackend

    settings.STUDIO_LOCAL_SANDBOX = "auto"
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    backend = LocalBackend()
    assert "the engine is not isolated (unshare: Operation not permitted)" in backend.submit_warnings()[0]
    job_id = backend.submit(job())
    backend.stop(8, 1, job_id)
    assert not (tmp_path / "runs" / "8" / "attempt-1" / "sandbox.json").exists()


def test_a_sandboxed_submit_hides_the_studios_state_and_shows_the_runs_inputs(settings, tmp_path):
    from training.backends.local import LocalBackend, sandbox_plan

    settings.STUDIO_LOCAL_SANDBOX = "auto"
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    spec = job()
    spec.base_model = str(Path(settings.VAR_DIR) / "demo" / "tiny-student")
    spec.dataset = [{"path": str(tmp_path / "runs" / "3" / "attempt-1" / "spec.json")}, {"path": str(tmp_path / "data.jsonl")}]
    spec.resume_from = str(tmp_path / "runs" / "3" / "attempt-1" / "output" / "checkpoint-2")
    plan = sandbox_plan(spec, tmp_path / "runs" / "8" / "attempt-1")
    assert {str(tmp_path / "runs"), str(Path(settings.VAR_DIR).resolve())} <= set(plan["hide"])
    assert plan["read_write"] == [str(tmp_path / "runs" / "8")]
    # another run's spec is never bound back; its saved step and the demo model are, read-only
    demo = str(Path(settings.VAR_DIR).resolve() / "demo" / "tiny-student")
    code = {str(REPO_ROOT / "training"), str(REPO_ROOT / "environments"), sys.prefix}
    assert sorted(set(plan["read_only"]) - code) == sorted([demo, spec.resume_from, str(tmp_path / "data.jsonl")])
    assert str(REPO_ROOT) in plan["hide"] and str(REPO_ROOT / "training") in plan["read_only"]
    with pytest.raises(BackendError, match=r"dataset\[0\]: .* is inside the Studio's own data"):
        LocalBackend().submit(spec)  # another run's spec is no dataset: submit refuses the job outright
    spec.dataset = spec.dataset[1:]
    job_id = LocalBackend().submit(spec)
    LocalBackend().stop(8, 1, job_id)
    assert (tmp_path / "runs" / "8" / "attempt-1" / "sandbox.json").is_file()
