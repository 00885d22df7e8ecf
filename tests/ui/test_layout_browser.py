"""Layout in a real browser at a phone's width (390 px) and a laptop's (1280 px): no page scrolls
sideways, controls do not overlap or leave the viewport, long names wrap or are cut with an
ellipsis (the full name in a title), and the run list's filter controls match and share a row.
Screenshots land in var/test-artifacts/ui/<test name>/."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from datahub import services as hub
from environments import services as env_services
from experiments.services import create_experiment
from studio.services import set_secret
from studio.webhooks import create_webhook, send_test
from tests.ui.conftest import login
from training import services
from training import status as status_service
from training.backends.local import run_dir
from training.models import Checkpoint, MetricPoint, Rollout, Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = [390, 1280]
LONG_NAME = "x" * 200  # the longest name an experiment can have, without a space to break at

# How far the page scrolls sideways, and what sticks out of it: each element past the right edge
# whose parent is not (the outermost culprits), so a failure says where to look.
OVERFLOW = """() => {
  const root = document.documentElement, width = root.clientWidth;
  const out = el => el.getBoundingClientRect().right > width + 0.5;
  const culprits = [...document.body.querySelectorAll('*')].filter(el => out(el) && !(el.parentElement && out(el.parentElement)))
    .slice(0, 5).map(el => `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}.${el.className}: right ${Math.round(el.getBoundingClientRect().right)}`);
  return {by: root.scrollWidth - width, culprits};
}"""

# Controls (fields and buttons) that are shown: none may overlap another, and none may reach past
# the viewport, unless it lies in a scrolling box (.table-wrap), which it may not leave.
CONTROL_PROBLEMS = """() => {
  const width = document.documentElement.clientWidth;
  const shown = el => { const r = el.getBoundingClientRect();
    return r.width > 1 && r.height > 1 && el.checkVisibility({visibilityProperty: true}); };  // not in a closed <details>
  const name = el => `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} "${(el.textContent || el.name || '').trim().slice(0, 30)}"`;
  const controls = [...document.querySelectorAll('main button, main input:not([type=hidden]), main select, main textarea, main a.btn-primary, header button, header select')].filter(shown);
  const problems = [];
  for (const el of controls) {
    const r = el.getBoundingClientRect(), box = el.closest('.table-wrap');
    const [left, right] = box ? [box.getBoundingClientRect().left, box.getBoundingClientRect().left + box.scrollWidth] : [0, width];
    if (r.left < left - 0.5 || r.right > right + 0.5) problems.push(`${name(el)} is outside ${box ? 'its table' : 'the viewport'} (${Math.round(r.left)}–${Math.round(r.right)})`);
  }
  for (let i = 0; i < controls.length; i++) for (let j = i + 1; j < controls.length; j++) {
    const a = controls[i].getBoundingClientRect(), b = controls[j].getBoundingClientRect();
    if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
      problems.push(`${name(controls[i])} overlaps ${name(controls[j])}`);
  }
  return problems;
}"""


def layout_problems(page, width: int, where: str) -> list[str]:
    found = page.evaluate(OVERFLOW)
    problems = [f"{where} at {width} px scrolls sideways by {found['by']} px: {found['culprits']}"] if found["by"] > 0 else []
    return problems + [f"{where} at {width} px: {p}" for p in page.evaluate(CONTROL_PROBLEMS)]


def assert_fits(page, width: int, where: str) -> None:
    problems = layout_problems(page, width, where)
    assert not problems, "\n".join(problems)


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def sized(request, transactional_db, project, page):
    """The owner of acme logged in, in a viewport `width` px wide: (width, page)."""
    page.set_viewport_size({"width": request.param, "height": 900})
    login(page)
    return request.param, page


def lora_run_with_checkpoints(project, user, experiment=None) -> TrainingRun:
    """A completed LoRA SFT run that saved every 5 steps: committed checkpoints (Download, Resume,
    Merge: each with hidden text for screen readers), its adapter and a merged model."""
    run = services.create_run(project, user, name="sft-ckpt", method="sft", experiment=experiment, base_model="org/base", dataset="org/data",
                              config={"lora_rank": 8, "save_steps": 5, "max_steps": 20})
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.RUNNING)
    for step, kind in [(5, "checkpoint"), (10, "checkpoint"), (15, "checkpoint"), (20, "checkpoint"), (20, "adapter"), (20, "merged")]:
        folder = run_dir(run.pk, 1) / "output" / f"{kind}-{step}"
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"weights")
        hub.commit_checkpoint(Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=str(folder)).pk)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=2.0 / s) for s in range(1, 21)])
    TrainingRun.objects.filter(pk=run.pk).update(progress={"step": 20, "max_steps": 20, "tokens_per_s": 7617.0, "step_time_s": 0.1})
    status_service.transition(run.pk, Status.COMPLETED)
    return run


def add_failing_webhook(project, settings) -> None:
    """A webhook with a long URL nothing answers at, and its ping's delivery, tried (eagerly) and failed."""
    from studio.celery import app

    settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = True
    webhook, _ = create_webhook(project, "https://127.0.0.1:9/hooks/studio/team-notifications-for-the-nightly-training-runs?source=studio", None)
    app.conf.task_always_eager = True
    try:
        send_test(webhook)
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def studio_data(project, users, settings, tmp_path):
    """What each page shows when it has content: runs of two methods (checkpoints, rollouts),
    an experiment, a published model, a forked environment, a secret and a webhook that failed."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    owner = users["owner"]
    experiment = create_experiment(project, "tone sweep")
    sft = lora_run_with_checkpoints(project, owner, experiment=experiment.pk)
    grpo = services.create_run(project, owner, name="grpo arith", method="grpo", experiment=experiment.pk, base_model="org/base",
                               config={"environment_id": "builtin/arith@main"})
    Rollout.objects.bulk_create([Rollout(run=grpo, step=10, prompt="What is 12 + 30?", completion=f"The answer is {40 + i}.",
                                         reward=float(i == 2), advantage=0.5 if i == 2 else -0.1) for i in range(4)])
    env_services.fork(project, "gsm-maths", "my-maths", user=owner)
    set_secret(project, "OPENAI_API_KEY", "sk-test")
    add_failing_webhook(project, settings)
    return {"sft": sft, "grpo": grpo, "experiment": experiment}


def tour(data) -> list[str]:
    sft, grpo = data["sft"], data["grpo"]
    return (["/training/", "/training/new/"]
            + [f"/training/runs/{sft.pk}/{tab}/" for tab in ("overview", "configuration", "datasets", "checkpoints", "lineage", "repository")]
            + [f"/training/runs/{grpo.pk}/{tab}/" for tab in ("overview", "configuration", "environment", "rollouts", "repository")]
            + ["/experiments/", f"/experiments/{data['experiment'].pk}/", "/models/", "/environments/", "/environments/my-maths/",
               "/settings/billing/", "/settings/secrets/", "/settings/api-tokens/", "/settings/webhooks/"])


def test_every_page_fits_the_viewport(sized, studio_data):
    width, page = sized
    problems: list[str] = []
    for url in tour(studio_data):
        page.goto(url)
        expect(page.locator("main")).to_be_visible()
        problems += layout_problems(page, width, url)
        page.shot(url.strip("/").replace("/", "-"))
    assert problems == [], "\n".join(problems)


def test_checkpoints_tab_keeps_hidden_action_text_inside_its_table(sized, project, users, settings, tmp_path):
    """The table scrolls in its own box at 390 px; the screen-reader text of Download, Resume and
    Merge (absolutely positioned) made the whole page 516 px wide."""
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    width, page = sized
    run = lora_run_with_checkpoints(project, users["owner"])
    page.goto(f"/training/runs/{run.pk}/checkpoints/")
    expect(page.locator("tr[data-checkpoint]")).to_have_count(6)
    expect(page.get_by_role("button", name="Resume from here (step 20)")).to_have_count(1)
    expect(page.get_by_role("link", name="Download step 15")).to_have_count(1)
    page.shot("checkpoints")
    assert page.evaluate(OVERFLOW)["by"] <= 0
    # The table may scroll in its box at 390 px, but its paths stay readable (not three letters a line).
    assert min(page.locator("tr[data-checkpoint] td.ref").evaluate_all("els => els.map(el => el.getBoundingClientRect().width)")) >= 120
    # Every piece of hidden text lies within the box that clips it, wherever that box is scrolled to.
    escaped = page.evaluate("""() => [...document.querySelectorAll('.visually-hidden')].filter(el => {
      const box = el.closest('.table-wrap'); if (!box) return false;
      const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
      return r.right > b.left + box.scrollWidth + 0.5 || r.left < b.left - box.scrollWidth - 0.5 || el.offsetParent === document.body;
    }).map(el => el.textContent)""")
    assert escaped == []
    assert_fits(page, width, "checkpoints")


def test_long_experiment_name_wraps_or_is_cut_and_filters_keep_their_row(sized, project, users):
    width, page = sized
    experiment = create_experiment(project, LONG_NAME)
    create_experiment(project, "short one")
    run = services.create_run(project, users["owner"], name="in a long experiment", method="sft", experiment=experiment.pk,
                              base_model="org/base", dataset="org/data")

    page.goto("/experiments/")
    row = page.locator(f'tr[data-experiment="{experiment.slug}"]')
    expect(row).to_be_visible()
    page.shot("experiments")
    assert_fits(page, width, "/experiments/")
    # The name wraps within its cell, and the other columns stay in view: at 1280 px all of them
    # (the table does not scroll); at 390 px the table may scroll in its box, but not by a name's length.
    name = row.get_by_role("link", name=LONG_NAME)
    assert name.evaluate("el => el.getClientRects().length") > 1, "the long name is on one line"
    table_scroll = "() => { const w = document.querySelector('#experiments .table-wrap'); return w.scrollWidth - w.clientWidth; }"
    assert page.evaluate(table_scroll) <= (0 if width >= 1280 else 150)  # its columns may scroll a little at 390 px; a long name would be 1000s
    for header in ("Runs", "Data Hub repo", "Created") if width >= 1280 else ("Runs",):
        box = page.get_by_role("columnheader", name=header).bounding_box()
        assert box and box["x"] + box["width"] <= width, f"{header} is out of view"

    page.goto("/training/")
    expect(page.locator("#run-rows tr")).to_have_count(1)
    page.shot("training")
    assert_fits(page, width, "/training/")
    # The Experiment filter keeps a sensible width; at 1280 px Search stays on its row.
    select = page.get_by_label("Experiment").bounding_box()
    search = page.get_by_label("Search").bounding_box()
    assert select and search and select["width"] <= 320
    if width >= 1280:
        assert abs(select["y"] - search["y"]) < 1, "Search was pushed onto a row of its own"
    # The run's Experiment cell is cut with an ellipsis; the full name is its title.
    cell = page.locator(f'tr[data-run="{run.pk}"]').get_by_role("link", name=LONG_NAME)
    assert cell.get_attribute("title") == LONG_NAME
    assert cell.evaluate("el => getComputedStyle(el).textOverflow") == "ellipsis"
    assert cell.evaluate("el => el.scrollWidth > el.clientWidth"), "the name is not cut"
    assert (cell.bounding_box() or {"width": 1e9})["width"] <= 320
    if width >= 1280:
        assert page.evaluate("() => { const w = document.querySelector('#run-list .table-wrap'); return w.scrollWidth - w.clientWidth; }") <= 0

    for url in (f"/experiments/{experiment.pk}/", f"/training/runs/{run.pk}/", "/training/new/", f"/training/new/?experiment={experiment.pk}"):
        page.goto(url)
        expect(page.locator("main")).to_be_visible()
        page.shot(url.strip("/").replace("/", "-").replace("?", "-"))
        assert_fits(page, width, url)


def test_search_matches_the_filter_selects(sized, project):
    width, page = sized
    page.goto("/training/")
    style = """el => { const s = getComputedStyle(el), r = el.getBoundingClientRect();
      return {font: s.fontSize + ' ' + s.fontFamily, padding: s.padding, border: s.border, radius: s.borderRadius, background: s.backgroundColor, height: Math.round(r.height)}; }"""
    select = page.get_by_label("Method").evaluate(style)
    search = page.get_by_label("Search").evaluate(style)
    page.shot("filters")
    assert search == select
    if width >= 1280:
        tops = {round((page.get_by_label(label).bounding_box() or {"y": -1})["y"]) for label in ("Status", "Method", "Experiment", "Search")}
        assert len(tops) == 1, "the filters are not on one row"


def test_environment_tab_wraps_a_pinned_commit(sized, project, users):
    width, page = sized
    run = services.create_run(project, users["owner"], name="grpo pinned", method="grpo", base_model="org/base",
                              config={"environment_id": "my-env@main"})
    TrainingRun.objects.filter(pk=run.pk).update(pinned={"config.environment_id": {"ref": "my-env@main", "commit": "c0ffee" * 6 + "abcd", "repo": "acme/my-env"}})
    page.goto(f"/training/runs/{run.pk}/environment/")
    expect(page.get_by_test_id("environment-pin")).to_contain_text("c0ffee" * 6 + "abcd")
    assert_fits(page, width, "environment tab")


def test_a_new_api_tokens_answer_fits_with_its_token_and_curl_example(sized, project):
    width, page = sized
    page.goto("/settings/api-tokens/")
    page.get_by_label("Name").fill("laptop")
    page.get_by_role("button", name="Make token").click()
    token = page.get_by_role("textbox", name="Token", exact=True)
    expect(token).to_have_value(re.compile(r"^stu_"))
    expect(page.locator("pre.code")).to_contain_text(token.input_value())
    page.shot("new-token")
    assert_fits(page, width, "new API token")
