"""NEW RUN and Edit run (Django's test client, no browser): a key that the config box and one of the
form's fields both set must say the same in both. QA: `rollouts_per_prompt: 1` or `max_steps: 0`
added to the box while the fields held 8 and 3 made the run with the fields' values, without a word,
and the box's value was never even validated. Now the form is refused, naming the key, both values
and what to do, and nothing is stored or changed."""
from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import refused_form_page
from training import services
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

GRPO = {"method": "grpo", "experiment": "", "base_model": "org/base", "dataset": "", "config.max_steps": "3",
        "config.rl_mode": "environment", "config.environment_id": "builtin/arith@main", "config.rollouts_per_prompt": "8",
        "config.kl_coef": "0.0", "config.max_response_length": "256", "compute.backend": "local", "compute.accelerators": "CPU"}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def box_errors(html: str) -> str:
    assert 'id="f-config-text-errors"' in html, html[:3000]
    return html.split('id="f-config-text-errors"')[1].split("</ul>")[0]


@pytest.mark.parametrize(("config_text", "says"), [
    ("rollouts_per_prompt: 1\n", "rollouts_per_prompt is 1 here but 8 in the form&#x27;s field config.rollouts_per_prompt: "
                                 "remove rollouts_per_prompt from this box or change the field"),
    ("max_steps: 0\n", "max_steps is 0 here but 3 in the form&#x27;s field config.max_steps: remove max_steps from this box or change the field"),
])
def test_a_key_in_the_box_that_a_field_sets_otherwise_is_refused_naming_both(project, users, config_text, says):
    html = refused_form_page(client_for(users["owner"]), "/training/new/", {**GRPO, "name": "both", "config_text": config_text}, "/training/new/")
    assert says in box_errors(html)
    assert config_text.strip() in html.split('name="config_text"')[1].split("</textarea>")[0]  # what was typed is shown again
    assert not TrainingRun.objects.filter(name="both").exists()


def test_the_box_and_a_field_saying_the_same_make_the_run(project, users):
    response = client_for(users["owner"]).post("/training/new/", {**GRPO, "name": "agree", "config_text": "rollouts_per_prompt: 8\nmax_steps: 3.0\n"})
    assert response.status_code == 302, response.content.decode()[:2000]
    config = project.runs.get(name="agree").config
    assert config["rollouts_per_prompt"] == 8 and config["max_steps"] == 3


@pytest.mark.parametrize(("field", "value", "loss_in_box", "says"), [
    ("config.loss.dpo_beta", "0.1", "dpo_beta: 0.5", "loss.dpo_beta is 0.5 here but 0.1 in the form&#x27;s field config.loss.dpo_beta"),
    ("config.loss.reference_free", "on", "reference_free: false",
     "loss.reference_free is false here but true in the form&#x27;s field config.loss.reference_free"),
])
def test_a_nested_key_is_named_by_its_path(project, users, field, value, loss_in_box, says):
    form = {"name": "nested", "method": "dpo", "experiment": "", "base_model": "org/base", "dataset": "org/prefs", "config.loss.type": "dpo",
            field: value, "compute.backend": "local", "compute.accelerators": "CPU", "config_text": f"lora_rank: 8\nloss:\n  {loss_in_box}\n"}
    html = refused_form_page(client_for(users["owner"]), "/training/new/", form, "/training/new/")
    assert says in box_errors(html)
    assert not project.runs.filter(name="nested").exists()


def test_edit_run_refuses_a_conflict_and_keeps_the_run_as_it_was(project, users):
    run = services.create_run(project, users["owner"], name="kept", method="grpo", base_model="org/base", dataset=None,
                              config={"environment_id": "builtin/arith@main", "rollouts_per_prompt": 8, "max_steps": 3, "max_response_length": 256},
                              compute={"backend": "local", "accelerators": "CPU"})
    before = dict(run.config)
    url = f"/training/runs/{run.pk}/edit/"
    html = refused_form_page(client_for(users["owner"]), url, {**GRPO, "name": "kept", "config_text": "max_steps: 0\n"}, url)
    assert "max_steps is 0 here but 3 in the form&#x27;s field config.max_steps" in box_errors(html)
    run.refresh_from_db()
    assert run.config == before


def test_the_live_estimate_says_the_box_and_a_field_disagree(project, users):
    part = client_for(users["owner"]).get("/training/new/fit", {**GRPO, "name": "x", "config_text": "rollouts_per_prompt: 1\n"}, HTTP_HX_REQUEST="true")
    assert part.status_code == 200
    html = part.content.decode()
    assert "no GPU memory estimate until the config box is fixed" in html and "rollouts_per_prompt is 1 here but 8" in html
