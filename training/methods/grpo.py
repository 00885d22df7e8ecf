from __future__ import annotations

from studio.errors import Finding, counted
from training.compute import accelerators_of
from training.methods.base import BOOL, COMMON_KEYS, MAX_STEPS, NON_NEGATIVE, Draft, Key, TrainingMethod

JUDGE_KEYS = {
    "mode": Key("choice", choices=("external", "colocated")),
    "endpoint": Key("str", nullable=True),
    "model": Key("str", nullable=True),
    "api_key_secret": Key("str", nullable=True),
}
RULER_KEYS = {"dataset": Key("ref"), "system_prompt": Key("str")}
# Seed 002's defaults. max_prompt_length (1024) applies only with use_unsloth: GRPO.implied_defaults.
DEFAULTS = {
    "rl_mode": "environment",
    "learning_rate": 1e-6,
    "max_steps": 100,
    "num_epochs": 1,
    "rollouts_per_prompt": 8,
    "kl_coef": 0.0,
    "max_response_length": 2048,
    "seed": 42,
}


GPU_BLOCKS = Key("int", minimum=0, maximum=65_536)


def generation_batch_findings(config: dict) -> list[Finding]:
    """TRL's generation-batch rules, as this engine sets TRL up: one process, per-device batch =
    rollouts_per_prompt, no accumulation (training/engine/grpo.py), so the global batch is one group."""
    group = config.get("rollouts_per_prompt", DEFAULTS["rollouts_per_prompt"])
    size = config.get("generation_batch_size")
    if size is not None and config.get("steps_per_generation") is not None:
        return [Finding("config.generation_batch_size", "set generation_batch_size or steps_per_generation, not both: "
                                                        "generation_batch_size = steps_per_generation × rollouts_per_prompt")]
    if size is not None and size % group:
        lower = size - size % group
        use = f"{lower} or {lower + group}" if lower else str(group)
        return [Finding("config.generation_batch_size", f"must be a multiple of the global batch, which for GRPO is one prompt's rollouts_per_prompt "
                                                        f"({group}) completions: use {use}, or set steps_per_generation instead")]
    return []


GRPO_STEP = "a GRPO step trains on one prompt and its rollouts_per_prompt completions"
# Keys every method has that GRPO's engine overrides (training/engine/grpo.py: the per-device batch is the
# group, with no accumulation; max_steps is always set, so TRL never reads the epoch count): accepted,
# they were stored and shown on the run while the trainer did something else. Each with what to use.
UNUSED_BY_GRPO = {
    "per_device_train_batch_size": "the batch is the group: set rollouts_per_prompt for more completions per step",
    "gradient_accumulation_steps": "there is no accumulation: set rollouts_per_prompt for a larger group, or lower learning_rate for smaller updates",
    "num_epochs": "the run length is max_steps (one pass over an N-prompt dataset is N steps): set max_steps",
}

# Keys GRPO's engine never reads (TrainingMethod.unread_keys): rollouts are sized by max_response_length.
UNREAD_BY_GRPO = {
    "max_length": "GRPO does not use max_length: rollouts are sized by max_response_length (the completion's tokens); "
                  "set max_response_length instead and remove max_length",
}


def unused_batch_findings(config: dict) -> list[Finding]:
    """num_epochs 1 is seed 002's default, stored on every GRPO run, so it is the one value let through."""
    return [Finding(f"config.{key}", f"GRPO does not use {key}: {GRPO_STEP}, and {why}; remove {key}")
            for key, why in UNUSED_BY_GRPO.items() if key in config and not (key == "num_epochs" and config[key] == DEFAULTS["num_epochs"])]


def mode_findings(config: dict) -> list[Finding]:
    """RULER mode wins in the engine (training/engine/environments.py environment_for loads the judge's
    task and never reads environment_id), so an environment_id beside it is taken and never loaded."""
    if config.get("rl_mode") == "ruler" and config.get("environment_id"):
        return [Finding("config.environment_id", "RULER mode scores rollouts with its judge, and environment_id would be silently unused: "
                                                 "remove environment_id, or set rl_mode: environment to score with the environment")]
    return []


# This engine generates rollouts in the trainer's own process, on the trainer's GPU (training/engine/rollout.py):
# there is no separate vLLM server. The blocks are the split the foundation contract asks for; on one GPU the
# inference and trainer blocks share it, while a colocated judge always needs a GPU of its own.
BLOCKS_MEANING = "rollouts are generated on the trainer's GPU, so on one GPU the inference and trainer blocks share it"


def gpu_blocks_needed(config: dict, gpus: int, *, colocated_judge: bool) -> int:
    inference, trainer = config.get("inference_blocks") or 0, config.get("trainer_blocks") or 0
    policy = max(inference, trainer) if gpus == 1 else inference + trainer
    judge = (config.get("judge_blocks") or 0) if colocated_judge else 0
    return policy + judge


def gpu_block_findings(config: dict, gpus: int, *, colocated_judge: bool) -> list[Finding]:
    findings = [Finding(f"config.{key}", f"GRPO on GPUs needs {key} ≥ 1 ({BLOCKS_MEANING})")
                for key in ("inference_blocks", "trainer_blocks") if not config.get(key)]
    needed = gpu_blocks_needed(config, gpus, colocated_judge=colocated_judge)
    if needed > gpus:
        how = "on one GPU the inference and trainer blocks share it and a colocated judge needs one of its own" if gpus == 1 else "the blocks add up"
        findings.append(Finding("compute.accelerators", f"the GPU blocks need {counted(needed, 'GPU')} ({how}) but the run asks for "
                                                         f"{counted(gpus, 'GPU')}: ask for at least {needed} or use fewer blocks"))
    return findings


class GRPO(TrainingMethod):
    """Group Relative Policy Optimisation with rewards from an environment or a RULER judge."""

    name = "grpo"
    label = "GRPO"
    trl_config = "GRPOConfig"
    # num_train_epochs: GRPO refuses num_epochs other than 1 (UNUSED_BY_GRPO), so its run length is max_steps.
    trl_aliases = {"num_generations": "rollouts_per_prompt", "max_completion_length": "max_response_length", "beta": "kl_coef",
                   "num_train_epochs": "max_steps"}
    needs_dataset = False  # prompts come from the environment or from ruler_task_args
    implied_defaults = {"use_unsloth": {"max_prompt_length": 1024}}
    unread_keys = UNREAD_BY_GRPO
    keys = {
        "rl_mode": Key("choice", choices=("environment", "ruler")),
        "environment_id": Key("str", nullable=True, hint='an environment ref like "builtin/arith@main"'),
        "ruler_task_args": Key("block", block=RULER_KEYS),
        "judge": Key("block", block=JUDGE_KEYS),
        # Upper bounds as COMMON_KEYS': a value past them parses but can never run (base.py).
        "inference_blocks": GPU_BLOCKS,
        "trainer_blocks": GPU_BLOCKS,
        "judge_blocks": GPU_BLOCKS,
        "rollouts_per_prompt": Key("int", minimum=2, maximum=65_536, hint="an integer from 2 to 65536 (the group size)"),
        "kl_coef": NON_NEGATIVE,
        "max_response_length": COMMON_KEYS["max_length"],
        "max_prompt_length": COMMON_KEYS["max_length"],
        # "auto": the engine's own static-KV decode loop on a GPU, plain generate on the CPU.
        "rollout_engine": Key("choice", choices=("auto", "static", "generate")),
        "use_unsloth": BOOL,
        "global_batch_size": Key("any"),
        "rollout_log_steps": Key("int", minimum=1, maximum=MAX_STEPS),
    }

    def create_findings(self, draft: Draft) -> list[Finding]:
        config, findings = draft.config, []
        if "global_batch_size" in config:
            findings.append(Finding("config.global_batch_size", "GRPO does not support global_batch_size: each step trains on one prompt and its rollouts_per_prompt completions; remove it"))
        if "max_prompt_length" in config and not config.get("use_unsloth"):
            findings.append(Finding("config.max_prompt_length", "max_prompt_length only applies with use_unsloth: the default trainer does not truncate prompts; remove it or set use_unsloth: true"))
        findings += mode_findings(config)
        findings += generation_batch_findings(config)
        findings += unused_batch_findings(config)
        # load_in_4bit without LoRA: the shared rule (TrainingMethod.check_types, lora_enabled), where lora: true is rank 16.
        # use_liger's restrictions apply to every method: training/validation.py liger_findings.
        return findings

    def apply_defaults(self, config: dict) -> dict:
        return super().apply_defaults({**DEFAULTS, **config})

    def start_findings(self, draft: Draft) -> list[Finding]:
        config, findings = draft.config, mode_findings(draft.config)  # again: a run stored before the rule, or resumed from one
        mode = config.get("rl_mode", "environment")
        if mode == "environment" and not config.get("environment_id"):
            findings.append(Finding("config.environment_id", 'Environment mode needs a registered environment: set environment_id, e.g. "builtin/arith@main"'))
        judge = config.get("judge") or {}
        if mode == "ruler":
            task = config.get("ruler_task_args") or {}
            if not task.get("dataset"):
                findings.append(Finding("config.ruler_task_args.dataset", "RULER mode needs a dataset of prompts in ruler_task_args.dataset"))
            if not task.get("system_prompt"):
                findings.append(Finding("config.ruler_task_args.system_prompt", "RULER mode needs the judge's criteria in ruler_task_args.system_prompt"))
            judge_mode = judge.get("mode", "external")
            if judge_mode == "external":
                if not judge.get("endpoint"):
                    findings.append(Finding("config.judge.endpoint", "an external judge needs the URL of your OpenAI-compatible endpoint"))
                secret = judge.get("api_key_secret")
                if not secret:
                    findings.append(Finding("config.judge.api_key_secret", "an external judge needs an API key: save it as a project secret and name it here"))
                elif draft.project is not None:
                    from studio.services import secret_exists

                    if not secret_exists(draft.project, secret):
                        findings.append(Finding("config.judge.api_key_secret", f"no project secret named {secret!r}: save it under Settings → Secrets (PUT /api/secrets/{secret})"))
            elif judge_mode == "colocated" and not config.get("judge_blocks"):
                findings.append(Finding("config.judge_blocks", "a colocated judge runs on its own GPUs: set judge_blocks ≥ 1"))
        accel = accelerators_of(draft.compute)
        if not accel.is_cpu:
            findings += gpu_block_findings(config, accel.count, colocated_judge=mode == "ruler" and judge.get("mode") == "colocated")
        return findings
