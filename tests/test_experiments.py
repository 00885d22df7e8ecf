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
