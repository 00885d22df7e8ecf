"""/api/experiments and how runs find their experiment (the project's `default` made on first use)."""
from __future__ import annotations

import pytest

from experiments.models import Experiment
from experiments.services import create_experiment
from tests.conftest import assert_error, sft_body
from training.models import TrainingRun


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_post_creates_an_experiment(api, project):
    response = api.post("/api/experiments", {"name": "Baseline Sweep"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "Baseline Sweep" and body["slug"] == "baseline-sweep"
    assert isinstance(body["id"], int) and body["created_at"]
    stored = Experiment.objects.get(pk=body["id"])
    assert (stored.project_id, stored.name, stored.slug) == (project.pk, "Baseline Sweep", "baseline-sweep")
    # The Data Hub seam gave it a repo.
    assert body["hub_repo"] and stored.hub_repo == body["hub_repo"]


@pytest.mark.parametrize("second", ["Baseline Sweep", "baseline sweep", "Baseline  Sweep!"])
def test_duplicate_name_is_409_naming_the_field(api, project, second):
    assert api.post("/api/experiments", {"name": "Baseline Sweep"}).status_code == 201
    assert_error(api.post("/api/experiments", {"name": second}), 409, "name")
    assert Experiment.objects.filter(project=project).count() == 1


def test_a_repo_of_another_type_holding_the_experiments_repo_name_is_409_and_stays_as_it_was(api, project):
    # The experiment adopted it: its runs committed their models to branches of the user's dataset repo.
    error = assert_error(api.post("/api/hub/repos", {"name": "experiment-foo", "type": "dataset"}), 400, "name")
    assert "kept for the experiments' own repos" in error["errors"][0]["message"]
    # One made before such names were kept:
    from datahub.models import Repo
    from datahub.repos import create_repo

    create_repo(project, "experiment-foo", "experiment")
    Repo.objects.filter(project=project, name="experiment-foo").update(type="dataset")
    error = assert_error(api.post("/api/experiments", {"name": "Foo"}), 409, "name")
    assert "dataset repo 'experiment-foo'" in error["detail"] and "rename or delete the dataset repo experiment-foo" in error["errors"][0]["message"]
    assert not Experiment.objects.filter(project=project, slug="foo").exists()
    assert api.get("/api/hub/repos/experiment-foo").json()["type"] == "dataset"


def test_same_name_in_another_project_is_fine(api, api_as):
    assert api.post("/api/experiments", {"name": "Sweep"}).status_code == 201
    assert api_as("outsider").post("/api/experiments", {"name": "Sweep"}).status_code == 201


@pytest.mark.parametrize("body, field", [
    ({}, "name"),
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "!!!"}, "name"),
    ({"name": None}, "name"),
    ({"name": 42}, "name"),
    ({"name": ["a"]}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"name": "ok", "description": "extra"}, "description"),
])
def test_bad_body_is_400_with_the_field_path(api, project, body, field):
    assert_error(api.post("/api/experiments", body), 400, field)
    assert not Experiment.objects.filter(project=project).exists()


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'"name"', b"null", b"{"])
def test_non_object_body_is_400(api, project, raw):
    assert_error(api.post("/api/experiments", raw=raw), 400, "body")
    assert not Experiment.objects.filter(project=project).exists()


def test_list_is_scoped_to_the_tokens_project(api, api_as, project, other_project):
    create_experiment(project, "Acme One")
    create_experiment(project, "Acme Two")
    create_experiment(other_project, "Globex One")
    ours = api.get("/api/experiments")
    assert ours.status_code == 200
    assert sorted(e["name"] for e in ours.json()) == ["Acme One", "Acme Two"]
    theirs = api_as("outsider").get("/api/experiments")
    assert [e["name"] for e in theirs.json()] == ["Globex One"]
    assert sorted(e["name"] for e in api_as("viewer").get("/api/experiments").json()) == ["Acme One", "Acme Two"]


def test_run_without_experiment_lands_in_default_made_once(api, project):
    first = api.post("/api/training-runs", sft_body(name="one"))
    second = api.post("/api/training-runs", sft_body(name="two", experiment=None))
    assert first.status_code == 201 and second.status_code == 201, (first.content, second.content)
    assert first.json()["experiment"]["slug"] == "default"
    assert first.json()["experiment"]["id"] == second.json()["experiment"]["id"]
    assert Experiment.objects.filter(project=project, slug="default").count() == 1
    assert Experiment.objects.filter(project=project).count() == 1


def test_posting_default_after_it_was_made_is_409(api, project):
    api.post("/api/training-runs", sft_body())
    assert_error(api.post("/api/experiments", {"name": "default"}), 409, "name")
    assert Experiment.objects.filter(project=project).count() == 1


@pytest.mark.parametrize("key", ["slug", "id", "id_as_string", "name"])
def test_run_naming_an_experiment_lands_there(api, project, key):
    experiment = create_experiment(project, "Long Runs")
    value = {"slug": experiment.slug, "id": experiment.pk, "id_as_string": str(experiment.pk), "name": experiment.name}[key]
    response = api.post("/api/training-runs", sft_body(experiment=value))
    assert response.status_code == 201, response.content
    assert response.json()["experiment"] == {"id": experiment.pk, "name": "Long Runs", "slug": "long-runs"}
    assert TrainingRun.objects.get(pk=response.json()["id"]).experiment_id == experiment.pk
    assert not Experiment.objects.filter(project=project, slug="default").exists()


@pytest.mark.parametrize("key", ["slug", "id"])
def test_run_naming_another_projects_experiment_is_400(api, project, other_project, key):
    theirs = create_experiment(other_project, "Secret Plans")
    value = theirs.slug if key == "slug" else theirs.pk
    assert_error(api.post("/api/training-runs", sft_body(experiment=value)), 400, "experiment")
    assert not TrainingRun.objects.exists()
    assert not Experiment.objects.filter(project=project).exists()


@pytest.mark.parametrize("value", ["no-such-experiment", 999_999, True, 1.5, {"id": 1}, ["default"]])
def test_run_naming_an_unknown_or_malformed_experiment_is_400(api, project, value):
    assert_error(api.post("/api/training-runs", sft_body(experiment=value)), 400, "experiment")
    assert not TrainingRun.objects.exists()


def test_viewer_cannot_create_experiments(api_as, project):
    assert_error(api_as("viewer").post("/api/experiments", {"name": "Nope"}), 403)
    assert not Experiment.objects.filter(project=project).exists()


@pytest.mark.parametrize("name", ["日本語", "!!!"])
def test_a_name_without_ascii_letters_or_digits_says_what_is_allowed(api, project, name):
    body = assert_error(api.post("/api/experiments", {"name": name}), 400, "name")
    message = body["errors"][0]["message"]
    assert "ASCII letters, digits, '-' and '_'" in message and "Data Hub repo name" in message and "e.g. tone-sweep" in message
    assert not Experiment.objects.filter(project=project).exists()


def test_a_run_never_commits_into_a_repo_of_another_type_named_as_its_experiments(api, project):
    # The experiment's repo was deleted, and a dataset repo of that name made before the name was kept.
    from datahub.models import Repo
    from datahub.services import run_repo
    from studio.errors import Conflict

    run = TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body(experiment=api.post("/api/experiments", {"name": "foo"}).json()["id"])).json()["id"])
    Repo.objects.filter(project=project, name="experiment-foo").update(type="dataset")
    with pytest.raises(Conflict, match="is a dataset repo, not experiment foo's"):
        run_repo(run)


@pytest.mark.parametrize("name", ["1", "007", " 42 ", "3!", "-5", "１２"])
def test_a_name_whose_slug_is_only_digits_is_400_as_it_would_read_as_an_id(api, project, name):
    # "1" was created with slug "1", and a run naming experiment "1" then went to experiment id 1 (default).
    body = assert_error(api.post("/api/experiments", {"name": name}), 400, "name")
    assert "only digits, which reads as an experiment id" in body["errors"][0]["message"] and "add a letter, e.g. exp-" in body["errors"][0]["message"]
    assert not Experiment.objects.filter(project=project).exists()


def test_a_digit_string_names_the_experiment_of_that_id_and_digits_with_a_letter_name_a_slug(api, project):
    default = TrainingRun.objects.get(pk=api.post("/api/training-runs", sft_body(name="first")).json()["id"]).experiment
    assert_error(api.post("/api/experiments", {"name": str(default.pk)}), 400, "name")
    run = api.post("/api/training-runs", sft_body(name="by id", experiment=str(default.pk)))
    assert run.status_code == 201 and run.json()["experiment"]["id"] == default.pk
    v1 = api.post("/api/experiments", {"name": "v1"}).json()
    moved = api.post("/api/training-runs", sft_body(name="by slug", experiment="v1"))
    assert moved.status_code == 201 and moved.json()["experiment"]["id"] == v1["id"]
    listed = api.get("/api/training-runs", experiment="v1").json()["items"]
    assert [r["name"] for r in listed] == ["by slug"]


@pytest.fixture
def compared(project, users):
    """An experiment of two SFT runs with loss points, learning rates apart, and one in another project."""
    from training.models import MetricPoint
    from training.services import create_run

    experiment = create_experiment(project, "lr sweep")
    runs = []
    for name, lr, losses in (("slow", 1e-5, [2.0, 1.9, 1.95]), ("fast", 1e-3, [2.0, 1.0, 1.2])):
        run = create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/data", experiment=experiment.pk,
                         config={"learning_rate": lr, "per_device_train_batch_size": 8})
        MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=v) for s, v in enumerate(losses, start=1)])
        runs.append(run)
    return experiment, runs


def test_compare_answers_each_runs_series_last_best_and_differing_settings(api_as, compared):
    experiment, (slow, fast) = compared
    response = api_as("viewer").get(f"/api/experiments/{experiment.pk}/compare", runs=f"{slow.pk},{fast.pk}", metric="loss")
    assert response.status_code == 200, response.content
    assert response.json() == {"metric": "loss", "metrics": ["loss"], "chosen": True, "runs": [
        {"id": fast.pk, "name": "fast", "status": "queued", "last": 1.2, "best": 1.0, "points": [[1, 2.0], [2, 1.0], [3, 1.2]], "settings": {"learning_rate": "0.001"}},
        {"id": slow.pk, "name": "slow", "status": "queued", "last": 1.95, "best": 1.9, "points": [[1, 2.0], [2, 1.9], [3, 1.95]], "settings": {"learning_rate": "1e-05"}},
    ]}
    newest = api_as("viewer").get(f"/api/experiments/{experiment.pk}/compare").json()
    assert (newest["chosen"], [run["id"] for run in newest["runs"]]) == (False, [fast.pk, slow.pk])


def test_compare_charts_the_reward_by_default_when_every_run_is_grpo(api, compared):
    # A GRPO sweep opened on its loss, which says little of what was learned.
    from training.models import MetricPoint, TrainingRun

    experiment, (slow, fast) = compared
    for run in (slow, fast):
        MetricPoint.objects.create(run=run, key="reward", step=1, value=0.5)
    assert api.get(f"/api/experiments/{experiment.pk}/compare").json()["metric"] == "loss"  # SFT runs: the loss
    TrainingRun.objects.filter(pk=slow.pk).update(method="grpo")
    assert api.get(f"/api/experiments/{experiment.pk}/compare").json()["metric"] == "loss"  # a mixed experiment: the loss
    assert api.get(f"/api/experiments/{experiment.pk}/compare", runs=str(slow.pk)).json()["metric"] == "reward"  # the chosen run is GRPO
    TrainingRun.objects.filter(pk=fast.pk).update(method="grpo")
    body = api.get(f"/api/experiments/{experiment.pk}/compare").json()
    assert body["metric"] == "reward" and [run["points"] for run in body["runs"]] == [[[1, 0.5]], [[1, 0.5]]]


@pytest.mark.parametrize("query, field, message", [
    ({"metric": "rewrd"}, "metric", 'no run of this experiment reports "rewrd": choose one of loss'),
    ({"metric": "a\x00b"}, "metric", 'no run of this experiment reports "a\\u0000b": choose one of loss'),
    ({"metric": "x" * 5000}, "metric", "no run of this experiment reports"),
    ({"runs": "1,two"}, "runs", '"two" is not a run id: give run ids separated by commas, e.g. runs=12,15'),
    ({"runs": "99999999"}, "runs", "no run #99999999 in this experiment"),
    ({"runs": ",".join(str(i) for i in range(10**9, 10**9 + 1000))}, "runs", "#1000000019 and 980 more in this experiment"),
])
def test_compare_with_a_bad_metric_or_run_is_400_naming_the_field(api, compared, query, field, message):
    experiment, _ = compared
    body = assert_error(api.get(f"/api/experiments/{experiment.pk}/compare", **query), 400, field)
    assert message in body["errors"][0]["message"]


def test_compare_never_shows_another_projects_runs_or_experiment(api, api_as, compared, other_project, users):
    from training.services import create_run

    experiment, _ = compared
    theirs = create_run(other_project, users["outsider"], name="globex plugh", method="sft", base_model="org/base", dataset="org/data")
    body = assert_error(api.get(f"/api/experiments/{experiment.pk}/compare", runs=str(theirs.pk)), 400, "runs")
    assert body["errors"][0]["message"].startswith(f"no run #{theirs.pk} in this experiment") and "plugh" not in str(body)
    assert_error(api_as("outsider").get(f"/api/experiments/{experiment.pk}/compare"), 404)


@pytest.mark.parametrize(("name", "code"), [("\u202eevil.exe", "U+202E"), ("tone\u200b", "U+200B"), ("a\u200dsweep", "U+200D")])
def test_a_name_with_a_bidi_control_or_an_invisible_character_is_400_naming_it(api, project, name, code):
    before = list(Experiment.objects.values_list("pk", flat=True))
    body = assert_error(api.post("/api/experiments", {"name": name}), 400, "name")
    assert f"an experiment name cannot contain {code}" in body["errors"][0]["message"], body
    assert list(Experiment.objects.values_list("pk", flat=True)) == before


@pytest.fixture
def environment_moved(api, project, tiny_local_model):
    """Two GRPO runs of an experiment on `sci-ui@main` with the same settings, each started: B before
    the environment's CONFIG was saved (a new commit on main), C after; and D, never started."""
    fork = api.post("/api/environments/fork", {"catalogue": "science-qa", "name": "sci-ui"})
    assert fork.status_code == 201, fork.content
    experiment = api.post("/api/experiments", {"name": "env versions"}).json()
    body = {"method": "grpo", "base_model": str(tiny_local_model), "experiment": experiment["id"],
            "config": {"environment_id": "sci-ui@main", "learning_rate": 1e-5, "max_steps": 10}}

    def run(name: str, start: bool) -> TrainingRun:
        made = api.post("/api/training-runs", {**body, "name": name})
        assert made.status_code == 201, made.content
        if start:
            started = api.post(f"/api/training-runs/{made.json()['id']}/start")
            assert started.status_code == 202, started.content
        return TrainingRun.objects.get(pk=made.json()["id"])

    before = run("B", True)
    saved = api.put("/api/environments/sci-ui/config", {"config": {**fork.json()["config"], "max_words": 7}})
    assert saved.status_code == 200, saved.content
    after = run("C", True)
    waiting = run("D", False)
    assert (before.pinned["config.environment_id"]["commit"], after.pinned["config.environment_id"]["commit"]) == (fork.json()["commit"], saved.json()["commit"])
    return experiment["id"], before, after, waiting


def test_compare_lists_the_environment_commit_each_run_trained_on_when_main_moved_between_them(api, users, environment_moved):
    from django.test import Client

    from tests.ui.test_experiment_compare import compare_table

    experiment_id, before, after, waiting = environment_moved
    body = api.get(f"/api/experiments/{experiment_id}/compare", runs=f"{before.pk},{after.pk},{waiting.pk}").json()
    pinned = {run.pk: f"sci-ui@main → commit {run.pinned['config.environment_id']['commit'][:12]}" for run in (before, after)}
    # Every setting is the same; what each trained on is not. D pinned nothing yet: no false difference.
    assert {run["id"]: run["settings"] for run in body["runs"]} == {
        before.pk: {"environment commit": pinned[before.pk]}, after.pk: {"environment commit": pinned[after.pk]},
        waiting.pk: {"environment commit": "nothing pinned: not started yet"}}
    unstarted = api.get(f"/api/experiments/{experiment_id}/compare", runs=f"{before.pk},{waiting.pk}").json()
    assert [run["settings"] for run in unstarted["runs"]] == [{}, {}]
    # The page's table says the same, and no longer that the runs share every setting.
    browser = Client()
    browser.force_login(users["viewer"])
    html = browser.get(f"/experiments/{experiment_id}/", {"runs": f"{before.pk},{after.pk}"}).content.decode()
    assert "share every setting" not in html
    assert [row[0:1] + row[-1:] for row in compare_table(html)] == [
        ["Run", "environment commit"], [f"C #{after.pk}", pinned[after.pk]], [f"B #{before.pk}", pinned[before.pk]]]
