"""A built-in environment has one version, `main`: create and PATCH (400) and START (422) refuse any
other @ref on config.environment_id, which used to be stored and then trained on main regardless."""

from __future__ import annotations

import pytest

from tests.conftest import assert_error
from training.models import Status, TrainingRun

GRPO = {"name": "arith", "method": "grpo", "base_model": "org/base", "dataset": None, "compute": {}}


def grpo(environment_id: str) -> dict:
    return {**GRPO, "config": {"environment_id": environment_id, "max_steps": 3}}


@pytest.mark.parametrize("environment_id", ["builtin/arith@nope", "builtin/gsm-maths@v2", "builtin/arith@"])
def test_create_with_a_builtin_at_another_ref_is_refused_naming_the_field(api, environment_id):
    body = assert_error(api.post("/api/training-runs", grpo(environment_id)), 400, "config.environment_id")
    assert "built-in environments are not versioned and have only @main" in body["errors"][0]["message"], body
    assert not TrainingRun.objects.exists()


@pytest.mark.parametrize("environment_id", ["builtin/arith@main", "builtin/arith", "builtin/gsm-maths@main"])
def test_create_with_a_builtin_at_main_or_bare_is_kept(api, environment_id):
    r = api.post("/api/training-runs", grpo(environment_id))
    assert r.status_code == 201, r.content
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["environment_id"] == environment_id


def test_patch_to_a_builtin_at_another_ref_is_refused_and_keeps_the_stored_config(api):
    run_id = api.post("/api/training-runs", grpo("builtin/arith@main")).json()["id"]
    body = assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"environment_id": "builtin/arith@nope"}}), 400, "config.environment_id")
    assert "write builtin/arith@main" in body["errors"][0]["message"], body
    assert TrainingRun.objects.get(pk=run_id).config["environment_id"] == "builtin/arith@main"


def test_start_of_a_run_stored_before_the_rule_is_a_422_and_nothing_starts(api):
    run_id = api.post("/api/training-runs", grpo("builtin/arith@main")).json()["id"]
    run = TrainingRun.objects.get(pk=run_id)
    TrainingRun.objects.filter(pk=run_id).update(config={**run.config, "environment_id": "builtin/arith@nope"})  # as an older Studio stored it
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    assert any("only @main" in e["message"] for e in body["errors"] if e["field"] == "config.environment_id"), body
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.QUEUED and run.config["environment_id"] == "builtin/arith@nope"
