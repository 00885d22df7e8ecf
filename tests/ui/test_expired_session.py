"""An htmx request (a poll, a button) from a browser whose session has ended: the whole page goes to
the login page and back, never the login form swapped into a fragment. And a stale form token: a
403 that says what happened and what to do."""
from __future__ import annotations

from urllib.parse import urlencode

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
    assert 'role="alert"' in html and "This page is out of date" in html
    assert '<a href="/experiments/">Open the page again</a>, fill in the form again, and send it.' in html
    assert not Experiment.objects.filter(name="stale token").exists()


def test_a_stale_token_on_a_full_page_form_links_to_a_fresh_copy_not_a_reload(project, users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["owner"])
    response = client.post("/hub/new", {"name": "stale"}, HTTP_REFERER=f"{PAGE}/hub/?type=dataset")
    assert response.status_code == 403
    html = response.content.decode()
    assert '<a href="/hub/?type=dataset">Open the page again</a> (reloading this one would send the same out-of-date form), fill in the form again' in html
    assert "Reload the page" not in html


@pytest.mark.parametrize(("action", "form_page"), [
    ("/hub/acme/my-data/upload", "/hub/acme/my-data/?ref=main"),
    ("/hub/new", "/hub/"),
    ("/hub/acme/my-data/delete", "/hub/acme/my-data/"),
    ("/projects/switch", "/experiments/"),
    ("/environments/fork", "/environments/"),
    ("/settings/secrets/set", "/settings/secrets/"),
    ("/settings/api-tokens/new", "/settings/api-tokens/"),
    ("/training/runs/1/checkpoints/5/resume", "/training/runs/1/checkpoints/"),
])
def test_a_plain_form_post_after_logout_returns_to_the_form_page(client, action, form_page):
    # Logging in then GETs `next`: the POST-only URL itself would answer 405.
    response = client.post(action, {"x": "1"}, HTTP_REFERER=f"{PAGE}{form_page}")
    assert response.status_code == 302
    assert response["Location"] == f"/login/?{urlencode({'next': form_page, 'expired': '1'})}"


@pytest.mark.parametrize("referer", ["https://evil.example/hub/", "", "javascript:alert(1)"])
def test_a_plain_form_post_from_elsewhere_after_logout_goes_to_login_without_next(client, referer):
    response = client.post("/hub/new", {"name": "x"}, HTTP_REFERER=referer)
    assert response.status_code == 302 and response["Location"] == "/login/?expired=1"


SESSION_ENDED = "Your session ended: nothing was done. Log in, then do it again."


def test_the_login_page_after_a_dropped_form_post_says_nothing_was_done(client, users):
    # The upload (any plain form) sent after the session ended is not done: the user must be told.
    response = client.post("/hub/acme/my-data/upload", {"x": "1"}, HTTP_REFERER=f"{PAGE}/hub/acme/my-data/", follow=True)
    html = response.content.decode()
    assert response.status_code == 200 and 'name="password"' in html
    assert SESSION_ENDED in html
    # A wrong password keeps saying it; the right one goes back to the form's page.
    html = client.post("/login/", {"username": "owner", "password": "guess", "next": "/hub/acme/my-data/", "expired": "1"}).content.decode()
    assert SESSION_ENDED in html
    response = client.post("/login/", {"username": "owner", "password": "pw", "next": "/hub/acme/my-data/", "expired": "1"})
    assert response.status_code == 302 and response["Location"] == "/hub/acme/my-data/"


@pytest.mark.parametrize("flag", ["", "0", "yes", "<b>gone</b>"])
def test_the_login_page_says_the_session_ended_only_for_its_own_flag(client, flag):
    html = client.get("/login/", {"expired": flag}).content.decode()
    assert SESSION_ENDED not in html and "<b>gone</b>" not in html
    assert SESSION_ENDED not in client.get("/login/").content.decode()
