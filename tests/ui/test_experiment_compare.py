"""The experiment page's comparison: by default the loss of the most recent runs that have loss points
(not queued runs with none), saying how many have none yet; any metric the compared runs report
(?metric=), the runs ticked (?runs=), a table of their last and best values and of the settings that
differ, refreshed while a compared run trains; and its value labels are drawn whole."""
from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from experiments.services import create_experiment
from training import services
from training.models import MetricPoint, TrainingRun

COMPARE_LIMIT = 12


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def run_in(project, users, experiment, name: str, losses: list[float] | None = None, config: dict | None = None, **series: list[float]):
    run = services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="my-data@main", experiment=experiment.pk,
                              config=config)
    for key, values in {"loss": losses or [], **series}.items():
        MetricPoint.objects.bulk_create([MetricPoint(run=run, key=key, step=s, value=v) for s, v in enumerate(values, start=1)])
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
    assert "loss by step — 3 runs with loss points compared" in html
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
    shown = [int(pk) for pk in re.findall(r'id="compare-run-(\d+)"', html)]  # the runs table's Compare boxes
    assert shown == order[:50] and "Runs 1–50 of 121" in html and '?metric=loss&amp;page=2" rel="next"' in html
    assert compared_labels(html) == [f"#{trained.pk} trained"]
    assert "120 runs have no loss points yet" in html  # counted over every run, not the page
    last = client.get(f"/experiments/{experiment.pk}/", {"page": "3"}).content.decode()
    assert [int(pk) for pk in re.findall(r'id="compare-run-(\d+)"', last)] == order[100:] and "Runs 101–121 of 121" in last


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
    expect(page.locator("#compare-chart")).to_have_attribute("data-drawn", "true")
    labels = page.evaluate("window.valueLabels")
    assert {label["text"] for label in labels} >= {"6.25", "6.00"}, labels
    for label in labels:
        assert 0 <= label["left"] < label["canvas"], label  # starts inside the canvas: every digit shows
    page.shot("compare-labels")


def chart_of(html: str) -> dict:
    """The chart the page draws (its json_script block, as studio.js reads it)."""
    block = re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html, re.S)
    assert block, html[:2000]
    return json.loads(block.group(1))[0]


def findings_of(html: str) -> list[str]:
    box = re.search(r'data-testid="compare-findings">(.*?)</div>', html, re.S)
    return [unescape(re.sub(r"<[^>]+>", "", item)).strip() for item in re.findall(r"<li>(.*?)</li>", box.group(1), re.S)] if box else []


def refused_page(users, experiment, query: dict) -> str:
    """The experiment page for a query it refuses part of: a 400 that still compares what it can."""
    response = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/", query)
    assert response.status_code == 400, response.status_code
    return response.content.decode()


def compare_table(html: str) -> list[list[str]]:
    """The compared runs' table, a list of rows of cell texts, its header first."""
    table = re.search(r'<table data-testid="compare-table">(.*?)</table>', html, re.S)
    assert table, html[:3000]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(1), re.S)
    return [[re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)] for row in rows]


@pytest.fixture
def sweep(project, users):
    """An experiment of three SFT runs: two that report a reward too (a custom metric here), one
    with loss alone; they differ in learning rate, the newest in LoRA rank too."""
    experiment = create_experiment(project, "sweep")
    plain = run_in(project, users, experiment, "plain", [2.0, 1.0, 1.5], config={"learning_rate": 1e-4, "per_device_train_batch_size": 8})
    low = run_in(project, users, experiment, "low lr", [2.0, 1.8, 1.7], config={"learning_rate": 1e-5, "per_device_train_batch_size": 8},
                 reward=[0.1, 0.4, 0.3], grad_norm=[3.0, 2.0, 1.0])
    high = run_in(project, users, experiment, "high lr", [2.0, 0.9, 0.8], config={"learning_rate": 1e-3, "per_device_train_batch_size": 8, "lora_rank": 8},
                  reward=[0.2, 0.6, 0.5])
    return experiment, {"plain": plain, "low": low, "high": high}


@pytest.mark.django_db
def test_a_chosen_metric_is_charted_for_the_newest_runs_that_report_it(project, users, sweep):
    experiment, runs = sweep
    client = client_for(users["owner"])
    default = client.get(f"/experiments/{experiment.pk}/").content.decode()
    metric_choice = re.search(r'<select id="compare-metric" name="metric">(.*?)</select>', default, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)"', metric_choice) == ["grad_norm", "loss", "reward"]  # every key of the compared runs
    assert 'value="loss" selected' in default and chart_of(default)["title"] == "loss by step"
    response = client.get(f"/experiments/{experiment.pk}/", {"metric": "reward"})
    assert response.status_code == 200
    html = response.content.decode()
    chart = chart_of(html)
    assert [s["label"] for s in chart["series"]] == [f"#{runs['high'].pk} high lr", f"#{runs['low'].pk} low lr"]  # plain has no reward
    assert chart["x"] == [1, 2, 3] and [s["values"] for s in chart["series"]] == [[0.2, 0.6, 0.5], [0.1, 0.4, 0.3]]
    assert "reward by step — 2 runs with reward points compared" in html and 'value="reward" selected' in html
    assert "1 run has no reward points yet" in html
    # Last and best (highest, for a reward) of each run, from every point.
    assert compare_table(html)[0][:4] == ["Run", "Status", "Last reward", "Best reward (highest)"]
    assert [row[2:4] for row in compare_table(html)[1:]] == [["0.5", "0.6"], ["0.3", "0.4"]]
    # A metric with no better end has no Best column.
    assert compare_table(client.get(f"/experiments/{experiment.pk}/", {"metric": "grad_norm"}).content.decode())[0][:3] == ["Run", "Status", "Last grad_norm"]


@pytest.mark.django_db
def test_an_unknown_metric_is_a_400_naming_the_field_and_its_choices_and_loss_is_shown(project, users, sweep):
    experiment, runs = sweep
    html = refused_page(users, experiment, {"metric": "rewrd"})
    assert findings_of(html) == ['metric: no run of this experiment reports "rewrd": choose one of grad_norm, loss, reward']
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{run.pk} {run.name}" for run in (runs["high"], runs["low"], runs["plain"])]
    assert 'value="loss" selected' in html


@pytest.mark.django_db
def test_ticked_runs_are_compared_with_only_the_settings_that_differ(project, users, sweep):
    experiment, runs = sweep
    client = client_for(users["owner"])
    # ?runs=1,2 (a shared link) and ?runs=1&runs=2 (the form's boxes) choose the same runs.
    for query in (f"runs={runs['plain'].pk},{runs['high'].pk}", f"runs={runs['plain'].pk}&runs={runs['high'].pk}"):
        response = client.get(f"/experiments/{experiment.pk}/?{query}")
        assert response.status_code == 200
        html = response.content.decode()
        assert [s["label"] for s in chart_of(html)["series"]] == [f"#{runs['high'].pk} high lr", f"#{runs['plain'].pk} plain"]
        assert "loss by step — 2 chosen runs compared" in html and "no loss points yet" not in html
        table = compare_table(html)
        # The batch size both use is left out; LoRA's alpha, stored beside the rank, is in.
        alpha = str(runs["high"].config["lora_alpha"])
        assert table == [["Run", "Status", "Last loss", "Best loss (lowest)", "learning_rate", "lora_alpha", "lora_rank"],
                         [f"high lr #{runs['high'].pk}", "queued", "0.8", "0.8", "0.001", alpha, "8"],
                         [f"plain #{runs['plain'].pk}", "queued", "1.5", "1.0", "0.0001", "—", "—"]]
        ticked = re.findall(r'<input type="checkbox" id="compare-run-(\d+)" name="runs" value="\d+" checked', html)
        assert sorted(map(int, ticked)) == sorted([runs["plain"].pk, runs["high"].pk])
    # The metric choice offers what the chosen runs report.
    html = client.get(f"/experiments/{experiment.pk}/", {"runs": f"{runs['plain'].pk},{runs['high'].pk}", "metric": "grad_norm"}).content.decode()
    assert findings_of(html) == ['metric: no chosen run reports "grad_norm": choose one of loss, reward']


@pytest.mark.django_db
def test_runs_sharing_every_setting_say_so(project, users):
    experiment = create_experiment(project, "repeat")
    same = [run_in(project, users, experiment, f"seed {i}", [1.0, 0.5], config={"learning_rate": 1e-4}) for i in range(2)]
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/", {"runs": ",".join(str(run.pk) for run in same)}).content.decode()
    assert "All compared runs share every setting." in html
    assert compare_table(html)[0] == ["Run", "Status", "Last loss", "Best loss (lowest)"]


@pytest.mark.django_db
def test_runs_of_a_dataset_branch_that_moved_between_their_starts_differ_in_its_commit(project, users):
    """Both runs name my-data@main; START pinned each to where main was then, and main moved between."""
    from datahub.commits import commit_files
    from datahub.refs import pin_refs
    from datahub.repos import create_repo

    data = create_repo(project, "my-data", "dataset")
    experiment = create_experiment(project, "data versions")
    runs = []
    for version in ("v1", "v2"):
        commit_files(data, "main", {"train.jsonl": f'{{"text": "{version}"}}\n'.encode()})
        run = run_in(project, users, experiment, f"on {version}", [1.0, 0.5], config={"learning_rate": 1e-4})
        TrainingRun.objects.filter(pk=run.pk).update(pinned=pin_refs(run), start_requested_at=timezone.now())  # as START does
        runs.append(TrainingRun.objects.get(pk=run.pk))
    unstarted = run_in(project, users, experiment, "waiting", [1.0], config={"learning_rate": 1e-4})
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/", {"runs": ",".join(str(run.pk) for run in [*runs, unstarted])}).content.decode()
    commits = [run.pinned["dataset"]["commit"][:12] for run in runs]
    assert "All compared runs share every setting." not in html
    assert compare_table(html) == [["Run", "Status", "Last loss", "Best loss (lowest)", "dataset commit"],
                                   [f"waiting #{unstarted.pk}", "queued", "1.0", "1.0", "nothing pinned: not started yet"],
                                   [f"on v2 #{runs[1].pk}", "queued", "0.5", "0.5", f"my-data@main → commit {commits[1]}"],
                                   [f"on v1 #{runs[0].pk}", "queued", "0.5", "0.5", f"my-data@main → commit {commits[0]}"]]


@pytest.mark.django_db
def test_chosen_ids_of_other_experiments_and_projects_are_reported_by_id_and_never_shown(project, other_project, users, sweep):
    experiment, runs = sweep
    elsewhere = run_in(project, users, create_experiment(project, "other"), "elsewhere xyzzy", [1.0])
    theirs = services.create_run(other_project, users["outsider"], name="globex plugh", method="sft", base_model="org/base", dataset="d@main")
    query = f"{runs['low'].pk},{elsewhere.pk},{theirs.pk},99999999999999999999"
    html = refused_page(users, experiment, {"runs": query})
    assert findings_of(html) == [f"runs: no run #{elsewhere.pk}, #{theirs.pk}, #99999999999999999999 in this experiment: "
                                 "left out (it may have been deleted, or be another experiment's)"]
    assert "xyzzy" not in html and "plugh" not in html
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{runs['low'].pk} low lr"]


@pytest.mark.django_db
def test_a_malformed_run_id_is_a_400_and_the_newest_runs_are_compared(project, users, sweep):
    experiment, runs = sweep
    html = refused_page(users, experiment, {"runs": "abc, ,²"})
    assert findings_of(html) == ['runs: "abc" is not a run id: give run ids separated by commas, e.g. runs=12,15',
                                 'runs: "²" is not a run id: give run ids separated by commas, e.g. runs=12,15']
    assert len(chart_of(html)["series"]) == 3
    # The form's own record of the runs it compared by default is read as strictly.
    html = refused_page(users, experiment, {"runs": str(runs["low"].pk), "shown": "low"})
    assert findings_of(html) == ['shown: "low" is not a run id: give run ids separated by commas, e.g. shown=12,15']
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{runs['low'].pk} low lr"]


@pytest.mark.django_db
def test_more_runs_chosen_than_the_limit_compares_the_newest_and_names_the_limit(project, users):
    experiment = create_experiment(project, "wide")
    runs = [run_in(project, users, experiment, f"r{i}", [1.0]) for i in range(COMPARE_LIMIT + 2)]
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/", {"runs": ",".join(str(run.pk) for run in runs)}).content.decode()
    assert findings_of(html) == [f"runs: at most {COMPARE_LIMIT} runs are compared at once: the oldest chosen (#{runs[1].pk}, #{runs[0].pk}) are left out; choose fewer"]
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{run.pk} {run.name}" for run in reversed(runs[2:])]


def form_sent(html: str) -> list[tuple[str, str]]:
    """What the comparison's form sends as it stands: its ticked boxes and hidden fields (metric left out)."""
    form = re.search(r'<form id="compare-form".*?</form>', html, re.S)
    assert form, html[:2000]
    inputs = re.findall(r'<input type="(checkbox|hidden)"[^>]* name="([^"]+)" value="([^"]*)"([^>]*)>', form.group(0))
    return [(name, value) for kind, name, value, rest in inputs if kind == "hidden" or " checked" in rest]


@pytest.fixture
def distill_sweep(project, users):
    """Four ended SFT runs with loss alone, then two DISTILL-like runs that report kd_loss too."""
    experiment = create_experiment(project, "distill sweep")
    plain = [run_in(project, users, experiment, f"sft {i}", [1.0, 0.5]) for i in range(4)]
    distilled = [run_in(project, users, experiment, f"distill {i}", [1.0, 0.6], kd_loss=[2.0, 1.0 - i / 10]) for i in range(2)]
    TrainingRun.objects.filter(pk__in=[run.pk for run in plain]).update(status="completed", finished_at=timezone.now() - timedelta(hours=1))
    return experiment, plain, distilled


@pytest.mark.django_db
def test_a_new_metric_with_the_default_ticks_untouched_compares_the_newest_runs_that_report_it(users, distill_sweep):
    experiment, plain, distilled = distill_sweep
    client, url = client_for(users["owner"]), f"/experiments/{experiment.pk}/"
    sent = form_sent(client.get(url).content.decode())
    # Every compared run's box is ticked, and the form says which runs it compared by default.
    assert sorted(int(value) for name, value in sent if name == "runs") == sorted(run.pk for run in plain + distilled)
    assert ("shown", ",".join(str(run.pk) for run in reversed(plain + distilled))) in sent
    response = client.get(url, [*sent, ("metric", "kd_loss")])  # the Metric changed, nothing ticked or unticked
    html = response.content.decode()
    assert response.status_code == 200 and "kd_loss by step — 2 runs with kd_loss points compared" in html
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{run.pk} {run.name}" for run in reversed(distilled)]
    assert "chosen" not in re.search(r"<figcaption>(.*?)</figcaption>", html).group(1) and "No kd_loss points" not in html
    # Still the default: a run that starts reporting kd_loss later joins it.
    MetricPoint.objects.create(run=plain[0], key="kd_loss", step=1, value=3.0)
    again = client.get(url, [*form_sent(html), ("metric", "kd_loss")]).content.decode()
    assert "kd_loss by step — 3 runs with kd_loss points compared" in again
    # A changed tick is a choice.
    unticked = [(name, value) for name, value in form_sent(again) if (name, value) != ("runs", str(distilled[0].pk))]
    chosen = client.get(url, [*unticked, ("metric", "kd_loss")]).content.decode()
    assert "kd_loss by step — 2 chosen runs compared" in chosen and 'name="shown"' not in chosen


@pytest.mark.django_db
def test_a_chosen_run_that_ended_without_points_of_the_metric_is_not_said_to_have_none_yet(project, users, distill_sweep):
    experiment, plain, distilled = distill_sweep
    waiting = run_in(project, users, experiment, "waiting", [1.0])
    html = client_for(users["owner"]).get(f"/experiments/{experiment.pk}/", {"metric": "kd_loss", "runs": f"{plain[0].pk},{distilled[0].pk},{waiting.pk}"}).content.decode()
    said = {box: unescape(re.sub(r"<[^>]+>", "", text)) for box, text in re.findall(r'data-testid="(chosen[a-z-]*)">(.*?)</p>', html, re.S)}
    assert said == {"chosen-without-points": f"No kd_loss points yet from #{waiting.pk} waiting.",
                    "chosen-ended-without-points": f"No kd_loss points from #{plain[0].pk} sft 0: it ended without reporting it."}


def metric_options(html: str) -> list[str]:
    """The keys the Metric choice offers."""
    return re.findall(r'<option value="([^"]+)"', re.search(r'<select id="compare-metric".*?</select>', html, re.S).group(0))


@pytest.fixture
def crowded(project, users):
    """An older DPO-like run with a metric of its own, then as many runs with loss alone as are
    compared: the default view leaves the DPO run out."""
    experiment = create_experiment(project, "wide")
    oldest = run_in(project, users, experiment, "dpo", [1.0], **{"rewards/margins": [0.1, 0.3]})
    runs = [run_in(project, users, experiment, f"r{i}", [1.0]) for i in range(COMPARE_LIMIT)]
    return experiment, oldest, runs


@pytest.mark.django_db
def test_a_run_ticked_beside_the_default_ones_is_kept_and_the_oldest_default_one_left_out(users, crowded):
    experiment, oldest, runs = crowded
    client, url = client_for(users["owner"]), f"/experiments/{experiment.pk}/"
    default = client.get(url).content.decode()
    response = client.get(url, [*form_sent(default), ("runs", str(oldest.pk)), ("metric", "loss")])  # its box ticked
    html = response.content.decode()
    assert response.status_code == 400 and findings_of(html) == [
        f"runs: at most {COMPARE_LIMIT} runs are compared at once: the oldest of those compared before (#{runs[0].pk}) are left out to make room for the runs ticked"]
    assert [s["label"] for s in chart_of(html)["series"]] == [f"#{run.pk} {run.name}" for run in [*reversed(runs[1:]), oldest]]
    assert ("runs", str(oldest.pk)) in form_sent(html) and ("runs", str(runs[0].pk)) not in form_sent(html)
    assert metric_options(html) == ["loss", "rewards/margins"]  # a choice offers its runs' keys: the ticked run's too


@pytest.mark.django_db
def test_by_default_the_metric_choice_offers_the_listed_runs_keys_and_picking_one_compares_those_that_report_it(users, crowded):
    experiment, oldest, runs = crowded
    client, url = client_for(users["owner"]), f"/experiments/{experiment.pk}/"
    default = client.get(url).content.decode()
    assert f"#{oldest.pk} dpo" not in compared_labels(default)  # not compared, but listed: its key is offered
    assert metric_options(default) == ["loss", "rewards/margins"]
    html = client.get(url, [*form_sent(default), ("metric", "rewards/margins")]).content.decode()
    assert compared_labels(html) == [f"#{oldest.pk} dpo"] and "rewards/margins by step — 1 run with rewards/margins points compared" in html
    # A choice offers its runs' keys alone: another would be refused.
    chosen = client.get(url, {"runs": ",".join(str(run.pk) for run in runs[:2])}).content.decode()
    assert metric_options(chosen) == ["loss"]


@pytest.mark.django_db
def test_the_comparison_polls_while_a_compared_run_trains_and_stops_once_all_ended(project, users, sweep):
    experiment, runs = sweep
    client = client_for(users["owner"])
    url = f"/experiments/{experiment.pk}/"
    query = {"runs": f"{runs['low'].pk},{runs['high'].pk}", "metric": "reward"}
    assert 'id="compare-live" hx-get' not in client.get(url, query).content.decode()  # nothing trains: no poll
    TrainingRun.objects.filter(pk=runs["low"].pk).update(status="running", attempt=1, last_heartbeat_at=timezone.now())
    html = client.get(url, query).content.decode()
    poll = re.search(r'id="compare-live" hx-get="([^"]+)" hx-trigger="every 5s"', html)
    assert poll, html
    poll_url = poll.group(1).replace("&amp;", "&")
    assert f"runs={runs['high'].pk}%2C{runs['low'].pk}" in poll_url and "metric=reward" in poll_url
    live = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "compare-live"}
    assert client.get(poll_url, **live).status_code == 204  # nothing changed: nothing to swap
    # A batch of points lands (ingest moves last_heartbeat_at): the chart and table come back.
    MetricPoint.objects.create(run=runs["low"], key="reward", step=4, value=0.9)
    TrainingRun.objects.filter(pk=runs["low"].pk).update(last_heartbeat_at=timezone.now() + timedelta(seconds=1))
    answer = client.get(poll_url, **live)
    assert answer.status_code == 200 and "<html" not in answer.content.decode()
    assert [row[2:4] for row in compare_table(answer.content.decode())[1:]] == [["0.5", "0.6"], ["0.9", "0.9"]]
    assert 'hx-trigger="every 5s"' in answer.content.decode()
    # Just ended, its engine may still report for a minute: the poll goes on.
    TrainingRun.objects.filter(pk=runs["low"].pk).update(status="completed", finished_at=timezone.now())
    settling = client.get(poll_url, **live).content.decode()
    assert "completed" in settling and 'hx-trigger="every 5s"' in settling
    poll_url = re.search(r'hx-get="([^"]+)"', settling).group(1).replace("&amp;", "&")
    # Once that window has closed too, with nothing else changed, the answer stops the poll.
    TrainingRun.objects.filter(pk=runs["low"].pk).update(finished_at=timezone.now() - timedelta(minutes=10))
    ended = client.get(poll_url, **live)
    assert ended.status_code == 200 and "hx-trigger" not in ended.content.decode()


@pytest.mark.django_db(transaction=True)
def test_unticking_a_run_and_picking_a_metric_redraws_the_chart_and_table(owner_page, project, users, sweep):
    page = owner_page
    experiment, runs = sweep
    page.goto(f"/experiments/{experiment.pk}/")
    chart, caption, table = page.locator("#compare-chart"), page.locator("#compare-live figcaption"), page.get_by_test_id("compare-table")
    expect(chart).to_have_attribute("data-drawn", "true")
    expect(caption).to_have_text("loss by step — 3 runs with loss points compared")
    page.get_by_label(f"Compare low lr #{runs['low'].pk}").uncheck()
    expect(caption).to_have_text("loss by step — 2 chosen runs compared")
    expect(page).to_have_url(re.compile(rf"runs={runs['high'].pk}&runs={runs['plain'].pk}"))
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("thead th")).to_have_text(["Run", "Status", "Last loss", "Best loss (lowest)", "learning_rate", "lora_alpha", "lora_rank"])
    page.get_by_label("Metric").select_option("reward")
    expect(caption).to_have_text("reward by step — 2 chosen runs compared")
    expect(page).to_have_url(re.compile(r"metric=reward"))
    expect(table.locator("tbody tr").first).to_contain_text("0.5")  # high lr's last reward
    expect(chart).to_have_attribute("data-drawn", "true")  # the swapped-in chart is drawn
    drawn = json.loads(page.locator("#chart-data").text_content())[0]
    assert [s["label"] for s in drawn["series"]] == [f"#{runs['high'].pk} high lr", f"#{runs['plain'].pk} plain"]
    assert drawn["series"][0]["values"] == [0.2, 0.6, 0.5] and drawn["series"][1]["values"] == [None, None, None]
    expect(page.locator(".u-legend")).to_contain_text(f"#{runs['high'].pk} high lr")
    expect(page.get_by_test_id("chosen-without-points")).to_have_text(f"No reward points yet from #{runs['plain'].pk} plain.")
    page.shot("compare-two-runs-reward")
    # The address shows the same comparison to whoever opens it.
    page.reload()
    expect(caption).to_have_text("reward by step — 2 chosen runs compared")
    expect(page.get_by_label(f"Compare low lr #{runs['low'].pk}")).not_to_be_checked()


@pytest.mark.django_db(transaction=True)
def test_picking_a_metric_in_the_default_view_keeps_comparing_the_newest_runs_that_report_it(owner_page, project, users, sweep):
    page = owner_page
    experiment, runs = sweep
    page.goto(f"/experiments/{experiment.pk}/")
    caption = page.locator("#compare-live figcaption")
    expect(caption).to_have_text("loss by step — 3 runs with loss points compared")
    page.get_by_label("Metric").select_option("reward")
    expect(caption).to_have_text("reward by step — 2 runs with reward points compared")
    expect(page.get_by_test_id("compare-table").locator("tbody tr")).to_have_count(2)
    expect(page.get_by_label(f"Compare plain #{runs['plain'].pk}")).not_to_be_checked()  # the new default set's ticks
    page.get_by_label(f"Compare plain #{runs['plain'].pk}").check()
    expect(caption).to_have_text("reward by step — 3 chosen runs compared")

