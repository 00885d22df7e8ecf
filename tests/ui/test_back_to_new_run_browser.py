"""Back to NEW RUN in a real browser: the browser puts back the Method (and GRPO's RL mode) picked
before leaving, and the fields below follow it, as when it was picked; they said SFT's under "GRPO",
and Create run sent a GRPO run with SFT's settings and no environment."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.django_db(transaction=True)


def leave_and_come_back(page) -> None:
    page.locator("header").get_by_role("link", name="Experiments", exact=True).click()
    page.wait_for_url(re.compile(r"/experiments/$"))
    page.go_back()
    page.wait_for_url(re.compile(r"/training/new/"))


def test_back_to_new_run_draws_the_fields_of_the_method_the_picker_says(owner_page):
    page = owner_page
    page.goto("/training/new/")
    method = page.get_by_label("Method", exact=True)
    method.select_option("grpo")
    expect(page.locator("#card-grpo")).to_be_visible()
    leave_and_come_back(page)
    expect(method).to_have_value("grpo")
    expect(page.locator("#method-fields")).to_have_attribute("data-method", "grpo")
    expect(page.locator("#card-grpo")).to_be_visible()
    expect(page.get_by_label("RL mode", exact=True)).to_be_visible()
    page.shot("back-to-grpo")


def test_back_to_new_run_draws_the_fields_of_the_rl_mode_the_picker_says(owner_page):
    page = owner_page
    page.goto("/training/new/?method=grpo")
    mode = page.get_by_label("RL mode", exact=True)
    mode.select_option("ruler")
    expect(page.locator("#grpo-mode")).to_have_attribute("data-mode", "ruler")
    leave_and_come_back(page)
    expect(mode).to_have_value("ruler")
    expect(page.locator("#grpo-mode")).to_have_attribute("data-mode", "ruler")
    expect(page.get_by_label("RULER prompts dataset")).to_be_visible()
