"""GRPO in Environment mode through TRL's GRPOTrainer.

Each optimizer step takes ONE prompt and its `rollouts_per_prompt` completions: the per-device batch is
the group, with no gradient accumulation, so TRL's group-relative advantage
``(r − mean) / (std + 1e-4)`` is computed over exactly that group. The environment's ``total`` is the
reward; its components are reported with the sampled rollouts. KL to the frozen reference (β =
`kl_coef`) is only computed when `kl_coef > 0`, so no reference model is held otherwise.

Rollouts come from one of three places (`rollout_engine`): an environment with a tool drives generation
itself (`tools.py`); "static" decodes the whole step's rollouts in one batch over a static KV cache with a
CUDA-graphed decode step (`rollout.py`), handed to TRL as its `rollout_func`; "generate" leaves TRL's plain
`model.generate` in charge. "auto" picks static where it pays (see `resolve_rollout_engine`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from .common import Context, ServingConfigMixin, StudioCallback, TokenCountingMixin, build_config, train_and_finish
from .data import load_rows
from .environments import Environment, environment_for, group_std
from .modeling import Device, load_policy, load_tokenizer
from .rollout import StaticDecoder, static_decoder_support
from .spec import SpecError
from .unsloth_loading import keep_prompt_end, load_unsloth_policy, prompt_limit, require_unsloth

# A column the engine adds to the prompt rows: the row's number (from 1, as START's dataset checks count),
# so an environment's failure names the row it scored. It never reaches score().
ROW_NUMBER = "_studio_row_number"
ADVANTAGE_EPS = 1e-4  # same ε as TRL, so the advantages we report are the ones it trains on
ROLLOUT_ENGINES = ("auto", "static", "generate")
# On the CPU, auto = static as well: on the tiny student, 8 rollouts, 15 interleaved runs each, the paired
# median ratio static/generate was 1.11 / 1.07 / 1.04 at 6 / 64 / 256 new tokens with 2 threads (1.11 / 1.11 /
# 0.99 with one), and tests/engine/test_grpo.py passes with it. The machine was shared and loaded: one burst of
# contention gave 0.81-0.88, so read the figures as "at least as fast", not as a speed-up worth quoting.
CPU_AUTO_ENGINE = "static"


class StudioGRPOTrainer(TokenCountingMixin, ServingConfigMixin, GRPOTrainer):
    # Every rollout engine (TRL's generate, the static decoder, tools.py) tokenises through _tokenize_prompts.
    max_prompt_length: int | None = None

    def _tokenize_prompts(self, prompts: list) -> Any:
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        if self.max_prompt_length is not None:
            prompt_ids = [keep_prompt_end(ids, self.max_prompt_length) for ids in prompt_ids]
        return prompt_ids, images, multimodal_fields


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
    numbered = "row" if ctx.spec.datasets else "prompt"  # without a dataset, the prompts cycle the environment's own data

    def environment_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        state = columns.get("trainer_state")
        step = (state.global_step if state is not None else 0) + 1  # scored before the step's update
        extra = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == len(prompts)}
        numbers = extra.pop(ROW_NUMBER, None) or [0] * len(prompts)
        rows = []
        for i, prompt in enumerate(prompts):
            row = {k: v[i] for k, v in extra.items()}
            row["prompt"] = _prompt_text(prompt)
            rows.append(row)
        scores = env.score_rollouts(rows, [_completion_text(c) for c in completions], step, numbers, numbered)
        totals = torch.tensor([s["total"] for s in scores], dtype=torch.float32)
        rep = ctx.reporter
        for key in scores[0]:
            if key != "total":
                rep.metric(step, f"rewards/{key}", sum(s[key] for s in scores) / len(scores))
        if step % every == 0:
            for start in range(0, len(scores), group):
                chunk = totals[start : start + group]
                std = group_std(chunk.tolist())
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
        ds = load_rows(spec.datasets, ctx.reporter.log)
        if "prompt" not in ds.column_names:
            raise SpecError("dataset: GRPO prompt datasets need a prompt column")
        _check_row_keys(ds, env)
    else:
        n = max(int(spec.cfg("max_steps", 100)), 64)
        ds = datasets.Dataset.from_list(env.own_prompts(n, spec.seed))
    system_prompt = spec.cfg("system_prompt") or getattr(env, "system_prompt", None)
    ctx.reporter.system_prompt(system_prompt)  # the environment's own is in no config the Studio holds
    if system_prompt:
        # A system prompt turns each string prompt into a chat, so the model's chat template applies.
        ds = ds.map(lambda r: {"prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": r["prompt"]}]})
    return ds


def _check_row_keys(ds: Any, env: Environment) -> None:
    """The run's own dataset has every column the environment scores against, in every row: found
    here, before the model loads, rather than as a KeyError at step one."""
    for key in env.row_keys:
        if key not in ds.column_names:
            raise SpecError(f'dataset: {env.id} scores each completion against the row\'s {", ".join(env.row_keys)}, and the dataset has no "{key}" column '
                            f"(its columns: {', '.join(ds.column_names)}): add it, or leave dataset empty to use the environment's own prompts")
        for number, value in enumerate(ds[key], start=1):
            if value is None or (isinstance(value, str) and not value.strip()):
                raise SpecError(f'dataset: row {number}: "{key}" is empty, and {env.id} scores each completion against it')


def _tool_rollouts(env: Environment, tokenizer: Any, max_len: int) -> Any:
    if not getattr(env, "tool_stop", None):
        return None
    from .tools import make_rollout_func

    return make_rollout_func(env, tokenizer, max_len)


def _unsupported_sampling(args: Any) -> str | None:
    """Generation settings the static decoder does not implement (plain generate honours them)."""
    if getattr(args, "use_vllm", False):
        return "use_vllm (vLLM generates the rollouts)"
    if getattr(args, "use_transformers_continuous_batching", False):
        return "use_transformers_continuous_batching"
    if getattr(args, "min_p", None) is not None:
        return "min_p"
    if float(getattr(args, "repetition_penalty", 1.0) or 1.0) != 1.0:
        return "repetition_penalty"
    if getattr(args, "generation_kwargs", None):
        return "generation_kwargs"
    return None


def resolve_rollout_engine(spec: Any, env: Environment, args: Any, model: Any, device: Device) -> tuple[str, str]:
    """Which engine makes this run's rollouts ("tools", "static" or "generate") and why, in words for the log."""
    asked = str(spec.cfg("rollout_engine", "auto") or "auto")
    if asked not in ROLLOUT_ENGINES:
        raise SpecError(f"config.rollout_engine: must be one of {', '.join(ROLLOUT_ENGINES)}, got {asked!r}")
    if getattr(env, "tool_stop", None):
        return "tools", f"environment {env.id} calls a tool mid-rollout, so its rollout loop generates (rollout_engine={asked} does not apply)"
    if asked == "generate":
        return "generate", "config.rollout_engine is generate"
    why_not = static_decoder_support(model) or _unsupported_sampling(args)
    if why_not is not None:
        if asked == "static":
            raise SpecError(f"config.rollout_engine: the static decoder does not support {why_not}; set rollout_engine to auto or generate")
        return "generate", f"auto: the static decoder does not support {why_not}"
    if asked == "static":
        return "static", "config.rollout_engine is static"
    if device.kind == "cuda":
        return "static", "auto on CUDA: one batch per step, static KV cache, CUDA-graphed decode step"
    if CPU_AUTO_ENGINE == "static":
        return "static", "auto on the CPU: the static decoder is at least as fast as plain generate here"
    return "generate", "auto on the CPU: plain generate is as fast as the static decoder here"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def make_static_rollout_func(ctx: Context, tokenizer: Any, max_completion_length: int) -> Any:
    """A TRL `rollout_func` over one StaticDecoder per trainer, built at the first step and reused after.

    TRL hands it the process's prompts already repeated `num_generations` times, so it returns one completion
    per prompt. The decoder shares the policy's weights (no copy, no merge), so each step samples from the
    current policy. It is rebuilt, larger, only when a step brings more prompts or a longer prompt than it
    was sized for.
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16; we pin it
    holder: dict[str, StaticDecoder] = {}

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.models import unwrap_model_for_generation

        prompt_ids = [list(p) for p in trainer._tokenize_prompts(prompts)[0]]
        longest = max(len(p) for p in prompt_ids)
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
        ) as model:
            decoder = holder.get("decoder")
            if decoder is None or decoder.model is not model or decoder.max_batch < len(prompt_ids) or decoder.max_total_len < longest + max_completion_length:
                # Headroom on the prompt side so a slightly longer prompt next step does not force a rebuild.
                total = _round_up(longest * 5 // 4 + max_completion_length + 1, 64)
                batch = len(prompt_ids)
                if decoder is not None:
                    total, batch = max(total, decoder.max_total_len), max(batch, decoder.max_batch)
                    holder.pop("decoder")  # free the old cache (and graph pool) before allocating the new one
                    ctx.reporter.log(f"rollout: resizing the static decoder to {batch} rows × {total} tokens")
                decoder = StaticDecoder(
                    model,
                    max_batch=batch,
                    max_total_len=total,
                    eos_token_ids=list(trainer.eos_token_ids),
                    pad_token_id=int(tokenizer.pad_token_id),
                    log=ctx.reporter.log,
                )
                holder["decoder"] = decoder
            out = decoder.generate(
                prompt_ids, max_completion_length, temperature=float(trainer.temperature), top_p=float(trainer.top_p), top_k=int(trainer.top_k or 0)
            )
        if trainer.model.training:  # evaluation rollouts are not the training step's throughput
            ctx.reporter.metric(trainer.state.global_step + 1, "rollout/tokens_per_s", out.new_tokens / max(out.seconds, 1e-9))
        return {"prompt_ids": prompt_ids, "completion_ids": out.completion_ids, "logprobs": out.logprobs}

    return rollout


def run(ctx: Context) -> None:
    spec = ctx.spec
    env = environment_for(spec, ctx.reporter)  # before the model: a bad environment fails before step one
    group = int(spec.cfg("rollouts_per_prompt", 8))
    if group < 2:
        raise SpecError("config.rollouts_per_prompt: GRPO needs at least 2 rollouts per prompt")
    unsloth = bool(spec.cfg("use_unsloth", False))
    if unsloth:
        require_unsloth()  # before the tokenizer and the prompts, not after minutes of loading
    elif spec.cfg("max_prompt_length") is not None:
        ctx.reporter.log("config.max_prompt_length: applies only with use_unsloth; ignored, prompts are not truncated")
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = _prompt_rows(ctx, env)
    dataset = dataset.add_column(ROW_NUMBER, list(range(1, len(dataset) + 1)))
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
        "seed": spec.seed,
    }
    args = build_config(GRPOConfig, ctx, **method_kwargs)
    model = load_unsloth_policy(spec, ctx.device, ctx.reporter.log) if unsloth else load_policy(spec, ctx.device, log=ctx.reporter.log)
    engine, why = resolve_rollout_engine(spec, env, args, model, ctx.device)
    ctx.reporter.log(f"grpo: rollout engine {engine}: {why}")
    if engine == "tools":
        rollout_func = _tool_rollouts(env, tokenizer, method_kwargs["max_completion_length"])
    elif engine == "static":
        rollout_func = make_static_rollout_func(ctx, tokenizer, method_kwargs["max_completion_length"])
    else:
        rollout_func = None
    ref: list[Any] = []
    trainer = StudioGRPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        reward_funcs=[make_reward_fn(env, ctx, group, ref)],
        callbacks=[StudioCallback(ctx, ref)],
        rollout_func=rollout_func,
    )
    trainer.max_prompt_length = prompt_limit(spec)
    ref.append(trainer)
    ctx.reporter.stage("train")
    train_and_finish(trainer, ctx, tokenizer)
