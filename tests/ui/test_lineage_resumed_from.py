"""A resumed run's Lineage: its "Resumed from" row names the commit that holds the saved step's files
(Checkpoint.commit), linked to the Data Hub at that commit like the other pinned commits."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from datahub import services as hub
from training import checkpoints, services
from training.backends.local import run_dir
from training.models import Checkpoint

pytestmark = pytest.mark.django_db


def test_resumed_from_row_shows_the_checkpoints_commit_linked(project, users, tmp_path, settings):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    parent = services.create_run(project, users["owner"], name="parent", method="sft", base_model="org/base", dataset="org/data",
                                 config={"save_steps": 20})
    folder = run_dir(parent.pk, 1) / "output" / "checkpoint-20"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    saved = Checkpoint.objects.create(run=parent, attempt=1, step=20, kind="checkpoint", path=str(folder))
    commit = hub.commit_checkpoint(saved.pk)
    assert commit is not None
    child = checkpoints.resume_run(parent, 20, users["owner"])

    client = Client()
    client.force_login(users["owner"])
    html = client.get(f"/training/runs/{child.pk}/lineage/").content.decode()
    row = re.search(r"<tr><td>Resumed from \(step 20 of attempt 1\)</td>.*?</tr>", html, re.S)
    assert row, html
    assert f'<a href="/hub/acme/experiment-default/tree/{commit.pk}">{commit.pk}</a>' in row.group(0), row.group(0)


def test_resumed_from_a_step_not_yet_committed_says_no_commit(project, users):
    parent = services.create_run(project, users["owner"], name="parent", method="sft", base_model="org/base", dataset="org/data")
    Checkpoint.objects.create(run=parent, attempt=1, step=20, kind="checkpoint", path="/nowhere/checkpoint-20")
    child = checkpoints.resume_run(parent, 20, users["owner"])
    client = Client()
    client.force_login(users["owner"])
    html = client.get(f"/training/runs/{child.pk}/lineage/").content.decode()
    row = re.search(r"<tr><td>Resumed from \(step 20 of attempt 1\)</td>.*?</tr>", html, re.S)
    assert row and row.group(0).endswith("<td>—</td></tr>"), row
