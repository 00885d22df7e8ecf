from __future__ import annotations

from tests.conftest import sft_body


def test_create_then_get_run(api):
    r = api.post("/api/training-runs", sft_body())
    assert r.status_code == 201, r.content
    run = r.json()
    assert run["status"] == "queued" and run["experiment"]["slug"] == "default"
    assert api.get(f"/api/training-runs/{run['id']}").json()["id"] == run["id"]


def test_favicon_ico_redirects_to_the_studio_icon(client):
    r = client.get("/favicon.ico")
    assert r.status_code == 301 and r["Location"].endswith("/img/favicon.svg")
    from django.contrib.staticfiles import finders

    assert finders.find("img/favicon.svg")
