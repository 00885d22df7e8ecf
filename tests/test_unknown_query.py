"""A query parameter the endpoint does not take is a 400 naming it: a misspelt filter
(`?stauts=failed`) must not quietly answer as if there were no filter."""
from __future__ import annotations

import re

import pytest

from experiments.services import default_experiment
from studio.api import api as ninja_api
from studio.api import query_names
from tests.conftest import assert_error
from training.models import Status, TrainingRun


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def runs(project):
    experiment = default_experiment(project)
    return [TrainingRun.objects.create(project=project, experiment=experiment, name=f"run {status}", method="sft", status=status,
                                       base_model="org/base", dataset="org/data", config={}, compute={"backend": "local"})
            for status in (Status.QUEUED, Status.FAILED)]


def test_a_misspelt_filter_is_400_naming_it_and_what_the_endpoint_takes(api, runs):
    body = assert_error(api.get("/api/training-runs", stauts="failed"), 400, "stauts")
    message = body["errors"][0]["message"]
    assert "unknown query parameter" in message and "status" in message and "limit" in message
    # the spelling it meant still filters
    assert [r["status"] for r in api.get("/api/training-runs", status="failed").json()["items"]] == ["failed"]


def test_a_repeated_parameter_is_400_naming_it_rather_than_reading_only_the_last(api, runs):
    # ?status=failed&status=queued answered with the queued runs alone, as if filtered by both.
    body = assert_error(api.client.get("/api/training-runs?status=failed&status=queued", HTTP_AUTHORIZATION=f"Bearer {api.token}"), 400, "status")
    assert "given 2 times, and only one value is read: give it once" in body["errors"][0]["message"]
    run = runs[0]
    body = assert_error(api.client.get(f"/api/training-runs/{run.pk}/metrics?keys=loss&keys=entropy", HTTP_AUTHORIZATION=f"Bearer {api.token}"), 400, "keys")
    assert "keys=loss,kd_loss" in body["errors"][0]["message"]
    assert api.get(f"/api/training-runs/{run.pk}/metrics", keys="loss,entropy").status_code == 200


def test_every_unknown_name_is_named_once(api, runs):
    body = assert_error(api.get("/api/training-runs", b="1", a="2", status="failed"), 400)
    assert [e["field"] for e in body["errors"]] == ["a", "b"]


def test_an_endpoint_without_query_parameters_refuses_any(api, runs):
    body = assert_error(api.get(f"/api/training-runs/{runs[0].pk}", verbose="1"), 400, "verbose")
    assert "takes none" in body["errors"][0]["message"]
    assert api.get(f"/api/training-runs/{runs[0].pk}").status_code == 200


def test_names_read_by_hand_and_documented_are_taken(api, project):
    """The Data Hub reads `ref`, `limit`… from request.GET itself; they are what openapi_extra documents."""
    assert api.post("/api/hub/repos", {"name": "data", "type": "dataset"}).status_code == 201
    assert api.get("/api/hub/repos/data/commits", ref="main", limit="5").status_code == 200
    assert_error(api.get("/api/hub/repos/data/commits", revision="main"), 400, "revision")


def test_authentication_still_comes_first(api_as, runs):
    assert_error(api_as(None).get("/api/training-runs", stauts="failed"), 401)


def test_what_is_refused_is_exactly_what_openapi_does_not_document(api):
    """The check and /api/openapi.json agree for every operation: a documented name is never refused."""
    spec = api.client.get("/api/openapi.json").json()
    seen = 0
    for router in ninja_api._get_bound_routers():
        for path, view in router.path_operations.items():
            openapi_path = "/api" + re.sub(r"\{\w+:(\w+)\}", r"{\1}", router.prefix + path)
            for operation in view.operations:
                for method in operation.methods:
                    documented = {p["name"] for p in spec["paths"][openapi_path][method.lower()].get("parameters", [])
                                  if p["in"] == "query"}
                    assert query_names(operation) == documented, (method, openapi_path)
                    seen += 1
    assert seen > 40
