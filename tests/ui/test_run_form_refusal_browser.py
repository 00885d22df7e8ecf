"""A refused NEW RUN in a real browser: the refusal is shown at NEW RUN's own address
(redirect-after-POST), with what was typed and the focus on the error summary, and a reload is a
GET that sends nothing again (a page drawn from the POST asked to resubmit it, then did)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.ui.test_browser import fill_common
from training.models import TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refused_new_run_reloaded_sends_nothing_again_and_shows_a_clean_form(owner_page, project):
    page = owner_page
    page.goto("/training/new/?method=dpo")  # NEW RUN in this method, as a link to it opens it
    fill_common(page, "refused dpo", "prefs@main")
    page.get_by_label("Max steps").fill("0")
    page.get_by_label(re.compile("^Reference-free")).check()
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_label("Max steps")).to_have_attribute("aria-invalid", "true")
    assert page.url.endswith("/training/new/") and len(posts) == 1
    expect(page.locator("[data-error-summary]")).to_be_focused()
    expect(page.get_by_label("Max steps")).to_have_accessible_description(re.compile("must be at least 1, got 0"))
    expect(page.get_by_label("Name", exact=True)).to_have_value("refused dpo")
    expect(page.get_by_label("Method", exact=True)).to_have_value("dpo")
    expect(page.get_by_label("Dataset", exact=True)).to_have_value("prefs@main")
    expect(page.get_by_label(re.compile("^Reference-free"))).to_be_checked()
    expect(page.get_by_label(re.compile("^Normalise by completion length"))).not_to_be_checked()
    page.shot("refused")
    page.reload()  # waits for the load event: a POST it sent is counted by then
    assert len(posts) == 1, f"the reload sent the form again: {posts}"
    expect(page.get_by_label("Name", exact=True)).to_have_value("")
    assert page.url.endswith("/training/new/")
    expect(page.locator("[data-error-summary]")).to_have_count(0)
    expect(page.get_by_label("Max steps")).not_to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Method", exact=True)).to_have_value("sft")
    assert not TrainingRun.objects.filter(project=project).exists()
