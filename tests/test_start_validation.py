"""Build 6, start → 422 (and 402/409): each finding names its field; the run stays as it was."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.models import Plan
from studio.services import set_plan, set_secret
from tests.conftest import assert_error, sft_body
from training.models import Status, TrainingRun


def make_run(api, **overrides) -> int:
    r = api.post("/api/training-runs", sft_body(**overrides))
    assert r.status_code == 201, r.content
    return r.json()["id"]


def start(api, run_id: int):
    return api.post(f"/api/training-runs/{run_id}/start")


def assert_start_refused(api, run_id: int, status: int, field: str | None) -> dict:
    before = TrainingRun.objects.get(pk=run_id)
    body = assert_error(start(api, run_id), status, field)
    after = TrainingRun.objects.get(pk=run_id)
    assert (after.status, after.config, after.start_requested_at, after.attempt) == (before.status, before.config, before.start_requested_at, before.attempt)
    return body


def grpo(**config) -> dict:
    return {"method": "grpo", "dataset": None, "config": config}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"base_model": None}, "base_model"),
        ({"dataset": None}, "dataset"),
        ({"method": "dpo", "dataset": None, "config": {"loss": {"type": "dpo"}, "lora_rank": 8}}, "dataset"),
        ({"method": "distill", "dataset": None, "config": {"distillation": {"teacher_model": "org/t"}}}, "dataset"),
        # GRPO
        (grpo(), "config.environment_id"),
        (grpo(rl_mode="ruler", judge={"mode": "external", "endpoint": "http://judge", "api_key_secret": "k"}), "config.ruler_task_args.dataset"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts"}, judge={"mode": "external", "endpoint": "http://j", "api_key_secret": "k"}), "config.ruler_task_args.system_prompt"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "external", "api_key_secret": "k"}), "config.judge.endpoint"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "external", "endpoint": "http://j"}), "config.judge.api_key_secret"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "external", "endpoint": "http://j", "api_key_secret": "missing"}), "config.judge.api_key_secret"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "colocated"}), "config.judge_blocks"),
        ({**grpo(environment_id="builtin/arith@main"), "compute": {"backend": "dstack", "accelerators": "H100:2"}}, "config.inference_blocks"),
        ({**grpo(environment_id="builtin/arith@main", inference_blocks=1), "compute": {"backend": "dstack", "accelerators": "H100:2"}}, "config.trainer_blocks"),
        ({**grpo(environment_id="builtin/arith@main", inference_blocks=2, trainer_blocks=2), "compute": {"backend": "dstack", "accelerators": "H100:2"}}, "compute.accelerators"),
        # DPO's dataset entry types (its config's constraints: test_start_rechecks_dpo_config_rules_of_a_run_stored_before_create_checked_them)
        ({"method": "dpo", "dataset": [{"ref": "prefs@main", "type": "chat"}], "config": {"loss": {"type": "dpo"}, "lora_rank": 8}}, "dataset[0].type"),
        # Precision the accelerator cannot do
        ({"config": {"precision": "nvfp4"}, "compute": {"backend": "dstack", "accelerators": "H100:1"}}, "config.precision"),
        ({"config": {"precision": "fp8"}, "compute": {"backend": "dstack", "accelerators": "A100-80GB:2"}}, "config.precision"),
        ({"config": {"precision": "fp8"}, "compute": {"backend": "dstack", "accelerators": "GPU:1"}}, "compute.accelerators"),
        ({"config": {"precision": "FP8"}}, "config.precision"),
        # Options the trainer image cannot run: never a silent fallback
        ({**grpo(environment_id="builtin/arith@main", use_unsloth=True)}, "config.use_unsloth"),
        ({"config": {"use_vllm": True}, "method": "grpo", "dataset": None}, "config.use_vllm"),
        (grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "x"}, judge={"mode": "colocated"}, judge_blocks=1), "config.judge.mode"),
        # Backends
        ({"compute": {"backend": "modal", "accelerators": "L4"}}, "compute.backend"),
        ({"compute": {"backend": "local", "accelerators": "GPU:1"}}, "compute.accelerators"),
        ({"base_model": "/models/mine", "compute": {"backend": "dstack", "accelerators": "H100:1"}}, "base_model"),
        ({"dataset": ["ok@main", "/data/rows.jsonl"], "compute": {"backend": "modal", "accelerators": "L4"}}, "dataset[1]"),
    ],
)
def test_start_returns_422_naming_the_field(api, overrides, field):
    run_id = make_run(api, **overrides)
    assert_start_refused(api, run_id, 422, field)


def test_start_rechecks_distill_ranges_of_a_run_stored_before_create_checked_them(api):
    # Create refuses these now (tests/test_create_validation.py); a run stored before may hold one.
    run_id = make_run(api, method="distill", config={"distillation": {"teacher_model": "org/t"}})
    run = TrainingRun.objects.get(pk=run_id)
    run.config["distillation"].update(top_k=0, temperature=0, kd_weight=0, ce_weight=0)
    TrainingRun.objects.filter(pk=run_id).update(config=run.config)
    body = assert_start_refused(api, run_id, 422, "config.distillation.top_k")
    assert {"config.distillation.temperature", "config.distillation.kd_weight", "config.distillation.ce_weight"} <= {e["field"] for e in body["errors"]}


def stored_dpo_run(api, config: dict, **overrides) -> int:
    """A DPO run stored with `config`, as one created before create refused what it holds."""
    run_id = make_run(api, method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8}, **overrides)
    TrainingRun.objects.filter(pk=run_id).update(config=config)
    return run_id


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"loss": {"type": "dpo"}}, "config.lora_rank"),
        ({"loss": {"type": "dpo"}, "lora_rank": 8, "per_device_train_batch_size": 3}, "config.per_device_train_batch_size"),
        ({"loss": {"type": "dpo"}, "lora_rank": 8, "eval_split": 0.1, "per_device_eval_batch_size": 3}, "config.per_device_eval_batch_size"),
        ({"loss": {"type": "dpo", "target_margin": 0.5}, "lora_rank": 8}, "config.loss.target_margin"),
        ({"loss": {"type": "dpo", "dpo_beta": 0}, "lora_rank": 8}, "config.loss.dpo_beta"),
        ({"loss": {"type": "dpo", "dpo_beta": -0.1}, "lora_rank": 8}, "config.loss.dpo_beta"),
    ],
)
def test_start_rechecks_dpo_config_rules_of_a_run_stored_before_create_checked_them(api, config, field):
    # Create and PATCH refuse these now (tests/test_create_validation.py); a run stored before may hold one.
    assert_start_refused(api, stored_dpo_run(api, config), 422, field)


def test_lengths_past_the_models_context_return_422_naming_the_limit(api, tiny_local_model):
    # QA: max_response_length 100000 on a 512-position model passed create and START.
    config_file = Path(tiny_local_model) / "config.json"
    config_file.write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    arith = {"environment_id": "builtin/arith@main", "rollouts_per_prompt": 4}
    run_id = make_run(api, **grpo(**arith, max_response_length=100000), base_model=tiny_local_model)
    body = assert_start_refused(api, run_id, 422, "config.max_response_length")
    message = next(e["message"] for e in body["errors"] if e["field"] == "config.max_response_length")
    assert "at most 512 positions" in message and "below 512" in message, message
    run_id = make_run(api, **grpo(**arith, use_unsloth=True, max_prompt_length=500, max_response_length=100), base_model=tiny_local_model)
    assert "lower max_prompt_length to 412" in json.dumps(start(api, run_id).json())
    run_id = make_run(api, config={"max_length": 4096}, base_model=tiny_local_model, dataset="org/data")
    assert_start_refused(api, run_id, 422, "config.max_length")
    # Within the context, no such finding.
    run_id = make_run(api, **grpo(**arith, max_response_length=8), base_model=tiny_local_model)
    assert start(api, run_id).status_code == 202


def test_grpo_needs_no_dataset_on_cpu(api):
    run_id = make_run(api, **grpo(environment_id="builtin/arith@main"))
    assert start(api, run_id).status_code == 202
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is not None


def test_external_judge_with_saved_secret_passes(api, project):
    set_secret(project, "judge-key", "sk-123")
    run_id = make_run(api, **grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "external", "endpoint": "http://judge/v1", "api_key_secret": "judge-key"}))
    assert start(api, run_id).status_code == 202


def test_a_stored_ruler_run_with_an_environment_id_is_refused_at_start_naming_it(api, project):
    # Create and PATCH refuse the pair, but a run stored before that rule (or resumed from one, which
    # copies its parent's config unchecked) started: the judge scored it and the environment never loaded.
    set_secret(project, "judge-key", "sk-123")
    run_id = make_run(api, **grpo(rl_mode="ruler", ruler_task_args={"dataset": "org/prompts", "system_prompt": "Be kind"}, judge={"mode": "external", "endpoint": "http://judge/v1", "api_key_secret": "judge-key"}))
    run = TrainingRun.objects.get(pk=run_id)
    TrainingRun.objects.filter(pk=run_id).update(config={**run.config, "environment_id": "builtin/arith@main"})
    body = assert_start_refused(api, run_id, 422, "config.environment_id")
    assert [e["field"] for e in body["errors"]] == ["config.environment_id"]
    assert "remove environment_id, or set rl_mode: environment" in body["errors"][0]["message"]


def test_precision_advice_names_a_card_the_precision_runs_on():
    # NVFP4's advice on an H100 said "pick e.g. H100" (a Hopper, which it had just ruled out).
    from training.compute import parse_accelerators, precision_findings

    assert precision_findings("nvfp4", parse_accelerators("H100:1"))[0].message == "NVFP4 needs a Blackwell GPU; H100 is Hopper: use bf16 or pick e.g. B200"
    assert precision_findings("fp8", parse_accelerators("CPU"))[0].message.startswith("FP8 needs an Ada, Hopper or Blackwell GPU, and this run asks for the CPU")


def test_fp16_is_refused_at_create_as_the_engine_refuses_it(api):
    # It passed create and START, and the engine failed the run with "bad spec: config.precision".
    assert_error(api.post("/api/training-runs", sft_body(config={"precision": "fp16"})), 400, "config.precision")


def test_fp8_on_hopper_is_allowed_by_the_precision_rule(api):
    run_id = make_run(api, config={"precision": "fp8"}, compute={"backend": "dstack", "accelerators": "H100:1"})
    fields = [e["field"] for e in start(api, run_id).json()["errors"]]
    assert "config.precision" not in fields and "compute.accelerators" not in fields


def write_model(path, vocab: dict) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}))
    return str(path)


def test_teacher_with_another_tokenizer_returns_422(api, tmp_path):
    student = write_model(tmp_path / "student", {"a": 0, "b": 1})
    teacher = write_model(tmp_path / "teacher", {"a": 0, "c": 1})
    run_id = make_run(api, method="distill", base_model=student, config={"distillation": {"teacher_model": teacher}})
    assert_start_refused(api, run_id, 422, "config.distillation.teacher_model")


def test_teacher_with_same_tokenizer_passes(api, tmp_path):
    student = write_model(tmp_path / "student", {"a": 0, "b": 1})
    teacher = write_model(tmp_path / "teacher", {"a": 0, "b": 1})
    run_id = make_run(api, method="distill", base_model=student, config={"distillation": {"teacher_model": teacher}})
    assert start(api, run_id).status_code == 202


def test_a_data_hub_teacher_with_another_tokenizer_returns_422_before_start(api, project, tmp_path):
    # Only local folders were compared: a Data Hub teacher of another family failed the engine before capture.
    from datahub.commits import commit_files
    from datahub.repos import create_repo

    student = write_model(tmp_path / "student", {"a": 0, "b": 1})
    for name, vocab in (("teacher-mm", {"a": 0, "c": 1}), ("teacher-ok", {"a": 0, "b": 1})):
        folder = Path(write_model(tmp_path / name, vocab))
        commit_files(create_repo(project, name, "model"), "main", {p.name: p for p in folder.iterdir()}, message=name)
    mismatched = make_run(api, method="distill", base_model=student, config={"distillation": {"teacher_model": "teacher-mm@main"}})
    body = assert_start_refused(api, mismatched, 422, "config.distillation.teacher_model")
    assert any("the teacher's tokenizer differs from the student's" in e["message"] for e in body["errors"])
    fine = make_run(api, method="distill", base_model=student, config={"distillation": {"teacher_model": "teacher-ok@main"}})
    assert "config.distillation.teacher_model" not in [e["field"] for e in start(api, fine).json().get("errors", [])]


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"base_model": "../../etc/passwd"}, "base_model", "is a relative path"),
        ({"base_model": "/etc"}, "base_model", "no config.json in it"),
        ({"dataset": "/nonexistent/rows.jsonl"}, "dataset", "does not exist on the Studio's machine"),
        ({"method": "distill", "config": {"distillation": {"teacher_model": "/etc"}}}, "config.distillation.teacher_model", "no config.json in it"),
        # Stored and silently ignored before: this machine has neither.
        ({"compute": {"backend": "local", "region": "mars-1"}}, "compute.region", "a region does not apply"),
        ({"compute": {"backend": "local", "spot": True}}, "compute.spot", "there are no spot instances"),
    ],
)
def test_local_paths_for_the_local_backend_must_name_what_the_engine_loads(api, overrides, field, says):
    run_id = make_run(api, **overrides)
    body = assert_start_refused(api, run_id, 422, field)
    assert any(e["field"] == field and says in e["message"] for e in body["errors"]), body


def test_a_local_ruler_prompts_dataset_is_checked_row_by_row_at_start(api, project, tmp_path):
    # Chat rows passed START and the run failed on "rows need a prompt (or question/text) column".
    set_secret(project, "judge-key", "sk")
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    config = {"rl_mode": "ruler", "ruler_task_args": {"dataset": str(chat), "system_prompt": "Score it"},
              "judge": {"mode": "external", "endpoint": "http://judge.example/v1", "api_key_secret": "judge-key"}}
    body = assert_start_refused(api, make_run(api, **grpo(**config)), 422, "config.ruler_task_args.dataset")
    assert any(e["field"] == "config.ruler_task_args.dataset" and "rows have no prompt, question or text column" in e["message"] for e in body["errors"]), body


def test_a_local_dataset_is_checked_row_by_row_like_a_data_hub_one(api, tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    body = assert_start_refused(api, make_run(api, dataset=str(prefs)), 422, "dataset")
    assert any("rows look like prompt/chosen/rejected" in e["message"] and "SFT trains on" in e["message"] for e in body["errors"]), body
    chat = tmp_path / "chat"
    chat.mkdir()
    (chat / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    (chat / "b.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": 3}\n')
    body = assert_start_refused(api, make_run(api, dataset=str(chat)), 422, "dataset")
    assert [e["message"] for e in body["errors"] if e["field"] == "dataset"][0].startswith("b.jsonl row 2: "), body
    body = assert_start_refused(api, make_run(api, dataset="/etc/passwd"), 422, "dataset")
    assert any("is not a .jsonl, .json, .csv or .parquet file" in e["message"] for e in body["errors"]), body
    (chat / "b.jsonl").unlink()  # the cached findings follow the files
    fields = [e["field"] for e in start(api, make_run(api, dataset=str(chat))).json().get("errors", [])]
    assert "dataset" not in fields


def test_a_file_of_the_wrong_shape_in_a_local_folder_says_to_move_it_out(api, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    (folder / "prefs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    body = assert_start_refused(api, make_run(api, dataset=str(folder)), 422, "dataset")
    said = [e["message"] for e in body["errors"] if e["field"] == "dataset"]
    assert said == [f"prefs.jsonl rows look like prompt/chosen/rejected (columns: chosen, prompt, rejected); SFT trains on chat messages (messages) "
                    f"or prompt/completion or plain text (text) rows: move prefs.jsonl out of {folder}"], said


def test_local_roots_confine_what_runs_may_read(api, tmp_path, settings):
    allowed = tmp_path / "team"
    student = write_model(allowed / "student", {"a": 0, "b": 1})
    outside = write_model(tmp_path / "elsewhere" / "model", {"a": 0, "b": 1})
    (allowed / "escape").symlink_to(tmp_path / "elsewhere")
    settings.STUDIO_LOCAL_ROOTS = [allowed.resolve()]
    assert start(api, make_run(api, base_model=student)).status_code == 202
    for path in (outside, str(allowed / "escape" / "model"), str(allowed / ".." / "elsewhere" / "model")):
        body = assert_start_refused(api, make_run(api, base_model=path), 422, "base_model")
        message = [e["message"] for e in body["errors"] if e["field"] == "base_model"][0]
        assert message == f"{path} is outside the folders this Studio lets runs read ({allowed.resolve()}): put it under one of them, or push it to the Data Hub and use repo@ref"
    # Nor is a model outside them read for the tokenizer check or the GPU estimate.
    from training.refs import local_model_dir

    assert local_model_dir(outside) is None and local_model_dir(student) is not None


def test_a_data_hub_model_without_config_json_is_refused_at_start(api, project, users):
    from datahub.commits import commit_files
    from datahub.repos import create_repo

    commit_files(create_repo(project, "weights-only", "model", users["owner"]), "main", {"README.md": b"# soon"})
    body = assert_start_refused(api, make_run(api, base_model="weights-only@main"), 422, "base_model")
    assert any("weights-only@main has no config.json at its root" in e["message"] for e in body["errors"]), body


def test_a_bare_name_that_is_a_data_hub_repo_is_refused_at_start_saying_to_add_the_ref(api, project, users):
    # "qa-data" reads as an HF id: the engine looked for it on the Hub and the run failed after START.
    from datahub.repos import create_repo

    create_repo(project, "qa-data", "dataset", users["owner"])
    create_repo(project, "my-model", "model", users["owner"])
    run_id = make_run(api, base_model="my-model", dataset=["qa-data", {"ref": "other-data"}])
    body = assert_start_refused(api, run_id, 422, "dataset[0]")
    found = {e["field"]: e["message"] for e in body["errors"]}
    assert "write qa-data@main" in found["dataset[0]"] and "dataset repo qa-data" in found["dataset[0]"]
    assert "write my-model@main" in found["base_model"] and "or the HF id with its org (org/my-model)" in found["base_model"]
    assert "dataset[1].ref" not in found  # no repo of that name: an HF id, as before
    assert TrainingRun.objects.get(pk=run_id).status == Status.QUEUED


def test_all_findings_are_reported_at_once(api):
    run_id = stored_dpo_run(api, {"loss": {"type": "dpo", "dpo_beta": 0}, "per_device_train_batch_size": 3}, base_model=None, dataset=None)
    body = assert_start_refused(api, run_id, 422, "base_model")
    fields = {e["field"] for e in body["errors"]}
    assert {"base_model", "dataset", "config.lora_rank", "config.per_device_train_batch_size", "config.loss.dpo_beta"} <= fields


# ---- 402 ---------------------------------------------------------------------------------------

def test_start_without_training_plan_returns_402(api, project, free_plan):
    run_id = make_run(api)
    set_plan(project, free_plan)
    assert_start_refused(api, run_id, 402, None)


def test_start_beyond_concurrent_runs_returns_402(api, project):
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=1)
    first, second = make_run(api), make_run(api)
    assert start(api, first).status_code == 202
    body = assert_start_refused(api, second, 402, None)
    assert "1 run at once" in body["detail"]
    # It names the run holding the slot, so the user (or a script, from errors) knows which one to stop.
    assert f"1 is active (run {first}):" in body["detail"]
    name = TrainingRun.objects.get(pk=first).name
    assert body["errors"] == [{"field": f"runs.{first}", "message": f"run {first} {name!r} is starting and takes a slot: "
                                                                    f"stop it (POST /api/training-runs/{first}/stop, or Stop on its page) to free the slot"}]
    # Only a Studio administrator changes plans (the Billing page says so): the message sends the user there, not to "upgrade".
    assert "stop one, or ask a Studio administrator for a larger plan (Settings → Billing shows the plan)" in body["detail"]


def test_the_402_for_busy_slots_lists_each_run_and_keeps_bidi_isolates_out(api, project):
    """The 402 named the runs inside U+2068/U+2069 (for HTML display) with errors: []; a script could
    not tell which runs to stop. Each shown run is a finding, and a name's control characters show escaped."""
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=2)
    first, second, third = make_run(api), make_run(api), make_run(api)
    TrainingRun.objects.filter(pk=second).update(name="evil\u202egnp.exe")
    assert start(api, first).status_code == 202 and start(api, second).status_code == 202
    response = start(api, third)
    assert "\\u2068" not in response.content.decode() and "\\u2069" not in response.content.decode()
    body = assert_start_refused(api, third, 402, f"runs.{first}")
    assert [e["field"] for e in body["errors"]] == [f"runs.{first}", f"runs.{second}"]
    assert "(runs " + f"{first}, {second}):" in body["detail"]
    assert all("\u2068" not in text and "\u202e" not in text for text in [body["detail"], *(e["message"] for e in body["errors"])])
    assert f"run {second} 'evil\\u202egnp.exe' is starting" in body["errors"][1]["message"]


def test_start_beyond_gpus_per_run_returns_402(api, project):
    Plan.objects.filter(pk=project.plan_id).update(max_gpus_per_run=4)
    run_id = make_run(api, compute={"backend": "dstack", "accelerators": "H100:8"})
    assert_start_refused(api, run_id, 402, "compute.accelerators")


def test_the_runs_422_comes_before_the_plans_capacity_402(api, project):
    # It answered 402 first: the user stopped another run to free a slot, only to hear then that this one could not start.
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=1)
    first, second = make_run(api), make_run(api, base_model=None)
    assert start(api, first).status_code == 202
    assert_start_refused(api, second, 422, "base_model")


def test_402_comes_before_422(api, project, free_plan):
    run_id = make_run(api, base_model=None)
    set_plan(project, free_plan)
    assert_start_refused(api, run_id, 402, None)


def test_resume_without_training_plan_is_402_before_a_bad_step(api, project, free_plan):
    """Resume creates a run, so the plan gate (402) comes before the step's 400, as for create."""
    from training.models import Checkpoint

    run_id = make_run(api)
    Checkpoint.objects.create(run_id=run_id, attempt=1, step=3, path="/x/checkpoint-3")
    set_plan(project, free_plan)
    for step in (3, 4):
        assert_error(api.post(f"/api/training-runs/{run_id}/checkpoints/{step}/resume"), 402)
    assert TrainingRun.objects.count() == 1


def test_resume_with_a_body_on_a_plan_without_training_is_402_not_the_bodys_400(api, api_as, project, free_plan):
    # Precedence 401 → 404 → 403 → 402 → 409 → 400: the body check came first, and {"config": {}} got a 400.
    from training.models import Checkpoint

    run_id = make_run(api)
    Checkpoint.objects.create(run_id=run_id, attempt=1, step=5, path="/x/checkpoint-5")
    set_plan(project, free_plan)
    for body in ({"config": {}}, {"config": {"max_steps": 10}}):
        assert_error(api.post(f"/api/training-runs/{run_id}/checkpoints/5/resume", body), 402)
    assert_error(api_as("viewer").post(f"/api/training-runs/{run_id}/checkpoints/5/resume", {"config": {}}), 403)
    assert_error(api_as("outsider").post(f"/api/training-runs/{run_id}/checkpoints/5/resume", {"config": {}}), 404)
    assert TrainingRun.objects.count() == 1


# ---- 409 ---------------------------------------------------------------------------------------

def test_start_on_an_active_run_returns_409(api):
    run_id = make_run(api)
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING)
    assert_start_refused(api, run_id, 409, None)


def test_start_twice_returns_409(api):
    run_id = make_run(api)
    assert start(api, run_id).status_code == 202
    assert_start_refused(api, run_id, 409, None)


def test_start_and_patch_on_a_completed_run_return_409(api):
    run_id = make_run(api)
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED)
    assert_start_refused(api, run_id, 409, None)
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"name": "new"}), 409)
    assert TrainingRun.objects.get(pk=run_id).name == "sft run"


def test_patch_409_comes_before_body_errors(api):
    run_id = make_run(api)
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING)
    assert_error(api.patch(f"/api/training-runs/{run_id}", raw=b"{not json"), 409)


def test_409_comes_before_422(api):
    run_id = make_run(api, base_model=None)
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED)
    assert_start_refused(api, run_id, 409, None)


# ---- PATCH then start -------------------------------------------------------------------------

def test_patch_fixes_a_run_so_it_can_start(api):
    run_id = stored_dpo_run(api, {"loss": {"type": "dpo", "dpo_beta": 0.1}, "per_device_train_batch_size": 3})
    assert start(api, run_id).status_code == 422
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"lora_rank": 8, "per_device_train_batch_size": 4}})
    assert r.status_code == 200, r.content
    assert r.json()["config"]["loss"] == {"type": "dpo", "dpo_beta": 0.1}
    assert r.json()["config"]["lora_alpha"] == 8
    assert start(api, run_id).status_code == 202


def test_an_odd_dpo_batch_names_only_even_batches(api):
    batch = "config.per_device_train_batch_size"
    body = assert_error(api.post("/api/training-runs", sft_body(method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8, "per_device_train_batch_size": 1})), 400, batch)
    assert next(e["message"] for e in body["errors"] if e["field"] == batch).endswith("so the batch must be even: use 2"), body  # it said "use 2 or 2"
    run_id = make_run(api, method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8})
    body = assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"per_device_train_batch_size": 3}}), 400, batch)
    assert next(e["message"] for e in body["errors"] if e["field"] == batch).endswith("use 4 or 2"), body
    body = assert_start_refused(api, stored_dpo_run(api, {"loss": {"type": "dpo"}, "lora_rank": 8, "per_device_train_batch_size": 1}), 422, batch)
    assert next(e["message"] for e in body["errors"] if e["field"] == batch).endswith("so the batch must be even: use 2"), body


def test_patch_null_removes_a_key(api):
    run_id = make_run(api, config={"max_steps": 5, "seed": 3})
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"seed": None}})
    assert r.json()["config"] == {"max_steps": 5}


def test_patch_null_for_config_or_compute_puts_back_the_defaults_as_it_does_for_base_model(api):
    # RFC 7386: null deletes the member. base_model: null did; config: null and compute: null were a 400.
    run_id = make_run(api, method="dpo", config={"loss": {"type": "dpo", "dpo_beta": 0.3}, "lora_rank": 8, "max_steps": 5},
                      compute={"backend": "local", "accelerators": "CPU", "region": "here"})
    body = api.patch(f"/api/training-runs/{run_id}", {"compute": None}).json()
    assert body["compute"] == {"backend": "local", "accelerators": "CPU", "region": None, "spot": False}  # the defaults, as at create
    error = assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": None}), 400, "config.loss.type")  # DPO's own rule, as at create
    assert TrainingRun.objects.get(pk=run_id).config["loss"]["dpo_beta"] == 0.3, error
    sft = make_run(api, config={"max_steps": 5, "seed": 3})
    assert api.patch(f"/api/training-runs/{sft}", {"config": None}).json()["config"] == TrainingRun.objects.get(pk=make_run(api, config={})).config


def test_a_run_name_with_a_newline_is_refused_naming_the_character(api):
    run_id = make_run(api)
    body = assert_error(api.patch(f"/api/training-runs/{run_id}", {"name": "two\nlines"}), 400, "name")
    assert "U+000A" in body["errors"][0]["message"]
    assert_error(api.post("/api/training-runs", sft_body(name="tab\there")), 400, "name")


def test_patch_merges_a_dataset_object_like_config_and_compute(api):
    """The contract: PATCH is a JSON merge patch of dataset too (RFC 7386), so an entry's type
    changes alone and a null deletes it; a string or a list still replaces the dataset."""
    run_id = make_run(api, dataset={"ref": "org/d", "type": "sft"})
    r = api.patch(f"/api/training-runs/{run_id}", {"dataset": {"type": "preference"}})
    assert r.status_code == 200, r.content
    assert TrainingRun.objects.get(pk=run_id).dataset == {"ref": "org/d", "type": "preference"}
    r = api.patch(f"/api/training-runs/{run_id}", {"dataset": {"type": None}})
    assert r.status_code == 200, r.content
    assert TrainingRun.objects.get(pk=run_id).dataset == {"ref": "org/d"}
    r = api.patch(f"/api/training-runs/{run_id}", {"dataset": ["org/a", {"ref": "org/b", "type": "sft"}]})
    assert TrainingRun.objects.get(pk=run_id).dataset == ["org/a", {"ref": "org/b", "type": "sft"}]
    assert api.patch(f"/api/training-runs/{run_id}", {"dataset": None}).status_code == 200
    assert TrainingRun.objects.get(pk=run_id).dataset is None


def test_patch_that_breaks_a_rule_returns_400_and_keeps_the_run(api):
    run_id = make_run(api, method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8})
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"config": {"loss": None}}), 400, "config.loss.type")
    assert TrainingRun.objects.get(pk=run_id).config["loss"]["type"] == "dpo"


def test_patch_of_unknown_field_returns_400(api):
    run_id = make_run(api)
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"method": "dpo"}), 400, "method")
    assert TrainingRun.objects.get(pk=run_id).method == "sft"


def test_unresolvable_hub_refs_return_422_naming_the_field(api):
    run_id = make_run(api, base_model="no-such-model@main", dataset="no-such-data@main")
    body = assert_start_refused(api, run_id, 422, "base_model")
    assert "dataset" in {e["field"] for e in body["errors"]}


def test_choice_values_in_any_case_are_stored_in_lower_case_so_start_checks_them(api):
    """A choice is accepted in any case ("RULER", as the seed writes it): it must be stored as the
    rules and the engine read it, or START's RULER checks were skipped and the engine refused the
    spec inside the job."""
    run_id = make_run(api, method="grpo", dataset=None, config={"rl_mode": "RULER", "judge": {"mode": "External"}})
    config = TrainingRun.objects.get(pk=run_id).config
    assert (config["rl_mode"], config["judge"]["mode"]) == ("ruler", "external")
    body = assert_start_refused(api, run_id, 422, "config.ruler_task_args.dataset")
    assert {"config.ruler_task_args.system_prompt", "config.judge.endpoint", "config.judge.api_key_secret"} <= {e["field"] for e in body["errors"]}
    run_id = make_run(api, method="dpo", config={"lora": True, "loss": {"type": "DPO"}, "precision": "BF16"}, compute={"backend": "Local"})
    run = TrainingRun.objects.get(pk=run_id)
    assert (run.config["loss"]["type"], run.config["precision"], run.compute["backend"]) == ("dpo", "bf16", "local")
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"loss": {"type": "Dpo"}}})
    assert r.status_code == 200 and r.json()["config"]["loss"]["type"] == "dpo"


def test_a_child_run_resumes_only_from_its_parents_own_run_folder(api, tmp_path, settings):
    from training.backends.local import output_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = str(tmp_path / "runs")  # not var/runs, where an earlier session's run of this id may be
    parent_id = make_run(api)
    # An engine can report any path: one that points elsewhere on this machine (another project's
    # checkpoint, say) must not be what a child run on the local backend loads.
    elsewhere = tmp_path / "someone-elses" / "checkpoint-3"
    elsewhere.mkdir(parents=True)
    Checkpoint.objects.create(run_id=parent_id, attempt=1, step=3, path=str(elsewhere))
    own = output_dir(parent_id, 1) / "checkpoint-6"
    own.mkdir(parents=True)
    Checkpoint.objects.create(run_id=parent_id, attempt=1, step=6, path=str(own))
    refused = api.post(f"/api/training-runs/{parent_id}/checkpoints/3/resume").json()["id"]
    body = assert_start_refused(api, refused, 422, "resume_checkpoint")
    assert f"step 3 of run {parent_id} is not a checkpoint folder of that run" in body["errors"][-1]["message"]
    fine = api.post(f"/api/training-runs/{parent_id}/checkpoints/6/resume").json()["id"]
    # A body was ignored: {"config": {...}} made a child with the parent's settings.
    body = assert_error(api.post(f"/api/training-runs/{parent_id}/checkpoints/6/resume", {"config": {"max_steps": 10}}), 400, "body")
    assert "PATCH the new run" in body["errors"][0]["message"]
    assert api.post(f"/api/training-runs/{parent_id}/checkpoints/6/resume", {}).status_code == 201
    assert "resume_checkpoint" not in [e["field"] for e in start(api, fine).json().get("errors", [])]


def test_a_resumed_run_trains_the_same_model_and_adapter_past_its_step(api, project, settings, tmp_path):
    # A PATCH of the child's model or adapter failed the engine on a size mismatch; a max_steps at or
    # below the step it resumes from trained nothing, "completed" and published a model.
    from training.backends.local import output_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = str(tmp_path / "runs")
    parent_id = make_run(api, config={"max_steps": 30, "lora_rank": 8})
    TrainingRun.objects.filter(pk=parent_id).update(status=Status.COMPLETED)
    for step in (10, 30):
        folder = output_dir(parent_id, 1) / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        Checkpoint.objects.create(run_id=parent_id, attempt=1, step=step, path=str(folder))
    resumed = api.post(f"/api/training-runs/{parent_id}/checkpoints/30/resume").json()
    # Resumed from the parent's last step, the child trains as many steps again: it kept max_steps 30,
    # which START refused ("raise max_steps above 30"), so Resume from here on the last step was a dead end.
    assert resumed["config"] == {**TrainingRun.objects.get(pk=parent_id).config, "max_steps": 60}
    last = resumed["id"]
    assert api.patch(f"/api/training-runs/{last}", {"config": {"max_steps": 30}}).status_code == 200
    body = assert_start_refused(api, last, 422, "config.max_steps")
    assert f"step 30 of run #{parent_id} is where this run starts, and max_steps is 30: raise max_steps above 30" in body["errors"][0]["message"]
    assert api.patch(f"/api/training-runs/{last}", {"config": {"max_steps": 60}}).status_code == 200
    assert start(api, last).status_code == 202

    child = api.post(f"/api/training-runs/{parent_id}/checkpoints/10/resume").json()
    assert child["config"]["max_steps"] == 30  # a step before the end keeps the parent's max_steps
    child = child["id"]
    assert api.patch(f"/api/training-runs/{child}", {"base_model": "org/other-model", "config": {"lora_rank": 16}}).status_code == 200
    body = assert_start_refused(api, child, 422, "base_model")
    found = {e["field"]: e["message"] for e in body["errors"]}
    parent_model = TrainingRun.objects.get(pk=parent_id).base_model
    assert f"step 10 of run #{parent_id} trained {parent_model}: set base_model back to it" in found["base_model"]
    assert "saved an adapter with lora_rank 8: set it back, or start a new run with lora_rank 16" in found["config.lora_rank"]
    assert TrainingRun.objects.get(pk=child).status == Status.QUEUED


def test_a_stored_checkpoint_row_pointing_at_its_attempt_folder_itself_is_not_a_checkpoint(api, tmp_path, settings):
    # The attempt folder holds spec.json with the ingest token: only its output folder's saves are checkpoints.
    from training.backends.local import checkpoint_dir, output_dir, run_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = str(tmp_path / "runs")
    parent_id = make_run(api)
    (output_dir(parent_id, 1) / "checkpoint-2").mkdir(parents=True)
    rows = [Checkpoint.objects.create(run_id=parent_id, attempt=1, step=step, path=str(path))
            for step, path in ((1, run_dir(parent_id, 1)), (2, output_dir(parent_id, 1) / "checkpoint-2"), (3, output_dir(parent_id, 1)))]
    assert [checkpoint_dir(row) is not None for row in rows] == [False, True, False]


def test_resuming_a_full_fine_tune_with_lora_rank_says_the_step_saved_full_weights(api, settings, tmp_path):
    # QA: the message said "saved an adapter with lora_rank None" of a checkpoint holding full weights.
    from training.backends.local import run_dir
    from training.models import Checkpoint

    settings.STUDIO_RUNS_DIR = str(tmp_path / "runs")
    parent_id = make_run(api, config={"max_steps": 30})
    TrainingRun.objects.filter(pk=parent_id).update(status=Status.COMPLETED)
    folder = run_dir(parent_id, 1) / "checkpoint-4"
    folder.mkdir(parents=True)
    Checkpoint.objects.create(run_id=parent_id, attempt=1, step=4, path=str(folder))
    child = api.post(f"/api/training-runs/{parent_id}/checkpoints/4/resume").json()["id"]
    assert api.patch(f"/api/training-runs/{child}", {"config": {"lora_rank": 8}}).status_code == 200
    body = assert_start_refused(api, child, 422, "config.lora_rank")
    message = next(e["message"] for e in body["errors"] if e["field"] == "config.lora_rank")
    assert message == f"step 4 of run #{parent_id} saved full weights (no LoRA): remove lora_rank, or start a new run to train an adapter"
    assert "None" not in json.dumps(body)
    assert TrainingRun.objects.get(pk=child).status == Status.QUEUED



ONE_L4_QLORA_GRPO = {"environment_id": "builtin/arith@main", "lora_rank": 16, "load_in_4bit": True, "inference_blocks": 1, "trainer_blocks": 1}
ONE_L4 = {"backend": "local", "accelerators": "L4:1"}


def start_findings_of(api, run_id: int) -> list[tuple[str, str]]:
    return [(e["field"], e["message"]) for e in assert_start_refused(api, run_id, 422, None)["errors"]]


def test_grpo_on_one_gpu_shares_it_between_inference_and_trainer_blocks(api):
    # QA: seed 002's one-L4 smoke test got "the GPU blocks add up to 2 but the run asks for 1 GPU".
    run_id = make_run(api, **grpo(**ONE_L4_QLORA_GRPO), base_model="Qwen/Qwen2.5-0.5B-Instruct", compute=ONE_L4)
    # What is left is this machine's: the local backend here has no GPU.
    assert start_findings_of(api, run_id) == [("compute.accelerators", "the local backend has 0 GPUs and this run asks for 1: use CPU here, or a remote backend")]


@pytest.mark.parametrize(
    "config",
    [
        {**ONE_L4_QLORA_GRPO, "inference_blocks": 2},
        {"rl_mode": "ruler", "ruler_task_args": {"dataset": "org/prompts", "system_prompt": "Be kind"}, "judge": {"mode": "colocated"},
         "judge_blocks": 1, "inference_blocks": 1, "trainer_blocks": 1},
    ],
)
def test_grpo_on_one_gpu_refuses_more_blocks_than_it_can_share(api, config):
    run_id = make_run(api, **grpo(**config), compute=ONE_L4)
    blocks = [message for field, message in start_findings_of(api, run_id) if message.startswith("the GPU blocks")]
    assert blocks == ["the GPU blocks need 2 GPUs (on one GPU the inference and trainer blocks share it and a colocated judge needs one of its own) "
                      "but the run asks for 1 GPU: ask for at least 2 or use fewer blocks"]


@pytest.mark.parametrize("method, config", [("sft", {}), ("distill", {"distillation": {"teacher_model": "org/t"}})])
def test_a_dataset_entry_of_a_type_sft_does_not_train_on_is_refused(api, method, config):
    # {"type": "preference"} was trained on: the engine joins every entry into the training rows. (A type
    # that is none of DATASET_TYPES, such as "eval", is refused at create: tests/test_create_validation.py.)
    run_id = make_run(api, method=method, config=config, dataset=[{"ref": "org/data"}, {"ref": "org/held-out", "type": "preference"}])
    body = assert_start_refused(api, run_id, 422, "dataset[1].type")
    said = next(e["message"] for e in body["errors"] if e["field"] == "dataset[1].type")
    assert 'set type to sft, chat, text, prompt_completion or leave it out (got "preference")' in said, said
    assert "dataset[0].type" not in [e["field"] for e in body["errors"]]
