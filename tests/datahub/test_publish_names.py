"""A run's final weights are published to its model repo whatever the run is called: a name starting
"Experiment" used to give experiment-…-run<id>, a name create_repo keeps for experiments' repos, so the
publish raised in the worker, the run's log said nothing and its Overview called the repo "deleted".
A publish that a Data Hub rule refuses says so in the run's log and on its Overview."""

from __future__ import annotations

import re

import pytest

from datahub import repos
from datahub.models import Repo
from datahub.services import PUBLISH_RE, commit_checkpoint, create_run_branch, model_repo_name
from tests.conftest import sft_body, wait_for
from training.models import Checkpoint, LogLine, Status, TrainingRun


@pytest.fixture
def final_of(api, settings, tmp_path):
    """A completed run of `name` with its final (step 3) saved in its attempt's output folder, not committed yet."""
    from training.backends.local import output_dir

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"

    def make(name: str) -> Checkpoint:
        r = api.post("/api/training-runs", sft_body(name=name, config={"max_steps": 3}))
        assert r.status_code == 201, r.content
        TrainingRun.objects.filter(pk=r.json()["id"]).update(status=Status.COMPLETED, attempt=1)
        run = TrainingRun.objects.get(pk=r.json()["id"])
        create_run_branch(run)
        folder = output_dir(run.pk, 1) / "final"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        return Checkpoint.objects.create(run=run, attempt=1, step=3, kind="final", path=str(folder))

    return make


def published_line(browser, run) -> str:
    match = re.search(r'data-testid="published-model">(.*?)</p>', browser("owner").get(f"/training/runs/{run.pk}/").content.decode(), re.S)
    assert match, "the Overview has no Published model line"
    return match.group(1)


@pytest.mark.parametrize("name", ["Experiment 1 \u2713", "experiment", "EXPERIMENT-x"])
def test_a_run_named_experiment_publishes_its_model_outside_the_experiments_namespace(api, project, browser, final_of, name):
    final = final_of(name)
    run = final.run
    assert commit_checkpoint(final.pk) is not None
    expected = f"model-{model_repo_name(run).removeprefix('model-')}"
    assert model_repo_name(run) == expected and expected.startswith("model-experiment") and expected.endswith(f"-run{run.pk}")
    repo = repos.find_repo(project, expected)
    assert repo is not None and repo.type == "model"
    head = repos.resolve(repo, "main")
    assert PUBLISH_RE.match(head.message) and set(repos.tree(head)) == {"model.safetensors", "README.md", "training_config.json"}
    assert Checkpoint.objects.get(pk=final.pk).publish_error == ""
    assert f"<code>acme/{expected}</code></a>" in published_line(browser, run)
    models = browser("owner").get("/models/").content.decode()
    assert f"/hub/acme/{expected}" in models and f"/training/runs/{run.pk}/" in models  # the Models page pairs it with the run


def test_other_names_keep_their_model_repo_name(api, final_of):
    run = final_of("Sft of tiny").run
    assert model_repo_name(run) == f"sft-of-tiny-run{run.pk}"


def test_a_publish_a_data_hub_rule_refuses_is_in_the_run_log_and_on_the_overview_not_called_deleted(api, project, browser, final_of):
    final = final_of("clash")
    run = final.run
    # a repo whose name differs from the run's model repo only in case: create_repo refuses the model repo (409)
    repos.create_repo(project, model_repo_name(run).upper(), "dataset")
    assert commit_checkpoint(final.pk) is not None  # committed on the run's branch all the same
    assert list(Repo.objects.filter(name__iexact=model_repo_name(run)).values_list("type", flat=True)) == ["dataset"]  # only the other repo
    error = Checkpoint.objects.get(pk=final.pk).publish_error
    assert error.count("already has a repo") == 1 and "choose another name" not in error, error  # QA: said twice, the second time with a form's advice
    line = LogLine.objects.filter(run=run, line__contains="not published to model repo").values_list("line", flat=True).get()
    assert f"acme/{model_repo_name(run)}: Project acme already has a repo" in line and f"its files are on branch run-{run.pk}" in line, line
    overview = published_line(browser, run)
    assert "(deleted)" not in overview and f"publishing to <code>acme/{model_repo_name(run)}</code> failed" in overview, overview
    shown = api.get(f"/api/training-runs/{run.pk}").json()["published_model"]  # the API says the same
    assert shown["full_name"] == f"acme/{model_repo_name(run)}" and not shown["deleted"] and "already has a repo" in shown["error"], shown

    # once the clash is gone, the next try publishes and the Overview links the repo
    repos.delete_repo(repos.find_repo(project, model_repo_name(run).upper()))
    assert commit_checkpoint(final.pk) is not None
    assert Checkpoint.objects.get(pk=final.pk).publish_error == ""
    assert f"<code>acme/{model_repo_name(run)}</code></a>" in published_line(browser, run)
    shown = api.get(f"/api/training-runs/{run.pk}").json()["published_model"]
    assert shown["commit"] and shown["error"] == "" and not shown["deleted"], shown


def test_a_run_whose_publish_the_old_name_refused_is_not_called_deleted_after_the_upgrade(api, project, browser, final_of):
    """training's migration 0016 marks the final checkpoints that the old experiment-…-run<id> name kept
    from being published (committed on the run's branch, no repo of that name), so their Overview says
    why instead of "(deleted)"; a published run's, and another run's, stay as they were."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("training.migrations.0016_checkpoint_publish_error")
    refused, published = final_of("Experiment 1 \u2713"), final_of("Experiment 2")
    Checkpoint.objects.filter(pk=refused.pk).update(commit="c" * 40)  # as the old Studio left it: committed, then the publish raised
    assert commit_checkpoint(published.pk) is not None  # an upgraded Studio published this one
    repos.create_repo(project, f"experiment-2-run{published.run.pk}", "experiment")  # a repo of the old name: not refused
    migration.mark_refused_publishes(apps, None)

    assert f"its model repo name experiment-1-run{refused.run.pk} started with experiment-" in Checkpoint.objects.get(pk=refused.pk).publish_error
    assert Checkpoint.objects.get(pk=published.pk).publish_error == ""
    overview = published_line(browser, refused.run)
    assert "(deleted)" not in overview and "failed" in overview, overview


@pytest.mark.worker
def test_the_qa_repro_a_run_named_experiment_trains_and_publishes_its_model(api, project, browser, studio_worker, tiny_models):
    """The QA round's repro on the local backend (a real Celery worker and engine): the run finished,
    the worker logged BadRequest("'experiment-1-run43' is an experiment's repo name."), no model repo."""
    body = {
        "name": "Experiment 1 \u2713",
        "method": "sft",
        "base_model": tiny_models["student"],
        "dataset": tiny_models["data_sft"],
        "config": {"max_steps": 3, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64},
    }
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(
        lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5, message="the run to end"
    )
    assert run.status == Status.COMPLETED, (run.error, list(run.log_lines.values_list("line", flat=True))[-30:])
    name = f"model-experiment-1-run{run_id}"
    published = wait_for(
        lambda: (repo := repos.find_repo(project, name)) and PUBLISH_RE.match(repos.resolve(repo, "main").message), 60, message=f"the publish commit on {name}"
    )
    assert int(published[1]) == run_id
    assert f"<code>acme/{name}</code></a>" in published_line(browser, run)
