"""Every page and read of a run, an experiment and a Data Hub repo on SQLite, the embedded default.

The suite runs on PostgreSQL; SQLite refuses some SQL that PostgreSQL takes (a QA found the Lineage
tab a 500 there: an ORDER BY inside a UNION). This builds a project on a fresh SQLite file in a
subprocess (the database is fixed per process): a finished run that reads Data Hub refs, with
checkpoints committed, metrics and logs, and a GRPO draft with rollouts; then it GETs each of their
pages and API reads with Django's test client."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT, shell_project

SCRIPT = shell_project("pages") + """
from django.test import Client
from datahub import commits, repos
from datahub import services as hub
from experiments.services import create_experiment
from training import services
from training.backends.local import run_dir
from training.models import Checkpoint, LogLine, MetricPoint, Rollout, Status, TrainingRun

base = repos.create_repo(project, "base", "model", user)
pinned = commits.commit_files(base, "main", {"config.json": b'{"model_type": "llama"}'}, "weights")
repos.create_tag(base, "v1", pinned.pk)
data = repos.create_repo(project, "data", "dataset", user)
commits.commit_files(data, "main", {"train.jsonl": b'{"text": "hello"}\\n'}, "rows")
experiment = create_experiment(project, "sweep")
run = services.create_run(project, user, name="hub refs", method="sft", experiment=experiment.slug, base_model="base@v1", dataset="data@main",
                          config={"save_steps": 2})
TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1,
                                             pinned={"base_model": {"ref": "base@v1", "commit": pinned.pk, "repo": "pages/base"}})
for step in (2, 4):
    folder = run_dir(run.pk, 1) / "output" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    hub.commit_checkpoint(Checkpoint.objects.create(run=run, attempt=1, step=step, kind="checkpoint", path=str(folder)).pk)
MetricPoint.objects.bulk_create([MetricPoint(run=run, step=s, key="loss", value=1.0 / (s + 1)) for s in range(20)])
LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=f"line {i}") for i in range(20)])
grpo = services.create_run(project, user, name="grpo", method="grpo", base_model="base@main", dataset="data@main",
                           config={"rl_mode": "environment", "environment_id": "builtin/arith@main"})
Rollout.objects.bulk_create([Rollout(run=grpo, step=s, prompt="2+2", completion="4", reward=1.0, advantage=0.5) for s in range(4)])

client = Client(raise_request_exception=False)
client.force_login(user)
api = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token}")
r, g, e = f"/training/runs/{run.pk}", f"/training/runs/{grpo.pk}", experiment.pk
pages = ["/training/", "/training/new/", f"{r}/", f"{r}/status", f"{r}/live", f"{r}/log", f"{r}/log.txt",
         *(f"{r}/{tab}/" for tab in ("overview", "configuration", "datasets", "checkpoints", "lineage", "repository")),
         f"{g}/", f"{g}/edit/", *(f"{g}/{tab}/" for tab in ("environment", "rollouts", "lineage", "datasets")),
         "/experiments/", f"/experiments/{e}/", f"/experiments/{e}/?metric=loss&runs={run.pk}", "/hub/", "/hub/pages/base", "/hub/pages/base/tree/v1", f"/hub/pages/base/tree/{pinned.pk}",
         "/hub/pages/base/commits/main", "/hub/pages/data/preview/main/train.jsonl", "/hub/pages/experiment-sweep",
         f"/hub/pages/experiment-sweep/tree/run-{run.pk}", f"/hub/pages/experiment-sweep/commits/run-{run.pk}"]
reads = ["/api/training-runs", f"/api/training-runs/{run.pk}", f"/api/training-runs/{run.pk}/metrics", f"/api/training-runs/{run.pk}/metrics?after_step=5", f"/api/training-runs/{run.pk}/logs",
         f"/api/training-runs/{run.pk}/checkpoints", f"/api/training-runs/{run.pk}/attempts", f"/api/training-runs/{run.pk}/rollouts",
         f"/api/training-runs/{run.pk}/fit", f"/api/training-runs/{grpo.pk}/rollouts", "/api/experiments", f"/api/experiments/{e}/compare", "/api/hub/repos", "/api/hub/repos/base/branches", "/api/hub/repos/base/tags",
         "/api/hub/repos/base/commits", "/api/hub/repos/base/files", "/api/hub/repos/data/preview?path=train.jsonl"]
# the SQL of the newer reads, on SQLite: metrics after a step, and each checkpoint's metrics at its step
assert api.get(f"/api/training-runs/{run.pk}/metrics?after_step=15&max_points=3").json()["series"]["loss"][0][0] == 16
assert [c["metrics"] for c in api.get(f"/api/training-runs/{run.pk}/checkpoints").json()] == [{"loss": 1 / 3}, {"loss": 1 / 5}]
print(json.dumps({**{url: client.get(url, HTTP_HX_REQUEST="true").status_code for url in pages}, **{url: api.get(url).status_code for url in reads}}))
"""


def test_every_page_and_read_of_a_run_with_data_hub_refs_answers_200_on_sqlite(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'studio.sqlite3'}", "DEBUG": "1", "STUDIO_VAR_DIR": str(tmp_path / "var"),
           "DATAHUB_ROOT": str(tmp_path / "hub"), "STUDIO_RUNS_DIR": str(tmp_path / "runs")}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=REPO_ROOT, env=env, check=True)
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-5000:]
    statuses = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(statuses) == 49
    assert {url: status for url, status in statuses.items() if status != 200} == {}, done.stderr[-5000:]
