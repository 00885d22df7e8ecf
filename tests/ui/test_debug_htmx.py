"""DEBUG (the `make studio` default) must not change how HTMX answers land: findings (400/409/...)
swap into their target as in production, not over the whole document; a 5xx still shows the
developer the error page."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from environments import services as env_services

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def debug(settings):
    settings.DEBUG = True


def assert_page_intact(page) -> None:
    """The nav, the title and the stylesheet are still there: the answer did not replace the document."""
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    assert page.title().endswith("· Studio")
    assert page.locator('link[rel="stylesheet"]').count() >= 1


@pytest.mark.parametrize("name", ["!!!", ""])
def test_experiment_findings_swap_into_the_form_under_debug(debug, owner_page, project, name):
    page = owner_page
    page.goto("/experiments/")
    assert page.locator('script[src$="js/htmx-debug.js"]').count() == 1
    page.get_by_label("New experiment name").fill(name)
    if not name:  # the browser's own required check would stop an empty submit before HTMX
        page.get_by_label("New experiment name").evaluate("el => el.removeAttribute('required')")
    page.get_by_role("button", name="Create experiment").click()
    expect(page.locator("#f-name-errors")).to_be_visible()
    assert_page_intact(page)
    page.shot("experiment-finding")


def test_environment_config_finding_swaps_into_the_card_under_debug(debug, owner_page, project, users):
    env_services.fork(project, "multiple-choice", "mc", user=users["owner"])
    page = owner_page
    page.goto("/environments/mc/")
    page.get_by_label("CONFIG (JSON object)").fill("CONFIG = {")
    page.get_by_role("button", name="Save CONFIG").click()
    expect(page.locator("#f-config-errors")).to_be_visible()
    assert_page_intact(page)
    page.shot("config-finding")


def test_a_500_still_shows_the_error_page_under_debug(debug, owner_page, project):
    page = owner_page
    page.goto("/experiments/")
    # Nothing here can make a real view fail on demand: the browser is handed a 500 for this one request.
    page.route("**/experiments/create", lambda route: route.fulfill(status=500, content_type="text/html", body="<html><head><title>boom</title></head><body><h1 id=tb>Traceback here</h1></body></html>"))
    page.get_by_label("New experiment name").fill("x")
    page.get_by_role("button", name="Create experiment").click()
    expect(page.locator("#tb")).to_have_text("Traceback here")
