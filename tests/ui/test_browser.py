"""The Studio in a real browser: Debian's chromium, driven by Playwright, against live_server.
Screenshots land in var/test-artifacts/ui/<test name>/."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import login
from training import services
from training import status as status_service
from training.models import MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)

EXPECTED_TABS = {
    "sft": ["Overview", "Configuration", "Datasets", "Checkpoints", "Lineage", "Repository"],
    "dpo": ["Overview", "Configuration", "Datasets", "Checkpoints", "Lineage", "Repository"],
    "distill": ["Overview", "Configuration", "Datasets", "Checkpoints", "Lineage", "Repository"],
    # A GRPO run without a dataset (its prompts come from the environment) has no Datasets tab.
    "grpo": ["Overview", "Configuration", "Environment", "Rollouts", "Checkpoints", "Lineage", "Repository"],
}
UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby'))
  .map(el => el.name || el.id || el.outerHTML.slice(0, 80))"""
OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"


def check_page(page) -> None:
    """Every field labelled; nothing wider than the 1280 px viewport; no template syntax shown (a
    {# comment #} that spans lines is text to Django)."""
    assert page.evaluate(UNLABELLED) == []
    assert not re.search(r"\{[#%]|[#%]\}", page.locator("body").inner_text()), "template syntax on the page"
    assert page.evaluate(OVERFLOW) <= 0, "the page scrolls horizontally at 1280 px"


def tab_names(page) -> list[str]:
    return [t.strip() for t in page.locator("nav.tabs a").all_inner_texts()]


def test_login_training_page_and_nav(transactional_db, project, users, page):
    users["owner"].is_staff = True
    users["owner"].save()
    page.goto("/training/")
    expect(page).to_have_url(re.compile(r"/login/"))
    check_page(page)
    page.shot("login")
    login(page)
    nav = page.get_by_role("navigation", name="Main")
    for name in ("Training", "Experiments", "Models", "Settings", "Admin"):
        expect(nav.get_by_role("link", name=name, exact=True)).to_be_visible()
    expect(page.get_by_label("Project")).to_have_value("acme")
    expect(page.get_by_label("Status")).to_be_visible()
    expect(page.get_by_label("Method")).to_be_visible()
    expect(page.get_by_label("Experiment")).to_be_visible()
    check_page(page)
    page.shot("training-empty")
    nav.get_by_role("link", name="Settings", exact=True).click()
    expect(page.get_by_test_id("plan-name")).to_have_text("team")
    tabs = page.get_by_role("navigation", name="Settings")
    expect(tabs.get_by_role("link", name="Billing")).to_have_attribute("aria-current", "page")
    tabs.get_by_role("link", name="API tokens").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Settings → API tokens")
    expect(nav.get_by_role("link", name="Settings", exact=True)).to_have_attribute("aria-current", "page")
    tabs.get_by_role("link", name="Billing").click()
    expect(page.get_by_test_id("plan-name")).to_have_text("team")
    check_page(page)
    page.shot("billing")


def test_training_list_filters_and_updates_live(owner_page, project, users):
    page = owner_page
    sft = services.create_run(project, users["owner"], name="live sft", method="sft", base_model="org/base", dataset="d@main")
    services.create_run(project, users["owner"], name="a dpo", method="dpo", base_model="org/base", dataset="d@main", config={"loss": {"type": "dpo"}, "lora_rank": 8})
    page.goto("/training/")
    expect(page.locator("#run-rows tr")).to_have_count(2)
    page.get_by_label("Method").select_option("dpo")
    expect(page.locator("#run-rows tr")).to_have_count(1)
    expect(page).to_have_url(re.compile(r"method=dpo"))
    page.get_by_label("Method").select_option("")
    expect(page.locator("#run-rows tr")).to_have_count(2)
    # Typing in Search narrows the list as you type (no Enter), and the URL keeps it.
    page.get_by_label("Search").press_sequentially("live")
    expect(page.locator("#run-rows tr")).to_have_count(1)
    expect(page).to_have_url(re.compile(r"q=live"))
    page.get_by_label("Search").fill("")
    page.get_by_label("Search").press("Backspace")
    expect(page.locator("#run-rows tr")).to_have_count(2)
    row_status = page.locator(f'tr[data-run="{sft.pk}"] .status')
    expect(row_status).to_have_text("queued")
    # The engine reports progress: the list follows without a reload.
    status_service.transition(sft.pk, Status.PROVISIONING)
    status_service.transition(sft.pk, Status.RUNNING)
    TrainingRun.objects.filter(pk=sft.pk).update(progress={"step": 5, "max_steps": 10})
    expect(row_status).to_have_text("running", timeout=10_000)
    expect(page.locator(f'tr[data-run="{sft.pk}"]')).to_contain_text("50%")
    check_page(page)
    page.shot("training-live")


def test_back_after_filtering_shows_that_pages_filters_and_rows(owner_page, project, users):
    """Back over the list's filter steps: each page's controls and rows agree with its URL. htmx's
    history snapshots kept the rows of the step but the controls as first rendered (an empty Search
    over a list filtered by it)."""
    page = owner_page
    services.create_run(project, users["owner"], name="alpha sft", method="sft", base_model="org/base", dataset="d@main")
    services.create_run(project, users["owner"], name="beta sft", method="sft", base_model="org/base", dataset="d@main")
    services.create_run(project, users["owner"], name="alpha dpo", method="dpo", base_model="org/base", dataset="d@main", config={"loss": {"type": "dpo"}, "lora_rank": 8})
    page.goto("/training/")
    expect(page.locator("#run-rows tr")).to_have_count(3)
    page.get_by_label("Search").fill("alpha")
    expect(page).to_have_url(re.compile(r"q=alpha"))
    expect(page.locator("#run-rows tr")).to_have_count(2)
    page.get_by_label("Method").select_option("dpo")
    expect(page).to_have_url(re.compile(r"method=dpo"))
    expect(page.locator("#run-rows tr")).to_have_count(1)

    page.go_back()
    expect(page).to_have_url(re.compile(r"/training/\?.*q=alpha"))
    expect(page).not_to_have_url(re.compile(r"method=dpo"))
    expect(page.get_by_label("Search")).to_have_value("alpha")
    expect(page.get_by_label("Method")).to_have_value("")
    expect(page.locator("#run-rows tr")).to_have_count(2)

    page.go_back()
    expect(page).to_have_url(re.compile(r"/training/$"))
    expect(page.get_by_label("Search")).to_have_value("")
    expect(page.locator("#run-rows tr")).to_have_count(3)
    check_page(page)


def test_create_experiment_with_htmx(owner_page, project):
    page = owner_page
    page.get_by_role("link", name="Experiments", exact=True).click()
    page.get_by_label("New experiment name").fill("tone sweep")
    page.get_by_role("button", name="Create experiment").click()
    expect(page.locator('tr[data-experiment="tone-sweep"]')).to_be_visible()
    expect(page).to_have_url(re.compile(r"/experiments/$"))  # swapped in place, no navigation
    page.get_by_label("New experiment name").fill("tone sweep")
    page.get_by_role("button", name="Create experiment").click()
    expect(page.locator("#f-name-errors")).to_contain_text("already has an experiment")
    check_page(page)
    page.shot("experiments")
    page.locator('tr[data-experiment="tone-sweep"]').get_by_role("link", name="tone sweep").click()
    expect(page.get_by_role("heading", name="tone sweep")).to_be_visible()
    page.get_by_role("link", name="NEW RUN in this experiment").click()
    expect(page.get_by_label("Experiment")).to_have_value(str(project.experiments.get(slug="tone-sweep").pk))


def fill_common(page, name: str, dataset: str | None = "my-data@main") -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Base model").fill("org/base-model")
    if dataset:
        page.get_by_label("Dataset", exact=True).fill(dataset)


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo", "distill"])
def test_new_run_for_each_method(owner_page, project, method):
    page = owner_page
    page.get_by_role("link", name="NEW RUN").click()
    picker = page.get_by_label("Method", exact=True)
    assert [o.strip() for o in picker.locator("option").all_inner_texts()] == ["SFT", "DPO", "GRPO", "DISTILL"]
    picker.select_option(method)
    expect(page.locator("#method-fields")).to_have_attribute("data-method", method)
    fill_common(page, f"ui {method}", None if method == "grpo" else "my-data@main")
    if method == "dpo":
        expect(page.get_by_role("group", name="Preference loss")).to_be_visible()
        page.get_by_label("β (dpo_beta)").fill("0.2")
        page.get_by_label("Batch size (per device)").fill("2")
    elif method == "distill":
        expect(page.get_by_role("group", name="Distillation")).to_be_visible()
        page.get_by_label("Teacher model").fill("Qwen/Qwen2.5-72B-Instruct")
        page.get_by_label("Accelerators").fill("L4:1")
        page.get_by_label("Accelerators").press("Tab")
        expect(page.get_by_test_id("storage-estimate")).to_have_text("≈ 113.3 MB")
        expect(page.get_by_test_id("teacher-warning")).to_contain_text("too large for one L4")
        page.get_by_role("button", name="Pure distillation (ce_weight 0)").click()
        expect(page.get_by_label("CE weight (ce_weight)")).to_have_value("0")
        page.get_by_label("Accelerators").fill("CPU")
    elif method == "grpo":
        page.get_by_label("RL mode").select_option("ruler")
        expect(page.get_by_label("Judge system prompt")).to_be_visible()
        expect(page.get_by_label("Judge blocks (colocated judge)")).to_be_visible()
        page.get_by_label("RL mode").select_option("environment")
        expect(page.get_by_label("Environment", exact=True)).to_be_visible()
        expect(page.get_by_label("Max response length")).to_have_value("2048")
        # Quick try: short rollouts in both cards, the empty environment filled, and the GPU estimate asked again.
        with page.expect_request(re.compile(r"/training/new/fit\?.*max_response_length=8")):
            page.get_by_role("button", name=re.compile("^Quick try")).click()
        expect(page.get_by_label("Max response length")).to_have_value("8")
        expect(page.get_by_label("Max steps")).to_have_value("40")
        expect(page.get_by_label("Environment", exact=True)).to_have_value("builtin/arith@main")
        expect(page.get_by_label("Inference blocks", exact=True)).to_be_visible()
    check_page(page)
    page.shot(f"new-{method}")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    run = project.runs.get(name=f"ui {method}")
    assert run.status == Status.QUEUED and run.start_requested_at is None and run.method == method
    if method == "distill":
        assert run.config["distillation"]["ce_weight"] == 0 and run.config["distillation"]["teacher_model"] == "Qwen/Qwen2.5-72B-Instruct"
    if method == "dpo":
        assert run.config["loss"]["dpo_beta"] == 0.2
    if method == "grpo":
        assert {k: run.config[k] for k in ("max_steps", "learning_rate", "rollouts_per_prompt", "max_response_length", "environment_id")} == {
            "max_steps": 40, "learning_rate": 2e-2, "rollouts_per_prompt": 8, "max_response_length": 8, "environment_id": "builtin/arith@main"}
    assert tab_names(page) == EXPECTED_TABS[method]
    for tab in EXPECTED_TABS[method]:
        page.locator("nav.tabs").get_by_role("link", name=tab, exact=True).click()
        expect(page.locator('nav.tabs a[aria-current="page"]')).to_have_text(tab)
        expect(page).to_have_url(re.compile(rf"/{tab.lower()}/$"))
        if tab == "Configuration":
            card = {"dpo": "#preference-loss-card", "distill": "#distillation-card", "grpo": "#rl-card"}.get(method)
            if card:
                expect(page.locator(card)).to_be_visible()
        check_page(page)
        page.shot(f"{method}-{tab.lower()}")


def test_start_shows_422_findings_inline_for_a_run_missing_its_dataset(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    fill_common(page, "no data", dataset=None)
    page.get_by_role("button", name="Create run").click()
    start = page.locator("#start-btn")
    expect(start).to_be_disabled()
    expect(page.locator('#start-blockers li[data-field="dataset"]')).to_contain_text("SFT trains on a dataset")
    page.shot("start-blocked")
    page.locator("nav.tabs").get_by_role("link", name="Configuration").click()
    expect(page.locator("#f-dataset-errors")).to_contain_text("set dataset")
    page.get_by_role("link", name="Edit run").first.click()
    expect(page.locator("#f-dataset-errors")).to_contain_text("set dataset")  # next to the Dataset field
    check_page(page)
    page.shot("edit-with-findings")
    page.get_by_label("Dataset", exact=True).fill("org/sft-data")  # an HF id: nothing to check in the Data Hub
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#start-btn")).to_be_enabled()
    expect(page.locator("#start-blockers")).to_have_count(0)
    assert project.runs.get(name="no data").dataset == "org/sft-data"


def test_keyboard_only_new_run_and_tabs(owner_page, project):
    page = owner_page

    def tab_to(predicate_js: str, limit: int = 60) -> None:
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate(f"() => {{ const el = document.activeElement; return !!el && ({predicate_js}); }}"):
                return
        raise AssertionError(f"could not reach {predicate_js} with Tab")

    page.goto("/training/")
    tab_to("el.textContent.trim() === 'NEW RUN'")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/training/new/$"))
    tab_to("el.name === 'name'")
    page.keyboard.type("keyboard run")
    tab_to("el.name === 'method'")
    page.keyboard.press("ArrowDown")  # SFT → DPO
    expect(page.locator("#method-fields")).to_have_attribute("data-method", "dpo")
    tab_to("el.name === 'base_model'")
    page.keyboard.type("org/base")
    tab_to("el.name === 'dataset'")
    page.keyboard.type("prefs@main")
    tab_to("el.type === 'submit' && el.textContent.trim() === 'Create run'")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    assert project.runs.get(name="keyboard run").method == "dpo"
    tab_to("el.dataset && el.dataset.tab === 'lineage'")
    page.keyboard.press("Enter")
    expect(page.locator('nav.tabs a[aria-current="page"]')).to_have_text("Lineage")
    page.shot("keyboard")


def test_failed_run_shows_code_message_log_and_what_to_do(owner_page, project, users):
    run = services.create_run(project, users["owner"], name="oom run", method="sft", base_model="org/base", dataset="d@main")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.FAILED, error={"code": "oom", "message": "CUDA out of memory", "log_tail": [f"line {i}" for i in range(250)]})
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    expect(page.get_by_test_id("error-code")).to_have_text("oom")
    expect(page.locator(".failure")).to_contain_text("CUDA out of memory")
    expect(page.locator(".failure")).to_contain_text("Drop to a smaller base".lower()[0:0] + "drop to a smaller base")
    expect(page.locator(".failure summary")).to_have_text("Last 250 log lines".replace("250", "200"))
    expect(page.locator("#start-btn")).to_have_text("Start again")
    check_page(page)
    page.shot("failed")


def test_stop_asks_for_confirmation_and_shows_cancelled(owner_page, project, users):
    run = services.create_run(project, users["owner"], name="to stop", method="distill", base_model="org/base", dataset="d@main",
                              config={"distillation": {"teacher_model": "org/teacher"}})
    status_service.transition(run.pk, Status.PROVISIONING)
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    expect(page.get_by_test_id("run-status")).to_have_text("provisioning")
    # The engine starts reporting: status, progress and both DISTILL curves follow without a reload.
    status_service.transition(run.pk, Status.RUNNING)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key=k, step=s, value=3.0 / (s + 1) + (0.1 if k == "loss" else 0)) for s in range(1, 300) for k in ("loss", "kd_loss")])
    TrainingRun.objects.filter(pk=run.pk).update(progress={"step": 299, "max_steps": 1000, "tokens_per_s": 1234.5, "step_time_s": 0.5, "eta_s": 350})
    expect(page.get_by_test_id("run-status")).to_have_text("running", timeout=10_000)
    expect(page.locator("#run-figures")).to_contain_text("ETA")  # beside the status area, not in it
    expect(page.locator("#chart-0 canvas")).to_have_count(1, timeout=10_000)
    expect(page.locator("#chart-1 canvas")).to_have_count(1)
    expect(page.locator(".chart figcaption")).to_have_text(["KD Loss", "Training Loss (CE)"])
    page.shot("running")
    dialogs: list[str] = []

    def on_dialog(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", on_dialog)
    page.get_by_role("button", name="STOP").click()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    assert dialogs and "Stop \u2068to stop\u2069?" in dialogs[0]
    expect(page.locator("#start-btn")).to_have_text("Start again")
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    page.shot("cancelled")


def test_delete_asks_first_then_lands_on_the_list_saying_what_stays(owner_page, project, users):
    run = services.create_run(project, users["owner"], name="to delete", method="sft", base_model="org/base", dataset="d@main")
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.FAILED, error={"code": "TRAINING_ERROR", "message": "boom"})
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    dialogs: list[str] = []
    page.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Delete run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("failed")  # dismissed: nothing happened
    assert dialogs and "Delete \u2068to delete\u2069?" in dialogs[0] and f"branch run-{run.pk}" in dialogs[0]
    assert TrainingRun.objects.filter(pk=run.pk).exists()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete run").click()
    expect(page).to_have_url(re.compile(r"/training/$"))
    expect(page.locator("ul.messages")).to_contain_text(f"Run #{run.pk} (\u2068to delete\u2069) was deleted")
    expect(page.get_by_role("link", name="to delete", exact=True)).to_have_count(0)
    assert not TrainingRun.objects.filter(pk=run.pk).exists()
    check_page(page)
    page.shot("deleted")


def test_live_start_to_completed_with_loss_chart(owner_page, project, studio_worker, tiny_models):
    """START a tiny SFT run on the local backend (real Celery worker + engine), watch it complete."""
    page = owner_page
    page.goto("/training/new/")
    page.get_by_label("Name", exact=True).fill("tiny live sft")
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_label("Dataset", exact=True).fill(tiny_models["data_sft"])
    page.get_by_label("Max steps").fill("8")
    page.get_by_label("Learning rate").fill("1e-3")
    page.get_by_label("Batch size (per device)").fill("2")
    page.get_by_label("Config (YAML or JSON)").fill("logging_steps: 1\nheartbeat_interval_seconds: 1\n")
    page.get_by_role("button", name="Create run").click()
    expect(page.locator("#start-btn")).to_be_enabled()
    page.get_by_role("button", name="START").click()
    expect(page.get_by_test_id("run-status")).to_have_text(re.compile("queued|provisioning|running"))
    expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=240_000)
    expect(page.locator("#chart-0 canvas")).to_have_count(1, timeout=15_000)
    page.shot("completed")
    page.locator("nav.tabs").get_by_role("link", name="Checkpoints").click()
    expect(page.locator("table").first).to_contain_text("final")
    page.shot("checkpoints")
    # The worker commits the final weights to the run's Data Hub branch; Repository lists and downloads them.
    for _ in range(90):
        page.goto(page.url.rsplit("/", 2)[0] + "/repository/")
        if page.locator("td.ref", has_text="final/config.json").count():
            break
        page.wait_for_timeout(1000)
    link = page.locator("tr", has=page.locator("td.ref", has_text="final/config.json")).get_by_role("link", name=re.compile("Download"))
    with page.expect_download() as download:
        link.click()
    assert download.value.suggested_filename == "config.json"
    page.shot("repository")


def test_live_stop_a_running_run(owner_page, project, studio_worker, tiny_models):
    run = services.create_run(project, None, name="long sft", method="sft", base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                              config={"max_steps": 100000, "learning_rate": 1e-3, "per_device_train_batch_size": 2, "heartbeat_interval_seconds": 1})
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    page.get_by_role("button", name="START").click()
    expect(page.get_by_test_id("run-status")).to_have_text("running", timeout=180_000)
    page.on("dialog", lambda d: d.accept())
    page.get_by_role("button", name="STOP").click()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    page.shot("stopped")


def test_deleting_a_secret_asks_first(owner_page, project, users):
    from studio.models import ProjectSecret
    from studio.services import set_secret

    set_secret(project, "JUDGE_KEY", "sk-test")
    page = owner_page
    page.goto("/settings/secrets/")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Delete secret JUDGE_KEY").click()
    expect(page.get_by_role("button", name="Delete secret JUDGE_KEY")).to_be_visible()
    assert asked and "Delete secret JUDGE_KEY?" in asked[0] and ProjectSecret.objects.filter(project=project, name="JUDGE_KEY").exists()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete secret JUDGE_KEY").click()
    expect(page.locator("ul.messages")).to_contain_text("Deleted secret JUDGE_KEY.")
    expect(page.get_by_role("button", name="Delete secret JUDGE_KEY")).to_have_count(0)
    assert not ProjectSecret.objects.filter(project=project, name="JUDGE_KEY").exists()
    check_page(page)


def test_switching_the_method_away_and_back_keeps_what_was_typed_in_its_card(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    picker = page.get_by_label("Method", exact=True)
    expect(page.get_by_label("Learning rate")).to_have_attribute("placeholder", "2e-5")
    picker.select_option("dpo")
    # A blank learning rate trains at the method's default, which the field now says (it showed 2e-4 for all).
    expect(page.get_by_label("Learning rate")).to_have_attribute("placeholder", "1e-6")
    expect(page.get_by_label("Learning rate")).to_have_accessible_description(re.compile("Blank trains at 1e-6, the default for DPO"))
    page.get_by_label("Max steps").fill("12")
    page.get_by_label("β (dpo_beta)").fill("0.3")
    page.get_by_label("Reference-free (score without a frozen reference copy)").check()
    picker.select_option("sft")
    expect(page.locator("#method-fields")).to_have_attribute("data-method", "sft")
    expect(page.get_by_label("β (dpo_beta)")).to_have_count(0)
    picker.select_option("dpo")
    expect(page.locator("#method-fields")).to_have_attribute("data-method", "dpo")
    expect(page.get_by_label("β (dpo_beta)")).to_have_value("0.3")  # was back to the default 0.1
    expect(page.get_by_label("Reference-free (score without a frozen reference copy)")).to_be_checked()
    expect(page.get_by_label("Max steps")).to_have_value("12")  # the training card, swapped with the method, keeps it
    # What the SFT card does not show is not part of an SFT run.
    picker.select_option("sft")
    fill_common(page, "carried")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    assert "loss" not in project.runs.get(name="carried").config


def test_start_again_of_a_run_with_saved_steps_says_it_trains_from_step_0_before_it_does(owner_page, project, users):
    """Start again quietly trained from step 0 while the Checkpoints tab had steps to resume from."""
    from training.models import Checkpoint, LogLine

    run = services.create_run(project, users["owner"], name="dpo stopped", method="dpo", base_model="org/base", dataset="org/prefs",
                              config={"lora_rank": 8, "loss": {"type": "dpo"}, "save_steps": 5, "max_steps": 60})
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    TrainingRun.objects.filter(pk=run.pk).update(attempt=1)
    LogLine.objects.create(run=run, attempt=1, line="attempt 1 step 21")
    for step in (5, 10, 15, 20):
        Checkpoint.objects.create(run=run, attempt=1, step=step, path=f"/out/checkpoint-{step}")
    status_service.transition(run.pk, Status.CANCELLED)
    page = owner_page
    page.goto(f"/training/runs/{run.pk}/")
    note = page.get_by_test_id("start-again-note")
    expect(note).to_contain_text("Start again trains from step 0")
    expect(page.locator("#start-btn")).to_have_accessible_description(re.compile("Resume from here"))
    dialogs: list[str] = []
    page.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.locator("#start-btn").click()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")  # dismissed: nothing started
    assert dialogs and "again from step 0?" in dialogs[0] and "Resume from here on the Checkpoints tab" in dialogs[0]
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.start_requested_at is None and run.attempt == 1
    check_page(page)
    page.shot("start-again-note")
    note.get_by_role("link", name="Checkpoints tab").click()
    expect(page.get_by_role("button", name="Resume from here (step 20)")).to_be_visible()
    page.get_by_role("link", name="Overview").click()
    page.get_by_test_id("log-links").get_by_role("link", name="Full log").click()
    expect(page.locator("#full-log")).to_contain_text("attempt 1 step 21")
    check_page(page)
    page.shot("full-log")
