"""Values that parse but cannot be stored or run: NaN and infinities and the dates and binary that
the NEW RUN form's YAML box can produce (the JSON columns of PostgreSQL and SQLite refuse them; the
API's own JSON parser already refuses NaN), numbers that would never end or overflow the trainer, and
names that are blank or too long. Each is a 400 on the field from the API and the form's live estimate,
and the form's 303 back to NEW RUN showing it beside the field; nothing is stored or changed."""
from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from tests.conftest import assert_error, refused_form_page, sft_body
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"max_steps": 10**23}, "config.max_steps", "at most 100000000,"),
        ({"num_epochs": 1e308}, "config.num_epochs", "at most 10000"),
        ({"seed": 2**40}, "config.seed", "at most 4294967295,"),  # exactly: :g said 4.29497e+09
        ({"max_length": "long"}, "config.max_length", "an integer from 1 to 4194304,"),
        ({"learning_rate": 3}, "config.learning_rate", "at most 1"),
    ],
)
def test_unrunnable_numbers_are_400_on_their_field(api, config, field, says):
    before = TrainingRun.objects.count()
    body = assert_error(api.post("/api/training-runs", sft_body(config=config)), 400, field)
    assert says in json.dumps(body), body
    assert TrainingRun.objects.count() == before


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"rollouts_per_prompt": 10**20}, "config.rollouts_per_prompt", "at most 65536"),
        ({"max_response_length": 10**12}, "config.max_response_length", "at most 4194304"),
        ({"trainer_blocks": 10**9}, "config.trainer_blocks", "at most 65536"),
        ({"rollout_log_steps": 10**23}, "config.rollout_log_steps", "at most 100000000"),
    ],
)
def test_unrunnable_grpo_numbers_are_400_on_their_field(api, config, field, says):
    # 10**20 rollouts per prompt was stored, and the GPU estimate priced it at 2e20 GiB.
    body = sft_body(method="grpo", dataset=None, config={"environment_id": "builtin/arith@main", **config})
    found = assert_error(api.post("/api/training-runs", body), 400, field)
    assert says in json.dumps(found), found
    assert not TrainingRun.objects.exists()


def test_the_api_refuses_nan_in_the_body_itself(api):
    # Python's json would read NaN; the API's parser refuses it before any field is looked at.
    body = assert_error(api.post("/api/training-runs", sft_body(config={"learning_rate": float("nan")})), 400, "body")
    assert "NaN is not a JSON number" in body["errors"][0]["message"]


@pytest.mark.parametrize(("name", "says"), [("   ", "give the run a name"), ("x" * 201, "at most 200 characters")])
def test_blank_or_overlong_names_are_400(api, name, says):
    body = assert_error(api.post("/api/training-runs", sft_body(name=name)), 400, "name")
    assert says in body["errors"][0]["message"]


def test_a_name_is_stored_trimmed(api):
    response = api.post("/api/training-runs", sft_body(name="  first run  "))
    assert response.status_code == 201 and response.json()["name"] == "first run"


def test_patch_with_a_blank_name_is_400_and_changes_nothing(api):
    run = api.post("/api/training-runs", sft_body()).json()
    assert_error(api.patch(f"/api/training-runs/{run['id']}", {"name": " ", "config": {"learning_rate": 1e-3}}), 400, "name")
    stored = TrainingRun.objects.get(pk=run["id"])
    assert stored.name == run["name"] and stored.config == run["config"]


FORM = {"method": "sft", "experiment": "", "base_model": "org/base", "dataset": "my-data@main",
        "compute.backend": "local", "compute.accelerators": "CPU"}


@pytest.mark.parametrize(
    ("config_text", "field", "says"),
    [
        ("learning_rate: .nan\n", "config.learning_rate", "finite number"),
        ("warmup_ratio: .inf\n", "config.warmup_ratio", "finite number"),  # a TRL pass-through field
        ("num_epochs: 1\nnested:\n  when: 2024-01-01\n", "config.nested.when", "this is a date"),
        ("learning_rate: 2024-01-01\n", "config.learning_rate", "this is a date"),
        ("lora_rank: !!binary aGVsbG8=\n", "config.lora_rank", "this is binary data"),
    ],
)
def test_the_form_and_its_live_estimate_refuse_what_yaml_reads_as_non_json(project, users, config_text, field, says):
    client = Client()
    client.force_login(users["owner"])
    before = TrainingRun.objects.count()
    html = refused_form_page(client, "/training/new/", {**FORM, "name": "yaml", "config_text": config_text}, "/training/new/")
    assert field in html and says in html
    assert TrainingRun.objects.count() == before
    # The estimate beside START reads the same values while the form is being filled in: no 500.
    part = client.get("/training/new/fit", {**FORM, "name": "yaml", "config_text": config_text, "compute.accelerators": "L4"},
                      HTTP_HX_REQUEST="true")
    assert part.status_code == 200
    assert "no GPU memory estimate until this is fixed" in part.content.decode()


def test_the_config_box_reads_an_exponent_without_a_dot_as_a_number(project, users):
    # YAML 1.1 (PyYAML) reads `2e-4` as the text "2e-4"; the field's own hint says "typical: 1e-5".
    client = Client()
    client.force_login(users["owner"])
    response = client.post("/training/new/", {**FORM, "name": "exp", "config_text": "learning_rate: 2e-4\nweight_decay: 1E-2\nlora_rank: 16\n"})
    assert response.status_code == 302, response.content.decode()[:2000]
    config = TrainingRun.objects.get(name="exp").config
    assert config["learning_rate"] == 2e-4 and config["weight_decay"] == 1e-2 and config["lora_rank"] == 16


def test_the_config_box_refuses_yaml_aliases_before_they_expand(project, users):
    # Eight levels of nine aliases are 9**8 values: walking them held the worker for about a minute.
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
    client = Client()
    client.force_login(users["owner"])
    started = time.monotonic()
    html = refused_form_page(client, "/training/new/", {**FORM, "name": "bomb", "config_text": "\n".join(lines)}, "/training/new/")
    part = client.get("/training/new/fit", {**FORM, "config_text": "\n".join(lines), "compute.accelerators": "L4"}, HTTP_HX_REQUEST="true")
    assert time.monotonic() - started < 10
    assert "aliases (*a0) are not allowed" in html
    assert part.status_code == 200
    assert not TrainingRun.objects.filter(name="bomb").exists()


def test_the_form_refuses_a_name_the_api_refuses(project, users):
    client = Client()
    client.force_login(users["owner"])
    assert "at most 200 characters" in refused_form_page(client, "/training/new/", {**FORM, "name": "n" * 300, "config_text": ""}, "/training/new/")
    assert not TrainingRun.objects.filter(name__startswith="nnnn").exists()


@pytest.mark.parametrize("config_text", ["max_grad_norm: 1\nmax_grad_norm: 2\n", '{"max_grad_norm": 1, "max_grad_norm": 2}', "loss:\n  type: dpo\n  type: ipo\n"])
def test_the_config_box_refuses_a_key_given_twice_as_the_api_does(project, users, config_text):
    # PyYAML kept the last of the two: the run was made with a value the user may not have meant.
    client = Client()
    client.force_login(users["owner"])
    html = refused_form_page(client, "/training/new/", {**FORM, "name": "twice", "config_text": config_text}, "/training/new/")
    assert "appears twice in one mapping: keep one" in html, html[:3000]
    assert not TrainingRun.objects.filter(name="twice").exists()
