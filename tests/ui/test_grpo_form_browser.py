"""NEW RUN for GRPO in a real browser: the fields GRPO refuses (epochs, per-device batch, accumulation)
are not offered, and a GRPO run created from the form carries none of them, even after they were typed
for another method."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from playwright.sync_api import expect

from training.models import TrainingRun

EPOCH_BATCH_LABELS = ("Epochs", "Batch size (per device)", "Gradient accumulation steps")


def test_grpo_form_hides_and_never_sends_epochs_batch_or_accumulation(owner_page, project):
    page = owner_page
    page.goto("/training/new/")
    for label, value in zip(EPOCH_BATCH_LABELS, ("2", "4", "3"), strict=True):
        page.get_by_label(label, exact=True).fill(value)
    page.get_by_label("Method", exact=True).select_option("grpo")
    expect(page.locator("#card-grpo")).to_be_visible()
    for label in EPOCH_BATCH_LABELS:
        expect(page.get_by_label(label, exact=True)).to_have_count(0)
    expect(page.get_by_label("Max steps", exact=True)).to_be_visible()
    page.get_by_label("Name", exact=True).fill("grpo from the form")
    page.get_by_label("Base model").fill("org/base-model")
    page.get_by_label("Environment", exact=True).fill("builtin/arith@main")
    page.shot("grpo-no-epochs")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    config = TrainingRun.objects.get(project=project, name="grpo from the form").config
    assert not {"per_device_train_batch_size", "gradient_accumulation_steps"} & set(config) and config.get("num_epochs", 1) == 1, config


def test_switching_back_from_grpo_keeps_what_was_typed_for_epochs_and_batch(owner_page):
    page = owner_page
    page.goto("/training/new/")
    page.get_by_label("Epochs", exact=True).fill("2")
    page.get_by_label("Method", exact=True).select_option("grpo")
    expect(page.get_by_label("Epochs", exact=True)).to_have_count(0)
    page.get_by_label("Method", exact=True).select_option("sft")
    expect(page.get_by_label("Epochs", exact=True)).to_have_value("2")


def test_the_demo_model_typed_after_picking_grpo_gets_a_rollout_length_it_can_start_with(owner_page, project, tiny_models):
    # QA: the form's 2048 was refused at START on the demo model ("set max_response_length below 512").
    page = owner_page
    page.goto("/training/new/?method=grpo")
    expect(page.get_by_label("Environment", exact=True)).to_have_value("builtin/arith@main")
    expect(page.get_by_label("Max response length", exact=True)).to_have_value("2048")
    page.get_by_label("Name", exact=True).fill("grpo on the demo")
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_label("Base model").press("Tab")  # a change of the form: the fit estimate's request fits the length
    expect(page.get_by_label("Max response length", exact=True)).to_have_value("256")
    expect(page.locator("#grpo-numbers")).to_contain_text("attends over 512 positions")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    expect(page.locator("#start-btn")).to_be_enabled()
    assert TrainingRun.objects.get(project=project, name="grpo on the demo").config["max_response_length"] == 256


def test_a_bigger_model_chosen_after_the_demo_one_brings_the_default_rollout_length_back(owner_page, tiny_models, tmp_path):
    # QA: the 256 fitted to the demo model stayed when a model with 4096 positions was chosen after it.
    from tests.ui.test_grpo_form_defaults import long_context_model

    page = owner_page
    page.goto("/training/new/?method=grpo")
    length = page.get_by_label("Max response length", exact=True)
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_label("Base model").press("Tab")
    expect(length).to_have_value("256")
    page.get_by_label("Base model").fill(long_context_model(tiny_models["student"], tmp_path))
    page.get_by_label("Base model").press("Tab")
    expect(length).to_have_value("2048")
    expect(page.locator("#grpo-numbers")).not_to_contain_text("attends over")
    # A length the user typed is theirs: the demo model chosen again leaves it.
    length.fill("100")
    length.press("Tab")
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_label("Base model").press("Tab")
    page.wait_for_load_state("networkidle")
    expect(length).to_have_value("100")


def test_quick_try_clicked_straight_after_typing_a_base_model_keeps_its_8_token_rollouts(owner_page, project, tiny_models):
    # QA: the click ended the Base model edit, so the fit estimate's request (which fits the rollout
    # length to the model: 256 on the demo one) went out too, and when it was answered after Quick
    # try's, its 256 replaced the preset's 8. The fit is answered 1 s late here to make that order sure.
    page = owner_page
    page.route("**/training/new/fit*", lambda route: (page.wait_for_timeout(1000), route.continue_()))
    page.goto("/training/new/?method=grpo")
    page.get_by_label("Name", exact=True).fill("quick on the demo")
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_role("button", name="Quick try (8 × 8-token rollouts, 40 steps)").click()
    page.wait_for_timeout(2500)  # both answers are in
    expect(page.get_by_label("Max response length", exact=True)).to_have_value("8")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    assert TrainingRun.objects.get(project=project, name="quick on the demo").config["max_response_length"] == 8
    page.unroute_all(behavior="wait")  # a fit still held must finish here, not in the next test's page


def test_grpo_numbers_typed_while_the_fit_is_pending_are_not_replaced_by_its_answer(owner_page, project, tiny_models):
    # QA: typed straight after the Base model, Rollouts per prompt 4 and Max response length 8 went back
    # to 8 and 256 when the fit estimate's answer came: it swapped in the numbers its request was sent
    # with. The first fit is held here until both are typed, which makes that order sure.
    page = owner_page
    held: list = []

    def hold_the_first_fit_of_the_model(route):
        if not held and parse_qs(urlsplit(route.request.url).query).get("base_model"):
            held.append(route)
        else:
            route.continue_()

    page.route("**/training/new/fit*", hold_the_first_fit_of_the_model)
    page.goto("/training/new/?method=grpo")
    page.get_by_label("Name", exact=True).fill("typed while fitting")
    page.get_by_label("Base model").fill(tiny_models["student"])
    page.get_by_label("Base model").press("Tab")  # its change: the fit request goes out (8 and 2048), and is held
    while not held:
        page.wait_for_timeout(50)
    rollouts, length = page.get_by_label("Rollouts per prompt", exact=True), page.get_by_label("Max response length", exact=True)
    rollouts.fill("4")
    length.fill("8")
    held[0].continue_()
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(500)  # the held answer and the one the typing asked for are both swapped in
    expect(rollouts).to_have_value("4")
    expect(length).to_have_value("8")
    length.press("Tab")
    page.wait_for_load_state("networkidle")
    expect(length).to_have_value("8")
    page.get_by_role("button", name="Create run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
    config = TrainingRun.objects.get(project=project, name="typed while fitting").config
    assert (config["rollouts_per_prompt"], config["max_response_length"]) == (4, 8), config
    page.unroute_all(behavior="wait")
