"""A refused NEW RUN, Create of New run like this, and Edit run: redirect-after-POST. The POST answers
303 to the form's page, whose next GET shows every field as it was sent (the method, GRPO's mode,
DISTILL's fields, the dataset kept whole by `dataset_kept`, ticked and unticked boxes) with the
findings beside their fields and the error summary focused; the GET after that is NEW RUN's clean
form, or Edit run's stored run. A page drawn from the POST sent the form again on reload."""

from __future__ import annotations

import pytest

from tests.conftest import refused_form_page
from tests.ui.test_new_run_like_this import posted_form, settings_of
from tests.ui.test_new_run_round_trip import RUNS
from tests.ui.test_pages import client_for
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

COMPUTE = {"backend": "dstack", "accelerators": "H100:1", "spot": True, "region": "eu-west-1"}
NEW = "/training/new/"


def stored_run(api, kind: str) -> TrainingRun:
    """A run of `kind` (test_new_run_round_trip's RUNS: a value other than the default in every field
    the form shows) made through the API."""
    body = {"name": f"{kind} original", "method": kind.split("-")[0], "base_model": "org/base", "compute": COMPUTE, **RUNS[kind]}
    created = api.post("/api/training-runs", body)
    assert created.status_code == 201, created.content.decode()
    return TrainingRun.objects.get(pk=created.json()["id"])


def assert_refusal_shown(html: str, sent: dict[str, str]) -> None:
    """The page after the 303: what was sent, field for field, the finding beside max_steps, the focus on the summary."""
    assert posted_form(html) == sent
    assert 'aria-invalid="true"' in html.split('id="f-config-max-steps"')[1].split(">")[0]
    assert "must be at least 1, got 0" in html.split('id="f-config-max-steps-errors"')[1].split("</ul>")[0]
    assert "data-error-summary autofocus" in html


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_refused_new_run_like_this_answers_303_and_shows_every_field_sent_once(api, project, users, kind):
    run = stored_run(api, kind)
    client = client_for(users["owner"])
    sent = {**posted_form(client.get(f"/training/runs/{run.pk}/like/").content.decode()), "config.max_steps": "0"}
    if kind == "sft":
        assert "dataset_kept" in sent  # entries of different types: the fields cannot show them
    if kind == "dpo":
        assert sent["config.loss.reference_free"] == "true" and "config.loss.span_mask" not in sent  # one box ticked, one not
    html = refused_form_page(client, NEW, sent, NEW)
    assert_refusal_shown(html, sent)
    assert TrainingRun.objects.filter(project=project).count() == 1
    # Shown once: the next GET is a clean NEW RUN.
    again = client.get(NEW).content.decode()
    assert posted_form(again) == posted_form(client_for(users["owner"]).get(NEW).content.decode())
    assert "data-error-summary" not in again and 'aria-invalid="true"' not in again and "autofocus" not in again
    # The refused page's form, with the finding fixed, makes the copy the like page would have made.
    assert client.post(NEW, {**posted_form(html), "config.max_steps": str(run.config["max_steps"])}).status_code == 302
    copy = TrainingRun.objects.exclude(pk=run.pk).get(project=project)
    assert copy.name == f"{kind} original (2)" and settings_of(copy) == settings_of(run)


@pytest.mark.parametrize("kind", ["dpo", "grpo-ruler", "distill"])
def test_a_refused_edit_answers_303_shows_what_was_sent_once_then_the_stored_run(api, project, users, kind):
    run = stored_run(api, kind)
    before = settings_of(run)
    client = client_for(users["owner"])
    edit = f"/training/runs/{run.pk}/edit/"
    stored = posted_form(client.get(edit).content.decode())
    sent = {**stored, "name": "renamed", "config.max_steps": "0"}
    html = refused_form_page(client, edit, sent, edit)
    assert_refusal_shown(html, sent)
    run.refresh_from_db()
    assert run.name == f"{kind} original" and settings_of(run) == before  # nothing of the refused edit was stored
    assert posted_form(client.get(edit).content.decode()) == stored


def test_a_refused_new_run_shows_what_create_refused_beside_its_field(project, users):
    # Not only what the form itself cannot parse: create's own findings (a learning rate over 1), GRPO's mode kept.
    client = client_for(users["owner"])
    sent = {
        **posted_form(client.get(NEW, {"method": "grpo"}).content.decode()),
        "name": "too fast",
        "config.learning_rate": "3",
        "config.rl_mode": "ruler",
        "config.ruler_task_args.dataset": "questions@main",
        "config.judge.model": "judge-7b",
    }
    html = refused_form_page(client, NEW, sent, NEW)
    assert "at most 1" in html.split('id="f-config-learning-rate-errors"')[1].split("</ul>")[0]
    shown = posted_form(html)
    assert shown["config.rl_mode"] == "ruler" and shown["config.judge.model"] == "judge-7b" and shown["config.learning_rate"] == "3"
    assert not project.runs.exists()


def test_a_refused_edit_of_a_run_started_meanwhile_is_not_shown_later(api, project, users):
    run = stored_run(api, "sft")
    client = client_for(users["owner"])
    edit = f"/training/runs/{run.pk}/edit/"
    stored = posted_form(client.get(edit).content.decode())
    assert client.post(edit, {**stored, "config.max_steps": "0"}).status_code == 303
    TrainingRun.objects.filter(pk=run.pk).update(status="running")  # started from another tab before the 303 was followed
    assert client.get(edit)["Location"] == f"/training/runs/{run.pk}/"  # Edit run is closed to a running run
    TrainingRun.objects.filter(pk=run.pk).update(status="cancelled")
    html = client.get(edit).content.decode()
    assert posted_form(html) == stored and "got 0" not in html
