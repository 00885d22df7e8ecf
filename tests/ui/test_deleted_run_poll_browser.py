"""A Try it answer still being made, in a real browser, when its run is deleted in another tab: its
card says so and stops polling (it polled a 404 every 2 s for as long as the tab was open, and
went on saying "Waiting for a worker…")."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.test_playground import runs_dir, trained_run  # noqa: F401 - the fixture is used by name
from training import services
from training.models import Generation

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_answer_of_a_run_deleted_in_another_tab_says_so_and_stops_polling(owner_page, project, users, runs_dir):  # noqa: F811
    page = owner_page
    run = trained_run(project, users["owner"], runs_dir)
    generation = Generation.objects.create(run=run, created_by=users["owner"], prompt="2+2", max_new_tokens=8, temperature=0.7)
    page.goto(f"/training/runs/{run.pk}/try/")
    card = page.locator(f"#generation-{generation.pk}")
    expect(card).to_contain_text("Waiting for a worker")
    polls: list[str] = []
    page.on("request", lambda request: polls.append(request.url) if f"/generations/{generation.pk}" in request.url else None)
    services.delete_run(run)  # another tab
    expect(card).to_have_attribute("data-status", "gone", timeout=6_000)
    expect(card.get_by_role("alert")).to_contain_text(f"No training run {run.pk} in your projects.")
    expect(card.get_by_role("alert")).to_contain_text("It may have been deleted since this page was loaded")
    expect(card.get_by_role("link", name="← Training runs")).to_be_visible()
    answered = len(polls)
    page.wait_for_timeout(4_500)  # two more poll intervals
    assert len(polls) == answered
    page.shot("answer-of-deleted-run")
