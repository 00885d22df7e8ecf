"""Issue 8: NEW RUN's collapsed Performance (GPU) fieldset in a real browser."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.ui.test_browser import check_page

pytestmark = pytest.mark.django_db(transaction=True)


def test_grpo_run_with_the_static_rollout_engine(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    page.get_by_label("Method", exact=True).select_option("grpo")
    expect(page.locator("#method-fields")).to_have_attribute("data-method", "grpo")
    page.get_by_label("Name", exact=True).fill("ui static rollouts")
    page.get_by_label("Base model").fill("org/base-model")
    page.get_by_label("Environment", exact=True).fill("builtin/arith@main")
    expect(page.get_by_role("group", name="Performance (GPU)")).to_be_visible()
    engine = page.get_by_label("Rollout engine")
    expect(engine).to_be_hidden()  # collapsed until opened
    page.locator("summary", has_text="Performance (GPU)").click()
    expect(engine).to_be_visible()
    expect(engine).to_have_value("")  # Default (auto)
    expect(page.get_by_label("Packing")).to_have_count(0)  # SFT / DISTILL only
    engine.select_option("static")
    check_page(page)
    page.shot("performance-open")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    run = project.runs.get(name="ui static rollouts")
    assert run.method == "grpo" and run.config["rollout_engine"] == "static"
    assert not {"use_liger", "gradient_checkpointing", "packing"} & set(run.config)


def test_turning_checkpointing_off_moves_the_estimate(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    estimate = page.get_by_test_id("fit-estimate")
    page.get_by_label("Base model").fill("Qwen/Qwen2.5-7B")
    page.get_by_label("Backend").select_option("modal")
    page.get_by_label("Accelerators").fill("L4")
    page.get_by_label("Accelerators").press("Tab")
    expect(estimate).to_have_attribute("data-fit-status", "tight")  # a 7B LoRA on an L4: fits only with checkpointing
    page.locator("summary", has_text="Performance (GPU)").click()
    page.get_by_label("Activation checkpointing").select_option("false")
    expect(estimate).to_have_attribute("data-fit-status", "too_big")
    expect(estimate).to_contain_text("turn activation checkpointing back on")
    page.get_by_label("Activation checkpointing").select_option("")
    expect(estimate).to_have_attribute("data-fit-status", "tight")
