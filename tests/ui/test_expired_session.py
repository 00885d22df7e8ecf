"""An htmx request (a poll, a button) from a browser whose session has ended: the whole page goes to
the login page and back, never the login form swapped into a fragment. And a stale form token: a
403 that says what happened and what to do."""
from __future__ import annotations

import pytest
from django.test import Client

from experiments.models import Experiment
from training import services
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

PAGE = "http://testserver"


def htmx(current_url: str, **headers: str) -> dict[str, str]:
    return {"HTTP_HX_REQUEST": "true", "HTTP_HX_CURRENT_URL": current_url, **headers}


def assert_whole_page_to_login(response, next_path: str | None) -> None:
    assert response.status_code == 200
    expected = "/login/" if next_path is None else f"/login/?next={next_path}"
    assert response["HX-Redirect"] == expected
    assert b"password" not in response.content  # no login form to swap into the fragment


@pytest.fixture
def run(project, users):
    return services.create_run(project, users["owner"], name="left open", method="sft", base_model="org/base", dataset="d@main")


def test_runs_list_poll_after_logout_sends_the_page_to_login_and_back(client):
    response = client.get("/training/", {"status": "queued"}, **htmx(f"{PAGE}/training/?status=queued", HTTP_HX_TARGET="run-rows"))
    assert_whole_page_to_login(response, "%2Ftraining%2F%3Fstatus%3Dqueued")


def test_run_status_poll_after_logout_sends_the_run_page_not_the_fragment_url(client, run):
    response = client.get(f"/training/runs/{run.pk}/status", {"seen": "queued"}, **htmx(f"{PAGE}/training/runs/{run.pk}/"))
    assert_whole_page_to_login(response, f"%2Ftraining%2Fruns%2F{run.pk}%2F")


def test_tab_link_after_logout_sends_the_page_to_login(client, run):
    response = client.get(f"/training/runs/{run.pk}/configuration/", **htmx(f"{PAGE}/training/runs/{run.pk}/", HTTP_HX_TARGET="tab-panel"))
    assert_whole_page_to_login(response, f"%2Ftraining%2Fruns%2F{run.pk}%2F")


def test_delete_run_after_logout_deletes_nothing_and_sends_the_page_to_login(client, run):
    response = client.post(f"/training/runs/{run.pk}/delete", **htmx(f"{PAGE}/training/runs/{run.pk}/", HTTP_HX_TARGET="run-status"))
    assert_whole_page_to_login(response, f"%2Ftraining%2Fruns%2F{run.pk}%2F")
    assert TrainingRun.objects.filter(pk=run.pk).exists()


def test_create_experiment_after_logout_creates_nothing_and_sends_the_page_to_login(client, project):
    response = client.post("/experiments/create", {"name": "after logout"}, **htmx(f"{PAGE}/experiments/", HTTP_HX_TARGET="experiments"))
    assert_whole_page_to_login(response, "%2Fexperiments%2F")
    assert not Experiment.objects.filter(name="after logout").exists()


def test_a_current_url_of_another_site_is_not_where_login_returns(client):
    response = client.get("/training/", **htmx("https://evil.example/training/", HTTP_HX_TARGET="run-rows"))
    assert_whole_page_to_login(response, None)


def test_without_htmx_logged_out_is_still_a_plain_redirect_to_login(client, run):
    response = client.get(f"/training/runs/{run.pk}/")
    assert response.status_code == 302 and response["Location"] == f"/login/?next=/training/runs/{run.pk}/"
    assert "HX-Redirect" not in response


def test_a_stale_form_token_is_a_403_saying_to_reload(project, users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["owner"])
    response = client.post("/experiments/create", {"name": "stale token"}, **htmx(f"{PAGE}/experiments/", HTTP_HX_TARGET="experiments"))
    assert response.status_code == 403
    html = response.content.decode()
    assert 'role="alert"' in html and "This page is out of date" in html and "Reload the page, then do this again." in html
    assert not Experiment.objects.filter(name="stale token").exists()
