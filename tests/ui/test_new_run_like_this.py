"""A run page's way onward: "New run like this" (NEW RUN filled with the run's settings, stored only on
Create run), the model repo the run published, and Resume from here on the run's last step."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest

from datahub import repos
from datahub.commits import commit_files
from datahub.services import PUBLISH_MESSAGE, model_repo_name
from experiments.services import create_experiment
from tests.ui.test_pages import client_for, complete, make_run
from training.models import Checkpoint, TrainingRun

pytestmark = pytest.mark.django_db


class RunForm(HTMLParser):
    """#run-form as a browser posts it untouched: text inputs, checked boxes, selected options, the textarea."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.select: str | None = None
        self.textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and name != "csrfmiddlewaretoken" and (a.get("type") != "checkbox" or "checked" in a):
            self.values[name] = a.get("value") or ""
        elif tag == "select" and name:
            self.select = name
            self.values.setdefault(name, "")
        elif tag == "option" and self.select and "selected" in a:
            self.values[self.select] = a.get("value") or ""
        elif tag == "textarea" and name:
            self.textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        elif tag == "textarea":
            self.textarea = None

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.values[self.textarea] += data


def posted_form(html: str) -> dict[str, str]:
    parser = RunForm()
    parser.feed(html.split('id="run-form"', 1)[1].split("</form>", 1)[0] if 'id="run-form"' in html else html)  # the page, or a part of it
    return {k: v.removeprefix("\n") if k == "config_text" else v for k, v in parser.values.items()}


def settings_of(run: TrainingRun) -> dict:
    return {"method": run.method, "experiment": run.experiment_id, "base_model": run.base_model, "dataset": run.dataset,
            "config": run.config, "compute": run.compute}


@pytest.mark.parametrize(("method", "body"), [
    ("dpo", {"dataset": {"ref": "prefs@main", "type": "preference"},
             "config": {"lora_rank": 8, "loss": {"type": "dpo", "dpo_beta": 0.3}, "max_steps": 7, "learning_rate": 1e-5,
                        "per_device_train_batch_size": 4, "warmup_steps": 2, "precision": "bf16"},
             "compute": {"backend": "dstack", "accelerators": "H100:2", "spot": True, "region": "us-east-1"}}),
    ("grpo", {"dataset": None, "config": {"rl_mode": "environment", "environment_id": "builtin/arith@main", "max_steps": 12,
                                          "rollouts_per_prompt": 4, "max_response_length": 64, "kl_coef": 0.05}}),
    ("distill", {"dataset": ["a@main", "b@main"], "config": {"distillation": {"teacher_model": "org/teacher-8B", "top_k": 32, "kd_weight": 0.7},
                                                             "lora_rank": 16, "num_epochs": 2.0}}),
])
def test_new_run_like_this_fills_new_run_and_create_makes_a_run_with_the_same_settings(project, users, method, body):
    # QA: a completed run was a dead end, its only button "Delete run".
    experiment = create_experiment(project, "sweeps")
    run = make_run(project, users["owner"], method, name="sft-ui-run1", experiment=experiment.pk, **body)
    complete(run)
    client = client_for(users["owner"])
    page = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert f'href="/training/runs/{run.pk}/like/"' in page and "New run like this" in page
    response = client.get(f"/training/runs/{run.pk}/like/")
    html = response.content.decode()
    assert response.status_code == 200 and 'action="/training/new/"' in html and "Create run" in html
    assert "nothing is saved until you press Create run" in html
    assert TrainingRun.objects.filter(project=project).count() == 1  # only shown, not stored
    form = posted_form(html)
    assert form["name"] == "sft-ui-run1 (2)" and form["method"] == method and form["experiment"] == str(experiment.pk)
    response = client.post("/training/new/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    copy = TrainingRun.objects.exclude(pk=run.pk).get(project=project)
    assert copy.name == "sft-ui-run1 (2)" and copy.status == "queued"
    assert settings_of(copy) == settings_of(run)
    # The copy of the copy is (3), and a name taken by another run is skipped.
    make_run(project, users["owner"], method, name="sft-ui-run1 (3)", **body)
    assert posted_form(client.get(f"/training/runs/{copy.pk}/like/").content.decode())["name"] == "sft-ui-run1 (4)"


def test_a_copy_of_a_resumed_run_is_not_named_or_told_as_resuming(project, users):
    # QA: the copy of "ckpt sft (from step 3)" was "ckpt sft (from step 3) (2)", yet it trains from step 0.
    parent = make_run(project, users["owner"], "sft", name="ckpt sft")
    run = make_run(project, users["owner"], "sft", name="ckpt sft (from step 3)")
    TrainingRun.objects.filter(pk=run.pk).update(parent=parent)
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/like/").content.decode()
    assert posted_form(html)["name"] == "ckpt sft (2)"
    assert "It trains from step 0: to continue from a saved step of run" in html


def test_new_run_like_this_is_for_those_who_may_create_runs(project, users, other_project):
    from studio.services import add_member

    run = make_run(project, users["owner"], "sft")
    viewer = client_for(users["viewer"])
    assert "New run like this" not in viewer.get(f"/training/runs/{run.pk}/").content.decode()
    assert viewer.get(f"/training/runs/{run.pk}/like/").status_code == 403
    assert client_for(users["outsider"]).get(f"/training/runs/{run.pk}/like/").status_code == 404
    assert client_for(users["owner"]).post(f"/training/runs/{run.pk}/like/").status_code == 405
    # A run of another project than the one worked in: Create run would make the copy there, so it says to switch.
    add_member(other_project, users["owner"], "member")
    owner = client_for(users["owner"])
    assert owner.post("/projects/switch", {"project": "globex", "next": "/training/"}).status_code == 302
    page = owner.get(f"/training/runs/{run.pk}/like/", follow=True).content.decode()
    assert f"Run #{run.pk} is in project acme, not the one you are working in: switch to acme" in page
    assert 'id="run-form"' not in page


def test_the_overview_links_the_model_repo_the_run_published(project, users):
    run = make_run(project, users["owner"], "sft", name="sft ui run1")
    complete(run)
    client = client_for(users["owner"])
    assert 'data-testid="published-model"' not in client.get(f"/training/runs/{run.pk}/").content.decode()
    repos.create_repo(project, f"other-run{run.pk + 10}", "model")  # another run's
    # QA: a repo merely named like the run's (anyone may make `notes-run14`) was linked as its model.
    notes = repos.create_repo(project, f"notes-run{run.pk}", "model")
    commit_files(notes, "main", {"notes.md": b"mine"}, message="Publish my notes")
    mine = repos.create_repo(project, model_repo_name(run), "model")  # what publish_model makes: sft-ui-run1-run<id>
    assert 'data-testid="published-model"' not in client.get(f"/training/runs/{run.pk}/").content.decode()  # nothing published yet
    commit_files(mine, "main", {"README.md": b"card"}, message=PUBLISH_MESSAGE.format(kind="final", run=run.pk, step=3))
    for url in (f"/training/runs/{run.pk}/", f"/training/runs/{run.pk}/live"):
        html = client.get(url, HTTP_HX_REQUEST="true").content.decode()
        link = html.split('data-testid="published-model"', 1)[1].split("</p>", 1)[0]
        assert f'href="/hub/{project.slug}/sft-ui-run1-run{run.pk}"' in link and f"{project.slug}/sft-ui-run1-run{run.pk}" in link


def test_resume_from_the_last_step_gives_the_new_run_steps_to_train(project, users):
    # QA: Resume from here on step 3 of a max_steps 3 run made a run START refused ("raise max_steps above 3").
    run = make_run(project, users["owner"], "sft", dataset="org/data", config={"max_steps": 3, "lora_rank": 8})
    complete(run)
    Checkpoint.objects.create(run=run, attempt=1, step=3, kind="checkpoint", path="/out/checkpoint-3")
    client = client_for(users["owner"])
    page = client.post(f"/training/runs/{run.pk}/checkpoints/3/resume", follow=True).content.decode()
    child = TrainingRun.objects.get(parent=run)
    assert child.config == {**run.config, "max_steps": 6}
    assert f"Step 3 is where run #{run.pk} ends (its max_steps is 3): this run&#x27;s max_steps is 6, so it trains 3 steps more." in page
    assert "max_steps" not in str(services_blockers(child))


def services_blockers(run: TrainingRun) -> list:
    from training import services

    return [(f.field, f.message) for f in services.start_blockers(run)]
