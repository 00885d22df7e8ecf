"""use_liger (seed 002): one set of restrictions for every method, the GPU / image 422s at START, and the
engine switching liger on by capability only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_error, sft_body
from training.engine import liger
from training.models import TrainingRun

H100 = {"backend": "dstack", "accelerators": "H100:1"}
METHODS = {
    "sft": {"method": "sft", "config": {}},
    "dpo": {"method": "dpo", "config": {"loss": {"type": "dpo"}, "lora_rank": 8}},
    "distill": {"method": "distill", "config": {"distillation": {"teacher_model": "org/teacher"}}},
    "grpo": {"method": "grpo", "dataset": None, "config": {"environment_id": "builtin/arith@main"}},
}


def body(method: str, config: dict | None = None, **overrides) -> dict:
    base = METHODS[method]
    return sft_body(**{**base, "config": {**base["config"], **(config or {})}, **overrides})


def refused_at_create(api, payload: dict) -> dict:
    before = TrainingRun.objects.count()
    found = assert_error(api.post("/api/training-runs", payload), 400, "config.use_liger")
    assert TrainingRun.objects.count() == before
    return next(e for e in found["errors"] if e["field"] == "config.use_liger")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_liger_on_two_gpus_is_refused_for_every_method(api, method):
    err = refused_at_create(api, body(method, {"use_liger": True}, compute={"backend": "dstack", "accelerators": "H100:2"}))
    assert "single-GPU" in err["message"]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize(
    ("base_model", "family"),
    [("EleutherAI/pythia-160m", "GPT-NeoX/Pythia"), ("google/gemma-2-2b", "Gemma 2"), ("CohereForAI/c4ai-command-r-v01", "Cohere"), ("ibm-granite/granite-3.1-2b-instruct", "Granite")],
)
def test_liger_on_a_refused_family_is_refused_for_every_method(api, method, base_model, family):
    err = refused_at_create(api, body(method, {"use_liger": True}, base_model=base_model, compute=H100))
    assert family in err["message"] and "remove use_liger" in err["message"]


def test_liger_with_unsloth_is_refused(api):
    refused_at_create(api, body("grpo", {"use_liger": True, "use_unsloth": True}, compute=H100))


def test_the_model_type_in_config_json_decides_over_the_name(api, tmp_path: Path):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    err = refused_at_create(api, body("sft", {"use_liger": True}, base_model=str(model)))
    assert "Gemma 2" in err["message"]


def test_liger_on_a_supported_model_and_one_gpu_is_created(api):
    r = api.post("/api/training-runs", body("distill", {"use_liger": True}, base_model="Qwen/Qwen2.5-0.5B", compute=H100))
    assert r.status_code == 201, r.content
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["use_liger"] is True


def _start_errors(api, payload: dict) -> list[dict]:
    r = api.post("/api/training-runs", payload)
    assert r.status_code == 201, r.content
    started = api.post(f"/api/training-runs/{r.json()['id']}/start")
    return [] if started.status_code == 202 else [e for e in started.json()["errors"] if e["field"] == "config.use_liger"]


def test_start_of_liger_on_the_cpu_returns_422(api):
    errors = _start_errors(api, body("sft", {"use_liger": True}))
    assert [e["message"] for e in errors] == ["liger kernels need a GPU and this run asks for the CPU: remove use_liger"]


def test_start_of_liger_without_liger_kernel_in_the_image_returns_422(api, settings):
    settings.STUDIO_IMAGE_PACKAGES = ["torch", "transformers", "trl", "peft"]
    errors = _start_errors(api, body("sft", {"use_liger": True}, compute=H100))
    assert len(errors) == 1 and "not available in this image (no liger_kernel package)" in errors[0]["message"]


def test_start_of_liger_with_liger_kernel_in_the_image_has_no_liger_finding(api, settings):
    settings.STUDIO_IMAGE_PACKAGES = ["torch", "transformers", "trl", "peft", "liger_kernel"]
    assert _start_errors(api, body("sft", {"use_liger": True}, compute=H100)) == []


# ---- the engine side: capability decides, with one line saying why ------------------------------


class _Spec:
    def __init__(self, base_model: str) -> None:
        self.base_model, self.base_model_revision = base_model, None


def test_refusal_knows_the_families_by_model_type_and_by_name():
    assert "wrong log-probs" in (liger.refusal("gemma2") or "")
    assert "no kernels" in (liger.refusal("gpt_neox") or "")
    assert liger.refusal("granitemoe") and liger.refusal("cohere2")
    assert liger.refusal("llama") is None and liger.refusal("qwen2", "someone/pythia-fork") is None  # the type wins
    assert liger.refusal(None, "EleutherAI/pythia-1b") and liger.refusal(None, "Qwen/Qwen3-1.7B") is None


def test_engine_turns_liger_off_on_the_cpu(tiny_student):
    on, why = liger.engine_choice(_Spec(tiny_student), "cpu")
    assert not on and why == "liger: off (no CUDA device; liger's kernels are GPU-only)"


def test_engine_turns_liger_off_with_several_processes(tiny_student, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    on, why = liger.engine_choice(_Spec(tiny_student), "cuda")
    assert not on and "single-GPU" in why


def test_engine_turns_liger_off_without_the_package_or_on_a_refused_model(tiny_student, tmp_path: Path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    # This machine has no liger_kernel; pretend it does to reach the model-type rule (the import is never tried).
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real_find_spec(name, *a))
    on, why = liger.engine_choice(_Spec(tiny_student), "cuda")
    assert not on and "liger_kernel package is not installed" in why and "requirements-gpu.txt" in why

    gemma = tmp_path / "gemma"
    gemma.mkdir()
    config = json.loads((Path(tiny_student) / "config.json").read_text())
    (gemma / "config.json").write_text(json.dumps({**config, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel" else real_find_spec(name, *a))
    on, why = liger.engine_choice(_Spec(str(gemma)), "cuda")
    assert not on and why == "liger: off (liger computes wrong log-probs on it (Gemma 2 models))"


def test_build_config_logs_why_liger_is_off_and_passes_it_off(tiny_student, tmp_path: Path):
    from trl import SFTConfig

    from tests.engine.conftest import make_spec
    from training.engine.common import Context, build_config
    from training.engine.modeling import pick_device
    from training.engine.reporter import Reporter
    from training.engine.spec import parse_spec

    spec = parse_spec(make_spec("sft", tiny_student, [str(tmp_path / "rows.jsonl")], tmp_path, {"use_liger": True}))
    reporter = Reporter(None, None, echo=False)
    args = build_config(SFTConfig, Context(spec, reporter, pick_device(spec)))
    assert args.use_liger_kernel is False
    assert "liger: off (no CUDA device; liger's kernels are GPU-only)" in reporter.log_tail


@pytest.fixture(scope="module")
def tiny_student(tmp_path_factory) -> str:
    from training.engine.tiny import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny"))["student"]


def _qlora_errors(api) -> list[str]:
    r = api.post("/api/training-runs", body("sft", {"lora_rank": 8, "load_in_4bit": True}, compute=H100))
    assert r.status_code == 201, r.content
    started = api.post(f"/api/training-runs/{r.json()['id']}/start")
    return [] if started.status_code == 202 else [e["message"] for e in started.json()["errors"] if e["field"] == "config.load_in_4bit"]


def test_start_of_qlora_without_bitsandbytes_in_the_image_returns_422(api, settings):
    # The engine would end such a run at load with transformers' "pip install bitsandbytes" (seen on the device machine).
    settings.STUDIO_IMAGE_PACKAGES = ["torch", "transformers", "trl", "peft"]
    assert _qlora_errors(api) == [
        "QLoRA (load_in_4bit) is not available in this image (no bitsandbytes package): remove load_in_4bit (a 16-bit LoRA needs lora_rank alone)"]
    settings.STUDIO_IMAGE_PACKAGES = ["torch", "transformers", "trl", "peft", "bitsandbytes"]
    assert _qlora_errors(api) == []
