"""Issue 8, Build 5: the fit check before START. A GPU run that cannot fit on one card even with
activation checkpointing gets a 422 on the field of the best lever, with the estimate; what cannot be
estimated (the CPU, a generic GPU:n, an unknown model) is never refused."""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from studio.services import set_secret
from tests.conftest import sft_body
from tests.test_start_validation import assert_start_refused, make_run, start
from training.backends.connections import BackendConnection
from training.engine import fit
from training.methods.base import Draft
from training.models import Status, TrainingRun
from training.validation import fit_findings

# As published in the models' config.json on the Hugging Face hub (the fields memory depends on).
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
              "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
QWEN3_17B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "head_dim": 128, "intermediate_size": 6144,
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "vocab_size": 151936,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}


# ---- the model of memory ------------------------------------------------------------------------

def test_parameter_counts_from_config_json():
    # Qwen2.5-0.5B: 494,032,768 parameters (the safetensors header); Qwen3-1.7B: 1.72B with tied embeddings.
    assert fit.ModelShape.from_config(QWEN25_05B).params == pytest.approx(494.0e6, rel=0.005)
    qwen3 = fit.ModelShape.from_config(QWEN3_17B)
    assert qwen3.params == pytest.approx(1.72e9, rel=0.01)
    assert qwen3.params - qwen3.embedding_params == pytest.approx(1.41e9, rel=0.01)  # the card's "non-embedding 1.4B"
    untied = fit.ModelShape.from_config({**QWEN3_17B, "tie_word_embeddings": False})
    assert untied.params - qwen3.params == 151936 * 2048


def test_the_table_of_known_ids_matches_their_configs():
    assert fit.ModelShape.from_config(fit.known_config("Qwen/Qwen2.5-0.5B-Instruct")) == fit.ModelShape.from_config(QWEN25_05B)
    assert fit.ModelShape.from_config(fit.known_config("qwen/qwen3-1.7b")) == fit.ModelShape.from_config(QWEN3_17B)
    assert fit.ModelShape.from_config(fit.known_config("meta-llama/Llama-3.1-8B-Instruct")).params == pytest.approx(8.03e9, rel=0.01)
    assert fit.known_config("org/base") is None
    assert fit.ModelShape.from_config({"model_type": "mystery"}) is None


def test_checkpointing_and_adapters_shrink_the_estimate_where_the_model_says():
    shape = fit.ModelShape.from_config(QWEN25_7B)
    full = fit.estimate(shape, adapter="full", checkpointing=False)
    assert full.parts["gradients"] == shape.params * 2 and full.parts["optimizer"] == shape.params * 4  # bf16 params, bf16 AdamW moments
    ckpt = fit.estimate(shape, adapter="full", checkpointing=True)
    assert ckpt.parts["activations"] < full.parts["activations"] / 5 and ckpt.parts["weights"] == full.parts["weights"]
    lora = fit.estimate(shape, adapter="lora", lora_rank=16)
    assert shape.lora_params(16) == 40_370_176  # what PEFT reports for Qwen2.5-7B, r=16, all seven projections
    assert lora.parts["gradients"] == shape.lora_params(16) * 4 < full.parts["gradients"] / 50
    qlora = fit.estimate(shape, adapter="qlora", lora_rank=16)
    assert qlora.parts["weights"] < lora.parts["weights"] / 2
    # Gradient accumulation runs micro-batches one after another: no change to the peak.
    assert fit.estimate(shape, batch=2, grad_accum=8).total == fit.estimate(shape, batch=2).total
    # DPO's batch counts rows (2 a pair, chosen and rejected in one forward), so it holds `batch` sequences,
    # as SFT's does; a full DPO keeps a reference copy.
    dpo = fit.estimate(shape, method="dpo", adapter="full", batch=2)
    sft = fit.estimate(shape, adapter="full", batch=2)
    assert dpo.parts["reference"] == shape.params * 2
    assert dpo.parts["logits"] == sft.parts["logits"] and dpo.parts["activations"] == sft.parts["activations"]


def test_grpo_peak_is_the_larger_of_generation_and_training():
    shape = fit.ModelShape.from_config(QWEN25_05B)
    est = fit.estimate(shape, method="grpo", adapter="lora", rollouts=8, max_response_length=1024, kl_coef=0.0)
    assert {est.phase, est.other.phase} == {"train", "rollouts"}
    rollouts = est if est.phase == "rollouts" else est.other
    assert rollouts.parts["kv_cache"] == 8 * (512 + 1024) * 24 * 2 * (2 * 64) * 2
    assert fit.estimate(shape, method="grpo", adapter="full", kl_coef=0.1).parts["reference"] == shape.params * 2
    assert fit.estimate(shape, method="grpo", adapter="lora", kl_coef=0.1).parts["reference"] == 0  # the adapter is switched off instead


# ---- START on the GPU backends ------------------------------------------------------------------

@pytest.fixture
def modal(db, project, settings):
    """A configured Modal connection: START's backend check passes without calling Modal."""
    settings.STUDIO_PUBLIC_URL = "https://studio.example.com"  # a Modal job reports there (START refuses a loopback address)
    set_secret(project, "modal-token-id", "ak-test")
    set_secret(project, "modal-token-secret", "as-test")
    return BackendConnection.objects.create(project=project, backend="modal", token_id_secret="modal-token-id", token_secret="modal-token-secret")


def gpu(accelerators: str) -> dict:
    return {"backend": "modal", "accelerators": accelerators}


def test_full_fine_tune_of_a_7b_on_an_l4_is_refused_with_the_estimate_and_the_lever(api, modal):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", compute=gpu("L4"))
    body = assert_start_refused(api, run_id, 422, "config.lora_rank")
    message = next(e["message"] for e in body["errors"] if e["field"] == "config.lora_rank")
    gib = float(re.search(r"about ([\d.]+) GiB per GPU", message)[1])
    assert 40 < gib < 80, message  # 7.6B × 8 B of weights, gradients and AdamW moments, at least
    assert "an L4 has 24 GiB" in message and "weights 14.2" in message and "optimizer" in message
    assert "train a LoRA adapter (set lora_rank: 16)" in message and "load_in_4bit" in message and "compute.accelerators" in message
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.QUEUED and run.start_requested_at is None and run.attempt == 0


def test_lora_of_a_7b_on_an_h100_starts(api, modal):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B-Instruct", config={"lora_rank": 16}, compute=gpu("H100"))
    assert start(api, run_id).status_code == 202


def test_qlora_of_a_7b_on_an_l4_starts(api, modal):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B", config={"lora_rank": 16, "load_in_4bit": True}, compute=gpu("L4"))
    assert start(api, run_id).status_code == 202


def test_a_run_that_fits_only_with_checkpointing_starts_unless_checkpointing_is_forced_off(api, modal):
    # LoRA of a 7B at 1024 tokens on an L4: ≈ 23 GiB without checkpointing, ≈ 18 GiB with it.
    run_id = make_run(api, base_model="Qwen/Qwen2.5-7B", config={"lora_rank": 16}, compute=gpu("L4"))
    assert start(api, run_id).status_code == 202
    forced = make_run(api, base_model="Qwen/Qwen2.5-7B", config={"lora_rank": 16, "gradient_checkpointing": False}, compute=gpu("L4"))
    body = assert_start_refused(api, forced, 422, "config.gradient_checkpointing")
    assert body["errors"][0]["field"] == "config.gradient_checkpointing"


def test_cpu_runs_are_never_refused_by_the_fit_check(api):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-72B", compute={"backend": "local", "accelerators": "CPU"})
    assert start(api, run_id).status_code == 202


def test_an_unknown_model_gets_no_finding(api, modal):
    run_id = make_run(api, base_model="org/base", compute=gpu("T4"))
    assert start(api, run_id).status_code == 202


def test_a_generic_gpu_is_not_refused(api, modal):
    run_id = make_run(api, base_model="Qwen/Qwen2.5-72B", compute=gpu("GPU:1"))
    assert start(api, run_id).status_code == 202


def test_distill_with_a_32b_teacher_on_an_l4_is_refused_on_the_teacher(api, modal):
    run_id = make_run(api, method="distill", base_model="Qwen/Qwen3-0.6B",
                      config={"distillation": {"teacher_model": "Qwen/Qwen3-32B"}}, compute=gpu("L4"))
    body = assert_start_refused(api, run_id, 422, "config.distillation.teacher_model")
    message = body["errors"][0]["message"]
    assert "during capture" in message and "an L4 has 24 GiB" in message and "smaller teacher" in message
    # The same teacher on an H200 fits: capture holds ≈ 64 GiB.
    ok = make_run(api, method="distill", base_model="Qwen/Qwen3-0.6B", config={"distillation": {"teacher_model": "Qwen/Qwen3-32B"}}, compute=gpu("H200"))
    assert start(api, ok).status_code == 202


def test_grpo_with_huge_rollouts_is_refused_on_the_rollout_length(api, modal):
    config = {"environment_id": "builtin/arith@main", "inference_blocks": 1, "trainer_blocks": 1, "lora_rank": 16,
              "rollouts_per_prompt": 64, "max_response_length": 32768}
    run_id = make_run(api, method="grpo", dataset=None, base_model="Qwen/Qwen2.5-0.5B-Instruct", config=config, compute=gpu("L4:2"))
    body = assert_start_refused(api, run_id, 422, None)
    fit_errors = [e for e in body["errors"] if e["field"] in ("config.max_response_length", "config.rollouts_per_prompt")]
    assert len(fit_errors) == 1, body
    assert "shrink max_response_length (now 32768" in fit_errors[0]["message"] and "rollouts_per_prompt" in fit_errors[0]["message"]


def test_a_data_hub_base_is_estimated_from_its_config_json(api, modal, project, users):
    from datahub.commits import commit_files
    from datahub.repos import create_repo

    repo = create_repo(project, "my-7b", "model", users["owner"])
    commit_files(repo, "main", {"config.json": json.dumps(QWEN25_7B).encode()}, message="config")
    run_id = make_run(api, base_model="my-7b@main", compute=gpu("L4"))
    assert_start_refused(api, run_id, 422, "config.lora_rank")


def test_a_local_model_directory_is_estimated_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    draft = Draft("sft", str(tmp_path), "org/data", {}, {"backend": "local", "accelerators": "L4"})
    [finding] = fit_findings(draft)
    assert finding.field == "config.lora_rank" and "GiB" in finding.message
    assert fit_findings(Draft("sft", str(tmp_path), "org/data", {}, {"backend": "local", "accelerators": "CPU"})) == []


def test_the_start_button_shows_the_fit_finding(project, users, modal):
    from training import services

    run = services.create_run(project, users["owner"], **{**sft_body(base_model="Qwen/Qwen2.5-7B"), "compute": gpu("L4")})
    client = Client()
    client.force_login(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/").content.decode()
    assert 'id="start-btn"' in html and "disabled" in html.split('id="start-btn"')[1].split(">")[0]
    assert 'data-field="config.lora_rank"' in html and "an L4 has 24 GiB" in html
