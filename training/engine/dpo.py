"""DPO over {prompt, chosen, rejected} rows: TRL's DPOTrainer for data and batching, our own loss.

TRL 1.16 has no reference-free scoring, target margin or span-only scoring, so `_compute_loss` is replaced.
The score of a completion is its summed log-probability (mean with `length_norm`) minus the frozen
reference's (the base with the LoRA adapter disabled), or without the reference when `reference_free`.
`span_mask` scores only the tokens where chosen and rejected differ: their common prefix and common suffix
carry no preference signal and would otherwise dilute it. The loss is
``-log σ(β·(s_chosen − s_rejected) − target_margin)``; `target_margin` is thus in reward units (β-scaled)
like SimPO's γ.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from trl import DPOConfig, DPOTrainer

from .common import Context, ServingConfigMixin, StudioCallback, TokenCountingMixin, build_config, eval_callbacks, train_and_finish
from .data import load_eval_rows, load_rows, row_format, with_system_prompt_in_pairs
from .fit import max_length
from .modeling import load_policy, load_tokenizer
from .spec import SpecError


def span_masks(input_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Completion mask with each pair's common prefix and common suffix removed.

    The batch is [chosen_1..chosen_B, rejected_1..rejected_B] (TRL's collator layout).
    """
    out = completion_mask.clone()
    half = input_ids.size(0) // 2
    for i in range(half):
        rows = (i, i + half)
        pos = [completion_mask[r].nonzero().flatten() for r in rows]
        toks = [input_ids[r, p].tolist() for r, p in zip(rows, pos, strict=True)]
        shortest = min(len(t) for t in toks)
        prefix = 0
        while prefix < shortest and toks[0][prefix] == toks[1][prefix]:
            prefix += 1
        suffix = 0
        while suffix < shortest - prefix and toks[0][-1 - suffix] == toks[1][-1 - suffix]:
            suffix += 1
        for r, p in zip(rows, pos, strict=True):
            out[r, p[:prefix]] = 0
            if suffix:
                out[r, p[len(p) - suffix :]] = 0
    return out


def pairs_per_device(rows: int) -> int:
    """TRL's DPO batch counts pairs and its collator stacks each pair's chosen and rejected rows into one
    forward, so `rows` sequences (the Studio's batch, seed 001: even, 2 per pair) is rows // 2 pairs."""
    return int(rows) // 2


def sequence_scores(per_token_logps: torch.Tensor, mask: torch.Tensor, length_norm: bool) -> torch.Tensor:
    total = (per_token_logps * mask).sum(dim=1)
    return total / mask.sum(dim=1).clamp(min=1) if length_norm else total


class StudioDPOTrainer(TokenCountingMixin, ServingConfigMixin, DPOTrainer):
    def __init__(self, *args: Any, loss_options: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reference_free = bool(loss_options.get("reference_free", False))
        self.target_margin = float(loss_options.get("target_margin") or 0.0)
        self.length_norm = bool(loss_options.get("length_norm", False))
        self.span_mask = bool(loss_options.get("span_mask", False))

    def _logps(self, model: Any, inputs: dict[str, Any], score_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels, use_cache=False, fused_lm_head=True)
        seq = score_mask.size(1)
        per_token = outputs.log_probs[:, -seq:]
        return sequence_scores(per_token, score_mask, self.length_norm), outputs

    def _reference_context(self) -> Any:
        unwrapped = self.accelerator.unwrap_model(self.model)
        if hasattr(unwrapped, "disable_adapter"):
            return unwrapped.disable_adapter()
        return contextlib.nullcontext()

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        mode = "train" if self.model.training else "eval"  # type: ignore[union-attr]  # Trainer.model is typed Optional; set before any loss
        completion_mask = inputs["completion_mask"]
        mask = span_masks(inputs["input_ids"], completion_mask) if self.span_mask else completion_mask
        score_mask = mask[:, 1:].to(torch.float32)  # log_probs[t] scores token t+1
        logps, outputs = self._logps(model, inputs, score_mask)
        if self.reference_free:
            ref_logps = torch.zeros_like(logps)
        else:
            with torch.no_grad():
                if self.ref_model is not None:
                    ref_logps, _ = self._logps(self.ref_model, inputs, score_mask)
                else:
                    with self._reference_context():
                        ref_logps, _ = self._logps(self.model, inputs, score_mask)
        scores = logps - ref_logps
        chosen, rejected = scores.chunk(2, dim=0)
        loss = -F.logsigmoid(self.beta * (chosen - rejected) - self.target_margin).mean()

        chosen_rewards = (self.beta * chosen).detach()
        rejected_rewards = (self.beta * rejected).detach()
        m = self._metrics[mode]
        m["rewards/chosen"].append(chosen_rewards.mean().item())
        m["rewards/rejected"].append(rejected_rewards.mean().item())
        m["rewards/margins"].append((chosen_rewards - rejected_rewards).mean().item())
        m["rewards/accuracies"].append((chosen_rewards > rejected_rewards).float().mean().item())
        chosen_logps, rejected_logps = logps.detach().chunk(2, dim=0)
        m["logps/chosen"].append(chosen_logps.mean().item())
        m["logps/rejected"].append(rejected_logps.mean().item())
        entropy_mask = completion_mask[:, 1:].to(torch.float32)
        if getattr(outputs, "entropy", None) is not None:
            ent = outputs.entropy[:, -entropy_mask.size(1) :].detach()
            m["entropy"].append(((ent * entropy_mask).sum() / entropy_mask.sum().clamp(min=1)).item())
        return (loss, outputs) if return_outputs else loss


def pairs(dataset: Any, system_prompt: str | None) -> Any:
    """Preference rows as the trainer reads them: the pair's columns, with the run's system prompt."""
    return with_system_prompt_in_pairs(dataset.select_columns(["prompt", "chosen", "rejected"]), system_prompt)


def run(ctx: Context) -> None:
    spec = ctx.spec
    loss_options = dict(spec.cfg("loss", {}))
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = load_rows(spec.datasets, ctx.reporter.log)
    if row_format(dataset) != "preference":
        raise SpecError("dataset: DPO needs rows with prompt, chosen and rejected")
    dataset, held = load_eval_rows(spec, dataset, ctx.reporter.log)
    dataset = pairs(dataset, spec.cfg("system_prompt"))
    held = pairs(held, spec.cfg("system_prompt")) if held is not None else None
    ctx.reporter.log(
        f"dpo: {len(dataset)} pairs, beta={loss_options.get('dpo_beta', 0.1)}, "
        f"reference_free={bool(loss_options.get('reference_free'))}, "
        f"length_norm={bool(loss_options.get('length_norm'))}, span_mask={bool(loss_options.get('span_mask'))}"
    )
    args = build_config(
        DPOConfig,
        ctx,
        beta=float(loss_options.get("dpo_beta") or 0.1),
        max_length=max_length(spec, ctx.reporter.log),
        per_device_train_batch_size=pairs_per_device(spec.cfg("per_device_train_batch_size", 2)),
        **({"per_device_eval_batch_size": pairs_per_device(spec.cfg("per_device_eval_batch_size", spec.cfg("per_device_train_batch_size", 2)))}
           if spec.evaluates else {}),
    )
    model = load_policy(spec, ctx.device, log=ctx.reporter.log)
    ref: list[Any] = []
    trainer = StudioDPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=held,
        processing_class=tokenizer,
        callbacks=[StudioCallback(ctx, ref), *eval_callbacks(spec)],
        loss_options=loss_options,
    )
    ref.append(trainer)
    ctx.reporter.stage("train")
    train_and_finish(trainer, ctx, tokenizer)
