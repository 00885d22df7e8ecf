"""Numeric config keys say their real range and train with exactly the value stored (QA): lora_alpha 0
was stored and trained as the rank, 0.5 as 0 (every grad_norm 0, a completed run that learned nothing);
kl_coef's type error said "positive" of a key that takes 0; load_in_4bit: "yes" also asked for a
lora_rank; and a use_liger typed in the NEW RUN form's config box was refused under the Liger select,
which showed Default, without the key's path."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_error, refused_form_page, sft_body
from tests.engine.conftest import make_spec
from tests.ui.test_performance_pages import client_for, new_body
from training.engine.modeling import Device, wrap_lora
from training.engine.spec import SpecError, parse_spec
from training.keys import Key
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


def errors_of(response, status: int, field: str) -> list[dict]:
    return assert_error(response, status, field)["errors"]


@pytest.mark.parametrize("alpha", [0, -1, 0.0])
def test_a_lora_alpha_of_0_or_less_is_refused_at_create_and_patch(api, alpha):
    before = TrainingRun.objects.count()
    errors = errors_of(api.post("/api/training-runs", sft_body(config={"lora_rank": 4, "lora_alpha": alpha})), 400, "config.lora_alpha")
    assert [e["message"] for e in errors] == [f"must be greater than 0, got {alpha}: a number greater than 0 and at most 1000000 "
                                              "(the adapter is scaled by lora_alpha / lora_rank; default: lora_rank)"]
    assert TrainingRun.objects.count() == before
    run_id = api.post("/api/training-runs", sft_body(config={"lora_rank": 4})).json()["id"]
    errors_of(api.patch(f"/api/training-runs/{run_id}", {"config": {"lora_alpha": alpha}}), 400, "config.lora_alpha")
    assert TrainingRun.objects.get(pk=run_id).config["lora_alpha"] == 4


def test_a_stored_lora_alpha_of_0_is_refused_at_start(api):
    run_id = api.post("/api/training-runs", sft_body(config={"lora_rank": 4})).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(config={"lora_rank": 4, "lora_alpha": 0})  # stored before create refused it
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.lora_alpha")
    assert any(e["field"] == "config.lora_alpha" and e["message"].startswith("must be greater than 0, got 0") for e in body["errors"]), body
    assert TrainingRun.objects.get(pk=run_id).status == "queued"


def test_a_fractional_lora_alpha_is_stored_and_trained_as_it_is(api, tmp_path: Path):
    r = api.post("/api/training-runs", sft_body(config={"lora_rank": 4, "lora_alpha": 0.5}))
    assert r.status_code == 201, r.content
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["lora_alpha"] == 0.5
    from transformers import GPT2Config, GPT2LMHeadModel

    spec = parse_spec(make_spec("sft", "unused", ["unused.jsonl"], tmp_path / "out", {"lora_rank": 4, "lora_alpha": 0.5}))
    lines: list[str] = []
    model = wrap_lora(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32)), spec,
                      Device("cpu", False, "fp32"), four_bit=False, log=lines.append)
    assert any(line.endswith("(rank 4, alpha 0.5)") for line in lines), lines
    scalings = {m.scaling["default"] for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "scaling")}
    assert scalings == {0.125}  # 0.5 / 4, where int(0.5) scaled the adapters to 0
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)  # 0 with a scale of 0


def test_the_engine_takes_the_stored_alpha_and_refuses_0(tmp_path: Path):
    spec = lambda config: parse_spec(make_spec("sft", "m", ["d.jsonl"], tmp_path, config))  # noqa: E731
    assert spec({"lora_rank": 4, "lora_alpha": 8}).lora_alpha == 8
    assert spec({"lora_rank": 4}).lora_alpha == 4
    with pytest.raises(SpecError, match=r"^config\.lora_alpha: must be > 0, got 0$"):
        spec({"lora_rank": 4, "lora_alpha": 0})


@pytest.mark.parametrize(("config", "field", "says"), [
    ({"environment_id": "builtin/arith@main", "kl_coef": "x"}, "config.kl_coef", 'must be a number ≥ 0, got "x"'),
    ({"environment_id": "builtin/arith@main", "lora_rank": 4, "lora_alpha": "x"}, "config.lora_alpha", "must be a number greater than 0 and at most 1000000"),
])
def test_a_numeric_keys_type_error_states_its_real_range(api, config, field, says):
    body = {"name": "g", "method": "grpo", "base_model": "org/base", "config": config}
    errors = errors_of(api.post("/api/training-runs", body), 400, field)
    assert [e["field"] for e in errors] == [field] and errors[0]["message"].startswith(says), errors
    assert api.post("/api/training-runs", {**body, "name": "zero", "config": {"environment_id": "builtin/arith@main", "kl_coef": 0}}).status_code == 201


def test_the_distillation_blocks_type_errors_state_their_ranges(api):
    block = {"teacher_model": "org/teacher", "top_k": "many", "temperature": "hot", "kd_weight": "x", "ce_weight": "y"}
    errors = errors_of(api.post("/api/training-runs", sft_body(method="distill", config={"distillation": block})), 400, "config.distillation.top_k")
    assert {e["field"]: e["message"] for e in errors} == {
        "config.distillation.top_k": 'must be an integer from 1 to 1024 (default 64), got "many"',
        "config.distillation.temperature": 'must be a number greater than 0 (default 1.0), got "hot"',
        "config.distillation.kd_weight": 'must be a number ≥ 0 (default 0.5), got "x"',
        "config.distillation.ce_weight": 'must be a number ≥ 0 (default 1 − kd_weight), got "y"',
    }


def test_a_positive_keys_own_description_says_0_is_refused():
    assert Key("number", minimum=0, positive=True).describe() == "a number greater than 0"
    assert Key("number", minimum=0, positive=True, maximum=2).describe() == "a number greater than 0 and at most 2"
    assert Key("number", minimum=0).describe() == "a number ≥ 0"


@pytest.mark.parametrize(("config", "field"), [
    ({"load_in_4bit": "yes"}, "config.load_in_4bit"),
    ({"lora_alpha": "x"}, "config.lora_alpha"),
    ({"lora": "yes", "lora_rank": 8}, "config.lora"),
])
def test_a_mistyped_adapter_key_gets_only_its_own_type_error(api, config, field):
    errors = errors_of(api.post("/api/training-runs", sft_body(config=config)), 400, field)
    assert len(errors) == 1 and errors[0]["message"].startswith("must be "), errors


def test_a_negative_dpo_target_margin_is_refused_at_create(api):
    # The engine refused it (config.loss.target_margin: must be >= 0) after START took it.
    config = {"loss": {"type": "dpo", "reference_free": True, "target_margin": -1}, "lora_rank": 8}
    errors = errors_of(api.post("/api/training-runs", sft_body(method="dpo", dataset="org/prefs", config=config)), 400, "config.loss.target_margin")
    assert errors[0]["message"] == "must be at least 0, got -1"


def field_errors(html: str) -> dict[str, list[str]]:
    return {found[0]: re.findall(r"<li>(.*?)</li>", found[1], re.S) for found in re.findall(r'<ul class="field-errors" id="([^"]*)"[^>]*>(.*?)</ul>', html, re.S)}


def test_a_finding_on_a_key_typed_in_the_config_box_is_shown_there_with_its_path(project, users):
    client = client_for(users["owner"])
    typed = new_body("liger", "grpo", config_text="use_liger: true\nuse_unsloth: true\nlora_rank: 8\n", compute__accelerators="H100:1", compute__backend="dstack")
    errors = field_errors(refused_form_page(client, "/training/new/", typed, "/training/new/"))
    assert errors == {"f-config-text-errors": ["config.use_liger: use_liger cannot be combined with use_unsloth (Unsloth patches the model with kernels "
                                               "of its own): remove use_liger or use_unsloth"]}, errors
    # Chosen with the Liger select, the finding stays beside it.
    chosen = new_body("liger", "grpo", config__use_liger="true", config_text="use_unsloth: true\nlora_rank: 8\n", compute__accelerators="H100:1",
                      compute__backend="dstack")
    errors = field_errors(refused_form_page(client, "/training/new/", chosen, "/training/new/"))
    assert list(errors) == ["f-config-use-liger-errors"] and errors["f-config-use-liger-errors"][0].startswith("use_liger cannot be combined"), errors
