"""Tool calls inside a GRPO rollout (the calculator environment and any package with a tool).

An environment with a tool has ``tool_stop`` (the text that ends a call, e.g. ``</calc>``),
``call_tool(text_so_far) -> str | None`` and ``max_tool_calls``. Generation stops at ``tool_stop``; the
tool's reply is appended to the completion and generation continues, up to ``max_tool_calls`` times
within the rollout. The tool's tokens are masked out of the loss (TRL's ``env_mask``): the policy is
trained on the tokens it generated, and the environment scores the whole transcript.
"""

from __future__ import annotations

import os
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16; we pin it


def make_rollout_func(env: Any, tokenizer: Any, max_completion_length: int) -> Any:
    stop = str(env.tool_stop)
    max_calls = int(getattr(env, "max_tool_calls", 3))

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.models import unwrap_model_for_generation

        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        eos_ids = set(trainer.eos_token_ids) if getattr(trainer, "eos_token_ids", None) else {tokenizer.eos_token_id}
        device = trainer.accelerator.device
        all_completion_ids, env_masks, calls_made = [], [], []
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs) as model, torch.no_grad():
            for ids in prompt_ids:
                ids = list(ids)
                completion: list[int] = []
                mask: list[int] = []
                calls = 0
                while len(completion) < max_completion_length:
                    context = torch.tensor([ids + completion], device=device)
                    out = model.generate(
                        input_ids=context, attention_mask=torch.ones_like(context), generation_config=trainer.generation_config,
                        max_new_tokens=max_completion_length - len(completion), stop_strings=[stop], tokenizer=tokenizer,
                    )
                    new = out[0, context.shape[1]:].tolist()
                    ended = False
                    for j, tok in enumerate(new):
                        if tok in eos_ids:
                            new, ended = new[: j + 1], True
                            break
                    completion += new
                    mask += [1] * len(new)
                    text = tokenizer.decode(completion, skip_special_tokens=True)
                    if ended or not new or not text.rstrip().endswith(stop) or calls >= max_calls:
                        break
                    reply = env.guarded("call_tool()", env.call_tool, text)
                    if reply is None:
                        break
                    calls += 1
                    reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"][: max_completion_length - len(completion)]
                    completion += reply_ids
                    mask += [0] * len(reply_ids)
                all_completion_ids.append(completion)
                env_masks.append(mask)
                calls_made.append(calls)
        return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": all_completion_ids, "logprobs": None,
                "env_mask": env_masks, "tool_calls": calls_made}

    return rollout
