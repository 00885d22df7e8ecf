"""The run page follows its run when the change comes from elsewhere: a START from another tab, a
teammate or the API while the page shows a run that is not live, and what an engine still reports in
the minute after a STOP. Client tests for the polls' answers; one browser test for the two tabs."""
from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from training import services
from training import status as status_service
from training.models import Status, TrainingRun

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ended_run(project, users, end: str, ago: timedelta, name: str = "ended") -> TrainingRun:
    """A run that trained to 70 % and ended `ago` (an HF dataset id: START has nothing to look up)."""
    run = services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/sft-data",
                              config={"max_steps": 100, "save_steps": 10})
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1, progress={"step": 70, "max_steps": 100})
    status_service.transition(run.pk, end)
    TrainingRun.objects.filter(pk=run.pk).update(finished_at=timezone.now() - ago)
    run.refresh_from_db()
    return run


def status_poll(html: str, run: TrainingRun) -> tuple[str, str] | None:
    """(trigger, seen) of the #run-status poll in `html`, or None when the area does not poll."""
    section = re.search(r'<section id="run-status"[^>]*>', html)
    assert section, html[:2000]
    get = re.search(rf'hx-get="/training/runs/{run.pk}/status\?seen=([^"]+)" hx-trigger="([^"]+)"', section.group(0))
    return (get.group(2), get.group(1)) if get else None


def test_a_cancelled_runs_page_polls_slowly_and_swaps_in_a_start_made_elsewhere(project, users):
    run = ended_run(project, users, Status.CANCELLED, timedelta(minutes=5))
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert "Start again" in html and "70%" in html
    poll = status_poll(html, run)
    assert poll is not None, "a cancelled run's page never looked again: a START from elsewhere did not show"
    trigger, seen = poll
    assert trigger == "every 15s"

    # Nothing changed: an empty 204, which htmx does not swap (cheap: no rendering, no START check).
    unchanged = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert unchanged.status_code == 204 and unchanged.content == b""

    services.start_run(run)  # another tab, a teammate or the API
    changed = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert changed.status_code == 200 and changed["HX-Trigger"] == "run-changed"  # the Overview reloads too
    fragment = changed.content.decode()
    assert 'data-testid="run-status">queued<' in fragment and "starting…" in fragment and 'id="stop-btn"' in fragment
    assert "Start again" not in fragment and "70%" not in fragment
    assert status_poll(fragment, run)[0] == "every 2s"


def test_a_queued_runs_page_notices_a_start_made_elsewhere(project, users):
    run = services.create_run(project, users["owner"], name="not started", method="sft", base_model="org/base", dataset="org/sft-data")
    client = client_for(users["owner"])
    trigger, seen = status_poll(client.get(f"/training/runs/{run.pk}/").content.decode(), run)
    assert trigger == "every 15s"
    services.start_run(run)
    changed = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert changed.status_code == 200 and 'id="stop-btn"' in changed.content.decode()


@pytest.mark.parametrize("patch", [{"name": "renamed by a teammate"}, {"config": {"max_steps": 50}}, {"base_model": "org/other-base"},
                                   {"dataset": "org/other-data"}, {"compute": {"backend": "dstack", "accelerators": "H100:1"}}])
def test_a_teammates_edit_of_a_failed_run_wakes_its_slow_poll_and_reloads_the_page(project, users, api_as, patch):
    run = ended_run(project, users, Status.FAILED, timedelta(minutes=5))
    client = client_for(users["owner"])
    trigger, seen = status_poll(client.get(f"/training/runs/{run.pk}/").content.decode(), run)
    assert trigger == "every 15s"
    assert client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX).status_code == 204

    assert api_as("member").patch(f"/api/training-runs/{run.pk}", patch).status_code == 200
    changed = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert changed.status_code == 200 and changed["HX-Trigger"] == "run-changed" and changed["HX-Refresh"] == "true"
    fresh = status_poll(client.get(f"/training/runs/{run.pk}/").content.decode(), run)[1]
    assert fresh != seen and client.get(f"/training/runs/{run.pk}/status", {"seen": fresh}, **HTMX).status_code == 204


def test_a_start_elsewhere_swaps_the_status_area_without_reloading_the_page(project, users):
    run = services.create_run(project, users["owner"], name="not started", method="sft", base_model="org/base", dataset="org/sft-data")
    client = client_for(users["owner"])
    seen = status_poll(client.get(f"/training/runs/{run.pk}/").content.decode(), run)[1]
    services.start_run(run)
    changed = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert changed["HX-Trigger"] == "run-changed" and "HX-Refresh" not in changed


def test_a_completed_runs_page_stops_polling_once_its_reports_are_closed(project, users):
    run = ended_run(project, users, Status.COMPLETED, timedelta(minutes=5))
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    assert status_poll(html, run) is None  # a completed run cannot start again: nothing to look for
    assert 'hx-trigger="run-changed from:body"' in html  # nor does the Overview poll


def test_after_a_stop_the_page_follows_what_the_engine_still_reports_for_a_minute(project, users):
    run = ended_run(project, users, Status.CANCELLED, timedelta(seconds=5))
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    trigger, seen = status_poll(html, run)
    assert trigger == "every 5s"
    assert 'hx-trigger="every 5s, run-changed from:body"' in html  # the Overview's charts and log
    checkpoints = client.get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    assert 'id="checkpoint-table" hx-get=' in checkpoints and 'hx-trigger="every 3s"' in checkpoints  # a SIGTERM flush's checkpoint shows up

    # The minute is over: the engine's reports are refused now (ingest.LATE_REPORTS). The next poll
    # swaps in the slow one and tells the Overview, which stops refreshing.
    TrainingRun.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(seconds=61))
    changed = client.get(f"/training/runs/{run.pk}/status", {"seen": seen}, **HTMX)
    assert changed.status_code == 200 and changed["HX-Trigger"] == "run-changed"
    assert status_poll(changed.content.decode(), run)[0] == "every 15s"
    live = client.get(f"/training/runs/{run.pk}/live", **HTMX).content.decode()
    assert 'hx-trigger="run-changed from:body"' in live
    assert "every 3s" not in client.get(f"/training/runs/{run.pk}/checkpoints/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_start_in_another_tab_shows_on_a_cancelled_runs_page(owner_page, project, users):
    page = owner_page
    run = ended_run(project, users, Status.CANCELLED, timedelta(minutes=5), name="two tabs")
    page.goto(f"/training/runs/{run.pk}/")
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Start again")).to_be_visible()

    other = page.context.new_page()
    other.goto(f"/training/runs/{run.pk}/")
    other.get_by_role("button", name="Start again").click()
    expect(other.locator("#stop-btn")).to_be_visible()
    other.close()

    # The slow poll (every 15 s) swaps in the live status area: no reload.
    expect(page.locator("#stop-btn")).to_be_visible(timeout=20_000)
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    expect(page.get_by_role("button", name="Start again")).to_have_count(0)
    expect(page.locator("#run-progress")).to_have_count(0)  # the old attempt's 70 % went with it
    page.shot("started-elsewhere")


@pytest.mark.django_db(transaction=True)
def test_a_teammates_edit_of_a_queued_run_shows_on_its_page_within_one_poll(owner_page, project, users, api_as):
    # The HTTP tests above check the poll's answer; this, that the browser obeys it: the reload shows the
    # new name in the heading and the new max_steps on the Configuration tab, with no click.
    page = owner_page
    run = services.create_run(project, users["owner"], name="before the edit", method="sft", base_model="org/base", dataset="org/sft-data",
                              config={"max_steps": 100})
    page.goto(f"/training/runs/{run.pk}/configuration/")
    expect(page.locator("h1")).to_contain_text("before the edit")
    assert api_as("member").patch(f"/api/training-runs/{run.pk}", {"name": "renamed by a teammate", "config": {"max_steps": 37}}).status_code == 200
    expect(page.locator("h1")).to_contain_text("renamed by a teammate", timeout=20_000)  # the slow poll is every 15 s
    expect(page.locator("#tab-panel")).to_contain_text("37")
    expect(page.get_by_test_id("run-status")).to_have_text("queued")


def without_csrf_tokens(html: str) -> str:
    """An answer as static/js/studio.js compares poll answers: each carries a freshly masked token."""
    return re.sub(r'(name="csrfmiddlewaretoken" value=")[^"]*"', r'\1"', html)


def test_a_running_runs_status_answer_is_the_same_while_only_time_passes(project, users):
    # Its Duration ticked inside the answer, so every 2 s poll was swapped in: STOP refocused, the area re-read.
    run = services.create_run(project, users["owner"], name="steady", method="sft", base_model="org/base", dataset="org/sft-data")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    TrainingRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=70))
    client = client_for(users["owner"])
    poll = status_poll(client.get(f"/training/runs/{run.pk}/").content.decode(), run)
    assert poll is not None and poll[0] == "every 2s"
    url = f"/training/runs/{run.pk}/status?seen={poll[1]}"
    first = client.get(url, **HTMX)
    time.sleep(1.1)  # the shown duration is to the second
    second = client.get(url, **HTMX)
    assert first.status_code == second.status_code == 200
    assert without_csrf_tokens(first.content.decode()) == without_csrf_tokens(second.content.decode())
    started = TrainingRun.objects.get(pk=run.pk).started_at.replace(microsecond=0)
    assert f'<time datetime="{started.isoformat()}" data-ticks-from' in first.content.decode()  # what the browser counts from
