"""URLs a page only calls behind the scenes, opened directly (the address bar, a bookmark, a link
opened in a new tab): a fragment URL goes to the page the fragment belongs to, a POST-only action's
to its page, never a bare piece of HTML without the layout or a 405 with an empty body. And what
those calls say once their run was deleted in another tab."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from tests.ui.test_run_page_follows import HTMX, client_for
from training import services
from training.models import Generation, TrainingRun

pytestmark = pytest.mark.django_db


def queued_run(project, users, name: str = "fragments") -> TrainingRun:
    return services.create_run(project, users["owner"], name=name, method="sft", base_model="org/base", dataset="org/sft-data")


def test_a_fragment_url_opened_without_htmx_redirects_to_its_page(project, users):
    run = queued_run(project, users)
    generation = Generation.objects.create(run=run, created_by=users["owner"], prompt="2+2", max_new_tokens=8, temperature=0.7)
    client = client_for(users["owner"])
    page, try_tab = f"/training/runs/{run.pk}/", f"/training/runs/{run.pk}/try/"
    for url, expected in [
        (f"{page}status", page),
        (f"{page}status?seen=x", page),
        (f"{page}live", page),
        (f"{page}generations/{generation.pk}", try_tab),
        (f"{page}generations/999999", try_tab),
        ("/training/new/method?method=grpo&name=x", "/training/new/?method=grpo"),
        ("/training/new/fit?method=dpo&experiment=sweep&config.lr=1", "/training/new/?method=dpo&experiment=sweep"),
        ("/training/new/estimate", "/training/new/"),
        ("/training/new/quick?method=grpo", "/training/new/?method=grpo"),
        ("/training/new/sft", "/training/new/"),
    ]:
        response = client.get(url)
        assert (response.status_code, response["Location"]) == (302, expected), url
    # With htmx they are the fragments they were.
    assert client.get(f"{page}live", **HTMX).status_code == 200
    assert 'id="run-status"' in client.get(f"{page}status", **HTMX).content.decode()
    assert client.get("/training/new/method", {"method": "grpo"}, **HTMX).status_code == 200
    assert client.get("/training/new/sft", **HTMX).status_code == 404
    assert TrainingRun.objects.filter(pk=run.pk, status="queued").exists()


def test_a_get_of_a_run_actions_url_goes_to_its_page_and_does_nothing(project, users):
    run = queued_run(project, users)
    client = client_for(users["owner"])
    page = f"/training/runs/{run.pk}/"
    for action, expected in [
        ("start", page),
        ("stop", page),
        ("delete", page),
        ("generate", f"{page}try/"),
        ("checkpoints/5/resume", f"{page}checkpoints/"),
        ("checkpoints/5/merge", f"{page}checkpoints/"),
    ]:
        response = client.get(f"{page}{action}")
        assert (response.status_code, response["Location"]) == (302, expected), action
        assert client.put(f"{page}{action}").status_code == 405  # still nothing but a POST acts
    run.refresh_from_db()
    assert run.status == "queued" and run.start_requested_at is None


def test_an_answer_polled_after_its_run_was_deleted_stops_the_poll_and_says_so(project, users):
    run = queued_run(project, users)
    generation = Generation.objects.create(run=run, created_by=users["owner"], prompt="2+2", max_new_tokens=8, temperature=0.7)
    client = client_for(users["owner"])
    url = f"/training/runs/{run.pk}/generations/{generation.pk}"
    assert 'hx-trigger="every 2s"' in client.get(url, **HTMX).content.decode()
    services.delete_run(run)  # another tab
    response = client.get(url, **HTMX)
    html = response.content.decode()
    assert response.status_code == 286  # htmx's "stop polling": the card below is swapped in and not polled again
    assert "hx-trigger" not in html and f'id="generation-{generation.pk}"' in html and 'data-status="gone"' in html
    assert f"No training run {run.pk} in your projects." in html and "deleted since this page was loaded" in html


def test_edit_run_save_on_a_run_deleted_in_another_tab_goes_to_the_runs_list_and_says_nothing_was_saved(project, users):
    run = queued_run(project, users, name="to be renamed")
    client = client_for(users["owner"])
    form = client.get(f"/training/runs/{run.pk}/edit/")
    assert form.status_code == 200
    services.delete_run(run)  # another tab
    response = client.post(f"/training/runs/{run.pk}/edit/", {"name": "renamed", "method": "sft", "base_model": "org/base", "dataset": "org/sft-data"})
    assert (response.status_code, response["Location"]) == (302, "/training/")
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert len(said) == 1 and f"No training run {run.pk} in your projects." in said[0]
    assert "may have been deleted" in said[0] and "your changes to \u2068renamed\u2069 were not saved." in said[0]
    assert not TrainingRun.objects.filter(name__in=["renamed", "to be renamed"]).exists()
    # A GET of it is still the 404 page.
    assert client.get(f"/training/runs/{run.pk}/edit/").status_code == 404
