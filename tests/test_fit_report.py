"""Issue 8: the GPU memory estimate a person sees before START — GET /api/training-runs/{id}/fit.
The figures are START's own fit check (training/validation.py fit_check): too_big here is exactly
what START refuses with 422, on the same field."""
from __future__ import annotations

import pytest

from tests.conftest import assert_error
from tests.test_fit import gpu, modal  # noqa: F401 - the fixture: a configured Modal connection
from tests.test_start_validation import make_run, start
from training.fit_report import TIGHT_SHARE, form_fit_report
from training.methods.base import Draft
from training.models import TrainingRun


def fit_of(api, run_id: int) -> dict:
    response = api.get(f"/api/training-runs/{run_id}/fit")
    assert response.status_code == 200, response.content
    return response.json()


def test_full_fine_tune_of_a_7b_on_an_l4_is_too_big_with_the_lever(api, modal):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", compute=gpu("L4"))
    body = fit_of(api, run_id)
    assert body["status"] == "too_big" and body["gpu"] == "L4" and body["gpu_gib"] == 24 and body["gpu_count"] == 1
    assert 40 < body["total_gib"] < 80 and body["checkpointing"] is True and body["phase"] == "train"
    assert {"weights", "gradients", "optimizer", "activations", "logits", "overhead"} <= set(body["breakdown"])
    assert sum(body["breakdown"].values()) == pytest.approx(body["total_gib"], abs=0.05)
    assert body["field"] == "config.lora_rank" and "train a LoRA adapter (set lora_rank: 16)" in body["message"]
    assert "an L4 has 24 GiB" in body["message"]
    # One rule: START refuses it on the same field with the same sentence.
    refused = start(api, run_id)
    assert refused.status_code == 422
    assert {"field": body["field"], "message": body["message"]} in [{"field": e["field"], "message": e["message"]} for e in refused.json()["errors"]]


def test_lora_of_a_7b_on_an_h100_fits_without_checkpointing(api, modal):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", config={"lora_rank": 16}, compute=gpu("H100"))
    body = fit_of(api, run_id)
    assert body["status"] == "fits" and body["checkpointing"] is False and body["field"] is None
    assert body["total_gib"] < TIGHT_SHARE * 80 and body["message"].startswith(f"about {body['total_gib']:.1f} GiB of 80 GiB on one H100")
    assert start(api, run_id).status_code == 202


def test_lora_of_a_7b_on_an_l4_is_tight_because_it_needs_checkpointing(api, modal):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B", config={"lora_rank": 16}, compute=gpu("L4"))
    body = fit_of(api, run_id)
    assert body["status"] == "tight" and body["checkpointing"] is True
    assert "(activation checkpointing on)" in body["message"] and "fits only because activation checkpointing is on" in body["message"]
    assert start(api, run_id).status_code == 202  # a warning, not a refusal


def test_a_run_over_80_percent_of_the_card_is_tight_without_checkpointing(api, modal):  # noqa: F811
    # A full fine-tune of a 7B at 1024 tokens on an H100: ≈ 65 GiB of 80, under the engine's 85 % "auto" line.
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B", compute=gpu("H100"))
    body = fit_of(api, run_id)
    assert body["status"] == "tight" and body["checkpointing"] is False
    assert TIGHT_SHARE * 80 < body["total_gib"] <= 0.85 * 80 and "over 80% of the card" in body["message"]


def test_forced_checkpointing_is_reported_as_on(api, modal):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-0.5B", config={"lora_rank": 16, "gradient_checkpointing": True}, compute=gpu("H100"))
    body = fit_of(api, run_id)
    assert body["status"] == "fits" and body["checkpointing"] is True


def test_a_cpu_run_has_no_estimate(api):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-72B", compute={"backend": "local", "accelerators": "CPU"})
    body = fit_of(api, run_id)
    assert body == {"status": "unknown", "total_gib": None, "gpu": None, "gpu_count": 0, "gpu_gib": None, "checkpointing": None,
                    "phase": None, "breakdown": {}, "field": None, "message": "no GPU memory estimate: this run asks for the CPU"}


@pytest.mark.parametrize(("base_model", "accelerators", "says"), [
    ("org/base", "L4", "no GPU memory estimate for this model"),
    ("Qwen/Qwen2.5-7B", "GPU:1", "generic GPU:n"),
])
def test_an_unknown_model_or_a_generic_gpu_has_no_estimate(api, modal, base_model, accelerators, says):  # noqa: F811
    body = fit_of(api, make_run(api, base_model=base_model, compute=gpu(accelerators)))
    assert body["status"] == "unknown" and says in body["message"] and body["total_gib"] is None


def test_distill_reports_the_capture_phase(api, modal):  # noqa: F811
    run_id = make_run(api, method="distill", base_model="Qwen/Qwen3-0.6B", config={"distillation": {"teacher_model": "Qwen/Qwen3-32B"}}, compute=gpu("H200"))
    body = fit_of(api, run_id)
    assert body["status"] == "fits" and body["phase"] == "capture" and "during capture" in body["message"]
    assert body["breakdown"]["weights"] > 55  # the 32B teacher in bf16


def test_viewer_and_member_read_it_and_an_outsider_gets_404(api, api_as, modal):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", config={"lora_rank": 16}, compute=gpu("H100"))
    for role in ("member", "viewer"):
        assert fit_of(api_as(role), run_id)["status"] == "fits"
    assert_error(api_as("outsider").get(f"/api/training-runs/{run_id}/fit"), 404)
    assert_error(api_as(None).get(f"/api/training-runs/{run_id}/fit"), 401)
    assert_error(api.get("/api/training-runs/999999/fit"), 404)


def test_reading_the_estimate_changes_nothing_and_costs_a_fixed_number_of_queries(api, modal, django_assert_num_queries):  # noqa: F811
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", compute=gpu("L4"))
    before = TrainingRun.objects.values().get(pk=run_id)
    # The token, the membership and the run, as for GET run: an HF id is sized from the table, without a query.
    with django_assert_num_queries(3):
        assert fit_of(api, run_id)["status"] == "too_big"
    assert TrainingRun.objects.values().get(pk=run_id) == before


def test_the_form_estimate_gives_no_figure_for_a_value_of_the_wrong_type():
    # The NEW RUN form's YAML box is not validated while it is typed: `.inf` is a float, not a length.
    draft = Draft("sft", "Qwen/Qwen2.5-7B", None, {"max_length": float("inf")}, {"backend": "modal", "accelerators": "L4"})
    report = form_fit_report(draft)
    assert report.status == "unknown" and report.field == "config.max_length" and "config.max_length" in report.message


def test_the_run_page_works_out_the_fit_once_for_the_start_button_and_the_estimate(api, modal, users, monkeypatch):  # noqa: F811
    from django.test import Client

    from training.engine import fit

    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", compute=gpu("L4"))
    calls = []
    real_check = fit.check
    monkeypatch.setattr(fit, "check", lambda *a, **k: calls.append(1) or real_check(*a, **k))
    client = Client()
    client.force_login(users["owner"])
    html = client.get(f"/training/runs/{run_id}/").content.decode()
    # Both show it: the refusal beside Start and the estimate; one estimate was made for them.
    assert "train a LoRA adapter (set lora_rank: 16)" in html and "GiB" in html
    assert len(calls) == 1
