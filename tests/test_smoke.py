from __future__ import annotations

from tests.conftest import sft_body


def test_create_then_get_run(api):
    r = api.post("/api/training-runs", sft_body())
    assert r.status_code == 201, r.content
    run = r.json()
    assert run["status"] == "queued" and run["experiment"]["slug"] == "default"
    assert api.get(f"/api/training-runs/{run['id']}").json()["id"] == run["id"]
