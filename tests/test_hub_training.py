"""Issue 5 × 3: a run whose base model and dataset are Data Hub refs trains on the local backend.
The refs are pinned to commits at START and the engine fetches them through Studio's HF-compatible
/hub with the attempt's own token; the checkpoints land on the run's branch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from datahub import storage
from datahub.commits import commit_files
from datahub.models import Branch, TreeEntry, blob_path
from datahub.repos import create_repo
from tests.conftest import wait_for
from training.models import Status, TrainingRun

pytestmark = pytest.mark.worker


def test_a_run_trains_from_data_hub_refs(api, project, studio_worker, tiny_models):
    model = create_repo(project, "tiny-student", "model")
    commit_files(model, "main", {p.name: p for p in Path(tiny_models["student"]).iterdir() if p.is_file()}, message="tiny student")
    data = create_repo(project, "sft-rows", "dataset")
    commit_files(data, "main", {"train.jsonl": Path(tiny_models["data_sft"])}, message="rows")

    body = {"name": "from the hub", "method": "sft", "base_model": "tiny-student@main", "dataset": "sft-rows@main",
            "config": {"max_steps": 4, "save_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end")
    assert run.status == Status.COMPLETED, (run.error, list(run.log_lines.values_list("line", flat=True))[-30:])
    head = Branch.objects.get(repo=model, name="main").head_id
    assert run.pinned["base_model"]["commit"] == head
    assert run.pinned["dataset"]["commit"] == Branch.objects.get(repo=data, name="main").head_id
    # The engine loaded the repo id through /hub (at the pinned revision), not a local path.
    lines = list(run.log_lines.values_list("line", flat=True))
    assert any(f"base {project.slug}/tiny-student" in line for line in lines), lines[:20]
    assert run.metric_points.filter(key="loss").count() == 4

    def checkpoint_committed() -> bool:
        branch = Branch.objects.filter(repo__project=project, repo__name=f"experiment-{run.experiment.slug}", name=f"run-{run.pk}").first()
        return bool(branch) and TreeEntry.objects.filter(commit_id=branch.head_id, path__startswith="checkpoints/step-2/").exists()

    wait_for(checkpoint_committed, 60, message="the step-2 checkpoint on the run's branch")
    # Every commit lands in the order the engine reported its checkpoint, though the worker runs
    # their tasks side by side: step 2's commit, which Download and a resumed run pin, has no step 4.
    wait_for(lambda: not run.checkpoints.filter(commit="").exists(), 60, message="every checkpoint committed")
    saved = list(run.checkpoints.order_by("pk"))
    history = api.get(f"/api/hub/repos/experiment-{run.experiment.slug}/commits", ref=f"run-{run.pk}").json()
    assert [c["id"] for c in reversed(history)][1:] == [c.commit for c in saved], [c["message"] for c in history]
    steps = [c for c in saved if c.kind == "checkpoint"]
    assert [c.step for c in steps] == [2, 4]
    assert not TreeEntry.objects.filter(commit_id=steps[0].commit, path__startswith="checkpoints/step-4/").exists()
    # Step 2's commit has the metrics up to step 2 (a run stopped after it keeps them on its branch).
    step2_metrics = [json.loads(line) for line in blob_text(steps[0].commit, "metrics.jsonl").splitlines()]
    assert {row["step"] for row in step2_metrics if row["key"] == "loss"} == {1, 2}
    # The published card's front matter names the Data Hub base by the repo id it was pinned to, not tiny-student@main.
    # The publish follows the final checkpoint's commit (which sets its `commit`), in the same task: wait for it.
    def published_head() -> str | None:
        head = Branch.objects.filter(repo__project=project, repo__name=f"from-the-hub-run{run.pk}", name="main").values_list("head_id", flat=True).first()
        return head if head and TreeEntry.objects.filter(commit_id=head, path="README.md").exists() else None

    wait_for(published_head, 60, message="the final weights published with their model card")
    published = published_head()
    card = blob_text(published, "README.md")
    assert f"base_model: {project.slug}/tiny-student\n" in card and "- learning_rate: 0.005" in card, card
    assert json.loads(blob_text(published, "training_config.json"))["base_model"]["commit"] == head


def blob_text(commit_id: str, path: str) -> str:
    with storage.open_blob(blob_path(TreeEntry.objects.get(commit_id=commit_id, path=path).blob.sha256)) as fh:
        return fh.read().decode()


@pytest.mark.parametrize("names", [("train.jsonl", "extra.jsonl"), ("data.jsonl", "test.jsonl")], ids=["train-and-extra", "data-and-test"])
def test_a_run_trains_on_every_file_of_a_data_hub_dataset(api, project, studio_worker, tiny_models, names):
    """START checks every data file of the repo, so the run trains on every one: the Hub's
    split-by-file-name rule trained train.jsonl alone (extra.jsonl dropped), and failed a repo of
    data.jsonl + test.jsonl with 'Unknown split "train"'."""
    model = create_repo(project, "tiny-student", "model")
    commit_files(model, "main", {p.name: p for p in Path(tiny_models["student"]).iterdir() if p.is_file()}, message="tiny student")
    rows = Path(tiny_models["data_sft"]).read_bytes()  # 64 chat rows
    more = b"".join(rows.splitlines(keepends=True)[:5])
    data = create_repo(project, "two-files", "dataset")
    commit_files(data, "main", {names[0]: rows, names[1]: more}, message="rows")

    body = {"name": "two files", "method": "sft", "base_model": "tiny-student@main", "dataset": "two-files@main",
            "config": {"max_steps": 1, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end")
    lines = list(run.log_lines.values_list("line", flat=True))
    assert run.status == Status.COMPLETED, (run.error, lines[-30:])
    assert any(line.startswith("sft: 69 chat rows") for line in lines), [line for line in lines if line.startswith("sft:")]
