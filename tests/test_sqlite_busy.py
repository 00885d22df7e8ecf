"""The embedded default's SQLite with its one write lock held elsewhere for longer than the busy
timeout (a QA at scale saw 500s there): gunicorn on a SQLite file, the lock held by another
connection, as a long write of another process would. Ingest, an upload chunk, creating a run
and the Data Hub's upload form each answer 503 with Retry-After, not a 500; nothing stored
before is lost, and the same requests sent again once the lock is free are applied, once."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid

import pytest
import requests

from tests.conftest import REPO_ROOT, free_port, listening, shell_project, wait_for

SETUP = shell_project("busy") + """
from bench.common import session_cookie
from django.urls import reverse
from datahub import repos, uploads
from studio import crypto
from training.models import Status, TrainingRun
from training.services import create_run
repo = repos.create_repo(project, "data", "dataset", user)
session = uploads.create_upload(repo, user, "main", [{"path": "a.bin", "size": 8}])
run = create_run(project, user, name="busy", method="sft", base_model="org/base", dataset="org/data")
ingest = crypto.new_token("ing")
TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1, ingest_token_hash=crypto.hash_token(ingest))
print(json.dumps({"token": token, "ingest": ingest, "run": run.pk, "upload": str(session.pk), "cookie": session_cookie(user),
                  "form": reverse("datahub:upload", args=[project.slug, repo.name])}))
"""
CSRF = "a" * 32  # a CSRF secret of the cookie's form: the header may carry it unmasked


def batch(first_step: int) -> dict:
    return {"batch_id": uuid.uuid4().hex, "metrics": [{"step": s, "key": "loss", "value": 1.0 / s} for s in range(first_step, first_step + 50)],
            "logs": [f"step {first_step}"]}


@pytest.fixture
def sqlite_studio(tmp_path):
    db = tmp_path / "studio.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "DEBUG": "1", "STUDIO_VAR_DIR": str(tmp_path / "var"), "DATAHUB_ROOT": str(tmp_path / "hub")}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=REPO_ROOT, env=env, check=True)
    made = subprocess.run([sys.executable, "manage.py", "shell", "-c", SETUP], cwd=REPO_ROOT, env=env, check=True, capture_output=True, text=True)
    ids = json.loads(made.stdout.strip().splitlines()[-1])
    port = free_port()
    log = (tmp_path / "web.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "studio/gunicorn.conf.py", "studio.wsgi:application"], cwd=REPO_ROOT,
                            env={**env, "GUNICORN_BIND": f"127.0.0.1:{port}", "GUNICORN_WORKERS": "1", "GUNICORN_THREADS": "8"}, stdout=log, stderr=subprocess.STDOUT)

    try:
        wait_for(lambda: listening(port, proc, tmp_path / "web.log"), 60, message="gunicorn to listen")
        yield f"http://127.0.0.1:{port}", db, ids
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def metric_count(db, run_id: int) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute("SELECT COUNT(*) FROM training_metricpoint WHERE run_id = ?", (run_id,)).fetchone()[0]


def test_requests_that_find_the_database_locked_get_503_with_retry_after_and_lose_nothing(sqlite_studio):
    url, db, ids = sqlite_studio
    ingest_url = f"{url}/api/ingest/runs/{ids['run']}"
    engine = {"Authorization": f"Bearer {ids['ingest']}"}
    user = {"Authorization": f"Bearer {ids['token']}"}
    chunk_url = f"{url}/api/hub/uploads/{ids['upload']}/files/0?offset=0"
    first = requests.post(ingest_url, json=batch(1), headers=engine, timeout=60)
    assert first.status_code == 200, first.text
    assert metric_count(db, ids["run"]) == 50

    second = batch(51)
    calls = {
        "ingest": lambda: requests.post(ingest_url, json=second, headers=engine, timeout=60),
        "chunk": lambda: requests.put(chunk_url, data=b"12345678", headers=user, timeout=60),
        "create": lambda: requests.post(f"{url}/api/training-runs", json={"name": "busy 2", "method": "sft", "base_model": "org/base", "dataset": "org/data"},
                                        headers=user, timeout=60),
        "form": lambda: requests.post(url + ids["form"], files={"files": ("b.txt", b"hello")}, data={"branch": "main", "folder": "", "message": ""},
                                      headers={"HX-Request": "true", "X-CSRFToken": CSRF}, cookies={"sessionid": ids["cookie"], "csrftoken": CSRF}, timeout=60),
    }
    answers: dict[str, requests.Response] = {}
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, for longer than the server's busy timeout (20 s)
    try:
        threads = [threading.Thread(target=lambda name=name, call=call: answers.__setitem__(name, call())) for name, call in calls.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    for name in ("ingest", "chunk", "create"):
        answer = answers[name]
        assert answer.status_code == 503, (name, answer.status_code, answer.text[:500])
        assert answer.headers["Retry-After"] == "5"
        body = answer.json()
        assert body["detail"].startswith("The database is busy"), body
        assert body["errors"][0]["field"] == "database"
    form = answers["form"]
    assert form.status_code == 503 and form.headers["Retry-After"] == "5", (form.status_code, form.text[:500])
    assert 'role="alert"' in form.text and "The database is busy" in form.text  # the card htmx's error banner shows

    assert metric_count(db, ids["run"]) == 50  # the refused batch stored nothing; the earlier one is all there
    again = requests.post(ingest_url, json=second, headers=engine, timeout=60)
    assert again.status_code == 200 and again.json()["duplicate"] is False, again.text
    assert requests.post(ingest_url, json=second, headers=engine, timeout=60).json()["duplicate"] is True
    assert metric_count(db, ids["run"]) == 100
    chunk = requests.put(chunk_url, data=b"12345678", headers=user, timeout=60)
    assert chunk.status_code == 200 and chunk.json()["received"] == 8, chunk.text
    created = requests.post(f"{url}/api/training-runs", json={"name": "busy 2", "method": "sft", "base_model": "org/base", "dataset": "org/data"}, headers=user, timeout=60)
    assert created.status_code == 201, created.text
