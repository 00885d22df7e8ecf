"""Try it's answers run on a queue of their own ("<CELERY_QUEUE>-answers"), which a worker of its own
serves (runstudio's "answers" part, one at a time): answers in flight no longer hold the main worker's
slots, so a START is dispatched and trains meanwhile, and an answer asked behind another one says how
many it waits for."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import Client

from studio.celery import answers_queue, app
from tests.conftest import REPO_ROOT, free_port, wait_for
from tests.test_local_training import FAST
from training import services
from training.models import Checkpoint, Generation, Status, TrainingRun

ASK = {"prompt": "What colour is the cat?", "max_new_tokens": 512, "temperature": 1.0}


def weights_run(project, user, runs_dir: Path, model: str) -> TrainingRun:
    """A completed run whose final weights are a real model (a copy of `model`) in its output folder."""
    run = services.create_run(project, user, name="tried", method="sft", base_model=model, dataset="org/data")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    final = runs_dir / str(run.pk) / "attempt-1" / "output" / "final"
    shutil.copytree(model, final)
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path=str(final))
    return run


def some_weights(folder: Path) -> str:
    """A folder that passes for weights where nothing loads them."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return str(folder)


def purge_answers() -> None:
    """What earlier tests left on the answers queue (app.control.purge empties the default one only)."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(answers_queue())


def test_answers_are_sent_to_their_own_queue_and_other_tasks_to_the_main_one(api, project, users, settings, tmp_path, django_capture_on_commit_callbacks):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    assert answers_queue() == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-answers"
    router = app.amqp.router
    assert router.route({}, "training.tasks.generate_answer")["queue"].name == answers_queue()
    for task in ("training.tasks.dispatch_run", "training.tasks.reconcile_runs", "training.tasks.stop_backend_job", "training.tasks.merge_checkpoint"):
        assert router.route({}, task)["queue"].name == settings.CELERY_TASK_DEFAULT_QUEUE, task

    # The ask's task really lands there, on the broker (no worker here takes it).
    run = weights_run(project, users["owner"], settings.STUDIO_RUNS_DIR, some_weights(tmp_path / "model"))
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    purge_answers()
    app.control.purge()
    try:
        with django_capture_on_commit_callbacks(execute=True):
            asked = api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "max_new_tokens": 8})
        assert asked.status_code == 202, asked.content
        assert broker.llen(answers_queue()) == 1 and broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0
    finally:
        purge_answers()


def test_the_tab_says_how_many_earlier_answers_a_queued_one_waits_for(project, users, settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    model = some_weights(tmp_path / "model")
    run, other = (weights_run(project, users["owner"], settings.STUDIO_RUNS_DIR, model) for _ in range(2))

    def ask(on: TrainingRun, status: str) -> Generation:
        return Generation.objects.create(run=on, checkpoint=on.checkpoints.get(), prompt="Hi", max_new_tokens=8, temperature=0, status=status)

    ask(run, "completed")
    ask(other, "running")  # another run's answer is made first: they share the queue
    second = ask(run, "queued")
    third = ask(run, "queued")
    client = Client()
    client.force_login(users["owner"])
    polled = client.get(f"/training/runs/{run.pk}/generations/{third.pk}", HTTP_HX_REQUEST="true").content.decode()
    assert "Waiting for 2 earlier answers (answers are made in turn)…" in polled
    tab = client.get(f"/training/runs/{run.pk}/try/").content.decode()
    assert "Waiting for 1 earlier answer (answers are made in turn)…" in tab and "Waiting for 2 earlier answers" in tab
    Generation.objects.exclude(pk__in=(second.pk, third.pk)).update(status="completed")
    polled = client.get(f"/training/runs/{run.pk}/generations/{second.pk}", HTTP_HX_REQUEST="true").content.decode()
    assert "Waiting for a worker…" in polled  # next in turn


def group_generators(pgid: int) -> list[int]:
    """The Try it generator processes (python -m training.engine.generate) in process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid
                and b"training.engine.generate" in (entry / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


class Holder(threading.Thread):
    """Holds every Try it answer of a Studio in flight: each generator process it starts is stopped
    (SIGSTOP) as soon as it appears, so the task answering it waits on it (until its 120 s timeout)."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.held, self.done = pgid, set[int](), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):  # a generator takes seconds to import torch before it loads anything
            for pid in set(group_generators(self.pgid)) - self.held:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                self.held.add(pid)

    def release(self) -> None:
        self.done.set()
        self.join(timeout=5)
        for pid in self.held:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.worker
def test_a_start_trains_while_answers_are_in_flight(api, project, users, tiny_models, tmp_path, settings, transactional_db):
    """The embedded Studio's worker had 2 slots and answers took them: two answers in flight (one user
    clicking twice) and a START waited up to their 120 s generator timeouts, with the reconciler behind
    it. Here two answers are held in flight while a run is started: it is claimed at once and trains."""
    from django.db import connection

    runs_dir = tmp_path / "runs"
    settings.STUDIO_RUNS_DIR = runs_dir
    run = weights_run(project, users["owner"], runs_dir, tiny_models["student"])
    db = connection.settings_dict
    env = {
        **os.environ,
        "DEBUG": "1",
        "STUDIO_VAR_DIR": str(tmp_path / "var"),
        "STUDIO_RUNS_DIR": str(runs_dir),
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "REDIS_URL": settings.CELERY_BROKER_URL,
        "CELERY_QUEUE": app.conf.task_default_queue,
        "RECONCILE_INTERVAL_SECONDS": "3",
        "STUDIO_STOP_GRACE_SECONDS": "5",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("STUDIO_PUBLIC_URL", None)  # runstudio's own address, where the engine reports
    app.control.purge()
    purge_answers()
    log_path = tmp_path / "studio.log"
    with log_path.open("wb") as log:
        studio = subprocess.Popen(
            [sys.executable, "manage.py", "runstudio", "--addr", f"127.0.0.1:{free_port()}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    holder = Holder(studio.pid)
    holder.start()
    said = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        wait_for(lambda: "Studio is up" in said(), 60, message="runstudio to start its parts")
        workers = len(re.findall(r"^(?:worker|answers) started \(pid", said(), re.M))
        wait_for(lambda: said().count(" ready.") >= workers, 120, message="the Celery workers to be ready")

        asked = [api.post(f"/api/training-runs/{run.pk}/generate", ASK) for _ in range(2)]
        assert [a.status_code for a in asked] == [202, 202], [a.content for a in asked]
        wait_for(
            lambda: holder.held and Generation.objects.filter(status="running").count() == len(holder.held),
            90,
            message="an answer's generator to be running (and held)",
        )
        states = sorted(Generation.objects.values_list("status", flat=True))
        assert states in (["queued", "running"], ["running", "running"]), states

        created = api.post(
            "/api/training-runs",
            {
                "name": "while answering",
                "method": "sft",
                "base_model": tiny_models["student"],
                "dataset": tiny_models["data_sft"],
                "config": {**FAST, "max_steps": 3},
            },
        )
        assert created.status_code == 201, created.content
        started = created.json()["id"]
        assert api.post(f"/api/training-runs/{started}/start").status_code == 202
        # The main worker claims it at once: no answer holds its slots (they held both for 120 s).
        wait_for(
            lambda: TrainingRun.objects.values_list("status", flat=True).get(pk=started) != Status.QUEUED,
            45,
            message="the START to be claimed while answers are in flight",
        )
        wait_for(
            lambda: TrainingRun.objects.values_list("status", flat=True).get(pk=started) in (Status.COMPLETED, Status.FAILED),
            240,
            interval=1,
            message="the run to finish",
        )
        ended = TrainingRun.objects.get(pk=started)
        assert ended.status == Status.COMPLETED, (ended.error, said()[-3000:])

        # The answers worker makes one answer at a time: the second still waits, and its tab says for what.
        assert sorted(Generation.objects.values_list("status", flat=True)) == ["queued", "running"]
        assert len(holder.held) == 1
        queued = Generation.objects.get(status="queued")
        client = Client()
        client.force_login(users["owner"])
        polled = client.get(f"/training/runs/{run.pk}/generations/{queued.pk}", HTTP_HX_REQUEST="true").content.decode()
        assert "Waiting for 1 earlier answer (answers are made in turn)…" in polled
        # runstudio's parts: the main worker serves the main queue only, the answers worker the answers queue.
        assert re.search(r"^answers started \(pid \d+\)", said(), re.M), said()[-3000:]
        worker, answers = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for pid in (re.search(rf"^{name} started \(pid (\d+)\)", said(), re.M).group(1) for name in ("worker", "answers"))
        )
        assert f"-Q {app.conf.task_default_queue} -c 2" in worker and answers_queue() not in worker, worker
        assert f"-Q {answers_queue()} -c 1" in answers, answers
    finally:
        if studio.poll() is None:
            os.killpg(studio.pid, signal.SIGINT)
        holder.release()  # the held answers end, so the workers' warm shutdown does not wait on them
        try:
            studio.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(studio.pid, signal.SIGKILL)
        purge_answers()
