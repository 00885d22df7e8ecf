"""Try it, for real: a tiny SFT run trains on the local backend through a real Celery worker, then its
final weights, a saved step and its base model answer prompts through the REST API, each in the
engine's generator process that the worker starts (CPU here: this machine has no GPU)."""
from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.test_local_training import FAST, run_to_the_end
from training.models import Generation

pytestmark = pytest.mark.worker
CHAT = [{"role": "user", "content": "What colour is the cat?"}]


def answered(api, generation_id: int) -> dict:
    """The generation once a worker has finished it (completed or failed)."""
    def finished():
        body = api.get(f"/api/training-runs/generations/{generation_id}").json()
        return body if body["status"] in ("completed", "failed") else None

    return wait_for(finished, 240, interval=0.5, message=f"generation {generation_id} to be answered")


def test_a_trained_runs_weights_answer_through_the_api_beside_its_base_and_a_saved_step(api, studio_worker, tiny_models):
    run = run_to_the_end(api, {"name": "sft", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
                               "config": {**FAST, "max_steps": 10, "save_steps": 5}})

    asked = api.post(f"/api/training-runs/{run.pk}/generate", {"messages": CHAT, "max_new_tokens": 8, "temperature": 0, "compare_base": True})
    assert asked.status_code == 202, asked.content
    assert asked.json()["status"] == "queued" and asked.json()["weights"] == "final"
    done = answered(api, asked.json()["id"])
    assert done["status"] == "completed" and done["error"] == "", done
    trained, base = done["outputs"]
    assert (trained["model"], base["model"]) == ("trained", "base")
    for output in (trained, base):
        assert 1 <= output["tokens"] <= 8 and output["seconds"] > 0 and isinstance(output["text"], str), output
        assert output["device"] == "cpu" and output["device_note"] == "on the CPU: the Studio machine has no GPU", output
    assert trained["text"] != base["text"]  # greedy answers of different weights: training changed them

    asked = api.post(f"/api/training-runs/{run.pk}/generate", {"prompt": "What colour is the cat?", "step": 5, "max_new_tokens": 4, "temperature": 1.5})
    assert asked.status_code == 202, asked.content
    done = answered(api, asked.json()["id"])
    assert done["status"] == "completed" and done["step"] == 5 and done["weights"] == "checkpoint", done
    [step_five] = done["outputs"]
    assert step_five["model"] == "trained" and 1 <= step_five["tokens"] <= 4

    # Kept: a reload reads the same answers from the database.
    assert list(Generation.objects.filter(run=run).values_list("status", flat=True)) == ["completed", "completed"]
