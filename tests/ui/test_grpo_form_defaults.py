"""NEW RUN's GRPO defaults on the demo model: a run made from the untouched form can START. The
environment is a value, not a placeholder, and the default max_response_length (2048, for real models)
is fitted to a base model that attends over fewer positions (the tiny demo model's 512)."""
from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path

import pytest

from tests.ui.test_new_run_like_this import posted_form
from tests.ui.test_pages import client_for
from training import services
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


def response_length(html: str) -> str:
    return re.search(r'name="config.max_response_length"[^>]*value="([^"]*)"', html).group(1)


def sent_values(html: str) -> dict[str, str]:
    return json.loads(unescape(re.search(r'id="grpo-numbers"[^>]* data-sent-values="([^"]*)"', html).group(1)))


def test_the_grpo_form_fills_the_environment_and_fits_the_rollout_length_to_the_demo_model(project, users, tiny_models):
    # QA: Environment showed builtin/arith@main only as a placeholder (so it was blank), and 2048 was refused on the demo.
    client = client_for(users["owner"])
    page = client.get("/training/new/", {"method": "grpo"}).content.decode()
    assert re.search(r'name="config.environment_id"[^>]*value="builtin/arith@main"', page)
    assert response_length(page) == "2048"  # no base model yet: the default for real models
    picked = {**posted_form(page), "name": "grpo on the demo", "base_model": tiny_models["student"], "config.max_steps": "2"}

    # The method picked with the demo model already typed: the card comes with a length that fits.
    card = client.get("/training/new/method", picked, HTTP_HX_REQUEST="true").content.decode()
    assert response_length(card) == "256" and "attends over 512 positions, too few for the default 2048" in card
    # The demo model typed after the method: the fit estimate's request swaps the numbers in out of band.
    fit = client.get("/training/new/fit", picked, HTTP_HX_REQUEST="true").content.decode()
    assert '<div id="grpo-numbers" class="grid-3" hx-swap-oob="true"' in fit and response_length(fit) == "256"
    # With what its request sent: the page swaps them in only while its fields still say that (studio.js).
    assert sent_values(fit) == {"config.rollouts_per_prompt": "8", "config.kl_coef": "0.0", "config.max_response_length": "2048"}
    # A length the user chose stays, and a model with more positions (or one the Studio cannot read) keeps 2048.
    for changed in ({"config.max_response_length": "300"}, {"base_model": "org/unknown-model"}, {"base_model": "Qwen/Qwen2.5-0.5B-Instruct"}):
        fit = client.get("/training/new/fit", {**picked, **changed}, HTTP_HX_REQUEST="true").content.decode()
        assert 'id="grpo-numbers"' not in fit, changed

    # Created from what the form shows, the run passes START's checks of the environment and the lengths.
    response = client.post("/training/new/", {**picked, **posted_form(card)})
    assert response.status_code == 302, response.content.decode()[:3000]
    run = TrainingRun.objects.get(project=project, name="grpo on the demo")
    assert run.config["environment_id"] == "builtin/arith@main" and run.config["max_response_length"] == 256
    assert services.start_blockers(run) == []


def long_context_model(student: str, tmp_path: Path) -> str:
    """The demo student with 4096 positions: a base model the default 2048 fits."""
    model = Path(shutil.copytree(student, tmp_path / "long-student"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return str(model)


def fitted_length(html: str) -> str | None:
    found = re.search(r'name="fitted_response_length" value="([^"]*)"', html)
    return found.group(1) if found else None


def test_a_rollout_length_fitted_to_a_small_model_goes_back_to_the_default_for_a_bigger_one(project, users, tiny_models, tmp_path):
    # QA: the demo model's 256 stayed after a model with 4096 positions was chosen instead.
    client = client_for(users["owner"])
    form = {**posted_form(client.get("/training/new/", {"method": "grpo"}).content.decode()), "base_model": tiny_models["student"]}
    fit = client.get("/training/new/fit", form, HTTP_HX_REQUEST="true").content.decode()
    assert response_length(fit) == "256" and fitted_length(fit) == "256"
    fitted = {**form, **posted_form(fit)}  # the numbers as the out-of-band swap left them
    bigger = client.get("/training/new/fit", {**fitted, "base_model": long_context_model(tiny_models["student"], tmp_path)}, HTTP_HX_REQUEST="true").content.decode()
    assert '<div id="grpo-numbers" class="grid-3" hx-swap-oob="true"' in bigger
    assert response_length(bigger) == "2048" and fitted_length(bigger) is None and "attends over" not in bigger
    # Back to the demo model, it is fitted again; a length the user typed over the fitted one stays.
    again = client.get("/training/new/fit", {**fitted, **posted_form(bigger), "base_model": tiny_models["student"]}, HTTP_HX_REQUEST="true").content.decode()
    assert response_length(again) == "256"
    typed = {**fitted, "config.max_response_length": "200", "base_model": long_context_model(tiny_models["student"], tmp_path / "typed")}
    assert 'id="grpo-numbers"' not in client.get("/training/new/fit", typed, HTTP_HX_REQUEST="true").content.decode()
    # The method picked again with a bigger model: the card starts at the default, not the fitted length.
    card = client.get("/training/new/method", {**fitted, "base_model": typed["base_model"]}, HTTP_HX_REQUEST="true").content.decode()
    assert response_length(card) == "2048" and fitted_length(card) is None
