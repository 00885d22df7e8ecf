"""GRPO in Environment mode through TRL's GRPOTrainer.

Each optimizer step takes ONE prompt and its `rollouts_per_prompt` completions: the per-device batch is
the group, with no gradient accumulation, so TRL's group-relative advantage
``(r − mean) / (std + 1e-4)`` is computed over exactly that group. The environment's ``total`` is the
reward; its components are reported with the sampled rollouts. KL to the frozen reference (β =
`kl_coef`) is only computed when `kl_coef > 0`, so no reference model is held otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from .common import Context, StudioCallback, TokenCountingMixin, build_config, train_and_finish
from .data import load_rows
from .environments import Environment, environment_for
from .modeling import load_policy, load_tokenizer
from .spec import SpecError

ADVANTAGE_EPS = 1e-4  # same ε as TRL, so the advantages we report are the ones it trains on


class StudioGRPOTrainer(TokenCountingMixin, GRPOTrainer):
    pass


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    # Conversational completions are a list of messages; the assistant's content is what gets scored.
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), str(prompt))


def make_reward_fn(env: Environment, ctx: Context, group: int, trainer_ref: list[Any]) -> Any:
    every = int(ctx.spec.cfg("rollout_log_steps", 1))

    def environment_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        state = columns.get("trainer_state")
        step = (state.global_step if state is not None else 0) + 1  # scored before the step's update
        extra = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == len(prompts)}
        rows = []
        for i, prompt in enumerate(prompts):
            row = {k: v[i] for k, v in extra.items()}
            row["prompt"] = _prompt_text(prompt)
            rows.append(row)
        scores = env.score_group(rows, [_completion_text(c) for c in completions])
        totals = torch.tensor([s["total"] for s in scores], dtype=torch.float32)
        rep = ctx.reporter
        for key in scores[0]:
            if key != "total":
                rep.metric(step, f"rewards/{key}", sum(s[key] for s in scores) / len(scores))
        if step % every == 0:
            for start in range(0, len(scores), group):
                chunk = totals[start : start + group]
                std = chunk.std() if chunk.numel() > 1 else torch.tensor(0.0)
                adv = (chunk - chunk.mean()) / (std + ADVANTAGE_EPS)
                for j in range(chunk.numel()):
                    i = start + j
                    rep.rollout(
                        {
                            "step": step,
                            "prompt": _prompt_text(prompts[i]),
                            "completion": _completion_text(completions[i]),
                            "reward": float(totals[i]),
                            "advantage": float(adv[j]),
                            "components": {k: float(v) for k, v in scores[i].items() if k != "total"},
                        }
                    )
        return totals.tolist()

    return environment_reward


def _prompt_rows(ctx: Context, env: Environment) -> Any:
    import datasets

    spec = ctx.spec
    if spec.datasets:
        ds = load_rows(spec.datasets)
        if "prompt" not in ds.column_names:
            raise SpecError("dataset: GRPO prompt datasets need a prompt column")
    else:
        n = max(int(spec.cfg("max_steps", 100)), 64)
        ds = datasets.Dataset.from_list(env.prompts(n, seed=int(spec.cfg("seed", 42))))
    system_prompt = spec.cfg("system_prompt") or getattr(env, "system_prompt", None)
    if system_prompt:
        # A system prompt turns each string prompt into a chat, so the model's chat template applies.
        ds = ds.map(lambda r: {"prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": r["prompt"]}]})
    return ds


def _tool_rollouts(env: Environment, tokenizer: Any, max_len: int) -> Any:
    if not getattr(env, "tool_stop", None):
        return None
    from .tools import make_rollout_func

    return make_rollout_func(env, tokenizer, max_len)


def run(ctx: Context) -> None:
    spec = ctx.spec
    env = environment_for(spec, ctx.reporter)  # before the model: a bad environment fails before step one
    group = int(spec.cfg("rollouts_per_prompt", 8))
    if group < 2:
        raise SpecError("config.rollouts_per_prompt: GRPO needs at least 2 rollouts per prompt")
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = _prompt_rows(ctx, env)
    kl_coef = float(spec.cfg("kl_coef", 0.0))
    ctx.reporter.log(f"grpo: environment {env.id}, {len(dataset)} prompts, {group} rollouts per prompt, kl_coef={kl_coef}")
    method_kwargs: dict[str, Any] = {
        "per_device_train_batch_size": group,
        "gradient_accumulation_steps": 1,
        "num_generations": group,
        "max_completion_length": int(spec.cfg("max_response_length", 2048)),
        "beta": kl_coef,
        "learning_rate": float(spec.cfg("learning_rate", 1e-6)),
        "max_steps": int(spec.cfg("max_steps", 100)),
        "seed": int(spec.cfg("seed", 42)),
    }
    args = build_config(GRPOConfig, ctx, **method_kwargs)
    model = load_policy(spec, ctx.device)
    ref: list[Any] = []
    trainer = StudioGRPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=[make_reward_fn(env, ctx, group, ref)],
        callbacks=[StudioCallback(ctx, ref)],
        rollout_func=_tool_rollouts(env, tokenizer, method_kwargs["max_completion_length"]),
    )
    ref.append(trainer)
    ctx.reporter.stage("train")
    train_and_finish(trainer, ctx, tokenizer)
