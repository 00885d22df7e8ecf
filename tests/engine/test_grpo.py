from __future__ import annotations

from pathlib import Path

import pytest

from training.engine.environments import ArithEnvironment, load_environment
from training.engine.spec import SpecError
from training.engine.unsloth_loading import keep_prompt_end

from .conftest import IngestStub, make_spec, mean, run_inprocess

GRPO_CONFIG = {
    "max_steps": 40,
    "learning_rate": 2e-2,
    "lr_scheduler_type": "constant",
    "rollouts_per_prompt": 8,
    "max_response_length": 6,
    "environment_id": "builtin/arith@main",
    "rollout_log_steps": 5,
}


def test_arith_reward_is_dense() -> None:
    env = ArithEnvironment()
    row = {"prompt": "What is 7+5? Answer with digits only."}
    perfect = env.score(row, " 12")
    assert perfect == {"format": 1.0, "digits": 1.0, "exact": 1.0, "total": 1.0}
    half = env.score(row, "15 apples")
    assert 0 < half["total"] < perfect["total"] and half["digits"] == 0.5
    assert env.score(row, "hello")["total"] == 0.0
    assert env.score(row, "1")["total"] > env.score(row, "x")["total"]  # partial credit for a digit


def test_unknown_environment_names_the_field() -> None:
    with pytest.raises(SpecError, match="config.environment_id"):
        load_environment("builtin/nope@main")


def test_grpo_mean_reward_rises_on_builtin_arith(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    spec = make_spec("grpo", tiny["student"], [], tmp_path, GRPO_CONFIG, ingest)
    assert run_inprocess(spec) == 0
    rewards = ingest.series("reward")
    assert len(rewards) == 40
    assert mean(rewards[-10:]) > mean(rewards[:10]) + 0.1, rewards
    for key in ("reward_std", "loss", "completions/mean_length", "entropy", "rewards/format", "tokens_per_s"):
        assert len(ingest.series(key)) >= 40, key
    assert "kl" not in ingest.metrics()  # kl_coef = 0: no reference model, no kl metric
    rollouts = ingest.collect("rollouts")
    assert sorted({r["step"] for r in rollouts}) == [5, 10, 15, 20, 25, 30, 35, 40]
    assert len(rollouts) == 8 * 8  # every completion of each sampled group
    first = rollouts[0]
    assert set(first) == {"step", "prompt", "completion", "reward", "advantage", "components"}
    assert set(first["components"]) == {"format", "digits", "exact"}
    group = [r for r in rollouts if r["step"] == 5]
    assert abs(sum(r["advantage"] for r in group)) < 1e-3  # group-relative: advantages centre on 0


def test_grpo_with_kl_system_prompt_and_lora(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {
        **GRPO_CONFIG,
        "max_steps": 3,
        "rollouts_per_prompt": 4,
        "kl_coef": 0.01,
        "lora_rank": 4,
        "system_prompt": "Answer with the number only.",
        "rollout_log_steps": 1,
    }
    spec = make_spec("grpo", tiny["student"], [tiny["grpo"]], tmp_path, cfg, ingest)
    assert run_inprocess(spec) == 0
    assert len(ingest.series("kl")) == 3
    rollouts = ingest.collect("rollouts")
    assert len(rollouts) == 3 * 4
    assert rollouts[0]["prompt"].startswith("What is ")  # the user turn, not the system prompt
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["adapter", "merged"]


def test_arith_scores_a_row_without_answer_or_sum_0_and_warns_once() -> None:
    logged: list[str] = []
    env = ArithEnvironment(log=logged.append)
    assert env.score({"prompt": "Q1", "answer": "A"}, "A")["exact"] == 1.0
    assert env.score({"prompt": "Q2"}, "4") == {"format": 0.0, "digits": 0.0, "exact": 0.0, "total": 0.0}
    assert env.score({"prompt": "Q3"}, "4")["total"] == 0.0
    assert env.score({"prompt": "What is 2+2?"}, "4")["exact"] == 1.0
    assert logged == ['builtin/arith: the row with prompt \'Q2\' has no "answer" and no a+b in its prompt, so its rollouts score 0 '
                      '(later such rows too, without another warning): give those rows an "answer" column']


def test_keep_prompt_end_cuts_prompts_from_the_left() -> None:
    assert keep_prompt_end([1, 2, 3, 4, 5], 3) == [3, 4, 5]  # the end of the prompt, next to the completion, survives
    assert keep_prompt_end([1, 2], 3) == [1, 2]
    assert keep_prompt_end([1, 2, 3], 3) == [1, 2, 3]
    with pytest.raises(SpecError, match="config.max_prompt_length"):
        keep_prompt_end([1], 0)


def test_grpo_trainer_tokenises_prompts_cut_to_max_prompt_length(tiny, tmp_path: Path) -> None:
    # Every rollout engine (TRL's generate, the static decoder, tools.py) takes its prompt ids from here.
    import datasets
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from training.engine.grpo import StudioGRPOTrainer
    from training.engine.modeling import load_tokenizer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1, use_cpu=True, report_to="none")
    trainer = StudioGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny["student"]), args=args, processing_class=load_tokenizer(tiny["student"]),
                                train_dataset=datasets.Dataset.from_list([{"prompt": "x"}] * 2), reward_funcs=[lambda prompts, **_: [0.0] * len(prompts)])
    prompt = ["What is 17+25? Answer with digits only."]
    whole = list(trainer._tokenize_prompts(prompt)[0][0])
    trainer.max_prompt_length = 4
    assert len(whole) > 4 and list(trainer._tokenize_prompts(prompt)[0][0]) == whole[-4:]


def test_use_unsloth_without_the_package_fails_before_the_model_loads_naming_the_field(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # Unsloth is not installed here: the run must not train without it, as it did while the key was "ignored".
    cfg = {**GRPO_CONFIG, "max_steps": 1, "use_unsloth": True, "max_prompt_length": 64}
    assert run_inprocess(make_spec("grpo", tiny["student"], [], tmp_path, cfg, ingest)) == 2
    failure = next(b["error"] for b in ingest.batches if b["status"] == "failed")
    assert failure["message"].startswith("config.use_unsloth: the unsloth package is not installed"), failure
    assert not any(line.startswith("attention:") for line in ingest.collect("logs"))  # no model was loaded


def test_grpo_no_longer_logs_use_unsloth_or_max_prompt_length_as_not_grpo_config_fields(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {**GRPO_CONFIG, "max_steps": 1, "rollouts_per_prompt": 2, "use_unsloth": False, "max_prompt_length": 64}
    assert run_inprocess(make_spec("grpo", tiny["student"], [], tmp_path, cfg, ingest)) == 0
    logs = ingest.collect("logs")
    assert not [line for line in logs if "not a GRPOConfig field" in line], logs
    assert "config.max_prompt_length: applies only with use_unsloth; ignored, prompts are not truncated" in logs
