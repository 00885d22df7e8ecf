"""/api/docs works offline: Swagger UI comes from our static files, not a CDN."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.django_db(transaction=True)


def test_api_docs_render_with_no_network_beyond_the_studio(page, live_server):
    outside: list[str] = []

    def only_the_studio(route):
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_studio)
    page.goto("/api/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Studio API")
    expect(page.locator(".opblock-summary-path").filter(has_text="/api/training-runs").first).to_be_visible()
    assert outside == []
    page.shot("api-docs")


def test_try_it_out_writes_with_the_logged_in_session(owner_page, project):
    """The docs page carries the CSRF token and Swagger sends it: a write from "Try it out" with the
    browser's session is made (it was a 403 "CSRF check failed", the page having an empty token)."""
    from experiments.models import Experiment

    page = owner_page
    page.goto("/api/docs")
    create = page.locator(".opblock-post").filter(has=page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/experiments$")))
    create.locator(".opblock-summary").click()
    create.get_by_role("button", name="Try it out").click()
    create.locator("textarea.body-param__text").fill('{"name": "swagger try"}')
    create.get_by_role("button", name="Execute").click()
    status = create.locator(".live-responses-table .response .response-col_status").first
    expect(status).to_have_text("201")
    assert Experiment.objects.filter(project=project, name="swagger try").count() == 1
    page.shot("api-docs-try-it-out")


def test_a_session_write_without_the_token_is_still_refused(owner_page, project):
    """The token on the docs page is what lets its writes through: a write with the session but
    without X-CSRFToken is still a 403, and nothing is made."""
    from experiments.models import Experiment

    page = owner_page
    page.goto("/api/docs")
    status = page.evaluate("""() => fetch("/api/experiments", {method: "POST", headers: {"Content-Type": "application/json"},
                                                              body: JSON.stringify({name: "no token"})}).then(r => r.status)""")
    assert status == 403
    assert not Experiment.objects.filter(name="no token").exists()
