"""What every method shares: the run context, TRL config building, and the reporting callback."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from .modeling import Device
from .reporter import Reporter, Superseded
from .spec import ENGINE_KEYS, Spec

# Trainer's end-of-run summary; Studio charts per-step series only.
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}


@dataclass
class Context:
    spec: Spec
    reporter: Reporter
    device: Device


def build_config(config_cls: type, ctx: Context, **method_kwargs: Any) -> Any:
    """Map the product-contract keys onto a TRL config; pass through any other key that is a field of it."""
    spec, device = ctx.spec, ctx.device
    c = spec.config
    save_steps = c.get("save_steps")
    kwargs: dict[str, Any] = {
        "output_dir": str(spec.output_dir),
        "num_train_epochs": float(c.get("num_epochs") or 1),
        "max_steps": int(c["max_steps"]) if c.get("max_steps") else -1,
        "per_device_train_batch_size": int(c.get("per_device_train_batch_size") or 1),
        "gradient_accumulation_steps": int(c.get("gradient_accumulation_steps") or 1),
        "seed": int(spec.cfg("seed", 42)),
        "logging_steps": int(c.get("logging_steps") or 1),
        "save_strategy": "steps" if save_steps else "no",
        "save_steps": int(save_steps) if save_steps else 500,
        "report_to": "none",
        "disable_tqdm": True,
        "bf16": device.bf16,
        "use_cpu": device.kind == "cpu",
        "dataloader_num_workers": 0,
    }
    if c.get("learning_rate") is not None:
        kwargs["learning_rate"] = float(c["learning_rate"])
    if c.get("use_liger") and device.kind == "cuda":
        kwargs["use_liger_kernel"] = True
    fields = {f.name for f in dataclasses.fields(config_cls)}
    # Checkpointing trades compute for memory: worth it on GPU-sized models, pure cost on tiny CPU runs.
    # transformers 5 renamed the knob; use whichever this version has so no deprecation path is taken.
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kwargs[ckpt_key] = device.kind == "cuda"
    kwargs.update(method_kwargs)
    for key, value in c.items():
        if key in ENGINE_KEYS:
            continue
        if key in fields:
            kwargs[key] = value
        else:
            ctx.reporter.log(f"config.{key}: not a {config_cls.__name__} field; ignored")
    return config_cls(**kwargs)


def count_tokens(inputs: dict[str, Any]) -> int:
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    if "completion_mask" in inputs and "prompt_mask" in inputs:
        return int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
    if "input_ids" in inputs:
        return int(inputs["input_ids"].numel())
    return 0


class TokenCountingMixin:
    """Counts the tokens each training forward sees, for the tokens_per_s metric."""

    tokens_seen: int = 0

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if model.training:
            self.tokens_seen += count_tokens(inputs)
        return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]


class StudioCallback(TrainerCallback):
    """Streams TRL's logs, per-step speed/progress and checkpoints to the reporter."""

    def __init__(self, ctx: Context, trainer_ref: list[Any]) -> None:
        self.ctx = ctx
        self.trainer_ref = trainer_ref  # filled after the trainer exists (it needs the callback first)
        self.step_started = 0.0
        self.avg_step_s: float | None = None
        self.tokens_at_step_start = 0
        self.announced_running = False

    def _tokens(self) -> int:
        return getattr(self.trainer_ref[0], "tokens_seen", 0) if self.trainer_ref else 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ctx.reporter.log(f"training: max_steps={state.max_steps} starting at step {state.global_step}")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._check_superseded()
        self.step_started = time.perf_counter()
        self.tokens_at_step_start = self._tokens()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rep, step = self.ctx.reporter, state.global_step
        step_time = max(time.perf_counter() - self.step_started, 1e-9)
        # EMA so the ETA neither jumps on one slow step nor ignores a trend.
        self.avg_step_s = step_time if self.avg_step_s is None else 0.8 * self.avg_step_s + 0.2 * step_time
        tokens_per_s = (self._tokens() - self.tokens_at_step_start) / step_time
        eta = max(state.max_steps - step, 0) * self.avg_step_s
        rep.metric(step, "tokens_per_s", tokens_per_s)
        rep.metric(step, "step_time_s", step_time)
        rep.metric(step, "eta_s", eta)
        rep.progress(
            {"step": step, "max_steps": state.max_steps, "tokens_per_s": round(tokens_per_s, 3), "step_time_s": round(step_time, 4), "eta_s": round(eta, 2)}
        )
        if not self.announced_running:
            self.announced_running = True
            rep.status("running")
        self._check_superseded()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        parts = []
        for key, value in logs.items():
            if key in _SUMMARY_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                continue
            self.ctx.reporter.metric(state.global_step, key, value)
            parts.append(f"{key}={value:.5g}")
        if parts and not all(p.startswith("epoch=") for p in parts):
            self.ctx.reporter.log(f"step {state.global_step}: " + " ".join(parts))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        self.ctx.reporter.checkpoint(state.global_step, path, "checkpoint")

    def _check_superseded(self) -> None:
        if self.ctx.reporter.superseded.is_set():
            raise Superseded("ingest refused this attempt's token; stopping")


def train_and_finish(trainer: Any, ctx: Context, tokenizer: Any) -> None:
    """Run the trainer (resuming if asked), then write final weights; status 'completed' comes after."""
    from transformers.trainer_callback import PrinterCallback

    from .modeling import save_final

    # Our callback already prints one line per log; Trainer's printer would duplicate it as a dict.
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=ctx.spec.resume_from)
    model = trainer.model
    save_final(model, tokenizer, ctx.spec, ctx.device, trainer.state.global_step, ctx.reporter)
