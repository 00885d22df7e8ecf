"""A live run's page, in a real browser, whose run is deleted in another tab: its status poll meets a
404, says so once, and stops polling (it asked again every 2 s, and met the same 404, for as long as
the tab stayed open); the focus stays where it was."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from training import services
from training.models import Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_live_runs_status_poll_stops_once_the_run_is_deleted(owner_page, project, users):
    page = owner_page
    run = services.create_run(project, users["owner"], name="polled", method="sft", base_model="org/base", dataset="org/data")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1)  # a live run's page polls every 2 s
    page.goto(f"/training/runs/{run.pk}/")
    expect(page.get_by_test_id("run-status")).to_have_text("running")
    polls: list[str] = []
    page.on("request", lambda request: polls.append(request.url) if f"/training/runs/{run.pk}/status" in request.url else None)
    page.wait_for_timeout(2_500)
    assert polls, "the live run's page did not poll its status"
    page.get_by_role("button", name="STOP").focus()
    # another tab: the run ended (a queued run may be deleted), then Delete run
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.QUEUED, attempt=0)
    services.delete_run(TrainingRun.objects.get(pk=run.pk))
    banner = page.locator("#request-error")
    expect(banner).to_contain_text("It may have been deleted since this page was loaded", timeout=6_000)
    asked = len(polls)
    page.wait_for_timeout(5_000)  # two more poll intervals
    assert len(polls) == asked, polls[asked - 1:]
    expect(page.get_by_role("button", name="STOP")).to_be_focused()  # the keyboard user is where they were
    expect(page.get_by_test_id("run-status")).to_have_text("running")  # the page as it was loaded, banner above
