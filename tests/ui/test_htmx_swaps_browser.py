"""What the page does around its htmx swaps, in a real browser: a session ended in another tab, an
error answer without a partial, log boxes that follow their newest line, a banner that no longer
applies, and where focus lands. Screenshots land in var/test-artifacts/ui/<test name>/."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from experiments.models import Experiment
from tests.ui.conftest import PASSWORD
from tests.ui.test_browser import fill_common
from training import services
from training import status as status_service
from training.models import LogLine, Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)

AT_END = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 2"


def log_out_in_another_tab(page) -> None:
    other = page.context.new_page()
    other.goto("/training/")
    other.get_by_role("button", name="Log out").click()
    other.wait_for_url(re.compile(r"/login/"))
    other.close()


def startable_run(project, users, name: str = "two tabs") -> TrainingRun:
    # An HF dataset id: nothing to look up in the Data Hub, so START is enabled.
    return services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/sft-data")


def test_list_poll_after_logout_in_another_tab_loads_login_then_returns(owner_page, project, users):
    page = owner_page
    startable_run(project, users)
    page.goto("/training/?status=queued")
    log_out_in_another_tab(page)
    # The rows poll every 4 s: the next one takes the whole page to the login form, not into #run-rows.
    expect(page).to_have_url(re.compile(r"/login/\?next=%2Ftraining%2F%3Fstatus%3Dqueued$"), timeout=10_000)
    expect(page.locator("#run-rows")).to_have_count(0)
    expect(page.get_by_role("heading", name="Log in to Studio")).to_be_visible()
    page.shot("login-after-poll")
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/training/\?status=queued$"))
    expect(page.locator("#run-rows tr")).to_have_count(1)


def test_actions_after_logout_in_another_tab_load_login_and_do_nothing(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    log_out_in_another_tab(page)
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete run").click()
    expect(page).to_have_url(re.compile(rf"/login/\?next=%2Ftraining%2Fruns%2F{run.pk}%2F$"))
    expect(page.locator("#run-status")).to_have_count(0)
    assert TrainingRun.objects.filter(pk=run.pk).exists()

    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(rf"/training/runs/{run.pk}/$"))
    page.goto("/experiments/")
    log_out_in_another_tab(page)
    page.get_by_label("New experiment name").fill("after logout")
    page.get_by_role("button", name="Create experiment").click()
    expect(page).to_have_url(re.compile(r"/login/\?next=%2Fexperiments%2F$"))
    expect(page.locator("#experiments")).to_have_count(0)
    assert not Experiment.objects.filter(name="after logout").exists()


def test_start_on_a_run_deleted_in_another_tab_says_so(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    other = page.context.new_page()
    other.goto(f"/training/runs/{run.pk}/")
    other.once("dialog", lambda d: d.accept())
    other.get_by_role("button", name="Delete run").click()
    other.wait_for_url(re.compile(r"/training/$"))
    other.close()

    page.get_by_role("button", name="START").click()  # a 404 page: no partial to swap
    banner = page.locator("#request-error")
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text(f"No training run {run.pk} in your projects")
    expect(banner).to_contain_text("It may have been deleted since this page was loaded")
    expect(banner.get_by_role("link", name="← Training runs")).to_be_visible()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")  # the status area was left as it was
    page.shot("start-deleted-run")
    banner.get_by_role("button", name="Dismiss").click()
    expect(banner).to_have_count(0)


def test_a_stale_form_token_says_to_reload_and_findings_still_swap_in(owner_page, project, live_server):
    page = owner_page
    page.goto("/experiments/")
    # Logging in again in another tab gives the session a new CSRF secret: this page's token no longer matches.
    page.context.add_cookies([{"name": "csrftoken", "value": "x" * 32, "url": live_server.url}])
    page.get_by_label("New experiment name").fill("stale token")
    page.get_by_role("button", name="Create experiment").click()
    banner = page.locator("#request-error")
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text("This page is out of date")
    expect(banner).to_contain_text("Open the page again, fill in the form again, and send it.")
    expect(banner.get_by_role("link", name="Open the page again")).to_have_attribute("href", "/experiments/")
    assert not Experiment.objects.filter(name="stale token").exists()
    page.shot("stale-token")

    page.reload()
    page.get_by_label("New experiment name").fill("!!!")
    page.get_by_role("button", name="Create experiment").click()
    expect(page.locator("#f-name-errors")).to_be_visible()  # a 400 with its partial still swaps into the form
    expect(page.locator("#request-error")).to_have_count(0)


def test_training_log_shows_newest_lines_and_keeps_a_reader_scrolled_up(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "logging")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    LogLine.objects.bulk_create([LogLine(run=run, line=f"step {i}") for i in range(150)])
    page.goto(f"/training/runs/{run.pk}/")
    log = page.locator('pre.log[aria-label="Training log"]')
    expect(log).to_contain_text("step 149")
    assert log.evaluate(AT_END), "the log opens at its top, away from the newest lines"

    LogLine.objects.bulk_create([LogLine(run=run, line=f"step {i}") for i in range(150, 160)])
    expect(log).to_contain_text("step 159", timeout=10_000)  # the Overview refreshes every 5 s
    assert log.evaluate(AT_END), "the refresh jumped the log back to its top"

    log.evaluate("el => { el.scrollTop = 100; }")
    LogLine.objects.bulk_create([LogLine(run=run, line=f"step {i}") for i in range(160, 170)])
    expect(log).to_contain_text("step 169", timeout=10_000)
    assert log.evaluate("el => el.scrollTop") == 100, "the refresh moved a reader who had scrolled up"
    page.shot("log-kept")


def test_failed_runs_last_log_lines_open_at_the_exception(owner_page, project, users):
    run = startable_run(project, users, "crashed")
    status_service.transition(run.pk, Status.PROVISIONING)
    tail = [f"line {i}" for i in range(199)] + ["RuntimeError: CUDA error: device-side assert triggered"]
    status_service.transition(run.pk, Status.FAILED, error={"code": "training_error", "message": "boom", "log_tail": tail})
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    log = page.locator(".failure pre.log")
    expect(log).to_contain_text("RuntimeError")
    assert log.evaluate(AT_END)
    expect(log.get_by_text("RuntimeError: CUDA error")).to_be_in_viewport()
    page.shot("failure-log")


def test_queued_banner_goes_once_the_run_changes(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    fill_common(page, "banner run", dataset="org/sft-data")
    page.get_by_role("button", name="Create run").click()
    banner = page.locator("#main > ul.messages")
    expect(banner).to_contain_text("Run \u2068banner run\u2069 is queued. Press START when it is ready.")
    page.get_by_role("button", name="START").click()
    expect(page.locator("#stop-btn")).to_be_visible()  # START was taken: a worker will pick it up
    expect(banner).to_have_count(0)
    run = project.runs.get(name="banner run")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    status_service.transition(run.pk, Status.COMPLETED)
    expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=10_000)
    expect(banner).to_have_count(0)
    page.shot("completed-no-banner")


def test_focus_lands_on_the_new_current_tab_after_enter(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "tabs")
    page.goto(f"/training/runs/{run.pk}/")
    page.locator('nav.tabs a[data-tab="configuration"]').focus()
    page.keyboard.press("Enter")
    current = page.locator('nav.tabs a[aria-current="page"]')
    expect(current).to_have_text("Configuration")
    expect(current).to_be_focused()
    page.keyboard.press("Tab")  # on from the tab strip, not from the top of the page
    expect(page.locator('nav.tabs a[data-tab="datasets"]')).to_be_focused()


def test_focus_moves_to_the_error_summary_after_a_failed_new_run(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    fill_common(page, "bad rate")
    page.get_by_label("Learning rate").fill("fast")
    page.get_by_role("button", name="Create run").click()  # refused: a 303 back to NEW RUN, which shows its findings
    summary = page.locator("main > .alert-error[role=alert]")
    expect(summary).to_have_text("Fix the fields marked below.")
    expect(summary).to_be_focused()
    expect(page.get_by_label("Learning rate")).to_have_attribute("aria-invalid", "true")
    assert not project.runs.filter(name="bad rate").exists()
    page.shot("new-run-errors-focused")
