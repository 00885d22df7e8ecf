"""A repo that ended runs trained from is deleted: its Delete names those runs first, Resume and Merge
of their steps are refused before anything is made (not failed later in the worker), START says the
pinned files were deleted with the repo, and a new repo of the same name is not shown as theirs."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from datahub import commits, repos
from datahub.refs import pin_refs
from tests.conftest import assert_error
from training import checkpoints, services
from training.models import Checkpoint, Status, TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def ended(project, users):
    """A cancelled LoRA run that trained from model repo chain-dpo@v1 and dataset chain-data@main,
    pinned and recorded as its START and claim do, with step 5 saved."""
    model = repos.create_repo(project, "chain-dpo", "model")
    commits.commit_files(model, "main", {"config.json": b'{"model_type": "llama"}'}, "weights")
    repos.create_tag(model, "v1", "main")
    data = repos.create_repo(project, "chain-data", "dataset")
    commits.commit_files(data, "main", {"train.jsonl": b'{"prompt": "hi", "completion": "hello"}\n'}, "rows")
    run = services.create_run(project, users["owner"], name="dpo chain", method="sft", base_model="chain-dpo@v1", dataset="chain-data@main",
                              config={"save_steps": 5, "lora_rank": 4})
    TrainingRun.objects.filter(pk=run.pk).update(pinned=pin_refs(run), attempt=1, status=Status.CANCELLED)
    run.refresh_from_db()
    services.record_attempt(run)
    Checkpoint.objects.create(run=run, attempt=1, step=5, kind="checkpoint", path="/out/checkpoint-5")
    return run


def page(users, url: str) -> str:
    client = Client()
    client.force_login(users["owner"])
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_repo_delete_names_the_ended_runs_that_trained_from_it(api, project, users, ended):
    html = page(users, "/hub/acme/chain-dpo")
    note = re.search(r'data-testid="delete-trained-from">(.*?)</p>', html, re.S)
    assert note, html
    assert f"#{ended.pk} (dpo chain, cancelled)" in note.group(1)
    assert "Start again and Resume from here stop working" in note.group(1)
    # A repo no run trained from says nothing of the kind.
    repos.create_repo(project, "unused", "model")
    assert "delete-trained-from" not in page(users, "/hub/acme/unused")
    # The API's 409 for a live run that uses it says the same of the ended ones.
    services.create_run(project, users["owner"], name="queued", method="sft", base_model="chain-dpo@main", dataset="org/data")
    body = assert_error(api.delete("/api/hub/repos/chain-dpo"), 409, "name")
    assert f"#{ended.pk} (dpo chain, cancelled)" in body["detail"], body


def test_resume_from_a_step_whose_base_repo_was_deleted_is_refused_before_a_run_is_made(api, users, ended):
    assert api.delete("/api/hub/repos/chain-dpo").status_code == 204
    runs = TrainingRun.objects.count()

    body = assert_error(api.post(f"/api/training-runs/{ended.pk}/checkpoints/5/resume"), 409, "base_model")
    message = next(e["message"] for e in body["errors"] if e["field"] == "base_model")
    assert f"acme/chain-dpo was deleted, and with it commit {ended.pinned['base_model']['commit'][:12]}" in message, message
    assert TrainingRun.objects.count() == runs
    # The Checkpoints tab says so beside a disabled Resume.
    html = page(users, f"/training/runs/{ended.pk}/checkpoints/")
    assert 'data-testid="resume-blocked-5">Cannot resume: ' in html, html


def test_start_after_the_base_repo_was_deleted_says_the_pinned_weights_are_gone(api, project, users, ended):
    child = checkpoints.resume_run(ended, 5, users["owner"])  # resumed before the delete, and failed (a queued run holds the repo)
    TrainingRun.objects.filter(pk=child.pk).update(status=Status.FAILED)
    child.refresh_from_db()
    assert api.delete("/api/hub/repos/chain-dpo").status_code == 204
    commit = ended.pinned["base_model"]["commit"][:12]

    for run in (ended, child):
        body = assert_error(api.post(f"/api/training-runs/{run.pk}/start"), 422, "base_model")
        message = next(e["message"] for e in body["errors"] if e["field"] == "base_model")
        assert f"acme/chain-dpo was deleted, and with it commit {commit}" in message and "train from another base model" in message.lower(), message
        assert "create it, or fix the name" not in message
        assert TrainingRun.objects.get(pk=run.pk).status == run.status
    # An empty repo of that name does not hold the commit: still deleted, and said so.
    repos.create_repo(project, "chain-dpo", "model")
    body = assert_error(api.post(f"/api/training-runs/{child.pk}/start"), 422, "base_model")
    message = next(e["message"] for e in body["errors"] if e["field"] == "base_model")
    assert "the repo of that name now is a new one, without it" in message, message
    # Setting the resumed run's base model to another cannot help it: it is told to make a new run.
    assert api.patch(f"/api/training-runs/{child.pk}", {"base_model": "org/other"}).status_code == 200
    body = assert_error(api.post(f"/api/training-runs/{child.pk}/start"), 422, "base_model")
    message = next(e["message"] for e in body["errors"] if e["field"] == "base_model")
    assert "no run can resume from that step" in message and "set base_model back" not in message, message


def test_lineage_and_dataset_tab_do_not_link_a_new_repo_of_a_deleted_ones_name(api, project, users, ended):
    for name in ("chain-dpo", "chain-data"):
        assert api.delete(f"/api/hub/repos/{name}").status_code == 204
    model = repos.create_repo(project, "chain-dpo", "model")
    commits.commit_files(model, "main", {"config.json": b'{"model_type": "other"}'}, "unrelated")
    repos.create_tag(model, "v1", "main")
    data = repos.create_repo(project, "chain-data", "dataset")
    commits.commit_files(data, "main", {"train.jsonl": b'{"prompt": "x", "completion": "y"}\n'}, "unrelated")

    lineage = page(users, f"/training/runs/{ended.pk}/lineage/")
    assert 'href="/hub/acme/chain-dpo/tree/v1"' not in lineage and 'href="/hub/acme/chain-data/tree/main"' not in lineage
    base = re.search(r"<tr><td>Base model \(weights\)</td>.*?</tr>", lineage, re.S)
    assert base and "deleted: the repo named chain-dpo now is a new one, without commit" in base.group(0), base
    dataset = page(users, f"/training/runs/{ended.pk}/datasets/")
    assert 'href="/hub/acme/chain-data/tree/main"' not in dataset
    assert "deleted: the repo named chain-data now is a new one" in dataset


def test_merge_after_the_experiment_repo_was_deleted_is_refused_and_disabled(api, users, ended):
    assert api.delete("/api/hub/repos/experiment-default").status_code == 204

    body = assert_error(api.post(f"/api/training-runs/{ended.pk}/checkpoints/5/merge"), 409)
    assert "was deleted with its repo, so the merged model would have nowhere to be committed" in body["detail"], body
    assert Checkpoint.objects.get(run=ended, step=5).merge_requested_at is None
    html = page(users, f"/training/runs/{ended.pk}/checkpoints/")
    blocked = re.search(r'<button type="button" disabled aria-describedby="merge-blocked-\d+">Merge.*?data-testid="merge-blocked-5">(.*?)</span>', html, re.S)
    assert blocked and "nowhere to be committed" in blocked.group(1), html
    assert f'action="/training/runs/{ended.pk}/checkpoints/5/merge"' not in html


def test_a_run_branch_as_base_model_says_what_to_train_from_instead(api, project, users, ended):
    body = {"name": "from a branch", "method": "sft", "base_model": f"experiment-default@run-{ended.pk}", "dataset": "chain-data@main"}
    run_id = api.post("/api/training-runs", body).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "base_model")
    message = next(e["message"] for e in body["errors"] if e["field"] == "base_model")
    assert f"it is run #{ended.pk}'s branch, which holds that run's checkpoints in folders and takes no uploads" in message, message
    # Not a merged checkpoint's folder: a run's folder is the Studio's own data, which no run may name.
    assert "merged checkpoint's folder" not in message and "push the folder" not in message, message


def test_repo_delete_offers_start_only_to_a_queued_run_that_could_start(api, project, users):
    empty = repos.create_repo(project, "no-weights", "model")  # no config.json: START refuses a run on it
    run = services.create_run(project, users["owner"], name="stuck", method="sft", base_model="no-weights@main", dataset="org/data")
    assert api.post(f"/api/training-runs/{run.pk}/start").status_code == 422
    body = assert_error(api.delete(f"/api/hub/repos/{empty.name}"), 409, "name")
    message = body["errors"][0]["message"]
    assert "start it" not in message and f"or delete run #{run.pk} (it cannot start as it is: its page says why)" in message, message


def test_the_log_names_each_input_with_its_ref_and_pinned_commit(ended):
    from datahub.refs import trained_from

    model, data = ended.pinned["base_model"]["commit"][:12], ended.pinned["dataset"]["commit"][:12]
    assert trained_from(ended.base_model, ended.dataset, ended.config, ended.pinned) == (
        f"base_model chain-dpo@v1 = acme/chain-dpo@{model}, dataset chain-data@main = acme/chain-data@{data}")
    # An HF id, or a ref START has not pinned, is named as it is.
    assert trained_from("org/base", [{"ref": "org/data"}], {"distillation": {"teacher_model": "teacher@main"}}, {}) == (
        "base_model org/base, dataset[0] org/data, config.distillation.teacher_model teacher@main")


def test_overview_says_a_published_model_repo_was_deleted(api, project, users, ended):
    from datahub.services import PUBLISH_MESSAGE, model_repo_name

    TrainingRun.objects.filter(pk=ended.pk).update(status=Status.COMPLETED)
    Checkpoint.objects.create(run=ended, attempt=1, step=10, kind="final", path="/out/final", commit="f" * 40)
    published = repos.create_repo(project, model_repo_name(ended), "model")
    commits.commit_files(published, "main", {"config.json": b"{}"}, PUBLISH_MESSAGE.format(kind="final", run=ended.pk, step=10))
    assert f'<a href="/hub/acme/{published.name}"><code>acme/{published.name}</code></a>' in page(users, f"/training/runs/{ended.pk}/")

    assert api.delete(f"/api/hub/repos/{published.name}").status_code == 204
    line = re.search(r'data-testid="published-model">(.*?)</p>', page(users, f"/training/runs/{ended.pk}/"), re.S)
    assert line and f"<code>acme/{published.name}</code>" in line.group(1) and "(deleted)" in line.group(1), line


def test_environment_tab_does_not_show_a_new_repo_of_a_deleted_environments_name(api, project, users):
    env = repos.create_repo(project, "calc-env", "environment")
    commits.commit_files(env, "main", {"calc_env.py": b"def load_environment(**kwargs): ...\n"}, "package")
    run = services.create_run(project, users["owner"], name="grpo", method="grpo", base_model="org/base",
                              config={"rl_mode": "environment", "environment_id": "calc-env@main"})
    TrainingRun.objects.filter(pk=run.pk).update(pinned=pin_refs(run), status=Status.COMPLETED)
    assert api.delete("/api/hub/repos/calc-env").status_code == 204
    again = repos.create_repo(project, "calc-env", "environment")
    head = commits.commit_files(again, "main", {"other_env.py": b"def load_environment(**kwargs): ...\n"}, "unrelated")

    html = page(users, f"/training/runs/{run.pk}/environment/")
    gone = re.search(r'data-testid="environment-gone">(.*?)</p>', html, re.S)
    assert gone and "Data Hub repo acme/calc-env was deleted" in gone.group(1), html
    assert head.pk[:10] not in html and "other_env.py" not in html
