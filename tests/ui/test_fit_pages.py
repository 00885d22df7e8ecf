"""Issue 8: the GPU memory estimate on the pages (Django's test client, no browser): NEW RUN's live
partial beside the compute fields, and the one-line estimate in a queued run's Start area."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.test_fit import modal  # noqa: F401 - the fixture: a configured Modal connection
from training import services
from training.fit_report import form_fit_report
from training.forms import draft_of_values

pytestmark = pytest.mark.django_db

FORM = {"method": "sft", "name": "x", "compute.backend": "modal"}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def fit_part(client: Client, **values: str) -> str:
    response = client.get("/training/new/fit", {**FORM, **values}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="fit-estimate"'), html[:200]  # the partial alone, for hx-swap="outerHTML"
    return html


def status_of(html: str) -> str | None:
    found = re.search(r'data-testid="fit-estimate" data-fit-status="([a-z_]+)"', html)
    return found[1] if found else None


def test_new_run_page_wires_the_estimate_to_the_form(project, users):
    html = client_for(users["owner"]).get("/training/new/").content.decode()
    wrap = html.split('hx-target="#fit-estimate"')[0].rsplit("<div", 1)[1]
    assert 'hx-get="/training/new/fit"' in wrap and 'hx-trigger="change from:#run-form"' in wrap and 'hx-include="#run-form"' in wrap
    # The form opens on the CPU: no figure, and a sentence saying why.
    assert status_of(html) == "unknown" and "this run asks for the CPU" in html


def test_an_l4_choice_shows_the_estimate_and_its_breakdown(project, users):
    html = fit_part(client_for(users["owner"]), base_model="Qwen/Qwen2.5-0.5B-Instruct", **{"compute.accelerators": "L4", "config_text": "lora_rank: 16\n"})
    assert status_of(html) == "fits"
    line = re.search(r"GPU memory: <strong>(about [\d.]+ GiB of 24 GiB on one L4 \(activation checkpointing off\))</strong>", html)
    assert line, html
    details = html.split("<details")[1].split("</details>")[0]
    assert "Weights" in details and "Optimizer" in details and "of 24 GiB" in details
    assert 'role="alert"' not in html


def test_a_tight_config_is_a_visible_warning(project, users):
    # LoRA of a 7B on an L4 fits only with activation checkpointing.
    html = fit_part(client_for(users["owner"]), base_model="Qwen/Qwen2.5-7B", **{"compute.accelerators": "L4", "config_text": "lora_rank: 16\n"})
    assert status_of(html) == "tight"
    warning = html.split('data-fit-status="tight"')[0].rsplit("<p", 1)[1]
    assert 'class="alert alert-warn"' in warning and 'role="alert"' in warning
    assert "(activation checkpointing on)" in html and "fits only because activation checkpointing is on" in html


def test_a_run_too_big_for_the_card_shows_the_lever(project, users):
    html = fit_part(client_for(users["owner"]), base_model="Qwen/Qwen2.5-7B-Instruct", **{"compute.accelerators": "L4", "config_text": ""})
    assert status_of(html) == "too_big"
    assert "Too big for one L4" in html and "train a LoRA adapter (set lora_rank: 16)" in html and "START refuses this run" in html


def test_an_unknown_model_or_a_bad_value_gives_no_figure(project, users):
    client = client_for(users["owner"])
    html = fit_part(client, base_model="org/base", **{"compute.accelerators": "L4"})
    assert status_of(html) == "unknown" and "no GPU memory estimate for this model" in html and "<details" not in html
    html = fit_part(client, base_model="Qwen/Qwen2.5-7B", **{"compute.accelerators": "L4", "config_text": "max_length: .inf\n"})
    assert status_of(html) == "unknown" and "config.max_length" in html


def test_form_fields_move_the_estimate(project, users):
    client = client_for(users["owner"])
    small = fit_part(client, base_model="Qwen/Qwen2.5-1.5B", **{"compute.accelerators": "L4", "config_text": "lora_rank: 16\n"})
    longer = fit_part(client, base_model="Qwen/Qwen2.5-1.5B", **{"compute.accelerators": "L4", "config_text": "lora_rank: 16\nmax_length: 4096\n",
                                                                  "config.per_device_train_batch_size": "2"})
    gib = [float(re.search(r"about ([\d.]+) GiB", html)[1]) for html in (small, longer)]
    assert gib[1] > gib[0]


def test_a_queued_gpu_run_shows_the_estimate_beside_start(project, users, modal):  # noqa: F811
    run = services.create_run(project, users["owner"], name="lora", method="sft", base_model="Qwen/Qwen2.5-7B", dataset="org/data",
                              config={"lora_rank": 16}, compute={"backend": "modal", "accelerators": "L4"})
    html = client_for(users["viewer"]).get(f"/training/runs/{run.pk}/").content.decode()
    status = html.split('<section id="run-status"')[1].split("</section>")[0]
    assert status_of(status) == "tight" and "on one L4 (activation checkpointing on)" in status


def test_a_too_big_run_says_so_once_and_leaves_the_lever_to_the_blockers(project, users, modal):  # noqa: F811
    run = services.create_run(project, users["owner"], name="full", method="sft", base_model="Qwen/Qwen2.5-7B", dataset="org/data",
                              config={}, compute={"backend": "modal", "accelerators": "L4"})
    status = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode().split('<section id="run-status"')[1].split("</section>")[0]
    assert status_of(status) == "too_big" and "too big for one L4" in status
    assert status.count("train a LoRA adapter") == 1 and 'data-field="config.lora_rank"' in status


def test_a_cpu_run_shows_no_estimate(project, users):
    run = services.create_run(project, users["owner"], name="cpu", method="sft", base_model="Qwen/Qwen2.5-7B", dataset="org/data",
                              config={}, compute={"backend": "local", "accelerators": "CPU"})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert 'data-testid="fit-estimate"' not in html


@pytest.mark.parametrize(("config_text", "says"), [
    ("lora_rank: [16\n", "this is not valid YAML or JSON (line 2, column 1): fix the syntax"),
    ("a: &x 16\nlora_rank: *x\n", "aliases (*x) are not allowed in a run's config: write the value out"),
])
def test_a_config_box_that_does_not_parse_gives_no_estimate_and_says_why(project, users, config_text, says):
    # It was estimated as if the box were empty: a full fine-tune, when the box asked for LoRA.
    html = fit_part(client_for(users["owner"]), base_model="Qwen/Qwen2.5-0.5B-Instruct", **{"compute.accelerators": "L4", "config_text": config_text})
    assert status_of(html) == "unknown", html
    assert f"GPU memory: no GPU memory estimate until the config box is fixed: {says}" in html.replace("&#x27;", "'"), html
    report = form_fit_report(*draft_of_values({**FORM, "base_model": "Qwen/Qwen2.5-0.5B-Instruct", "compute.accelerators": "L4", "config_text": config_text}))
    assert report.status == "unknown" and report.field == "config_text"
