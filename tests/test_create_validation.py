"""Build 6, create → 400 (and 402): every rule names its field, and no run is stored."""
from __future__ import annotations

import json
import re

import pytest

from studio.services import set_plan
from tests.conftest import assert_error, sft_body
from training.models import TrainingRun


def create(api, **overrides):
    return api.post("/api/training-runs", sft_body(**overrides))


def assert_refused(api, status, field, **overrides):
    before = TrainingRun.objects.count()
    body = assert_error(create(api, **overrides), status, field)
    assert TrainingRun.objects.count() == before
    return body


def test_ppo_is_refused_as_not_yet_supported(api):
    body = assert_refused(api, 400, "method", method="ppo")
    assert "PPO not yet supported" in body["detail"]


def test_unknown_method_returns_400(api):
    assert_refused(api, 400, "method", method="rlhf")


def test_dpo_without_loss_block_returns_400(api):
    body = assert_refused(api, 400, "config.loss.type", method="dpo", config={"lora_rank": 8})
    assert "dpo" in body["errors"][0]["message"]


def test_dpo_with_wrong_loss_type_returns_400(api):
    assert_refused(api, 400, "config.loss.type", method="dpo", config={"loss": {"type": "ipo"}})


def test_distill_without_teacher_returns_400(api):
    assert_refused(api, 400, "config.distillation.teacher_model", method="distill", config={"distillation": {"top_k": 8}})


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_steps": "ten"}, "config.max_steps"),
        ({"learning_rate": -1}, "config.learning_rate"),
        ({"lora": "yes"}, "config.lora"),
        ({"precision": "int3"}, "config.precision"),
        ({"per_device_train_batch_size": 0}, "config.per_device_train_batch_size"),
        ({"max_steps": True}, "config.max_steps"),
        ({"seed": 1.5}, "config.seed"),
        # 0 parses, but the engine refuses it after START (it was a failed run, not a 400).
        ({"learning_rate": 0}, "config.learning_rate"),
        ({"num_epochs": 0}, "config.num_epochs"),
    ],
)
def test_malformed_config_types_return_400(api, config, field):
    assert_refused(api, 400, field, config=config)


def test_malformed_top_level_fields_return_400(api):
    assert_refused(api, 400, "config", config=[1, 2])
    assert_refused(api, 400, "compute.accelerators", compute={"accelerators": "H100:zero"})
    assert_refused(api, 400, "compute.backend", compute={"backend": "slurm"})
    assert_refused(api, 400, "dataset[1].ref", dataset=["a@main", {"ref": 3}])
    assert_refused(api, 400, "base_model", base_model="not a model id!")
    # A trailing newline is not part of an id ($ in a regex would let it through).
    assert_refused(api, 400, "base_model", base_model="Qwen/Qwen2.5-0.5B\n")
    assert_refused(api, 400, "dataset", dataset="org/data\n")
    assert_refused(api, 400, "dataset[0]", dataset=["my-data@main\n"])
    assert_refused(api, 400, "name", name="")
    body = assert_refused(api, 400, "dataset", dataset="/data/" + "d" * 600)  # base_model's 500 already held; dataset had no limit
    assert "at most 500 characters" in body["errors"][0]["message"]


def test_unknown_config_key_is_refused_naming_it(api):
    body = assert_refused(api, 400, "config.learning_rat", config={"learning_rat": 1e-4})
    assert "SFTConfig" in body["errors"][0]["message"]


def test_trl_config_field_passes_through(api):
    r = create(api, config={"warmup_steps": 3, "weight_decay": 0.01})
    assert r.status_code == 201, r.content
    assert r.json()["config"]["warmup_steps"] == 3


@pytest.mark.parametrize(("method", "key", "value", "says"), [
    ("sft", "output_dir", "/tmp/elsewhere", "its own folder"),
    ("sft", "resume_from_checkpoint", "/tmp/ckpt", "/checkpoints/{step}/resume"),
    ("dpo", "push_to_hub", True, "Data Hub branch"),
    ("sft", "hub_token", "hf_x", "Data Hub branch"),
    ("grpo", "report_to", "wandb", "stream to the Studio"),
    ("sft", "model_init_kwargs", {"trust_remote_code": True}, "runs no code from its repo"),
    ("grpo", "vllm_server_host", "10.0.0.9", "vllm_mode: colocate"),
    ("sft", "chat_template_path", "/tmp/elsewhere/evil.jinja", "tokenizer_config.json"),
    ("distill", "chat_template_path", "org/other-model", "tokenizer_config.json"),
    ("sft", "deepspeed", "/tmp/elsewhere/ds.json", "compute.accelerators"),
    ("dpo", "deepspeed", {"zero_optimization": {"stage": 3}}, "compute.accelerators"),
    ("sft", "fsdp", "full_shard", "compute.accelerators"),
    ("grpo", "fsdp_config", "/tmp/elsewhere/fsdp.json", "compute.accelerators"),
    ("sft", "accelerator_config", "/tmp/elsewhere/accelerate.json", "compute.accelerators"),
    ("sft", "logging_dir", "/tmp/elsewhere/logs", "stream to the Studio"),
    ("dpo", "ref_model_init_kwargs", {"trust_remote_code": True}, "runs no code from its repo"),
    ("distill", "teacher_model_init_kwargs", {"trust_remote_code": True}, "runs no code from its repo"),
])
def test_trl_fields_the_studio_sets_itself_are_refused_naming_what_to_do(api, method, key, value, says):
    # They are fields of TRL's configs, so they used to pass through: output_dir wrote a run's
    # checkpoints to any folder of the machine, outside its run folder and its Data Hub branch.
    # chat_template_path and deepspeed took a file from anywhere on the machine that runs the job.
    extra = {"grpo": {"environment_id": "builtin/arith@main"}, "dpo": {"loss": {"type": "dpo"}, "lora_rank": 8},
             "distill": {"distillation": {"teacher_model": "org/teacher"}}}.get(method, {})
    body = assert_refused(api, 400, f"config.{key}", method=method, config={**extra, key: value}, dataset=None if method == "grpo" else "my-data@main")
    assert "the Studio sets this itself" in body["errors"][0]["message"] and says in body["errors"][0]["message"]
    run = create(api, config={"max_steps": 5}).json()
    assert_error(api.patch(f"/api/training-runs/{run['id']}", {"config": {key: value}}), 400, f"config.{key}")
    assert "output_dir" not in TrainingRun.objects.get(pk=run["id"]).config


@pytest.mark.parametrize(("method", "key", "use"), [
    ("grpo", "max_completion_length", "max_response_length"), ("grpo", "num_generations", "rollouts_per_prompt"), ("grpo", "beta", "kl_coef"),
    # QA: GRPO's pointed at num_epochs, which GRPO refuses unless it is 1.
    ("grpo", "num_train_epochs", "max_steps"),
    ("dpo", "beta", "loss.dpo_beta"), ("sft", "num_train_epochs", "num_epochs"), ("distill", "use_liger_kernel", "use_liger"),
])
def test_trl_fields_set_from_a_studio_key_are_refused_naming_the_key(api, method, key, use):
    # GRPO's max_completion_length beside max_response_length: the rollouts used one, the trainer the other.
    extra = {"grpo": {"environment_id": "builtin/arith@main"}, "dpo": {"loss": {"type": "dpo"}, "lora_rank": 8},
             "distill": {"distillation": {"teacher_model": "org/teacher"}}}.get(method, {})
    body = assert_refused(api, 400, f"config.{key}", method=method, config={**extra, key: 4})
    assert f"sets TRL's {key} from {use}: use {use} instead" in body["errors"][0]["message"]


def test_unknown_key_inside_method_block_is_refused(api):
    assert_refused(api, 400, "config.loss.gamma", method="dpo", config={"loss": {"type": "dpo", "gamma": 1}})


def test_qlora_without_lora_returns_400(api):
    assert_refused(api, 400, "config.load_in_4bit", config={"load_in_4bit": True})


class TestGrpoSubmitRejections:
    def grpo(self, api, config, **overrides):
        return assert_refused(api, 400, overrides.pop("field"), method="grpo", dataset=None, config={"environment_id": "builtin/arith@main", **config}, **overrides)

    def test_global_batch_size(self, api):
        self.grpo(api, {"global_batch_size": 64}, field="config.global_batch_size")

    def test_max_prompt_length_without_unsloth(self, api):
        self.grpo(api, {"max_prompt_length": 512}, field="config.max_prompt_length")

    def test_load_in_4bit_without_lora(self, api):
        self.grpo(api, {"load_in_4bit": True}, field="config.load_in_4bit")

    def test_load_in_4bit_with_lora_true_is_qlora_at_rank_16(self, api):
        # QA: refused with "set lora_rank", though lora: true means rank 16 for every other method.
        r = create(api, method="grpo", dataset=None, config={"environment_id": "builtin/arith@main", "lora": True, "load_in_4bit": True})
        assert r.status_code == 201, r.content
        config = TrainingRun.objects.get(pk=r.json()["id"]).config
        assert config["lora_rank"] == 16 and config["load_in_4bit"] is True

    def test_liger_with_more_than_one_gpu(self, api):
        self.grpo(api, {"use_liger": True}, compute={"backend": "dstack", "accelerators": "H100:2"}, field="config.use_liger")

    def test_liger_with_unsloth(self, api):
        self.grpo(api, {"use_liger": True, "use_unsloth": True}, field="config.use_liger")

    def test_liger_on_pythia(self, api):
        self.grpo(api, {"use_liger": True}, base_model="EleutherAI/pythia-160m", field="config.use_liger")

    def test_unsloth_with_more_than_one_gpu(self, api):
        body = self.grpo(api, {"use_unsloth": True}, compute={"backend": "dstack", "accelerators": "H100:2"}, field="config.use_unsloth")
        assert "single-GPU" in body["errors"][0]["message"] and "asked for 2" in body["errors"][0]["message"]


GRPO_ARITH = {"environment_id": "builtin/arith@main", "rollouts_per_prompt": 4, "max_response_length": 8}


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("generation_batch_size", 6, "multiple of the global batch"),
        ("temperature", 0, "greater than 0"),
        ("temperature", -1.0, "greater than 0"),
        ("top_k", -5, "at least 0"),
        ("top_p", 0, "greater than 0"),
        ("top_p", 1.5, "at most 1"),
        ("min_p", 2, "at most 1"),
        ("repetition_penalty", 0, "greater than 0"),
        ("steps_per_generation", 0, "at least 1"),
    ],
)
def test_grpo_sampling_settings_the_trainer_refuses_are_400_at_create_and_patch(api, key, value, says):
    # QA: each passed create and START, then failed the run inside TRL with a message naming no field.
    body = assert_refused(api, 400, f"config.{key}", method="grpo", dataset=None, config={**GRPO_ARITH, key: value})
    assert says in body["errors"][0]["message"], body
    run_id = create(api, method="grpo", dataset=None, config=GRPO_ARITH).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {key: value}}), 400, f"config.{key}")
    assert TrainingRun.objects.get(pk=run_id).config == before


def test_grpo_generation_batch_size_must_be_whole_groups(api):
    body = assert_refused(api, 400, "config.generation_batch_size", method="grpo", dataset=None, config={**GRPO_ARITH, "generation_batch_size": 6})
    assert "rollouts_per_prompt (4)" in body["errors"][0]["message"] and "use 4 or 8" in body["errors"][0]["message"]
    assert_refused(api, 400, "config.generation_batch_size", method="grpo", dataset=None, config={**GRPO_ARITH, "generation_batch_size": 8, "steps_per_generation": 2})
    # In range, they are stored as given.
    good = {"generation_batch_size": 8, "temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1}
    r = create(api, method="grpo", dataset=None, config={**GRPO_ARITH, **good})
    assert r.status_code == 201, r.content
    assert {k: TrainingRun.objects.get(pk=r.json()["id"]).config[k] for k in good} == good


@pytest.mark.parametrize(
    ("key", "value", "use"),
    [("per_device_train_batch_size", 3, "set rollouts_per_prompt"), ("gradient_accumulation_steps", 4, "set rollouts_per_prompt"), ("num_epochs", 3, "set max_steps")],
)
def test_grpo_refuses_batch_keys_its_engine_overrides_naming_the_key_to_use(api, key, value, use):
    # QA: accepted and shown on the run, while the engine trained one group per step, for max_steps.
    body = assert_refused(api, 400, f"config.{key}", method="grpo", dataset=None, config={**GRPO_ARITH, key: value})
    message = next(e["message"] for e in body["errors"] if e["field"] == f"config.{key}")
    assert "one prompt and its rollouts_per_prompt completions" in message and use in message, message
    run_id = create(api, method="grpo", dataset=None, config=GRPO_ARITH).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {key: value}}), 400, f"config.{key}")
    assert TrainingRun.objects.get(pk=run_id).config == before


def test_grpo_keeps_seed_002s_num_epochs_default(api):
    # Seed 002 lists num_epochs with default 1 ("not used by GRPO"): stored, and a PATCH of something else passes.
    r = create(api, method="grpo", dataset=None, config={**GRPO_ARITH, "num_epochs": 1})
    assert r.status_code == 201, r.content
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["num_epochs"] == 1
    assert api.patch(f"/api/training-runs/{r.json()['id']}", {"config": {"max_steps": 7}}).status_code == 200
    # SFT still uses all three.
    assert create(api, config={"per_device_train_batch_size": 3, "gradient_accumulation_steps": 4, "num_epochs": 3}).status_code == 201


@pytest.mark.parametrize(("method", "extra"), [("sft", {}), ("dpo", {"loss": {"type": "dpo"}}), ("distill", {"distillation": {"teacher_model": "org/teacher"}})])
def test_qlora_on_more_than_one_gpu_is_400_and_a_patch_cannot_get_there(api, method, extra):
    # Seed 002: QLoRA runs on a single GPU; for several, 16-bit LoRA.
    config = {"load_in_4bit": True, "lora_rank": 16, **extra}
    body = assert_refused(api, 400, "config.load_in_4bit", method=method, config=config, compute={"backend": "dstack", "accelerators": "GPU:4"})
    assert "lora_rank without load_in_4bit" in json.dumps(body)
    run = create(api, method=method, config=config, compute={"backend": "dstack", "accelerators": "H100:1"}).json()
    assert_error(api.patch(f"/api/training-runs/{run['id']}", {"compute": {"accelerators": "H100:2"}}), 400, "config.load_in_4bit")
    assert TrainingRun.objects.get(pk=run["id"]).compute["accelerators"] == "H100:1"


def test_create_without_training_plan_returns_402(api, project, free_plan):
    set_plan(project, free_plan)
    body = assert_refused(api, 402, None)
    assert "Settings → Billing" in body["detail"]


def test_402_comes_before_body_errors(api, project, free_plan):
    set_plan(project, free_plan)
    assert_error(api.post("/api/training-runs", {"method": "ppo"}), 402)


def test_create_applies_grpo_defaults_from_seed_002(api):
    r = create(api, method="grpo", dataset=None, config={"environment_id": "builtin/arith@main", "lora_rank": 8})
    assert r.status_code == 201, r.content
    config = r.json()["config"]
    assert config["learning_rate"] == 1e-6 and config["max_steps"] == 100 and config["rollouts_per_prompt"] == 8
    assert config["kl_coef"] == 0.0 and config["max_response_length"] == 2048 and config["seed"] == 42
    assert config["lora_alpha"] == 8
    assert "max_prompt_length" not in config
    stored = TrainingRun.objects.get(pk=r.json()["id"])
    assert stored.status == "queued" and stored.config == config


def test_max_prompt_length_defaults_only_with_unsloth(api):
    r = create(api, method="grpo", dataset=None, config={"environment_id": "builtin/arith@main", "use_unsloth": True})
    assert r.json()["config"]["max_prompt_length"] == 1024


UNSLOTH_GRPO = {"environment_id": "builtin/arith@main", "use_unsloth": True}


def test_turning_unsloth_off_takes_the_max_prompt_length_studio_filled_in_with_it(api):
    run_id = create(api, method="grpo", dataset=None, config=UNSLOTH_GRPO).json()["id"]
    # A patch that leaves use_unsloth on keeps the default.
    assert api.patch(f"/api/training-runs/{run_id}", {"config": {"max_steps": 50}}).json()["config"]["max_prompt_length"] == 1024
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"use_unsloth": False}})
    assert r.status_code == 200, r.content
    config = TrainingRun.objects.get(pk=run_id).config
    assert config["use_unsloth"] is False and "max_prompt_length" not in config and config["max_steps"] == 50
    # On again: the default is filled in again.
    assert api.patch(f"/api/training-runs/{run_id}", {"config": {"use_unsloth": True}}).json()["config"]["max_prompt_length"] == 1024


def test_turning_unsloth_off_keeps_a_max_prompt_length_the_user_set(api):
    run_id = create(api, method="grpo", dataset=None, config={**UNSLOTH_GRPO, "max_prompt_length": 512}).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    body = assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"use_unsloth": False}}), 400, "config.max_prompt_length")
    assert "remove it" in body["errors"][0]["message"]
    assert TrainingRun.objects.get(pk=run_id).config == before
    # Naming it in the same patch is setting it: refused too, unless it is removed.
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"use_unsloth": False, "max_prompt_length": 1024}}), 400, "config.max_prompt_length")
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"use_unsloth": False, "max_prompt_length": None}})
    assert r.status_code == 200 and "max_prompt_length" not in r.json()["config"]


def test_a_patch_works_out_again_the_defaults_that_follow_another_setting(api):
    # lora_alpha defaults to lora_rank and ce_weight to 1 − kd_weight: a PATCH of the one they follow
    # must not leave the old derived value behind (alpha 8 on rank 16 halves the adapter's scale).
    run_id = create(api, config={"lora_rank": 8}).json()["id"]
    config = api.patch(f"/api/training-runs/{run_id}", {"config": {"lora_rank": 16}}).json()["config"]
    assert config["lora_rank"] == 16 and config["lora_alpha"] == 16
    # An alpha the user chose stays.
    run_id = create(api, config={"lora_rank": 8, "lora_alpha": 32}).json()["id"]
    assert api.patch(f"/api/training-runs/{run_id}", {"config": {"lora_rank": 16}}).json()["config"]["lora_alpha"] == 32
    run_id = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher", "kd_weight": 0.3}}).json()["id"]
    block = api.patch(f"/api/training-runs/{run_id}", {"config": {"distillation": {"kd_weight": 0.8}}}).json()["config"]["distillation"]
    assert block["kd_weight"] == 0.8 and block["ce_weight"] == 0.2 and block["teacher_model"] == "org/teacher"
    run_id = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher", "kd_weight": 0.3, "ce_weight": 1}}).json()["id"]
    assert api.patch(f"/api/training-runs/{run_id}", {"config": {"distillation": {"kd_weight": 0.8}}}).json()["config"]["distillation"]["ce_weight"] == 1
    # A patch of something else leaves every stored value as it was.
    before = TrainingRun.objects.get(pk=run_id).config
    after = api.patch(f"/api/training-runs/{run_id}", {"config": {"max_steps": 7}}).json()["config"]
    assert after == {**before, "max_steps": 7}


def test_create_applies_distill_defaults_from_seed_001(api):
    r = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher"}})
    assert r.status_code == 201, r.content
    assert r.json()["config"]["distillation"] == {"teacher_model": "org/teacher", "top_k": 64, "temperature": 1.0, "kd_weight": 0.5, "ce_weight": 0.5}


def test_ce_weight_defaults_to_one_minus_kd_weight(api):
    r = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher", "kd_weight": 0.8}})
    assert r.json()["config"]["distillation"]["ce_weight"] == pytest.approx(0.2)


def test_lora_true_means_rank_16_and_alpha_defaults_to_rank(api):
    r = create(api, config={"lora": True})
    assert r.json()["config"]["lora_rank"] == 16 and r.json()["config"]["lora_alpha"] == 16


def test_compute_defaults_to_local_cpu(api):
    compute = create(api).json()["compute"]
    assert compute == {"backend": "local", "accelerators": "CPU", "spot": False, "region": None}


def test_dataset_shapes_are_accepted(api):
    for dataset in ("org/ds", "my-data@main", {"ref": "prefs@v1", "type": "preference"}, ["a@main", {"ref": "b@main"}]):
        r = create(api, dataset=dataset)
        assert r.status_code == 201, (dataset, r.content)
        assert r.json()["dataset"] == dataset


@pytest.mark.parametrize("kind", ["eval", "bogus", "", 3])
def test_a_dataset_entry_of_no_known_type_is_refused_at_create(api, kind):
    # It was stored, and refused only at START (or, for "prompt_completion" on chat rows, trained on as chat).
    body = assert_refused(api, 400, "dataset[1].type", dataset=["org/a", {"ref": "org/b", "type": kind}])
    said = next(e["message"] for e in body["errors"] if e["field"] == "dataset[1].type")
    assert said == f"type is one of sft, chat, text, prompt_completion, preference, prompts (got {json.dumps(kind)}), or leave it out", said


@pytest.mark.parametrize("value", ["ds/sft_missing37.jsonl", "data.jsonl", "train.CSV", "org/rows.parquet", "x.json"])
def test_a_relative_data_file_path_is_refused_not_read_as_an_hf_id(api, value):
    # It passed as an HF id, and the run failed after its job started: "Couldn't reach 'ds/sft_missing37.jsonl' on the Hub".
    body = assert_refused(api, 400, "dataset", dataset=value)
    said = body["errors"][0]["message"]
    assert said.startswith(f'"{value}" reads as a Hugging Face id, yet names a ') and "give the file's absolute path" in said, said
    assert create(api, dataset="org/jsonl-rows").status_code == 201  # an id that merely mentions a format is one


ZERO_WEIGHTS = {"teacher_model": "org/teacher", "kd_weight": 0, "ce_weight": 0}


@pytest.mark.parametrize(
    ("block", "field", "says"),
    [
        ({"top_k": 0}, "config.distillation.top_k", "from 1 to 1024"),
        ({"top_k": 2000}, "config.distillation.top_k", "from 1 to 1024"),
        ({"temperature": 0}, "config.distillation.temperature", "greater than 0"),
        ({"kd_weight": -1}, "config.distillation.kd_weight", "0 or more"),
        ({"ce_weight": -0.5}, "config.distillation.ce_weight", "0 or more"),
        ({"kd_weight": 1.5}, "config.distillation.ce_weight", "set ce_weight"),
        ({"kd_weight": 0, "ce_weight": 0}, "config.distillation.kd_weight", "give at least one a weight above 0"),
    ],
)
def test_distill_ranges_are_400_at_create_and_patch(api, block, field, says):
    # They were a 201 at create and a 422 at START, where GRPO's ranges are a 400 at create.
    body = assert_refused(api, 400, field, method="distill", config={"distillation": {"teacher_model": "org/teacher", **block}})
    assert any(e["field"] == field and says in e["message"] for e in body["errors"]), body
    run_id = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher"}}).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"distillation": block}}), 400, field)
    assert TrainingRun.objects.get(pk=run_id).config == before


def test_distill_with_both_weights_zero_is_refused_on_both_fields(api):
    # kd_weight 0 and ce_weight 0: the loss is 0 × KD + 0 × CE, so the run would train on nothing.
    body = assert_refused(api, 400, "config.distillation.kd_weight", method="distill", config={"distillation": ZERO_WEIGHTS})
    zero = [e for e in body["errors"] if e["field"] in ("config.distillation.kd_weight", "config.distillation.ce_weight")]
    assert len(zero) == 2 and all("at least one" in e["message"] and "above 0" in e["message"] for e in zero), body
    # Either weight alone may be 0: kd_weight 0 is plain SFT (ce_weight defaults to 1), ce_weight 0 pure distillation.
    for weights in ({"kd_weight": 0}, {"kd_weight": 0, "ce_weight": 0.5}, {"kd_weight": 1, "ce_weight": 0}):
        r = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher", **weights}})
        assert r.status_code == 201, (weights, r.content)
        fields = [e["field"] for e in api.post(f"/api/training-runs/{r.json()['id']}/start").json().get("errors", [])]
        assert "config.distillation.kd_weight" not in fields and "config.distillation.ce_weight" not in fields, (weights, fields)


def test_a_stored_distill_run_with_both_weights_zero_shows_why_beside_start(api, users):
    # A run stored before create refused it: START's 422 and the run page say so, from the same rule.
    run_id = create(api, method="distill", config={"distillation": {"teacher_model": "org/teacher"}}).json()["id"]
    config = TrainingRun.objects.get(pk=run_id).config
    config["distillation"].update(kd_weight=0, ce_weight=0)
    TrainingRun.objects.filter(pk=run_id).update(config=config)
    assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.distillation.kd_weight")
    assert TrainingRun.objects.get(pk=run_id).status == "queued"
    from django.test import Client

    client = Client()
    client.force_login(users["owner"])
    assert "give at least one a weight above 0" in client.get(f"/training/runs/{run_id}/").content.decode()


def test_a_data_hub_ref_of_another_project_is_refused_at_create_naming_its_field(api, project):
    # Taken at create, then refused by START (422): the run could never start as written.
    body = assert_refused(api, 400, "dataset", dataset="someone-else/their-data@main")
    assert "names project someone-else" in body["errors"][0]["message"] and "their-data@main" in body["errors"][0]["message"]
    assert_refused(api, 400, "base_model", base_model="someone-else/their-model@main")
    assert create(api, dataset=f"{project.slug}/my-data@main").status_code == 201  # its own project, written out


def test_grpo_ruler_mode_with_an_environment_id_is_refused_naming_the_unused_key(api):
    # Taken without comment: the judge scored the rollouts and the environment named was never loaded.
    ruler = {"rl_mode": "ruler", "environment_id": "builtin/arith@main", "ruler_task_args": {"dataset": "prompts@main", "system_prompt": "be right"}}
    body = assert_refused(api, 400, "config.environment_id", method="grpo", config=ruler)
    assert "remove environment_id, or set rl_mode: environment" in body["errors"][0]["message"]
    assert create(api, method="grpo", config={k: v for k, v in ruler.items() if k != "environment_id"}).status_code == 201


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"heartbeat_timeout_seconds": 1, "heartbeat_interval_seconds": 3600}, "config.heartbeat_timeout_seconds", "under the 60 s floor"),
        ({"heartbeat_timeout_seconds": 30}, "config.heartbeat_timeout_seconds", "use 60 or more"),
        ({"heartbeat_timeout_seconds": 100, "heartbeat_interval_seconds": 60}, "config.heartbeat_timeout_seconds", "set it to 120 or more"),
        ({"heartbeat_interval_seconds": 3600}, "config.heartbeat_interval_seconds", "use 150 or less"),
    ],
)
def test_a_heartbeat_deadline_a_healthy_run_can_miss_is_400_at_create_and_patch(api, config, field, says):
    # QA: a 1 s deadline failed a live GRPO run with heartbeat_timeout before its model loaded.
    grpo = {"method": "grpo", "dataset": None}
    body = assert_refused(api, 400, field, **grpo, config={**GRPO_ARITH, **config})
    assert says in body["errors"][0]["message"], body
    run_id = create(api, **grpo, config=GRPO_ARITH).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": config}), 400, field)
    assert TrainingRun.objects.get(pk=run_id).config == before
    fine = {"heartbeat_timeout_seconds": 7200, "heartbeat_interval_seconds": 3600}
    assert api.patch(f"/api/training-runs/{run_id}", {"config": fine}).status_code == 200
    assert {k: TrainingRun.objects.get(pk=run_id).config[k] for k in fine} == fine


def test_every_studio_key_every_method_takes_is_one_the_engine_reads_itself():
    # QA: every run that set heartbeat_timeout_seconds logged "not a GRPOConfig field; ignored".
    from training.engine.spec import ENGINE_KEYS
    from training.methods.base import COMMON_KEYS

    assert set(COMMON_KEYS) - ENGINE_KEYS == set()


@pytest.mark.parametrize(
    ("method", "config", "field", "says"),
    [
        ("grpo", {**GRPO_ARITH, "max_length": 16}, "config.max_length", "set max_response_length instead"),
        ("sft", {"lora_alpha": 32}, "config.lora_alpha", "lora_alpha needs lora_rank"),
        ("sft", {"lora": False, "lora_rank": 8}, "config.lora", "lora is false but lora_rank is 8"),
        ("dpo", {"loss": {"type": "dpo"}, "lora": False, "lora_rank": 8}, "config.lora", "remove lora: false"),
    ],
)
def test_keys_the_trainer_would_not_obey_are_400_at_create_and_patch(api, method, config, field, says):
    # QA: each was taken; GRPO sized rollouts by max_response_length, lora_alpha alone trained a full
    # fine-tune, and lora: false with a rank trained LoRA.
    extra = {"dataset": None} if method == "grpo" else {}
    body = assert_refused(api, 400, field, method=method, config=config, **extra)
    assert says in next(e["message"] for e in body["errors"] if e["field"] == field), body
    valid = {key: value for key, value in config.items() if key not in ("max_length", "lora_alpha", "lora")}
    run_id = create(api, method=method, config=valid, **extra).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    patch = {key: value for key, value in config.items() if key not in valid or key == "lora_rank"}
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": patch}), 400, field)
    assert TrainingRun.objects.get(pk=run_id).config == before


DPO_VALID = {"loss": {"type": "dpo"}, "lora_rank": 8}


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"loss": {"type": "dpo", "dpo_beta": -5}}, "config.loss.dpo_beta", "dpo_beta must be greater than 0 (e.g. 0.1), got -5"),
        ({"loss": {"type": "dpo", "dpo_beta": 0}}, "config.loss.dpo_beta", "greater than 0"),
        ({"per_device_train_batch_size": 3}, "config.per_device_train_batch_size", "the batch must be even: use 4 or 2"),
        ({"eval_split": 0.1, "per_device_eval_batch_size": 5}, "config.per_device_eval_batch_size", "the batch must be even: use 6 or 4"),
        ({"lora_rank": None}, "config.lora_rank", "it needs LoRA: set lora_rank"),
        ({"loss": {"type": "dpo", "target_margin": 0.5}}, "config.loss.target_margin", "also set reference_free: true"),
        ({"loss": {"type": "dpo", "target_margin": 0.5, "reference_free": False}}, "config.loss.target_margin", "also set reference_free: true"),
    ],
)
def test_dpo_config_rules_are_400_at_create_and_patch(api, config, field, says):
    # QA: dpo_beta -5, an odd batch, DPO without LoRA and target_margin without reference_free were a 201 at
    # create (and a 200 at PATCH), then a 422 at START: the config alone decides each, as it does a learning rate's.
    body = assert_refused(api, 400, field, method="dpo", config={key: value for key, value in {**DPO_VALID, **config}.items() if value is not None})
    assert any(e["field"] == field and says in e["message"] for e in body["errors"]), body
    run_id = create(api, method="dpo", config=DPO_VALID).json()["id"]
    before = TrainingRun.objects.get(pk=run_id).config
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": config}), 400, field)  # a null removes lora_rank (RFC 7386)
    assert TrainingRun.objects.get(pk=run_id).config == before


def test_dpo_values_the_rules_allow_are_taken_at_create_and_patch(api):
    config = {**DPO_VALID, "per_device_train_batch_size": 4, "loss": {"type": "dpo", "dpo_beta": 0.5, "reference_free": True, "target_margin": 0.2}}
    r = create(api, method="dpo", config=config)
    assert r.status_code == 201, r.content
    r = api.patch(f"/api/training-runs/{r.json()['id']}", {"config": {"lora_rank": None, "lora": True, "per_device_train_batch_size": 6, "loss": {"dpo_beta": 2}}})
    assert r.status_code == 200, r.content
    stored = TrainingRun.objects.get(pk=r.json()["id"]).config
    assert (stored["lora_rank"], stored["per_device_train_batch_size"], stored["loss"]["dpo_beta"]) == (16, 6, 2)


def test_dpo_stores_an_even_batch_by_default(api):
    # A blank batch was the engine's 1, which START let through while it refused an explicit 1.
    r = create(api, method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8})
    assert r.status_code == 201, r.content
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["per_device_train_batch_size"] == 2


@pytest.mark.parametrize("name", ["\u202e", "\u200b", "\ufeff", " \u200b\u2066 "])
def test_a_name_of_only_invisible_characters_is_refused_naming_it(api, name):
    body = assert_refused(api, 400, "name", name=name)
    assert "needs a visible character" in body["errors"][0]["message"]


@pytest.mark.parametrize("name", ["\u3164", "\u2800", "\u115f", "\u1160", "\uffa0", "\u034f", "\u0301\u20dd", " \u3164\u200b "])
def test_a_name_of_only_blank_rendering_characters_is_refused_naming_it(api, name):
    # Hangul fillers, the Braille blank, the combining grapheme joiner, lone combining marks: accepted, they rendered blank.
    body = assert_refused(api, 400, "name", name=name)
    assert "needs a visible character" in body["errors"][0]["message"]
    assert not TrainingRun.objects.exists()


def test_a_name_with_combining_marks_on_a_letter_is_kept(api):
    assert create(api, name="e\u0301\u034ftude").status_code == 201


@pytest.mark.parametrize(("name", "code"), [("\u202eevil.exe", "U+202E"), ("x\u200b", "U+200B"), ("a\u200db", "U+200D"), ("\ufeffrun", "U+FEFF"),
                                           ("tone \u2066sweep\u2069", "U+2066"), ("lrm\u200e", "U+200E"), ("soft\u00adhyphen", "U+00AD")])
def test_a_name_with_a_bidi_control_or_an_invisible_character_among_letters_is_refused_naming_it(api, name, code):
    # "\u202eevil.exe" showed as "exe.live" in the run lists; "x" and "x\u200b" looked the same.
    body = assert_refused(api, 400, "name", name=name)
    assert f"a run name cannot contain {code}" in body["errors"][0]["message"] and "remove it" in body["errors"][0]["message"], body


def test_a_patch_to_a_name_with_a_hidden_character_is_refused_and_keeps_the_stored_name(api):
    run_id = create(api, name="plain").json()["id"]
    body = assert_error(api.patch(f"/api/training-runs/{run_id}", {"name": "pla\u200bin"}), 400, "name")
    assert "U+200B (ZERO WIDTH SPACE)" in body["errors"][0]["message"], body
    assert TrainingRun.objects.get(pk=run_id).name == "plain"


def test_the_readme_names_every_field_the_studio_refuses_and_no_other():
    import fnmatch
    from pathlib import Path

    from training.engine.spec import STUDIO_MANAGED, STUDIO_MANAGED_VALUES

    refused = [*STUDIO_MANAGED, *STUDIO_MANAGED_VALUES]
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    listed = readme.split("except those the Studio sets itself or that would reach outside the run", 1)[1].split("or that the engine sets from a Studio key", 1)[0]
    patterns = re.findall(r"`([a-z_*]+)`", listed)
    assert [key for key in refused if not any(fnmatch.fnmatch(key, p) for p in patterns)] == []
    assert [p for p in patterns if not any(fnmatch.fnmatch(key, p) for key in refused)] == []


def test_vllm_server_mode_is_refused_and_colocate_taken(api):
    # vllm_mode "server" sent rollouts to whatever listens on the machine's port 8000 (vllm_server_host's default).
    grpo = {"method": "grpo", "dataset": None}
    body = assert_refused(api, 400, "config.vllm_mode", **grpo, config={"environment_id": "builtin/arith@main", "use_vllm": True, "vllm_mode": "server"})
    assert "vllm_mode: colocate" in body["errors"][0]["message"]
    r = create(api, **grpo, config={"environment_id": "builtin/arith@main", "use_vllm": True, "vllm_mode": "colocate"})
    assert r.status_code == 201, r.content
    assert_error(api.patch(f"/api/training-runs/{r.json()['id']}", {"config": {"vllm_mode": "server"}}), 400, "config.vllm_mode")
    assert TrainingRun.objects.get(pk=r.json()["id"]).config["vllm_mode"] == "colocate"
