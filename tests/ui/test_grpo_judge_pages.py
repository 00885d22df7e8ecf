"""GRPO RULER's judge on the run page: START's refusal of a colocated judge says what to choose instead,
and the Configuration tab shows only what the chosen judge mode uses."""
from __future__ import annotations

from html import escape

import pytest
from django.test import Client

from training import services
from training.validation import local_image_has

pytestmark = pytest.mark.django_db

COLOCATED_HELP = ('a colocated judge (vLLM) is not available in this image (no vllm package): choose External in the Judge select '
                  '(config.judge.mode "external") and give its endpoint and API key secret')


def ruler_run(project, users, judge: dict):
    return services.create_run(project, users["owner"], name="judged", method="grpo", base_model="org/base", dataset=None,
                               config={"rl_mode": "ruler", "ruler_task_args": {"dataset": "org/prompts", "system_prompt": "Be kind"},
                                       "judge": judge, "judge_blocks": 1})


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.skipif(local_image_has("vllm"), reason="this image has vLLM: a colocated judge can run here")
def test_a_colocated_judge_is_refused_saying_to_choose_external(project, users, api):
    # Typed as external first, then switched to colocated: the endpoint and key stay in the config.
    run = ruler_run(project, users, {"mode": "colocated", "endpoint": "not a url", "api_key_secret": "nosuchsecret"})
    refused = api.post(f"/api/training-runs/{run.pk}/start")
    assert refused.status_code == 422
    assert {"field": "config.judge.mode", "message": COLOCATED_HELP} in [{"field": e["field"], "message": e["message"]} for e in refused.json()["errors"]]
    run.refresh_from_db()
    assert run.start_requested_at is None

    client = client_for(users["owner"])
    overview = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert escape(COLOCATED_HELP) in overview and "turn it off" not in overview  # beside START
    config_tab = client.get(f"/training/runs/{run.pk}/configuration/").content.decode()
    judge_row = config_tab.split('data-testid="judge">', 1)[1].split("</tr>", 1)[0]
    assert judge_row.startswith("colocated (vLLM on the run's judge blocks)")
    assert escape(COLOCATED_HELP) in judge_row  # the finding stands next to the setting it names
    assert "not a url" not in judge_row and "nosuchsecret" not in judge_row  # an external judge's settings do not apply


def test_an_external_judge_shows_its_endpoint_model_and_key(project, users):
    run = ruler_run(project, users, {"mode": "external", "endpoint": "https://judge.example.com/v1", "model": "judge-7b", "api_key_secret": "judge-key"})
    config_tab = client_for(users["owner"]).get(f"/training/runs/{run.pk}/configuration/").content.decode()
    judge_row = config_tab.split('data-testid="judge">', 1)[1].split("</tr>", 1)[0]
    assert judge_row.startswith("external · endpoint https://judge.example.com/v1 · model judge-7b · key: secret judge-key")
