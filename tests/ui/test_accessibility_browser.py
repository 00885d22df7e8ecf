"""What assistive technology meets on the Studio's pages, in a real browser: live regions that stay
put and say what changed, focus that stays where the user left it, and controls a keyboard reaches.
Screenshots land in var/test-artifacts/ui/<test name>/."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from datahub import repos
from studio import services as studio_services
from training import services
from training import status as status_service
from training.models import MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)

# Counts, from now on, the status area's poll answers (htmx:beforeSwap: after a swap, events on the
# swapped-out element no longer reach the document) and focus moving onto STOP, and keeps the status
# area of now: SEEN says whether another one replaced it. (An answer whose status area is unchanged
# still fires htmx:afterSwap on it, with swap style none, while its live figures are swapped out of band.)
WATCH_STATUS = """() => {
  window.seen = {polls: 0, focusins: 0};
  window.watchedArea = document.getElementById("run-status");
  if (window.watching) return;
  window.watching = true;
  document.addEventListener("htmx:beforeSwap", e => { if (e.detail.target.id === "run-status") window.seen.polls++; });
  document.addEventListener("focusin", e => { if (e.target.id === "stop-btn") window.seen.focusins++; });
}"""
SEEN = """() => ({...window.seen, replaced: document.getElementById("run-status") !== window.watchedArea})"""


def startable_run(project, users, name: str) -> TrainingRun:
    return services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/sft-data")


def test_live_status_poll_with_nothing_changed_leaves_focus_on_stop_alone(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "steady")
    status_service.transition(run.pk, Status.PROVISIONING)  # live, polled every 2 s; no start yet, so no ticking duration
    page.goto(f"/training/runs/{run.pk}/")
    page.evaluate(WATCH_STATUS)
    # The first poll may swap (the page's own copy was never compared); from then on answers repeat.
    page.wait_for_function("() => window.seen.polls >= 1", timeout=10_000)
    page.wait_for_timeout(200)
    page.locator("#stop-btn").focus()
    page.evaluate(WATCH_STATUS)
    page.wait_for_function("() => window.seen.polls >= 2", timeout=10_000)
    page.wait_for_timeout(200)  # the second answer's swap, if any
    seen = page.evaluate(SEEN)
    assert not seen["replaced"] and seen["focusins"] == 0, f"an unchanged answer was swapped in: {seen}"
    expect(page.locator("#stop-btn")).to_be_focused()


def shown_seconds(text: str) -> int:
    """A Duration as studio_ui.duration writes it ("1m 05s", "42s", "1h 02m"), in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def test_a_running_runs_duration_ticks_while_its_unchanged_status_area_keeps_focus_on_stop(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "ticking")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    TrainingRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=70))
    page.goto(f"/training/runs/{run.pk}/")
    duration = page.locator("#run-status .status-line span", has_text="Duration")
    expect(duration).to_have_text(re.compile(r"^Duration 1m \d\ds$"))  # counted in the browser from the start
    page.evaluate(WATCH_STATUS)
    page.wait_for_function("() => window.seen.polls >= 1", timeout=10_000)  # the page's own copy was never compared
    page.wait_for_timeout(200)
    page.locator("#stop-btn").focus()
    before = shown_seconds(duration.inner_text())
    page.evaluate(WATCH_STATUS)
    page.wait_for_function("() => window.seen.polls >= 3", timeout=15_000)  # three polls, 2 s apart
    page.wait_for_timeout(200)
    seen = page.evaluate(SEEN)
    assert not seen["replaced"] and seen["focusins"] == 0, f"a poll with only time passed was swapped in: {seen}"
    expect(page.locator("#stop-btn")).to_be_focused()
    assert shown_seconds(duration.inner_text()) >= before + 3, "the shown duration stood still"


def test_a_training_runs_advancing_step_leaves_its_status_area_and_focus_on_stop_alone(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "stepping")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    progress = {"step": 1, "max_steps": 100, "tokens_per_s": 900.0, "step_time_s": 0.5, "eta_s": 50.0}
    TrainingRun.objects.filter(pk=run.pk).update(progress=progress)
    page.goto(f"/training/runs/{run.pk}/")
    page.evaluate(WATCH_STATUS)
    page.wait_for_function("() => window.seen.polls >= 1", timeout=10_000)  # the page's own copy was never compared
    page.wait_for_timeout(200)
    page.locator("#stop-btn").focus()
    page.evaluate(WATCH_STATUS)
    figures = page.locator(".progress-line")  # in the status area before: every poll swapped it in
    for step in (5, 9, 13):  # what the engine's ingest writes each step: the step, speed and ETA move
        TrainingRun.objects.filter(pk=run.pk).update(progress={**progress, "step": step, "tokens_per_s": 900.0 + step, "eta_s": 50.0 - step / 2})
        expect(figures).to_contain_text(f"step {step} / 100", timeout=10_000)
        expect(figures).to_contain_text(f"{900 + step} tokens/s")
    seen = page.evaluate(SEEN)
    assert seen["polls"] >= 3 and not seen["replaced"] and seen["focusins"] == 0, f"the step's figures swapped the status area in: {seen}"
    expect(page.locator("#stop-btn")).to_be_focused()
    expect(page.locator("#run-status")).not_to_contain_text("tokens/s")


def test_an_open_show_data_table_stays_open_when_the_live_overview_is_swapped(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "charted")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)  # the Overview's live part is swapped every 5 s
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=2.0 - s / 10) for s in range(1, 4)])
    page.goto(f"/training/runs/{run.pk}/")
    page.get_by_text("Show data of Training loss").click()
    table = page.get_by_role("table", name="Training loss: the data")
    expect(table.get_by_role("row", name="loss")).to_have_text(re.compile(r"loss\s*3\s*1\.7"))
    MetricPoint.objects.create(run=run, key="loss", step=4, value=1.5)
    expect(table.get_by_role("row", name="loss")).to_have_text(re.compile(r"loss\s*4\s*1\.5"), timeout=10_000)  # swapped in, still open
    expect(page.locator("#chart-0-data")).to_have_attribute("open", "")


def test_a_run_status_change_is_said_in_the_pages_live_region(owner_page, project, users):
    page = owner_page
    run = startable_run(project, users, "told")
    status_service.transition(run.pk, Status.PROVISIONING)
    page.goto(f"/training/runs/{run.pk}/")
    announcer = page.locator("#announcer")
    expect(announcer).to_have_attribute("aria-live", "polite")
    expect(announcer).to_have_text("")  # nothing said on load
    status_service.transition(run.pk, Status.RUNNING)
    expect(page.get_by_test_id("run-status")).to_have_text("running", timeout=10_000)
    expect(announcer).to_have_text("Run told is now running.")
    assert announcer.evaluate("el => !document.getElementById('main').contains(el)"), "the region is inside swapped content"


def test_the_gpu_memory_estimates_live_region_stays_when_the_estimate_is_swapped(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    # The live region the estimate is in: marked, so the same element can be told apart after the swap.
    page.evaluate("() => { document.getElementById('fit-estimate').closest('[aria-live]').dataset.kept = 'yes'; }")
    page.get_by_label("Base model").fill("Qwen/Qwen2.5-7B")
    page.get_by_label("Backend").select_option("modal")
    page.get_by_label("Accelerators").fill("H200")
    page.get_by_label("Accelerators").press("Tab")
    expect(page.get_by_test_id("fit-estimate")).to_have_attribute("data-fit-status", "fits")
    region = page.locator("#fit-estimate").locator("xpath=ancestor-or-self::*[@aria-live][1]")
    expect(region).to_have_attribute("data-kept", "yes")
    expect(page.locator("#main [aria-live] [aria-live]")).to_have_count(0)  # no region inside another


def test_a_refused_new_repo_focuses_its_finding_and_a_reload_sends_nothing(owner_page, project):
    page = owner_page
    page.goto("/hub/")
    page.get_by_label("Repo name").fill("-bad name")
    page.get_by_role("button", name="Create repo").click()
    refused_field_is_focused_and_a_reload_sends_nothing(page, "Repo name", "/hub/", "-bad name")
    expect(page.get_by_role("button", name="Create repo")).to_be_visible()


def test_a_refused_repo_delete_focuses_the_confirm_field_and_a_reload_sends_nothing(owner_page, project):
    repos.create_repo(project, "keep-me", "dataset")
    page = owner_page
    page.goto("/hub/acme/keep-me/")
    page.get_by_label("Type the repo name to confirm").fill("keep-you")
    page.get_by_role("button", name="Delete this repo").click()
    refused_field_is_focused_and_a_reload_sends_nothing(page, "Type the repo name to confirm", "/hub/acme/keep-me", "keep-you")
    expect(page.get_by_role("heading", name="Delete this repo")).to_be_visible()


def test_a_blocked_start_is_reached_by_tab_and_pressing_it_does_nothing(owner_page, project, users):
    run = services.create_run(project, users["owner"], name="no data", method="sft", base_model="org/base", dataset=None)
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    start = page.locator("#start-btn")
    expect(start).to_have_attribute("aria-disabled", "true")
    expect(start).to_have_accessible_description(re.compile("This run cannot start yet"))
    page.locator("h1").click()
    for _ in range(30):  # on from the heading, by Tab alone
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.id") == "start-btn":
            break
    expect(start).to_be_focused()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if r.method == "POST" else None)
    page.keyboard.press("Enter")
    start.click(force=True)  # Playwright waits for an aria-disabled button to be enabled
    page.wait_for_timeout(500)
    assert requests == [], "a blocked START sent a request"
    run.refresh_from_db()
    assert run.start_requested_at is None and run.status == Status.QUEUED


def luminance(rgb: str) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_focus_ring_has_3_to_1_contrast_beside_the_controls_it_marks(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    ring = "() => getComputedStyle(document.activeElement).outlineColor"
    page.get_by_role("button", name="Create run").focus()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Tab")  # by keyboard: :focus-visible
    assert page.evaluate("() => document.activeElement.matches(':focus-visible.btn-primary')")
    for background in ("rgb(255, 255, 255)", "rgb(249, 250, 251)"):  # a card, the page
        assert contrast(page.evaluate(ring), background) >= 3, page.evaluate(ring)
    page.locator(".topbar a.brand").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.closest('.topbar') !== null")
    assert contrast(page.evaluate(ring), "rgb(17, 24, 39)") >= 3, page.evaluate(ring)


# Each scrolling table box, with what names it and what its table's caption says.
TABLE_BOXES = """() => Array.from(document.querySelectorAll('.table-wrap')).map(box => ({
  role: box.getAttribute('role'), tabindex: box.getAttribute('tabindex'), label: box.getAttribute('aria-label'),
  caption: (box.querySelector('caption') || {textContent: ''}).textContent.trim(),
}))"""


def test_table_scroll_boxes_are_named_regions_a_keyboard_can_scroll(owner_page, project, users):
    startable_run(project, users, "listed")
    repos.create_repo(project, "some-data", "dataset")
    studio_services.set_secret(project, "HF_TOKEN", "hf_x")
    studio_services.create_api_token(users["owner"], project, name="laptop")
    page = owner_page
    for url in ("/training/", "/hub/", "/settings/secrets/", "/settings/api-tokens/"):
        page.goto(url)
        boxes = page.evaluate(TABLE_BOXES)
        assert boxes, url
        for box in boxes:
            assert box["role"] == "region" and box["tabindex"] == "0" and box["label"] and box["label"] == box["caption"], (url, box)
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto("/hub/")
    region = page.get_by_role("region", name="Repos")
    region.focus()
    page.keyboard.press("End")  # a focused scroll box scrolls by keyboard
    expect(region).to_be_focused()



def test_page_titles_follow_the_run_tab_and_the_data_hub_tab(owner_page, project, users):
    run = startable_run(project, users, "kbd run")
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    expect(page).to_have_title("Overview · kbd run · Studio")
    page.locator("nav.tabs").get_by_role("link", name="Configuration").click()  # an htmx swap of the tab
    expect(page.locator('nav.tabs a[aria-current="page"]')).to_have_text("Configuration")
    expect(page).to_have_title("Configuration · kbd run · Studio")
    page.goto(f"/training/runs/{run.pk}/checkpoints/")
    expect(page).to_have_title("Checkpoints · kbd run · Studio")
    repos.create_repo(project, "titled", "dataset")
    page.goto("/hub/acme/titled/")
    expect(page).to_have_title("Files · acme/titled · Studio")
    page.get_by_role("link", name="Commits").click()
    expect(page).to_have_title("Commits · acme/titled · Studio")


def test_the_run_lists_progress_is_read_once(owner_page, project, users):
    run = startable_run(project, users, "done")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    status_service.transition(run.pk, Status.COMPLETED)
    page = owner_page
    page.goto("/training/")
    cell = page.locator(f'tr[data-run="{run.pk}"] td').nth(5)
    expect(cell).to_have_text(re.compile(r"100%"))
    snapshot = cell.aria_snapshot()
    # the bar's value, not also the text beside it (the cell read "100 100%")
    assert "100 100%" not in snapshot and snapshot.count("100%") == 1, snapshot
    expect(cell.get_by_role("progressbar", name="Progress of done")).to_have_attribute("value", "100")


def refused_field_is_focused_and_a_reload_sends_nothing(page, label: str, form_page: str, typed: str) -> None:
    """The refusal is shown at the form's page (redirect-after-POST): the refused field is marked,
    keeps what was typed and is focused (its finding is read with it, aria-describedby). A reload is a
    GET, which sends nothing again (a page drawn from the POST asked to resubmit it), and shows a
    clean form."""
    assert page.url.endswith(form_page)
    field = page.get_by_label(label)
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(field).to_have_value(typed)
    expect(field).to_be_focused()
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.reload()
    assert posts == [] and page.url.endswith(form_page)
    expect(page.get_by_label(label)).not_to_have_attribute("aria-invalid", "true")
