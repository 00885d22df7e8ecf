"""The experiment page's loss comparison: it compares the most recent runs that have loss points (not
queued runs with none), says how many have none yet, and its value labels are drawn whole."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from playwright.sync_api import expect

from experiments.services import create_experiment
from training import services
from training.models import MetricPoint, TrainingRun

COMPARE_LIMIT = 12


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def run_in(project, users, experiment, name: str, losses: list[float] | None = None):
    run = services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="my-data@main", experiment=experiment.pk)
    if losses:
        MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=v) for s, v in enumerate(losses, start=1)])
    return run


def compared_labels(html: str) -> list[str]:
    """The series the chart draws, from its json_script block."""
    block = re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html, re.S)
    assert block, html[:2000]
    return re.findall(r'"label": "([^"]+)"', block.group(1))


@pytest.mark.django_db
def test_the_chart_compares_runs_with_points_and_counts_those_without(project, users):
    experiment = create_experiment(project, "lr sweep")
    trained = [run_in(project, users, experiment, f"trained {i}", [2.0, 1.5, 1.2]) for i in range(3)]
    waiting = [run_in(project, users, experiment, f"waiting {i}") for i in range(COMPARE_LIMIT)]  # newer, no points yet
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/").content.decode()
    # Newest first, as before, but only runs that have a curve to draw.
    assert compared_labels(html) == [f"#{run.pk} {run.name}" for run in reversed(trained)]
    assert "Loss by step — 3 runs with loss points compared" in html
    assert f"{len(waiting)} runs have no loss points yet (queued, or not past its first logged step), so they are not on the chart." in html
    assert all(run.name in html for run in waiting)  # the table still lists every run


@pytest.mark.django_db
def test_with_more_runs_with_points_than_slots_the_newest_are_compared(project, users):
    experiment = create_experiment(project, "many")
    runs = [run_in(project, users, experiment, f"trained {i}", [1.0, 0.5]) for i in range(COMPARE_LIMIT + 2)]
    run_in(project, users, experiment, "waiting")
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/").content.decode()
    assert compared_labels(html) == [f"#{run.pk} {run.name}" for run in reversed(runs[2:])]
    assert f"the {COMPARE_LIMIT} most recent of {COMPARE_LIMIT + 2} runs with loss points compared" in html
    assert "1 run has no loss points yet (queued, or not past its first logged step), so it is not on the chart." in html


@pytest.mark.django_db
def test_the_runs_table_shows_a_page_of_fifty_and_the_chart_counts_every_run(project, users):
    # 650 runs made a 184 KB page listing each: the table pages as the runs list does.
    experiment = create_experiment(project, "big sweep")
    TrainingRun.objects.bulk_create([TrainingRun(project=project, experiment=experiment, created_by=users["owner"], name=f"sweep {i}", method="sft",
                                                 base_model="org/base", dataset="my-data@main", config={}, compute={"backend": "local"}) for i in range(120)])
    trained = run_in(project, users, experiment, "trained", [1.0, 0.5])
    order = list(TrainingRun.objects.filter(experiment=experiment).order_by("-created_at", "-id").values_list("pk", flat=True))
    client = client_for(users["owner"])
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    shown = [int(pk) for pk in re.findall(r'<span class="muted">#(\d+)</span>', html)]
    assert shown == order[:50] and "Runs 1–50 of 121" in html and '?page=2" rel="next"' in html
    assert compared_labels(html) == [f"#{trained.pk} trained"]
    assert "120 runs have no loss points yet" in html  # counted over every run, not the page
    last = client.get(f"/experiments/{experiment.pk}/", {"page": "3"}).content.decode()
    assert [int(pk) for pk in re.findall(r'<span class="muted">#(\d+)</span>', last)] == order[100:] and "Runs 101–121 of 121" in last


# uPlot draws its tick labels on the canvas: record the value axis' ones (right-aligned against the
# ticks) with where they start, in the canvas' own pixels.
RECORD_VALUE_LABELS = """(() => {
  window.valueLabels = [];
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, ...rest) {
    if (this.textAlign === 'right' && /\\d/.test(String(text))) {
      window.valueLabels.push({text: String(text), left: x - this.measureText(String(text)).width, canvas: this.canvas.width});
    }
    return fill.call(this, text, x, ...rest);
  };
})()"""


@pytest.mark.django_db(transaction=True)
def test_value_labels_are_drawn_whole_inside_the_chart(owner_page, project, users):
    """Losses from 6.25 to 5.5: uPlot's first layout cycle had labels "5.5" … "6.0", the next "5.50" …
    "6.25", and the axis kept the first cycle's width: "6.25" started left of the canvas, read "5.25"."""
    page = owner_page
    page.add_init_script(RECORD_VALUE_LABELS)
    experiment = create_experiment(project, "clipped")
    run_in(project, users, experiment, "falling", [6.25 - 0.75 * (s / 38) for s in range(39)])
    page.goto(f"/experiments/{experiment.pk}/")
    expect(page.locator("#compare-loss")).to_have_attribute("data-drawn", "true")
    labels = page.evaluate("window.valueLabels")
    assert {label["text"] for label in labels} >= {"6.25", "6.00"}, labels
    for label in labels:
        assert 0 <= label["left"] < label["canvas"], label  # starts inside the canvas: every digit shows
    page.shot("compare-labels")
