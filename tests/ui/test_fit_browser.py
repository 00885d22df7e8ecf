"""Issue 8: the NEW RUN GPU memory estimate follows the form in a real browser (HTMX wiring)."""
from __future__ import annotations

from playwright.sync_api import expect


def test_new_run_estimate_follows_the_gpu_the_model_and_the_adapter(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    estimate = page.get_by_test_id("fit-estimate")
    expect(estimate).to_have_attribute("data-fit-status", "unknown")  # the form opens on the CPU
    page.get_by_label("Base model").fill("Qwen/Qwen2.5-7B")
    page.get_by_label("Backend").select_option("modal")
    page.get_by_label("Accelerators").fill("L4")
    page.get_by_label("Accelerators").press("Tab")
    # The default config box holds lora_rank: 16 — a 7B LoRA on an L4 fits only with checkpointing.
    expect(estimate).to_have_attribute("data-fit-status", "tight")
    expect(estimate).to_contain_text("of 24 GiB on one L4 (activation checkpointing on)")
    page.get_by_label("Config (YAML or JSON)").fill("")
    page.get_by_label("Config (YAML or JSON)").press("Tab")
    expect(estimate).to_have_attribute("data-fit-status", "too_big")
    expect(estimate).to_contain_text("train a LoRA adapter")
    page.get_by_label("Accelerators").fill("H200")
    page.get_by_label("Accelerators").press("Tab")
    expect(estimate).to_have_attribute("data-fit-status", "fits")
    page.get_by_text("Where the").click()
    expect(page.locator(".fit-breakdown table")).to_contain_text("Optimizer")
    page.shot("fit-estimate-h200")
