"""/api/docs works offline: Swagger UI comes from our static files, not a CDN."""
from __future__ import annotations

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
