"""What the page does when an htmx request gets no answer (the Studio is down, the network
dropped) or an answer with nothing to show: one announced banner, never silence or a blank page;
a button looks busy while its request is in flight; a poll that keeps failing says so once and the
banner goes once the Studio answers again; Dismiss puts focus back; the runs-list poll keeps focus
on the row it was in."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.ui.test_htmx_swaps_browser import startable_run
from training import services

pytestmark = pytest.mark.django_db(transaction=True)

BUSY = "el => getComputedStyle(el, '::after').content + ' ' + getComputedStyle(el).cursor"
RUNS_POLL = re.compile(r"/training/\?")


def test_start_while_the_studio_is_unreachable_looks_busy_then_says_so(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    held = []
    page.route("**/start", lambda route: held.append(route))  # the request hangs until the test answers it
    start = page.get_by_role("button", name="START")
    start.click()
    expect(page.locator("#run-status form.htmx-request")).to_have_count(1)
    assert start.evaluate(BUSY) == '" …" progress'
    page.shot("start-in-flight")
    held[0].abort("connectionrefused")
    banner = page.locator("#request-error")
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text("The Studio could not be reached, so this may not have been done")
    assert start.evaluate(BUSY) == "none pointer"
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    page.shot("start-unreachable")


def test_an_unreached_actions_banner_stays_when_a_later_poll_succeeds(owner_page, project, users):
    # The next poll answering says nothing about the START that got no answer: it may not have been done.
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    page.route("**/start", lambda route: route.abort("connectionrefused"))
    page.get_by_role("button", name="START").click()
    banner = page.locator("#request-error")
    expect(banner).to_contain_text("The Studio could not be reached, so this may not have been done")
    with page.expect_response(lambda response: "/live" in response.url and response.ok):
        page.evaluate("htmx.trigger(document.body, 'run-changed')")
    page.wait_for_timeout(300)
    expect(banner).to_contain_text("so this may not have been done")
    banner.get_by_role("button", name="Dismiss").click()
    expect(banner).to_have_count(0)


def test_a_failing_poll_shows_one_banner_that_goes_once_the_studio_answers(owner_page, project, users):
    page = owner_page
    startable_run(project, users)
    page.goto("/training/")
    failures = []
    page.route(RUNS_POLL, lambda route: (failures.append(route.request.url), route.abort("connectionrefused")))
    banner = page.locator("#request-error")
    expect(banner).to_contain_text("could not be reached", timeout=10_000)
    expect(banner).to_contain_text("it will retry")
    page.wait_for_timeout(4_500)  # one more poll (every 4 s) fails: still one banner, not a new one
    assert len(failures) >= 2
    expect(page.locator(".request-error")).to_have_count(1)
    page.shot("poll-unreachable")
    page.unroute(RUNS_POLL)
    expect(banner).to_have_count(0, timeout=10_000)
    expect(page.locator("#run-rows tr")).to_have_count(1)


def test_dismissing_the_banner_puts_focus_back_on_the_button(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    page.route("**/start", lambda route: route.fulfill(status=503, body="", content_type="text/html"))
    start = page.get_by_role("button", name="START")
    start.focus()
    page.keyboard.press("Enter")
    banner = page.locator("#request-error")
    expect(banner).to_contain_text("HTTP 503")
    banner.get_by_role("button", name="Dismiss").focus()
    page.keyboard.press("Enter")
    expect(banner).to_have_count(0)
    expect(start).to_be_focused()


def test_an_empty_5xx_under_debug_shows_the_banner_not_a_blank_page(settings, owner_page, project, users):
    settings.DEBUG = True
    page = owner_page
    run = startable_run(project, users)
    page.goto(f"/training/runs/{run.pk}/")
    assert page.locator('script[src$="js/htmx-debug.js"]').count() == 1
    page.route("**/start", lambda route: route.fulfill(status=502, body="", content_type="text/html"))
    page.get_by_role("button", name="START").click()
    expect(page.locator("#request-error")).to_contain_text("HTTP 502")
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")


def test_the_runs_poll_keeps_focus_on_the_link_of_the_same_row(owner_page, project, users):
    page = owner_page
    first = services.create_run(project, users["owner"], name="first", method="sft", base_model="org/base", dataset="org/d")
    second = services.create_run(project, users["owner"], name="second", method="sft", base_model="org/base", dataset="org/d")
    page.goto("/training/")
    # Both rows link to the same experiment ("default"): the focused one is the second row's.
    link = page.locator(f'tr[data-run="{first.pk}"] a.truncate')
    assert link.text_content() == page.locator(f'tr[data-run="{second.pk}"] a.truncate').text_content()
    link.focus()
    polls = page.evaluate_handle("() => { const seen = {n: 0}; document.addEventListener('htmx:afterRequest', () => seen.n++); return seen; }")
    page.wait_for_function("seen => seen.n >= 1", arg=polls, timeout=10_000)
    expect(link).to_be_focused()
    # An unchanged answer swaps nothing: the rows are the same elements as before it.
    page.evaluate("() => { document.getElementById('run-rows').dataset.kept = 'yes'; }")
    page.wait_for_function("seen => seen.n >= 2", arg=polls, timeout=10_000)
    expect(page.locator("#run-rows")).to_have_attribute("data-kept", "yes")
    expect(link).to_be_focused()
