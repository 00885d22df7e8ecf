"""The Lineage tab (issue 5: base model ref → dataset ref → run → checkpoints): a ref whose branch was
deleted says so and links the commit START pinned (its branch page is a 404); the run's output branch
shows its head commit; each checkpoint is listed with the commit that holds its files, linked."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from datahub import commits, repos
from datahub import services as hub
from datahub.models import Branch
from training import services
from training.backends.local import run_dir
from training.models import Checkpoint, Status, TrainingRun

pytestmark = pytest.mark.django_db

HREF = re.compile(r'href="(/hub/[^"#?]*)')


@pytest.fixture(autouse=True)
def folders(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.DATAHUB_ROOT = tmp_path / "hub"


@pytest.fixture
def viewer(users) -> Client:
    client = Client()
    client.force_login(users["viewer"])
    return client


def lineage(client: Client, run: TrainingRun) -> str:
    page = client.get(f"/training/runs/{run.pk}/lineage/")
    assert page.status_code == 200
    return page.content.decode()


def row(html: str, role: str) -> str:
    found = re.search(rf"<tr><td>{re.escape(role)}</td>.*?</tr>", html, re.S)
    assert found, (role, html)
    return found.group(0)


def text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def dead_hub_links(client: Client, html: str) -> list[str]:
    return [href for href in sorted(set(HREF.findall(html))) if client.get(href).status_code != 200]


def finished_run(project, users, **body) -> TrainingRun:
    run = services.create_run(project, users["owner"], **{"name": "sft", "method": "sft", "base_model": "org/base", "dataset": "org/data", **body})
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    return TrainingRun.objects.get(pk=run.pk)


def save(run: TrainingRun, step: int, kind: str = "checkpoint", commit: bool = True) -> Checkpoint:
    folder = run_dir(run.pk, 1) / "output" / (f"checkpoint-{step}" if kind == "checkpoint" else kind)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(f"{kind} {step}".encode())
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=str(folder))
    if commit:
        hub.commit_checkpoint(checkpoint.pk)
        checkpoint.refresh_from_db()
    return checkpoint


def test_a_base_model_whose_branch_was_deleted_is_marked_and_links_its_pinned_commit(project, users, viewer):
    base = repos.create_repo(project, "base", "model")
    repos.create_branch(base, "dev", "main")
    pinned = commits.commit_files(base, "dev", {"config.json": b'{"model_type": "llama"}'}, "dev weights")
    run = finished_run(project, users, base_model="base@dev")
    TrainingRun.objects.filter(pk=run.pk).update(pinned={"base_model": {"ref": "base@dev", "commit": pinned.pk, "repo": "acme/base"}})
    assert 'href="/hub/acme/base/tree/dev"' in row(lineage(viewer, run), "Base model (weights)")

    hub.delete_branch(base, "dev")  # the run has finished: nothing holds the branch
    html = lineage(viewer, run)
    cell = row(html, "Base model (weights)")
    assert "/tree/dev" not in cell and not dead_hub_links(viewer, html), dead_hub_links(viewer, html)
    assert f'<a href="/hub/acme/base/tree/{pinned.pk}">base@dev</a>' in cell, cell
    assert "base@dev (branch or tag dev deleted: the link opens the commit START pinned)" in text(cell)
    assert f'<a href="/hub/acme/base/tree/{pinned.pk}">{pinned.pk}</a>' in cell
    # A branch that is there, a tag and a commit id are not marked.
    repos.create_tag(base, "v1", pinned.pk)
    for ref in ("base@main", "base@v1", f"base@{pinned.pk[:12]}"):
        TrainingRun.objects.filter(pk=run.pk).update(base_model=ref, pinned={})
        cell = row(lineage(viewer, run), "Base model (weights)")
        assert "deleted" not in cell and f'href="/hub/acme/base/tree/{ref.partition("@")[2]}"' in cell, (ref, cell)


def test_lineage_lists_the_checkpoints_with_their_commits_and_the_output_branchs_head(project, users, viewer):
    run = finished_run(project, users, config={"save_steps": 2})
    step2, step4, final = save(run, 2), save(run, 4), save(run, 4, "final")
    pending = save(run, 6, commit=False)
    html = lineage(viewer, run)
    head = Branch.objects.get(repo__project=project, repo__name="experiment-default", name=f"run-{run.pk}").head_id
    assert head == final.commit
    output = row(html, "Output branch")
    assert f'<a href="/hub/acme/experiment-default/tree/{head}">{head}</a>' in output and "(its head)" in text(output), output
    repository = f"/training/runs/{run.pk}/repository/"
    for role, checkpoint, folder in (("Checkpoint (step 2)", step2, "checkpoints/step-2"), ("Checkpoint (step 4)", step4, "checkpoints/step-4"),
                                     ("Final weights (step 4)", final, "final")):
        cell = row(html, role)
        assert f'<a href="{repository}?path={folder}&amp;commit={checkpoint.commit}">{folder}/</a>' in cell, cell
        assert f'<a href="/hub/acme/experiment-default/tree/{checkpoint.commit}">{checkpoint.commit}</a>' in cell, cell
    # In the order of the chain: the inputs, the output branch, then the checkpoints by step.
    roles = re.findall(r"<tr><td>([^<]*)</td>", html)
    assert roles == ["Base model (weights)", "Dataset", "Output branch", "Checkpoint (step 2)", "Checkpoint (step 4)", "Final weights (step 4)",
                     "Checkpoint (step 6)"], roles
    assert "checkpoints/step-6/ (commit pending)" in text(row(html, "Checkpoint (step 6)"))
    assert row(html, "Checkpoint (step 6)").endswith("<td>—</td></tr>")
    assert not dead_hub_links(viewer, html)
    Checkpoint.objects.filter(pk=pending.pk).update(path="/elsewhere/checkpoint-6")  # a remote backend's path: never committed here
    assert "checkpoints/step-6/ (not committed)" in text(row(lineage(viewer, run), "Checkpoint (step 6)"))


def test_lineage_of_a_run_whose_repo_was_deleted_lists_its_checkpoints_unlinked(api, project, users, viewer):
    run = finished_run(project, users)
    step2 = save(run, 2)
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204
    html = lineage(viewer, run)
    assert "checkpoints/step-2/ (deleted with its repo)" in text(row(html, "Checkpoint (step 2)"))
    assert step2.commit in row(html, "Checkpoint (step 2)") and "deleted with its repo" in text(row(html, "Output branch"))
    assert not HREF.findall(row(html, "Checkpoint (step 2)")) and not dead_hub_links(viewer, html)


def test_lineage_reads_any_number_of_checkpoints_in_the_same_queries(project, users, viewer):
    one, many = finished_run(project, users, name="one"), finished_run(project, users, name="many")
    save(one, 2)
    for step in (2, 4, 6, 8):
        save(many, step)
    counts = []
    for run in (one, many):
        with CaptureQueriesContext(connection) as queries:
            lineage(viewer, run)
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
