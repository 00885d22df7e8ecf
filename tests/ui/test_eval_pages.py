"""Held-out evaluation on the pages (Django's test client): NEW RUN's Evaluation card writes
eval_split / eval_dataset / eval_steps for SFT and DPO only, editing shows them again, and the
Overview's loss chart draws eval_loss beside the training loss once the run reports it."""

from __future__ import annotations

import pytest

from tests.conftest import refused_form_page
from tests.ui.test_performance_pages import client_for, new_body, post_new
from training import services
from training.models import MetricPoint

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("method", "shown"), [("sft", True), ("dpo", True), ("grpo", False), ("distill", False)])
def test_the_evaluation_card_is_on_the_methods_that_evaluate(project, users, method, shown):
    html = client_for(users["owner"]).get(f"/training/new/?method={method}").content.decode()
    assert ('id="card-eval"' in html) is shown
    assert ('name="config.eval_split"' in html and 'name="config.eval_dataset"' in html and 'name="config.eval_steps"' in html) is shown


def test_the_card_writes_the_eval_keys_and_the_edit_page_shows_them(project, users):
    client = client_for(users["owner"])
    assert post_new(client, "held out", "sft", config__eval_split="0.1", config__eval_steps="25").status_code == 302
    run = project.runs.get(name="held out")
    assert (run.config["eval_split"], run.config["eval_steps"]) == (0.1, 25) and "eval_dataset" not in run.config
    html = client.get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert 'name="config.eval_split"' in html and 'value="0.1"' in html and "eval_split" not in html.split('name="config_text"')[1].split("</textarea>")[0]
    assert post_new(client, "held dpo", "dpo", config__eval_dataset="prefs@eval").status_code == 302
    assert project.runs.get(name="held dpo").config["eval_dataset"] == "prefs@eval"


def test_a_bad_eval_split_is_shown_next_to_its_field(project, users):
    html = refused_form_page(client_for(users["owner"]), "/training/new/", new_body("too much", "sft", config__eval_split="0.9"), "/training/new/")
    errors = html.split('id="f-config-eval-split-errors"')[1].split("</ul>")[0]
    assert "must be at most 0.5" in errors, errors


def test_a_list_of_eval_datasets_stays_in_the_config_box_when_edited(project, users):
    run = services.create_run(
        project, users["owner"], name="listed", method="sft", base_model="org/base", dataset="my-data@main", config={"eval_dataset": ["a@main", "b@main"]}
    )
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/edit/").content.decode()
    assert "a@main" in html.split('name="config_text"')[1].split("</textarea>")[0]


def test_the_loss_chart_draws_eval_loss_beside_the_training_loss(project, users):
    from training.views import run_charts  # after the URLconf: views and the API import each other

    run = services.create_run(project, users["owner"], name="charted", method="sft", base_model="org/base", dataset="my-data@main")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=s, key="loss", value=2.0 - s / 10) for s in range(1, 5)])
    assert [s["label"] for s in run_charts(run)[0]["series"]] == ["loss"]  # no eval: the chart as before
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=s, key="eval_loss", value=2.5 - s / 10) for s in (2, 4)])
    chart = run_charts(run)[0]
    assert chart["title"] == "Training loss" and [s["label"] for s in chart["series"]] == ["loss", "eval_loss"]
    assert chart["x"] == [1, 2, 3, 4] and chart["series"][1]["values"] == [None, 2.3, None, 2.1]


def test_the_datasets_tab_lists_the_held_out_rows_with_their_pin(project, users):
    # It listed the training entries only, though the eval dataset was pinned at START and read by the run.
    import re

    run = services.create_run(project, users["owner"], name="held", method="sft", base_model="org/base", dataset="my-data@main",
                              config={"eval_dataset": ["a@main", "b@main"]})
    run.pinned = {"config.eval_dataset[1]": {"repo": "acme/b", "ref": "b@main", "commit": "c0ffee" * 6 + "abcd"}}
    run.save(update_fields=["pinned"])
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/datasets/").content.decode()
    rows = [re.sub(r"<[^>]+>", "|", row) for row in re.findall(r'<tr data-testid="dataset-entry">(.*?)</tr>', html, re.S)]
    cells = [[c.strip() for c in row.split("|") if c.strip() and c.strip() != "(deleted)"] for row in rows]  # no such repos here
    assert [c[:2] for c in cells] == [["my-data@main", "Dataset"], ["a@main", "Evaluation (held out)"], ["b@main", "Evaluation (held out) 2"]], cells
    assert "c0ffee" * 6 + "abcd" in rows[2]
