"""Issue 8's GPU throughput levers on NEW RUN (Django's test client, no browser): use_liger,
gradient_checkpointing, packing and rollout_engine in the collapsed Performance (GPU) fieldset.
Default writes no key; On / Off / static write it; editing shows what a run has; the findings are
the one validator's, shown next to the field."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.conftest import refused_form_page
from training import services
from training.models import Status

pytestmark = pytest.mark.django_db

PERF_KEYS = {"use_liger", "gradient_checkpointing", "packing", "rollout_engine"}
BASE = {"experiment": "", "base_model": "org/base", "compute.backend": "local", "compute.accelerators": "CPU", "config_text": "lora_rank: 8\n"}
# What each method's form posts besides the common fields (a browser sends every select, "" at Default).
METHOD_POSTS = {
    "sft": {"dataset": "my-data@main", "config.packing": ""},
    "dpo": {"dataset": "prefs@main", "config.loss.type": "dpo", "config.loss.dpo_beta": "0.1"},
    "distill": {"dataset": "my-data@main", "config.distillation.teacher_model": "org/teacher-8B", "config.packing": ""},
    "grpo": {"config.rl_mode": "environment", "config.environment_id": "builtin/arith@main", "config.rollout_engine": ""},
}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def new_body(name: str, method: str, **fields: str) -> dict[str, str]:
    body = {"name": name, "method": method, **BASE, **METHOD_POSTS[method], "config.use_liger": "", "config.gradient_checkpointing": ""}
    body.update({k.replace("__", "."): v for k, v in fields.items()})
    return body


def post_new(client: Client, name: str, method: str, **fields: str):
    return client.post("/training/new/", new_body(name, method, **fields))


def select_of(html: str, name: str) -> str:
    return html.split(f'name="{name}"')[1].split("</select>")[0]


def selected(html: str, name: str) -> str:
    found = re.search(r'<option value="([^"]*)" selected>', select_of(html, name))
    assert found, select_of(html, name)
    return found[1]


def performance_card(html: str) -> str:
    return html.split('id="card-performance"')[1].split("</fieldset>")[0]


@pytest.mark.parametrize("method", ["sft", "dpo", "distill", "grpo"])
def test_the_performance_fieldset_is_collapsed_with_each_methods_levers(project, users, method):
    html = client_for(users["owner"]).get(f"/training/new/?method={method}").content.decode()
    card = performance_card(html)
    assert "<details>" in card and "<strong>Performance (GPU)</strong></summary>" in card  # collapsed: no `open`
    assert "only matter on GPUs" in card
    names = re.findall(r'<select id="[^"]+" name="([^"]+)"', card)
    expected = ["config.use_liger", "config.gradient_checkpointing"]
    expected += {"sft": ["config.packing"], "distill": ["config.packing"], "grpo": ["config.rollout_engine"]}.get(method, [])
    assert names == expected
    for name in names:
        assert selected(html, name) == ""  # Default
    assert re.findall(r'<option value="([^"]*)"', select_of(html, "config.gradient_checkpointing")) == ["", "true", "false"]
    assert "Default (auto)" in select_of(html, "config.gradient_checkpointing")


def test_the_method_picker_brings_the_methods_own_lever(project, users):
    client = client_for(users["owner"])
    html = client.get("/training/new/method", {"method": "grpo", "config.gradient_checkpointing": "false", "config.packing": "false"},
                      HTTP_HX_REQUEST="true").content.decode()
    card = performance_card(html)
    assert 'name="config.rollout_engine"' in card and 'name="config.packing"' not in card
    assert selected(html, "config.gradient_checkpointing") == "false" and "<details open>" in card  # kept, and shown


@pytest.mark.parametrize("method", ["sft", "dpo", "distill", "grpo"])
def test_a_form_left_at_the_defaults_writes_none_of_the_keys(project, users, method):
    client = client_for(users["owner"])
    assert post_new(client, f"{method} defaults", method).status_code == 302
    run = project.runs.get(name=f"{method} defaults")
    assert not PERF_KEYS & set(run.config)
    # The same run created without the new fields at all (as before they existed) has the same config.
    body = {"name": "plain", "method": method, **BASE, **{k: v for k, v in METHOD_POSTS[method].items() if k not in ("config.packing", "config.rollout_engine")}}
    assert client.post("/training/new/", body).status_code == 302
    assert project.runs.get(name="plain").config == run.config


def test_on_off_and_static_write_the_keys(project, users):
    client = client_for(users["owner"])
    response = post_new(client, "sft levers", "sft", config__gradient_checkpointing="false", config__packing="false", config__use_liger="false")
    assert response.status_code == 302, response.content.decode()[:2000]
    config = project.runs.get(name="sft levers").config
    assert (config["gradient_checkpointing"], config["packing"], config["use_liger"]) == (False, False, False)

    assert post_new(client, "grpo levers", "grpo", config__rollout_engine="static", config__gradient_checkpointing="true").status_code == 302
    config = project.runs.get(name="grpo levers").config
    assert config["rollout_engine"] == "static" and config["gradient_checkpointing"] is True
    assert "packing" not in config and "use_liger" not in config

    assert post_new(client, "distill packed", "distill", config__packing="true").status_code == 302
    assert project.runs.get(name="distill packed").config["packing"] is True


def test_default_leaves_the_yaml_box_alone_and_a_field_that_disagrees_with_it_is_refused(project, users):
    client = client_for(users["owner"])
    assert post_new(client, "yaml off", "sft", config_text="lora_rank: 8\npacking: false\n").status_code == 302
    assert project.runs.get(name="yaml off").config["packing"] is False  # Default: the box's value stands
    assert post_new(client, "both off", "sft", config_text="lora_rank: 8\npacking: false\n", config__packing="false").status_code == 302
    assert project.runs.get(name="both off").config["packing"] is False
    # On in the field, false in the box: neither silently wins (tests/ui/test_config_box_conflicts.py).
    html = refused_form_page(client, "/training/new/", new_body("field on", "sft", config_text="lora_rank: 8\npacking: false\n", config__packing="true"),
                             "/training/new/")
    assert "packing is false here but true in the form&#x27;s field config.packing" in html
    assert not project.runs.filter(name="field on").exists()


def test_a_forged_tristate_value_is_a_finding_at_the_field(project, users):
    html = refused_form_page(client_for(users["owner"]), "/training/new/", new_body("forged", "sft", config__packing="maybe"), "/training/new/")
    assert 'id="f-config-packing-errors"' in html and "choose Default, On or Off" in html
    assert "<details open>" in performance_card(html)
    assert not project.runs.filter(name="forged").exists()


def test_editing_shows_what_the_run_has_and_round_trips(project, users):
    run = services.create_run(project, users["owner"], name="levers", method="sft", base_model="org/base", dataset="org/data",
                              config={"lora_rank": 8, "gradient_checkpointing": False, "packing": False, "save_steps": 5},
                              compute={"backend": "local", "accelerators": "CPU"})
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert selected(html, "config.gradient_checkpointing") == "false" and selected(html, "config.packing") == "false"
    assert selected(html, "config.use_liger") == ""
    assert "<details open>" in performance_card(html)
    box = html.split('name="config_text"')[1].split("</textarea>")[0]
    assert "save_steps: 5" in box and "packing" not in box and "gradient_checkpointing" not in box
    form = {"name": "levers", "method": "sft", "base_model": "org/base", "dataset": "org/data", "compute.backend": "local",
            "compute.accelerators": "CPU", "config_text": "lora_rank: 8\nsave_steps: 5\n", "config.use_liger": "",
            "config.gradient_checkpointing": "false", "config.packing": "false"}
    before = dict(run.config)
    assert client.post(f"/training/runs/{run.pk}/edit/", form).status_code == 302
    run.refresh_from_db()
    assert run.config == before  # saved unchanged
    # Back to Default: the keys go away (the engine's defaults apply again).
    assert client.post(f"/training/runs/{run.pk}/edit/", {**form, "config.gradient_checkpointing": "", "config.packing": ""}).status_code == 302
    run.refresh_from_db()
    assert not PERF_KEYS & set(run.config) and run.config["save_steps"] == 5


def test_editing_keeps_values_a_select_cannot_show_in_the_yaml_box(project, users):
    run = services.create_run(project, users["owner"], name="explicit auto", method="grpo", base_model="org/base", dataset=None,
                              config={"environment_id": "builtin/arith@main", "rollout_engine": "auto", "gradient_checkpointing": "auto",
                                      "precision": "fp32"},
                              compute={"backend": "local", "accelerators": "CPU"})
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert selected(html, "config.rollout_engine") == "" and selected(html, "config.gradient_checkpointing") == ""
    box = html.split('name="config_text"')[1].split("</textarea>")[0]
    assert "rollout_engine: auto" in box and "gradient_checkpointing: auto" in box and "precision: fp32" in box


def test_liger_on_the_cpu_is_starts_422_next_to_the_field(project, users):
    client = client_for(users["owner"])
    # Create takes it (the CPU refusal is START's, as for fp8 on the CPU); START and the edit page show why.
    assert post_new(client, "liger cpu", "sft", config__use_liger="true").status_code == 302
    run = project.runs.get(name="liger cpu")
    assert run.config["use_liger"] is True
    response = client.post(f"/training/runs/{run.pk}/start", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'data-field="config.use_liger"' in response.content.decode()
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.start_requested_at is None
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    errors = html.split('id="f-config-use-liger-errors"')[1].split("</ul>")[0]
    assert "liger kernels need a GPU and this run asks for the CPU" in errors
    assert "<details open>" in performance_card(html) and 'id="f-config-use-liger-errors"' in performance_card(html)


def test_liger_on_two_gpus_is_refused_at_create_next_to_the_field(project, users):
    html = refused_form_page(client_for(users["owner"]), "/training/new/",
                             new_body("liger x2", "sft", config__use_liger="true", compute__accelerators="H100:2"), "/training/new/")
    card = performance_card(html)
    assert "<details open>" in card and "liger kernels are single-GPU" in card.split('id="f-config-use-liger-errors"')[1]
    assert not project.runs.filter(name="liger x2").exists()


def fit_status(client: Client, **values: str) -> str:
    form = {"method": "sft", "name": "x", "compute.backend": "modal", "base_model": "Qwen/Qwen2.5-7B", "compute.accelerators": "L4",
            "config_text": "lora_rank: 16\n"}
    html = client.get("/training/new/fit", {**form, **{k.replace("__", "."): v for k, v in values.items()}}, HTTP_HX_REQUEST="true").content.decode()
    return html


def test_gradient_checkpointing_moves_the_live_estimate(project, users):
    client = client_for(users["owner"])
    # A 7B LoRA on an L4 fits only with checkpointing: auto turns it on, Off leaves it too big.
    assert 'data-fit-status="tight"' in fit_status(client) and "(activation checkpointing on)" in fit_status(client)
    off = fit_status(client, config__gradient_checkpointing="false")
    assert 'data-fit-status="too_big"' in off and "turn activation checkpointing back on" in off
    # A 0.5B fits without it (auto: off); On forces it.
    small = {"base_model": "Qwen/Qwen2.5-0.5B-Instruct"}
    assert "(activation checkpointing off)" in fit_status(client, **small)
    assert "(activation checkpointing on)" in fit_status(client, **small, config__gradient_checkpointing="true")
