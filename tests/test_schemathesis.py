"""Schemathesis against /api/openapi.json, in-process through the WSGI app, with the owner's token.

Every operation gets a bounded number of generated requests (SCHEMATHESIS_EXAMPLES, default 25);
path ids are mostly mapped onto rows that exist (a queued, a running, a failed and a completed run;
a Data Hub repo; a secret; a webhook) so the handlers past the 404 are reached too. The contract checked:
no response is a 5xx, and every 4xx body carries `detail` (a sentence) and `errors` (a list).

Nothing fuzzed can train: the test runs inside a rolled-back transaction, where START's on_commit
dispatch never fires, and each backend's submit() is replaced by one that fails the test if called.
"""
from __future__ import annotations

import json
import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings

from studio import crypto
from studio.services import set_secret
from studio.webhooks import create_webhook
from tests.conftest import sft_body
from training.models import MetricPoint, Status, TrainingRun

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "25"))


@pytest.fixture
def fuzz_world(db, project, users, tokens, api, monkeypatch, settings, tmp_path):
    """Rows for the fuzzer to hit; returns {param name: [existing values]}."""
    from training.backends import BACKENDS

    settings.DATAHUB_ROOT = tmp_path / "hub"
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 0  # the fuzzer's odd headers are not an attack

    def refuse(*args, **kwargs):
        raise AssertionError("a fuzzed request reached a backend's submit(): nothing may train here")

    for name in ("local", "dstack", "modal"):
        backend = BACKENDS.get(name)
        if backend is not None:
            monkeypatch.setattr(backend, "submit", refuse)

    run_ids = []
    for status in (Status.QUEUED, Status.RUNNING, Status.FAILED, Status.COMPLETED):
        run_id = api.post("/api/training-runs", sft_body(name=f"{status} run")).json()["id"]
        TrainingRun.objects.filter(pk=run_id).update(status=status, attempt=1, ingest_token_hash=crypto.hash_token(f"ing_{status}"))
        MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key="loss", step=s, value=1.0 / (s + 1)) for s in range(50)])
        run_ids.append(run_id)
    repo = api.post("/api/hub/repos", {"name": "fuzz-model", "type": "model"})
    set_secret(project, "JUDGE_KEY", "s3cret")
    settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = True
    webhook, _ = create_webhook(project, "https://127.0.0.1/hook", None)
    settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = False
    return {"run_id": run_ids, "name": [repo.json().get("name", "fuzz-model") if repo.status_code < 300 else "fuzz-model", "JUDGE_KEY"],
            "experiment_id": [TrainingRun.objects.get(pk=run_ids[0]).experiment_id],  # the runs' (default) experiment: its comparison
            "webhook_id": [webhook.pk]}


def load_schema():
    # Loaded at collection (pytest-django has configured Django by then); serving the schema reads
    # no database. schemathesis.pytest.from_fixture would defer this, but it relies on pytest
    # internals that pytest 9 no longer has (Function._nodeid).
    from studio.wsgi import application

    return schemathesis.openapi.from_wsgi("/api/openapi.json", application)


schema = load_schema()


def pin_to_existing(case, world: dict) -> None:
    """Three generated ids in four are replaced by one that exists; the fourth stays as generated."""
    for param, values in world.items():
        value = (case.path_parameters or {}).get(param)
        if value is None:
            continue
        seed = value if isinstance(value, int) else len(str(value))
        if seed % 4:
            case.path_parameters[param] = values[seed % len(values)]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
def test_no_5xx_and_every_4xx_has_detail_and_errors(case, fuzz_world, tokens):
    pin_to_existing(case, fuzz_world)
    headers = {"Authorization": f"Bearer {tokens['owner']}"}
    # Like django.test.Client: a raw WSGI call would close the test transaction's connection at
    # request end (close_old_connections sees autocommit off and calls the connection obsolete).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        response = case.call(headers=headers)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    described = f"{case.method} {case.formatted_path} → {response.status_code}\nrequest: {case.as_curl_command(headers=headers)}\nbody: {response.content[:600]!r}"
    assert response.status_code < 500, described
    if 400 <= response.status_code < 500:
        try:
            body = json.loads(response.content)
        except ValueError:
            pytest.fail(f"a {response.status_code} without a JSON body\n{described}")
        assert isinstance(body, dict) and isinstance(body.get("detail"), str) and body["detail"], described
        assert isinstance(body.get("errors"), list), described


def test_the_fuzzer_sees_every_endpoint():
    """A router that drops out of the schema would drop out of the fuzzing silently."""
    paths = {op.ok().path for op in schema.get_all_operations()}
    for expected in ("/api/training-runs", "/api/training-runs/{run_id}/start", "/api/ingest/runs/{run_id}", "/api/secrets/{name}", "/api/experiments",
                     "/api/experiments/{experiment_id}/compare", "/api/webhooks/{webhook_id}/test"):
        assert expected in paths, sorted(paths)

