"""Try it in a real browser with a real Celery worker: the tab loads by htmx, Generate queues an ask,
and the answer (the run's weights beside its base model, made by the engine's generator on the CPU)
replaces "Generating…" by itself as the tab polls. Screenshots land in var/test-artifacts/ui/<test name>/."""
from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import expect

from training import services
from training.models import Checkpoint, Status, TrainingRun

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_prompt_typed_on_the_try_it_tab_is_answered_by_the_run_and_its_base(owner_page, project, users, studio_worker, tiny_models):
    page = owner_page
    run = services.create_run(project, users["owner"], name="tried", method="sft", base_model=tiny_models["student"], dataset=tiny_models["data_sft"])
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    final = studio_worker.runs_dir / str(run.pk) / "attempt-1" / "output" / "final"
    shutil.copytree(tiny_models["student"], final)  # the weights as a full fine-tune's engine saves them
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path=str(final))

    page.goto(f"/training/runs/{run.pk}/")
    page.locator('nav.tabs a[data-tab="try"]').click()
    expect(page).to_have_url(re.compile(rf"/training/runs/{run.pk}/try/$"))
    page.get_by_label("Message").fill("What colour is the cat?")
    page.get_by_label("Max new tokens").fill("6")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Compare with the base model").check()
    page.get_by_role("button", name="Generate").click()
    answer = page.get_by_test_id("generation").first
    expect(answer).to_have_attribute("data-status", re.compile("queued|running"))  # a quick worker has it already
    expect(page.get_by_label("Message")).to_have_value("")  # ready for the next prompt
    expect(answer).to_have_attribute("data-status", "completed", timeout=240_000)
    expect(answer.locator(".answer")).to_have_count(2)
    for model in ("trained", "base"):
        expect(answer.locator(f'.answer[data-model="{model}"] [data-testid="answer-stats"]')).to_contain_text(
            "· cpu (on the CPU: the Studio machine has no GPU)")
    page.shot("answered")
    page.reload()
    expect(page.get_by_test_id("generation")).to_have_count(1)  # kept across reloads
