"""The run page after "Start again" and for GRPO runs (Django's test client): earlier attempts'
logs, what Start again trains from, GRPO's Checkpoints, Lineage and Datasets tabs, and a
Checkpoints note that speaks only of what the rows offer."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from training import services
from training.models import Checkpoint, LogLine, Status, TrainingRun

pytestmark = pytest.mark.django_db

TRACEBACK = ["Traceback (most recent call last):", "ValueError: the reward function returned None"]


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def sft_run(project, user, **config) -> TrainingRun:
    return services.create_run(project, user, name="sft", method="sft", base_model="org/base", dataset="org/data", config=config)


def grpo_run(project, user, dataset=None, **config) -> TrainingRun:
    config = {"rl_mode": "environment", "environment_id": "builtin/arith@main", **config}
    return services.create_run(project, user, name="grpo", method="grpo", base_model="org/base", dataset=dataset, config=config)


# ---- logs of earlier attempts ---------------------------------------------------------------------

@pytest.fixture
def restarted(project, users):
    """A run whose attempt 1 failed with a traceback, started again: attempt 2 is training."""
    run = sft_run(project, users["owner"])
    LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=line) for line in ["attempt 1 step 1", *TRACEBACK]])
    LogLine.objects.bulk_create([LogLine(run=run, attempt=2, line=f"attempt 2 step {i}") for i in range(3)])
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2, status=Status.RUNNING)
    return TrainingRun.objects.get(pk=run.pk)


def test_overview_links_the_full_log_and_each_earlier_attempts_log(users, restarted):
    run, client = restarted, client_for(users["viewer"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    box = html.split('id="training-log"')[1].split("</pre>")[0]
    assert "attempt 2 step 2" in box and "ValueError" not in box
    assert "(attempt 2, last 3 lines)" in html
    links = re.search(r'<p class="log-links"[^>]*>(.*?)</p>', html, re.S).group(1)
    assert f'href="/training/runs/{run.pk}/log">Full log</a>' in links and f'href="/training/runs/{run.pk}/log?attempt=1">attempt 1</a>' in links
    live = client.get(f"/training/runs/{run.pk}/live", HTTP_HX_REQUEST="true").content.decode()  # the box's refresh keeps the links
    assert f"/training/runs/{run.pk}/log?attempt=1" in live


def test_the_log_page_shows_an_earlier_attempts_whole_log(users, restarted):
    run, client = restarted, client_for(users["viewer"])
    first = client.get(f"/training/runs/{run.pk}/log", {"attempt": "1"})
    html = first.content.decode()
    assert first.status_code == 200
    assert "ValueError: the reward function returned None" in html and "attempt 2 step" not in html
    assert 'aria-current="page">Attempt 1</a>' in html and "3 lines" in html
    assert f"/api/training-runs/{run.pk}/logs?after=0&amp;attempt=1" in html
    current = client.get(f"/training/runs/{run.pk}/log").content.decode()
    assert "attempt 2 step 0" in current and "ValueError" not in current and "(attempt 2)" in current
    text = client.get(f"/training/runs/{run.pk}/log.txt", {"attempt": "1"})
    assert text["Content-Type"].startswith("text/plain") and b"".join(text.streaming_content).decode() == "\n".join(["attempt 1 step 1", *TRACEBACK]) + "\n"


@pytest.mark.parametrize("attempt", ["3", "0", "two"])
def test_the_log_page_of_an_attempt_the_run_never_had_is_a_404_that_says_so(users, restarted, attempt):
    response = client_for(users["owner"]).get(f"/training/runs/{restarted.pk}/log", {"attempt": attempt})
    assert response.status_code == 404 and "its attempts are 1 to 2" in response.content.decode()
    assert client_for(users["owner"]).get(f"/training/runs/{restarted.pk}/log.txt", {"attempt": attempt}).status_code == 404


def test_an_outsider_gets_404_for_a_runs_log(users, restarted):
    assert client_for(users["outsider"]).get(f"/training/runs/{restarted.pk}/log").status_code == 404
    assert client_for(users["outsider"]).get(f"/training/runs/{restarted.pk}/log.txt").status_code == 404


def test_a_failed_runs_box_links_to_its_full_log(project, users):
    from training import status as status_service

    run = sft_run(project, users["owner"])
    status_service.transition(run.pk, Status.PROVISIONING)
    status_service.transition(run.pk, Status.FAILED, error={"code": "training_error", "message": "boom", "log_tail": TRACEBACK})
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/").content.decode()
    failure = html.split('class="failure"')[1].split("</section>")[0]
    assert f'href="/training/runs/{run.pk}/log">Full log</a>' in failure


# ---- what Start again trains from ---------------------------------------------------------------

def start_form(html: str) -> str:
    return re.search(r'<form[^>]*action="/training/runs/\d+/start"[^>]*>', html).group(0)


def test_start_again_on_a_run_with_saved_steps_says_it_trains_from_step_zero(project, users):
    run = sft_run(project, users["owner"], save_steps=5)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.CANCELLED, attempt=1)
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert "start-again-note" not in html and "hx-confirm" not in start_form(html)  # nothing saved: nothing to resume instead
    Checkpoint.objects.create(run=run, attempt=1, step=5, path="/out/checkpoint-5")
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    note = re.search(r'<p class="muted" id="start-again-note"[^>]*>(.*?)</p>', html, re.S).group(1)
    assert "Start again trains from step 0, in a new attempt" in note and "Resume from here" in note
    assert f'href="/training/runs/{run.pk}/checkpoints/"' in note
    form = start_form(html)
    assert "again from step 0?" in form and "Resume from here on the Checkpoints tab" in form
    assert 'aria-describedby="start-again-note"' in html
    # A viewer cannot start it: no note about starting.
    assert "start-again-note" not in client_for(users["viewer"]).get(f"/training/runs/{run.pk}/").content.decode()


def test_start_again_of_a_resumed_run_says_it_trains_from_its_parents_step(project, users):
    parent = sft_run(project, users["owner"], save_steps=5, max_steps=20)
    saved = Checkpoint.objects.create(run=parent, attempt=1, step=5, path="/out/checkpoint-5")
    child = sft_run(project, users["owner"], save_steps=5, max_steps=20)
    TrainingRun.objects.filter(pk=child.pk).update(parent=parent, resume_checkpoint=saved, status=Status.FAILED, attempt=1)
    Checkpoint.objects.create(run=child, attempt=1, step=10, path="/out/checkpoint-10")
    html = client_for(users["owner"]).get(f"/training/runs/{child.pk}/").content.decode()
    assert f"Start again trains from step 5 of run #{parent.pk}, where this run was resumed from" in html


# ---- GRPO's tabs ----------------------------------------------------------------------------------

def tabs(html: str) -> list[str]:
    return re.findall(r'data-tab="([a-z]+)"', html)


def test_a_grpo_runs_checkpoints_can_be_resumed_and_merged_from_its_page(project, users):
    run = grpo_run(project, users["owner"], lora_rank=8, save_steps=10, max_steps=40)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    for step in (10, 20, 30, 40):
        Checkpoint.objects.create(run=run, attempt=1, step=step, path=f"/out/checkpoint-{step}")
    client = client_for(users["owner"])
    assert tabs(client.get(f"/training/runs/{run.pk}/").content.decode()) == [
        "overview", "configuration", "environment", "rollouts", "checkpoints", "try", "lineage", "repository"]
    html = client.get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    assert f'action="/training/runs/{run.pk}/checkpoints/20/resume"' in html and f'action="/training/runs/{run.pk}/checkpoints/20/merge"' in html
    assert client.post(f"/training/runs/{run.pk}/checkpoints/20/merge", {"attempt": "1"}).status_code == 302
    assert list(Checkpoint.objects.filter(run=run, merge_requested_at__isnull=False).values_list("step", flat=True)) == [20]
    response = client.post(f"/training/runs/{run.pk}/checkpoints/20/resume", {"attempt": "1"})
    child = TrainingRun.objects.get(parent=run)
    assert response.status_code == 302 and child.method == "grpo" and child.resume_checkpoint.step == 20
    lineage = client.get(f"/training/runs/{child.pk}/lineage/")
    assert lineage.status_code == 200 and "Resumed from (step 20 of attempt 1)" in lineage.content.decode()


def test_a_grpo_run_with_a_prompts_dataset_shows_its_datasets_tab(project, users):
    client = client_for(users["owner"])
    run = grpo_run(project, users["owner"], dataset={"ref": "org/prompts", "type": "prompts"})
    assert tabs(client.get(f"/training/runs/{run.pk}/").content.decode()) == [
        "overview", "configuration", "datasets", "environment", "rollouts", "checkpoints", "lineage", "repository"]
    html = client.get(f"/training/runs/{run.pk}/datasets/").content.decode()
    assert "org/prompts" in html and "Hugging Face" in html
    assert "org/prompts" in client.get(f"/training/runs/{run.pk}/lineage/").content.decode()


def test_a_grpo_ruler_runs_prompts_dataset_is_on_its_datasets_and_lineage_tabs(project, users):
    run = services.create_run(project, users["owner"], name="ruler", method="grpo", base_model="org/base", config={
        "rl_mode": "ruler", "ruler_task_args": {"dataset": "org/ruler-prompts", "system_prompt": "be nice"}})
    client = client_for(users["owner"])
    assert "datasets" in tabs(client.get(f"/training/runs/{run.pk}/").content.decode())
    html = client.get(f"/training/runs/{run.pk}/datasets/").content.decode()
    assert "org/ruler-prompts" in html and "prompts (ruler_task_args)" in html
    assert "Prompts (RULER task)" in client.get(f"/training/runs/{run.pk}/lineage/").content.decode()


def lineage_rows(html: str) -> dict[str, str]:
    """The Lineage table's rows, keyed by role: each row's cells after the role, as HTML."""
    rows = re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", html)
    return dict(rows)


def test_a_grpo_runs_lineage_lists_its_environment_repo_at_the_commit_start_pinned(project, users, settings, tmp_path):
    from datahub.commits import commit_files
    from datahub.models import Repo
    from datahub.refs import pin_refs
    from environments import services as env_services

    settings.DATAHUB_ROOT = tmp_path / "hub"
    fork = env_services.fork(project, "gsm-maths", "my-maths", user=users["owner"])
    run = grpo_run(project, users["owner"], environment_id="my-maths@main")
    TrainingRun.objects.filter(pk=run.pk).update(pinned=pin_refs(run), status=Status.COMPLETED, attempt=1)  # as START pins it
    commit_files(Repo.objects.get(project=project, name="my-maths"), "main", {"NOTES.md": b"later"}, message="Notes")  # main moves on
    run.refresh_from_db()
    assert run.pinned["config.environment_id"]["commit"] == fork["commit"]
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/lineage/").content.decode()
    row = lineage_rows(html)["Environment (rewards)"]
    assert '<a href="/hub/acme/my-maths/tree/main">my-maths@main</a>' in row and "Data Hub" in row
    assert f'<a href="/hub/acme/my-maths/tree/{fork["commit"]}">{fork["commit"]}</a>' in row  # the repo at the pinned commit, not at main


@pytest.mark.parametrize(("environment", "source"), [("builtin/arith@main", "Built into the engine"), ("builtin/gsm-maths@main", "Studio catalogue")])
def test_a_grpo_runs_lineage_lists_a_builtin_environment_as_not_versioned_from_the_source_its_tab_names(project, users, environment, source):
    # QA: builtin/arith's Environment tab said "Built into the engine" while Lineage said "Studio catalogue".
    run = grpo_run(project, users["owner"], environment_id=environment)
    client = client_for(users["owner"])
    row = lineage_rows(client.get(f"/training/runs/{run.pk}/lineage/").content.decode())["Environment (rewards)"]
    assert f'<a href="/environments/">{environment}</a>' in row and source in row and "—" in row
    assert "not a repo of project" not in row
    assert source in client.get(f"/training/runs/{run.pk}/environment/").content.decode()


# ---- the Checkpoints note -------------------------------------------------------------------------

def note_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", re.search(r'<p class="muted" id="ckpt-note">(.*?)</p>', html, re.S).group(1)))


@pytest.mark.parametrize("kinds", [("final",), ("adapter", "merged")])
def test_the_checkpoints_note_offers_no_resume_or_merge_when_only_the_end_weights_are_listed(project, users, kinds):
    run = sft_run(project, users["owner"], **({"lora_rank": 8} if "adapter" in kinds else {}))
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    for kind in kinds:
        Checkpoint.objects.create(run=run, attempt=1, step=30, kind=kind, path=f"/out/{kind}")
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode()
    note = note_of(html)
    assert "Resume from here" not in note and "Merge" not in note and "/checkpoints/30/resume" not in html and "/checkpoints/30/merge" not in html
    assert "with save_steps in the config, a run saves a checkpoint every that many steps, which can be resumed from" in note


def test_the_checkpoints_note_says_no_step_was_saved_when_save_steps_was_set(project, users):
    run = sft_run(project, users["owner"], save_steps=50, max_steps=30)
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED, attempt=1)
    Checkpoint.objects.create(run=run, attempt=1, step=30, kind="final", path="/out/final")
    note = note_of(client_for(users["owner"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode())
    assert "No step was saved along the way (save_steps is 50)" in note and "Resume from here" not in note


def test_the_checkpoints_note_explains_resume_and_merge_where_the_rows_offer_them(project, users):
    run = sft_run(project, users["owner"], lora_rank=8, save_steps=10)
    Checkpoint.objects.create(run=run, attempt=1, step=10, path="/out/checkpoint-10")
    Checkpoint.objects.create(run=run, attempt=1, step=20, kind="adapter", path="/out/adapter")
    note = note_of(client_for(users["owner"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode())
    assert "Resume from here makes a new run" in note and "Merge folds the LoRA checkpoint" in note and "save_steps" not in note
    viewer = note_of(client_for(users["viewer"]).get(f"/training/runs/{run.pk}/checkpoints/").content.decode())
    assert "Resume from here" not in viewer and "Merge" not in viewer
