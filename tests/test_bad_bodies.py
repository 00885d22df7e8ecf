"""Every body an API user can send that is wrong gets a 4xx with `detail` and field paths, never a 500.

Hypothesis throws arbitrary JSON (and non-JSON bytes, arrays, nulls, huge numbers, nested junk) at
each write endpoint. Each example runs inside a savepoint that is rolled back afterwards, so every
example starts from the same database, and a refused PATCH can be checked to have changed nothing.
The Django test client re-raises a view's exception, so a 500 fails the example with its traceback.
"""
from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from studio import crypto
from studio.models import ProjectSecret
from tests.conftest import Api, sft_body
from training import status as status_service
from training.backends.local import output_dir
from training.models import LogLine, MetricPoint, Status, TrainingRun

# BAD_BODIES_EXAMPLES=1000 for a deeper local hunt; 60 keeps the file under a minute in `make test`.
SETTINGS = settings(
    max_examples=int(os.environ.get("BAD_BODIES_EXAMPLES", "60")), deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# ---- strategies ----------------------------------------------------------------------------------

HUGE = st.sampled_from([2**31, -(2**31) - 1, 2**63, -(2**63) - 1, 10**30, -(10**100), 1e308, -1e308, 5e-324])
scalars = st.none() | st.booleans() | st.integers() | HUGE | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)

CONFIG_KEYS = [
    "num_epochs", "max_steps", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
    "precision", "seed", "system_prompt", "lora", "lora_rank", "lora_alpha", "load_in_4bit", "loss", "distillation", "rl_mode",
    "environment_id", "ruler_task_args", "judge", "inference_blocks", "trainer_blocks", "judge_blocks", "rollouts_per_prompt",
    "kl_coef", "max_response_length", "use_liger", "use_unsloth", "heartbeat_timeout_seconds", "global_batch_size",
    "max_prompt_length", "beta", "no_such_key",
]
BLOCK_KEYS = ["type", "dpo_beta", "reference_free", "target_margin", "length_norm", "span_mask", "teacher_model", "top_k",
              "temperature", "kd_weight", "ce_weight", "dataset", "system_prompt", "mode", "endpoint", "model", "api_key_secret"]
blocks = st.dictionaries(st.sampled_from(BLOCK_KEYS), json_values, max_size=4)
configs = st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values | blocks, max_size=5) | json_values
computes = st.dictionaries(st.sampled_from(["backend", "accelerators", "spot", "region", "gpus"]),
                           st.sampled_from(["local", "dstack", "modal", "GPU:0", "GPU:-1", "H100:999999999999", "CPU:2", "", "TPU"]) | json_values, max_size=4) | json_values
refs = st.sampled_from(["", "@", "repo@", "@main", "a/b/c@x@y", "org/model", "x" * 600, "../../etc/passwd", "other/repo@main"]) | json_values
datasets = refs | st.lists(refs | st.dictionaries(st.sampled_from(["ref", "type", "split"]), refs, max_size=3), max_size=3)
methods = st.sampled_from(["sft", "dpo", "grpo", "distill", "ppo", "PPO", "SFT", "", "rlhf"]) | json_values


def with_junk(valid: dict[str, Any], fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[Any]:
    """A valid body with some fields replaced by junk, extra keys, or a body that is junk throughout."""
    replaced = st.fixed_dictionaries({}, optional={k: v for k, v in fields.items()}).map(lambda junk: {**valid, **junk})
    extra = st.dictionaries(st.text(max_size=12), json_values, min_size=1, max_size=3).map(lambda more: {**more, **valid})
    dropped = st.sets(st.sampled_from(sorted(valid)), min_size=1).map(lambda gone: {k: v for k, v in valid.items() if k not in gone})
    free = st.dictionaries(st.sampled_from(sorted(fields)) | st.text(max_size=8), json_values, max_size=6)
    return replaced | extra | dropped | free | json_values


# Bodies that are not JSON objects at all, or JSON that Python accepts and PostgreSQL or the spec do not.
RAW = st.sampled_from([
    b"", b"   ", b"not json", b"{", b"}", b"[]", b"null", b"0", b'"text"', b"\xff\xfe\x00", b"{'single': 'quotes'}",
    b"NaN", b'{"name": NaN}', b'{"name": "x", "config": {"learning_rate": Infinity}}', b'{"value": -Infinity}',
    b'{"name": 1e999}', b'{"name": "nul\\u0000byte"}', b'{"nul\\u0000key": 1}', b'{"value": "nul\\u0000byte"}',
    b'{"name": "lone \\ud800 surrogate"}', b'{"name": "a", "name": "b"}',
    b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
]) | st.binary(max_size=64)


def body_or_raw(bodies: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, bytes | None]]:
    return bodies.map(lambda b: (b, None)) | RAW.map(lambda r: (None, r))


# ---- the check -----------------------------------------------------------------------------------

def assert_4xx_with_field_paths(response) -> None:
    assert response.status_code < 500, response.content[:500]
    if response.status_code < 400:
        return
    body = response.json()
    assert isinstance(body.get("detail"), str) and body["detail"].strip(), body
    assert isinstance(body.get("errors"), list) and body["errors"], body
    for error in body["errors"]:
        assert isinstance(error.get("field"), str) and error["field"], body  # may be a key like "\r" itself
        assert isinstance(error.get("message"), str) and error["message"].strip(), body


def send(api: Api, method: str, path: str, body: Any, raw: bytes | None):
    """One request inside a savepoint that is always rolled back: each example sees the same rows."""
    savepoint = transaction.savepoint()
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"HTTP_AUTHORIZATION": f"Bearer {api.token}"} if api.token else {}
        return getattr(api.client, method)(path, data=data, content_type="application/json", **headers)
    finally:
        transaction.savepoint_rollback(savepoint)


def run_snapshot(pk: int) -> tuple:
    return tuple(TrainingRun.objects.filter(pk=pk).values_list("name", "base_model", "dataset", "config", "compute", "status", "experiment_id").get())


@pytest.fixture
def queued_run(api) -> TrainingRun:
    response = api.post("/api/training-runs", sft_body(name="target", config={"learning_rate": 1e-4}, compute={"backend": "local", "accelerators": "CPU"}))
    assert response.status_code == 201, response.content
    return TrainingRun.objects.get(pk=response.json()["id"])


# ---- endpoints -----------------------------------------------------------------------------------

RUN_FIELDS = {"name": json_values, "experiment": json_values, "method": methods, "base_model": refs, "dataset": datasets, "config": configs, "compute": computes}


def test_create_run_never_500s(api, project):
    @SETTINGS
    @given(body_or_raw(with_junk(sft_body(), RUN_FIELDS)))
    def check(case):
        body, raw = case
        assert_4xx_with_field_paths(send(api, "post", "/api/training-runs", body, raw))

    check()


def test_create_run_per_method_never_500s(api, project):
    """Junk inside each method's own blocks, with a method that reads them."""
    @SETTINGS
    @given(st.sampled_from(["sft", "dpo", "grpo", "distill"]), configs, computes)
    def check(method, config, compute):
        body = sft_body(method=method, config=config, compute=compute)
        assert_4xx_with_field_paths(send(api, "post", "/api/training-runs", body, None))

    check()


def test_patch_run_never_500s_and_a_refused_patch_changes_nothing(api, queued_run):
    before = run_snapshot(queued_run.pk)
    patch_fields = {k: v for k, v in RUN_FIELDS.items() if k not in ("method", "experiment")} | {"method": methods, "status": json_values}

    @SETTINGS
    @given(body_or_raw(with_junk({"name": "renamed", "config": {"max_steps": 5}}, patch_fields)))
    def check(case):
        body, raw = case
        savepoint = transaction.savepoint()
        try:
            data = raw if raw is not None else json.dumps(body).encode()
            response = api.client.patch(f"/api/training-runs/{queued_run.pk}", data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api.token}")
            assert_4xx_with_field_paths(response)
            if response.status_code >= 400:
                assert run_snapshot(queued_run.pk) == before, "a refused PATCH changed the run"
        finally:
            transaction.savepoint_rollback(savepoint)

    check()
    assert run_snapshot(queued_run.pk) == before


def test_create_experiment_never_500s(api, project):
    @SETTINGS
    @given(body_or_raw(with_junk({"name": "Sweep"}, {"name": json_values})))
    def check(case):
        body, raw = case
        assert_4xx_with_field_paths(send(api, "post", "/api/experiments", body, raw))

    check()


secret_names = st.text(max_size=120).filter(lambda n: "/" not in n) | st.sampled_from(["ok_name", "1bad", "a" * 101, ".", "..", "a\x00b", "%2F"])


def test_put_secret_never_500s(api, project):
    @SETTINGS
    @given(secret_names, body_or_raw(with_junk({"value": "sk-1"}, {"value": json_values})))
    def check(name, case):
        body, raw = case
        response = send(api, "put", f"/api/secrets/{quote(name, safe='')}" if name else "/api/secrets/%20", body, raw)
        if response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json"):
            return  # a name that is no path at all (e.g. "..") never reaches the API
        assert_4xx_with_field_paths(response)

    check()
    assert not ProjectSecret.objects.filter(project=project).exists()


INGEST_FIELDS = {
    "batch_id": json_values,
    "metrics": st.lists(st.fixed_dictionaries({}, optional={"step": json_values | HUGE, "key": json_values, "value": json_values | HUGE}), max_size=3) | json_values,
    "logs": st.lists(json_values | st.text(), max_size=3) | json_values,
    "rollouts": st.lists(st.dictionaries(st.sampled_from(["step", "prompt", "completion", "reward", "advantage", "components"]), json_values | HUGE, max_size=6), max_size=2) | json_values,
    "checkpoints": st.lists(st.dictionaries(st.sampled_from(["step", "path", "kind"]), json_values | HUGE, max_size=3), max_size=2) | json_values,
    "stage": json_values, "status": st.sampled_from(["running", "completed", "failed", "queued", "cancelled"]) | json_values,
    "error": st.dictionaries(st.sampled_from(["code", "message", "log_tail"]), json_values, max_size=3) | json_values,
    "progress": json_values,
}
VALID_BATCH = {
    "batch_id": "b-1", "metrics": [{"step": 1, "key": "loss", "value": 1.5}], "logs": ["step 1"],
    "rollouts": [{"step": 1, "prompt": "p", "completion": "c", "reward": 1.0}], "checkpoints": [{"step": 1, "path": "/out/ckpt-1"}],
    "stage": "training", "progress": {"step": 1, "max_steps": 10},
}


@pytest.fixture
def ingest_api(queued_run) -> Api:
    from django.test import Client

    status_service.transition(queued_run.pk, Status.PROVISIONING)
    status_service.transition(queued_run.pk, Status.RUNNING)
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=queued_run.pk).update(ingest_token_hash=crypto.hash_token(token), attempt=1)
    return Api(Client(), token)


def test_ingest_never_500s(ingest_api, queued_run):
    metrics_before = MetricPoint.objects.filter(run=queued_run).count()
    logs_before = LogLine.objects.filter(run=queued_run).count()

    @SETTINGS
    @given(body_or_raw(with_junk(VALID_BATCH, INGEST_FIELDS)))
    def check(case):
        body, raw = case
        assert_4xx_with_field_paths(send(ingest_api, "post", f"/api/ingest/runs/{queued_run.pk}", body, raw))

    check()
    assert MetricPoint.objects.filter(run=queued_run).count() == metrics_before
    assert LogLine.objects.filter(run=queued_run).count() == logs_before


def test_ingest_valid_batch_is_applied(ingest_api, queued_run):
    """The happy path of the same harness, so the fuzzing above is known to reach the endpoint."""
    saved = str(output_dir(queued_run.pk, 1) / "checkpoint-1")  # VALID_BATCH's path is no folder of this run: a 400
    response = ingest_api.post(f"/api/ingest/runs/{queued_run.pk}", {**VALID_BATCH, "checkpoints": [{"step": 1, "path": saved}]})
    assert response.status_code == 200, response.content
    assert MetricPoint.objects.filter(run=queued_run, key="loss").count() == 1


# ---- named cases that once were 500s -------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b'{"name": "nul\\u0000byte", "method": "sft", "config": {}, "compute": {}}',
    b'{"name": "x", "method": "sft", "config": {"warmup_ratio": NaN}, "compute": {}}',
    b'{"name": "x", "method": "sft", "config": {"nul\\u0000key": 1}, "compute": {}}',
    b'{"name": "x", "method": "sft", "config": {"learning_rate": 1e999}, "compute": {}}',
    b"[" * 50_000 + b"]" * 50_000,
])
def test_create_run_with_json_postgres_cannot_store_is_400(api, project, raw):
    response = api.post("/api/training-runs", raw=raw)
    assert_4xx_with_field_paths(response)
    assert response.status_code == 400
    assert not TrainingRun.objects.exists()


def test_create_run_with_an_overlong_base_model_is_400(api, project):
    response = api.post("/api/training-runs", sft_body(base_model="org/" + "m" * 600))
    assert response.status_code == 400, response.content
    assert_4xx_with_field_paths(response)
    assert not TrainingRun.objects.exists()


@pytest.mark.parametrize("field, value", [("step", 2**31), ("step", -(2**31) - 1), ("value", 1e308 * 10)])
def test_ingest_metric_out_of_range_is_400(ingest_api, queued_run, field, value):
    metric = {"step": 1, "key": "loss", "value": 1.0, field: value}
    response = ingest_api.post(f"/api/ingest/runs/{queued_run.pk}", {"batch_id": "b", "metrics": [metric]}) if value != float("inf") else \
        ingest_api.post(f"/api/ingest/runs/{queued_run.pk}", raw=b'{"batch_id": "b", "metrics": [{"step": 1, "key": "loss", "value": 1e999}]}')
    assert response.status_code == 400, response.content
    assert_4xx_with_field_paths(response)
    assert not MetricPoint.objects.filter(run=queued_run).exists()


# ---- query strings and paths PostgreSQL cannot compare against -----------------------------------

@pytest.mark.parametrize("method, path", [
    ("get", "/api/training-runs?experiment=a%00b"),
    ("delete", "/api/secrets/a%00b"),
    ("put", "/api/secrets/a%00b"),
    ("get", "/api/training-runs?experiment=%ED%A0%80"),
])
def test_nul_or_broken_text_in_query_or_path_is_4xx(api, project, method, path):
    body = {} if method == "get" else {"data": b'{"value": "v"}', "content_type": "application/json"}
    response = getattr(api.client, method)(path, HTTP_AUTHORIZATION=f"Bearer {api.token}", **body)
    if method == "delete":  # no secret can have that name: a plain 404
        assert response.status_code == 404 and response.json()["detail"]
    else:
        assert_4xx_with_field_paths(response)


@pytest.mark.parametrize("experiment", ["²", "٣", "9" * 30, True, False])
def test_odd_experiment_keys_never_500(api, project, experiment):
    create = api.post("/api/training-runs", sft_body(experiment=experiment))
    assert_4xx_with_field_paths(create)
    assert create.status_code == 400 and not TrainingRun.objects.exists()
    listed = api.client.get("/api/training-runs", {"experiment": str(experiment)}, HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert_4xx_with_field_paths(listed)
    assert listed.status_code == 400 and listed.json()["errors"][0]["field"] == "experiment"  # no such experiment, as at create


@pytest.mark.parametrize("method, path", [
    ("post", "/api/training-runs"), ("patch", "/api/training-runs/{run}"), ("post", "/api/hub/repos"), ("put", "/api/secrets/HF_TOKEN"),
    ("post", "/api/experiments"), ("post", "/api/ingest/runs/{run}"),
])
def test_a_body_over_the_request_limit_is_413_naming_the_limit_and_stores_nothing(api, queued_run, settings, request, method, path):
    # Django refuses to read a body over DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB by default); that was a 500.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    who = request.getfixturevalue("ingest_api") if "ingest" in path else api  # (a running run: a PATCH of it is a 409 first)
    before, logs = run_snapshot(queued_run.pk), LogLine.objects.filter(run=queued_run).count()
    body = {**VALID_BATCH, "logs": ["x" * 100] * 200} if "ingest" in path else {"name": "big", "value": "v" * 20_000, "config": {"note": "n" * 20_000}}
    response = send(who, method, path.format(run=queued_run.pk), body, None)
    assert response.status_code == 413, response.content
    error = response.json()
    assert "over the 10000 bytes one request may carry" in error["detail"] and error["errors"][0]["field"] == "body"
    assert "send at most 10000 bytes" in error["errors"][0]["message"]
    assert run_snapshot(queued_run.pk) == before and LogLine.objects.filter(run=queued_run).count() == logs


@pytest.mark.parametrize("path", [
    "/api/training-runs", "/api/experiments", "/api/hub/repos", "/api/environments/fork", "/api/ingest/runs/{run}",
])
def test_a_form_body_is_415_saying_to_send_json_and_stores_nothing(api, queued_run, request, path):
    # A multipart form cannot be JSON, and once parsed its bytes are gone: reading them was a 500.
    who = request.getfixturevalue("ingest_api") if "ingest" in path else api
    before, logs = run_snapshot(queued_run.pk), LogLine.objects.filter(run=queued_run).count()
    response = who.client.post(path.format(run=queued_run.pk), {"name": "x", "batch_id": "b1"}, HTTP_AUTHORIZATION=f"Bearer {who.token}")
    assert response.status_code == 415, response.content
    assert response.json()["errors"] == [{"field": "Content-Type", "message": "send the body as JSON, with Content-Type: application/json"}]
    assert run_snapshot(queued_run.pk) == before and LogLine.objects.filter(run=queued_run).count() == logs
    assert TrainingRun.objects.count() == 1


@pytest.mark.parametrize("method", ["post", "patch", "put", "delete"])
def test_a_write_to_api_without_its_slash_is_a_json_404_not_a_500(api, settings, method):
    settings.DEBUG = True  # `make studio`'s default, where CommonMiddleware's APPEND_SLASH raised for a write it cannot redirect
    response = getattr(api.client, method)("/api", data="{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert response.status_code == 404 and "listed at /api/docs" in response.json()["detail"]
    assert api.client.get("/api").status_code == 302


def test_a_key_given_twice_in_a_body_is_a_400_naming_it_and_stores_nothing(api, ingest_api, queued_run):
    # json.loads keeps the last of two equal keys: {"name": "a", "name": "b"} made a run named "b".
    r = api.client.post("/api/experiments", data='{"name": "dup-first", "name": "dup-second"}', content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert r.status_code == 400 and "the key 'name' appears twice in one object: keep one" in r.json()["errors"][0]["message"], r.content
    nested = '{"batch_id": "b1", "metrics": [{"step": 1, "key": "loss", "value": 1.0, "value": 2.0}]}'
    r = ingest_api.client.post(f"/api/ingest/runs/{queued_run.pk}", data=nested, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {ingest_api.token}")
    assert r.status_code == 400 and "'value' appears twice" in r.json()["errors"][0]["message"], r.content
    assert not MetricPoint.objects.filter(run=queued_run).exists()


def test_lax_types_and_control_characters_are_refused_where_they_were_read_as_something_else(api, ingest_api, queued_run):
    from experiments.models import Experiment

    def post(who, path, body):
        return who.client.post(path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {who.token}")

    # true was experiment id 1, and 1.0 too
    for experiment in (True, 1.0):
        r = post(api, "/api/training-runs", sft_body(experiment=experiment))
        assert r.status_code == 400 and r.json()["errors"][0]["field"].startswith("experiment"), r.content
    r = post(api, "/api/experiments", {"name": "ctl\x1b[31mred"})
    assert r.status_code == 400 and "remove the control character U+001B" in r.json()["errors"][0]["message"], r.content
    assert not Experiment.objects.filter(name__startswith="ctl").exists()
    for bad in ({"step": True, "key": "loss", "value": 1.0}, {"step": 1, "key": "lo\nss", "value": 1.0}):
        r = post(ingest_api, f"/api/ingest/runs/{queued_run.pk}", {"batch_id": "b-lax", "metrics": [bad]})
        assert r.status_code == 400, r.content
    r = post(ingest_api, f"/api/ingest/runs/{queued_run.pk}", {"batch_id": "b-stage", "stage": "tr\x1b[2Jain"})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "stage", r.content
    assert not MetricPoint.objects.filter(run=queued_run).exists()


def test_overlong_compute_text_and_secret_values_are_400s(api):
    from studio.models import ProjectSecret

    for compute, field in (({"accelerators": "X" * 100_000}, "compute.accelerators"), ({"region": "r" * 101}, "compute.region")):
        r = api.post("/api/training-runs", sft_body(compute=compute))
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == field and "at most" in r.json()["errors"][0]["message"], r.content
    assert not TrainingRun.objects.exists()
    r = api.put("/api/secrets/BIG", {"value": "v" * 65_537})
    assert r.status_code == 400 and "at most 65536 characters" in r.json()["errors"][0]["message"]
    assert not ProjectSecret.objects.filter(name="BIG").exists()
    assert api.put("/api/secrets/BIG", {"value": "v" * 65_536}).status_code == 204


def test_a_patch_of_method_or_experiment_says_why_they_cannot_change(api, queued_run):
    for field, says in (("method", "a run's method cannot change"), ("experiment", "a run stays in its experiment")):
        r = api.patch(f"/api/training-runs/{queued_run.pk}", {field: "dpo" if field == "method" else 1})
        assert r.status_code == 400 and r.json()["errors"] == [{"field": field, "message": r.json()["errors"][0]["message"]}], r.content
        assert r.json()["errors"][0]["message"].startswith(says)
    assert run_snapshot(queued_run.pk)[5] == Status.QUEUED
    # A queued run whose START a worker has yet to take: the reason is the START, not the status.
    from django.utils import timezone

    TrainingRun.objects.filter(pk=queued_run.pk).update(start_requested_at=timezone.now())
    r = api.patch(f"/api/training-runs/{queued_run.pk}", {"name": "new"})
    assert r.status_code == 409 and r.json()["detail"].startswith("This run's START is being handled"), r.content


def test_head_on_an_api_read_answers_as_its_get_without_the_body(api, queued_run):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api.token}"}
    for path in ("/api/training-runs", f"/api/training-runs/{queued_run.pk}", "/api/training-runs/999999"):
        get, head = api.client.get(path, **auth), api.client.head(path, **auth)
        assert head.status_code == get.status_code and head.content == b"", path
        assert int(head["Content-Length"]) == len(get.content) and head["Content-Type"] == get["Content-Type"]
    assert api.client.head("/api/training-runs").status_code == 401  # HEAD is a read like GET, not a way round auth


def test_a_url_encoded_form_body_is_a_415_told_to_send_json(api):
    # curl -d 'name=x' without a content-type header sends a form: "Expecting value: line 1 column 1" did not say so,
    # and it was a 400 while a multipart form is a 415 (README: "a form body instead of JSON is a 415").
    r = api.client.post("/api/experiments", data="name=x&method=sft", content_type="application/x-www-form-urlencoded", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert r.status_code == 415 and r.json()["errors"][0]["field"] == "Content-Type", r.content
    assert "Content-Type: application/json" in r.json()["errors"][0]["message"]
    # JSON sent with curl's default form content type is still read as JSON.
    r = api.client.post("/api/experiments", data='{"name": "curl-default"}', content_type="application/x-www-form-urlencoded", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert r.status_code == 201, r.content
