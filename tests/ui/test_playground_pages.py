"""The run page's Try it tab (Django's test client): there once the run saved weights; its form takes a
chat message when the weights' tokenizer has a chat template; a viewer reads why they cannot ask; a
remote run's tab says where its weights are; a bad value comes back beside its field (400) and a good
one becomes an answer that polls until a worker has made it."""
from __future__ import annotations

import json
import re

from django.test import Client

from datahub.commits import commit_files
from datahub.services import create_run_branch, run_branch_name
from tests.test_playground import runs_dir, trained_run  # noqa: F401 - the fixture is used by name
from training.models import Checkpoint, Generation, TrainingRun

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "playground"}
FORM = {"format": "chat", "prompt": "What colour is the cat?", "max_new_tokens": "8", "temperature": "0.7", "step": ""}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tabs(html: str) -> list[str]:
    return re.findall(r'data-tab="([a-z]+)"', html)


def test_the_try_it_tab_is_there_once_the_run_saved_weights(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir, saved=())
    client = client_for(users["owner"])
    assert "try" not in tabs(client.get(f"/training/runs/{run.pk}/").content.decode())
    assert client.get(f"/training/runs/{run.pk}/try/").status_code == 404
    trained = trained_run(project, users["owner"], runs_dir, saved=(("checkpoint", 5), ("final", 10)))
    assert tabs(client.get(f"/training/runs/{trained.pk}/").content.decode()) == [
        "overview", "configuration", "datasets", "checkpoints", "try", "lineage", "repository"]
    html = client.get(f"/training/runs/{trained.pk}/try/").content.decode()
    assert 'data-testid="try-form"' in html and '<label for="f-prompt">Message</label>' in html
    assert '<option value="" selected>Final weights</option>' in html and '<option value="5">Step 5</option>' in html
    assert 'id="f-compare-base"' in html and "No answers yet." in html


def test_weights_without_a_chat_template_take_a_plain_prompt(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir, chat=False)
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/try/").content.decode()
    assert '<label for="f-prompt">Prompt</label>' in html and 'name="format" value="text"' in html


def test_a_viewer_reads_why_they_cannot_ask(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir)
    html = client_for(users["viewer"]).get(f"/training/runs/{run.pk}/try/").content.decode()
    assert 'data-testid="try-viewer"' in html and 'data-testid="try-form"' not in html
    assert client_for(users["viewer"]).post(f"/training/runs/{run.pk}/generate", FORM, **HTMX).status_code == 403


def test_a_remote_runs_tab_says_where_its_weights_are(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir, saved=())
    TrainingRun.objects.filter(pk=run.pk).update(compute={"backend": "modal", "accelerators": "L4:1"})
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path="/root/output/final")
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/try/").content.decode()
    assert 'data-testid="try-unavailable"' in html and f"branch run-{run.pk} of Data Hub repo" in html
    assert 'data-testid="try-form"' not in html


def test_a_remote_runs_weights_on_its_branch_take_a_chat_message(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir, saved=())
    TrainingRun.objects.filter(pk=run.pk).update(compute={"backend": "dstack", "accelerators": "L4:1"})
    commit_files(create_run_branch(run).repo, run_branch_name(run),
                 {"final/config.json": b"{}", "final/tokenizer_config.json": json.dumps({"chat_template": "{{ messages }}"}).encode()})
    Checkpoint.objects.create(run=run, attempt=1, step=10, kind="final", path="/workflow/output/final")
    html = client_for(users["owner"]).get(f"/training/runs/{run.pk}/try/").content.decode()
    assert 'data-testid="try-form"' in html and 'data-testid="try-unavailable"' not in html
    assert '<label for="f-prompt">Message</label>' in html  # read from the tokenizer_config.json on the branch


def test_a_bad_value_comes_back_beside_its_field_and_a_good_ask_polls_for_its_answer(project, users, runs_dir):  # noqa: F811
    run = trained_run(project, users["owner"], runs_dir)
    client = client_for(users["owner"])
    refused = client.post(f"/training/runs/{run.pk}/generate", {**FORM, "max_new_tokens": "600"}, **HTMX)
    html = refused.content.decode()
    assert refused.status_code == 400 and html.lstrip().startswith('<div id="playground">')
    assert 'id="f-max-new-tokens-errors"' in html and "at least 1 and at most 512 (600 given)" in html
    assert "What colour is the cat?" in html  # what was typed stays
    assert not Generation.objects.exists()

    asked = client.post(f"/training/runs/{run.pk}/generate", FORM, **HTMX)
    assert asked.status_code == 200
    generation = Generation.objects.get()
    assert generation.messages == [{"role": "user", "content": "What colour is the cat?"}] and generation.max_new_tokens == 8
    html = asked.content.decode()
    assert f'hx-get="/training/runs/{run.pk}/generations/{generation.pk}" hx-trigger="every 2s"' in html and "Waiting for a worker" in html

    Generation.objects.filter(pk=generation.pk).update(status="completed", outputs=[
        {"model": "trained", "text": "The cat is red.", "tokens": 5, "seconds": 0.25, "device": "cpu", "device_note": "on the CPU: the Studio machine has no GPU"}])
    polled = client.get(f"/training/runs/{run.pk}/generations/{generation.pk}", HTTP_HX_REQUEST="true").content.decode()
    assert "The cat is red." in polled and "5 tokens · 0.25 s · cpu (on the CPU: the Studio machine has no GPU)" in polled
    assert "hx-trigger" not in polled  # answered: the poll stops
    assert "The cat is red." in client.get(f"/training/runs/{run.pk}/try/").content.decode()  # kept across reloads


def test_polling_an_answer_the_run_never_had_says_it_has_none_and_a_pruned_one_may_have_been_deleted(api, project, other_project, users, runs_dir):  # noqa: F811
    # Another run's answer id said "Run 1 keeps no answer 7: it keeps its newest 20", as if run 1 had had it.
    from tests.test_playground import ASK
    from training.playground import KEPT_GENERATIONS

    run = trained_run(project, users["owner"], runs_dir)
    theirs = trained_run(other_project, users["outsider"], runs_dir)
    elsewhere = Generation.objects.create(run=theirs, created_by=users["outsider"], prompt="2+2", max_new_tokens=8, temperature=0.7)
    client = client_for(users["owner"])

    def gone(generation_id: int) -> str:
        response = client.get(f"/training/runs/{run.pk}/generations/{generation_id}", HTTP_HX_REQUEST="true")
        assert response.status_code == 286  # the poll stops
        return re.search(r'role="alert">(.*?)</p>', response.content.decode(), re.S)[1].strip()

    assert gone(elsewhere.pk) == f"Run {run.pk} has no answer {elsewhere.pk}."
    ids = [api.post(f"/api/training-runs/{run.pk}/generate", {**ASK, "prompt": f"ask {i}"}).json()["id"] for i in range(KEPT_GENERATIONS + 1)]
    assert not Generation.objects.filter(pk=ids[0]).exists()  # pruned: the run keeps its newest
    for older in (ids[0], elsewhere.pk):  # older than its kept answers: its own once, or not (another project's is not looked up)
        assert gone(older) == (f"Run {run.pk} has no answer {older}: it keeps only its newest {KEPT_GENERATIONS} answers, "
                               "so if this was one of its own, it has been deleted.")
    assert gone(ids[-1] + 1000) == f"Run {run.pk} has no answer {ids[-1] + 1000}."
