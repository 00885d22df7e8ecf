"""Each chart's text alternative, "Show data": a table of every series' last step and value, lowest and
highest value, rendered by the server from the points the chart draws, on the run page's Overview (and
its live part) and on an experiment's compare chart. A chart with no points has none."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from training import services
from training.models import MetricPoint, TrainingRun

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def data_rows(html: str, chart_id: str) -> dict[str, list[str]]:
    """The "Show data" table of chart `chart_id`: its rows' cells by series."""
    found = re.search(rf'<details class="chart-data" id="{chart_id}-data">(.*?)</details>', html, re.S)
    assert found, f"no Show data for {chart_id}"
    assert "<summary>Show data" in found.group(1)
    rows = re.findall(r'<tr><th scope="row">(.*?)</th>(.*?)</tr>', found.group(1), re.S)
    return {label: re.findall(r"<td>(.*?)</td>", cells) for label, cells in rows}


def trained_run(project, user, name: str) -> TrainingRun:
    """A GRPO run with 50 steps of reward and reward_std (two series on one chart) and no KL points."""
    run = services.create_run(project, user, name=name, method="grpo", base_model="org/base", dataset=None,
                              config={"environment_id": "builtin/arith@main"})
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="reward", step=s, value=0.1 + s / 100) for s in range(1, 51)]
                                    + [MetricPoint(run=run, key="reward_std", step=s, value=0.5 if s == 7 else 0.25) for s in range(1, 51, 2)])
    return run


def test_each_run_chart_with_points_has_a_table_of_its_series_last_min_and_max(project, users):
    run = trained_run(project, users["owner"], "rewarded")
    client = client_for(users["owner"])
    for url in (f"/training/runs/{run.pk}/", f"/training/runs/{run.pk}/live"):
        html = client.get(url, HTTP_HX_REQUEST="true").content.decode()  # the live part is htmx's only
        # chart-0 is Reward: per series, its own last step (reward_std was logged on odd steps only)
        assert data_rows(html, "chart-0") == {"reward": ["50", "0.6", "0.11", "0.6"], "reward_std": ["49", "0.25", "0.25", "0.5"]}
        assert 'id="chart-1-data"' not in html  # KL: no points, no table (the chart says why)


def test_the_experiment_compare_chart_has_a_row_per_run(project, users):
    first = trained_run(project, users["owner"], "first")
    second = services.create_run(project, users["owner"], name="second", method="sft", base_model="org/base", dataset="org/d",
                                 experiment=first.experiment_id)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=value)
                                     for run, points in ((first, [(1, 2.5), (2, 1.25)]), (second, [(1, 3.0), (5, 0.000125), (9, 0.5)]))
                                     for s, value in points])
    html = client_for(users["owner"]).get(f"/experiments/{first.experiment_id}/").content.decode()
    assert data_rows(html, "compare-chart") == {f"#{second.pk} second": ["9", "0.5", "0.000125", "3"],
                                               f"#{first.pk} first": ["2", "1.25", "1.25", "2.5"]}
