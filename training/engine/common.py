"""What every method shares: the run context, TRL config building, and the reporting callback."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback

from . import perf
from .launch import Rank
from .modeling import Device
from .reporter import Reporter, Superseded
from .spec import ENGINE_KEYS, STUDIO_MANAGED, Spec, studio_managed_value


@dataclass
class Context:
    spec: Spec
    reporter: Reporter
    device: Device
    rank: Rank = field(default_factory=Rank)


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
        "seed": spec.seed,
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
    if spec.evaluates:
        kwargs.update(eval_arguments(c))
    if c.get("use_liger"):
        # Capability decides (CUDA, the package, the model type); a liger that cannot run is off, with a reason.
        from .liger import engine_choice

        kwargs["use_liger_kernel"], why = engine_choice(spec, device.kind)
        ctx.reporter.log(why)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    # Checkpointing trades compute (≈ one more forward) for memory: on only when memory needs it (fit.py).
    # transformers 5 renamed the knob; use whichever this version has so no deprecation path is taken.
    from .fit import decide_checkpointing

    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kwargs[ckpt_key], why = decide_checkpointing(spec.method, c, spec.base_model, spec.base_model_revision, device.kind)
    ctx.reporter.log(why)
    if ctx.rank.world > 1:
        # Every parameter SFT and DPO train (full or LoRA) gets a gradient each step: Trainer's default
        # (look for unused ones unless checkpointing) cost a graph walk a step and a warning a run.
        # A config's own ddp_find_unused_parameters replaces it below.
        kwargs["ddp_find_unused_parameters"] = False
    kwargs.update(method_kwargs)
    for key, value in c.items():
        if key in ENGINE_KEYS:
            continue
        if key in STUDIO_MANAGED:
            ctx.reporter.log(f"config.{key}: set by the Studio ({STUDIO_MANAGED[key]}); ignored")
        elif instead := studio_managed_value(key, value):
            ctx.reporter.log(f"config.{key}: {value!r} is refused ({instead}); ignored")
        elif key in fields:
            kwargs[key] = value
        else:
            ctx.reporter.log(f"config.{key}: not a {config_cls.__name__} field; ignored")
    return config_cls(**kwargs)


EVALUATIONS_PER_RUN = 10  # eval_steps' default: about this many evaluations over the run


def eval_arguments(c: dict[str, Any]) -> dict[str, Any]:
    """TRL's evaluation settings for a run with held-out rows: every eval_steps optimizer steps, by
    default about EVALUATIONS_PER_RUN times over the run (a fraction of the run's steps, which TRL
    reads so, when the run is sized by epochs), at each save too (EvalAtSaves), and at its last step
    (transformers' DefaultFlowCallback). The eval batch is the train batch unless set."""
    if c.get("eval_steps"):
        every: float = int(c["eval_steps"])
    elif c.get("max_steps"):
        every = max(1, -(-int(c["max_steps"]) // EVALUATIONS_PER_RUN))
    else:
        every = 1 / EVALUATIONS_PER_RUN
    return {
        "eval_strategy": "steps",
        "eval_steps": every,
        "per_device_eval_batch_size": int(c.get("per_device_eval_batch_size") or c.get("per_device_train_batch_size") or 1),
    }


class EvalAtSaves(TrainerCallback):
    """Evaluates at every checkpoint as well, when eval_steps is the default: a checkpoint a user may
    resume or publish then has its eval_loss beside it."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if control.should_save:
            control.should_evaluate = True
        return control


def eval_callbacks(spec: Spec) -> list[TrainerCallback]:
    return [EvalAtSaves()] if spec.evaluates and not spec.config.get("eval_steps") else []


# A packed batch's real tokens per row (each row's, before its padding tail): for counting, never the model.
ROW_TOKENS = "row_tokens"


def packed_positions(lengths: list[int], width: int) -> torch.Tensor:
    """position_ids of one packed row `width` wide: 0..n-1 for each sequence in turn, then the padding
    tail as a sequence of its own (positions from 0), so no real token attends to it."""
    used = sum(lengths)
    return torch.cat([torch.arange(n) for n in list(lengths) + ([width - used] if width > used else [])])


def sequence_lengths(inputs: dict[str, Any]) -> torch.Tensor | None:
    """The real (unpadded) length of every sequence in a training micro-batch, as a 1-D tensor.

    Computed without a host sync (static shapes only), so counting does not stall the GPU queue mid-step.
    Packed, padding-free batches have no attention mask: their sequences are the runs between position
    resets (position_ids back at 0), counted with a scatter into a buffer of the largest possible size.
    Each packed document is a sequence of its own, as the attention sees it (varlen kernels, or the
    block-diagonal mask transformers derives from the position_ids), so Σ length² prices the attention a
    varlen kernel does. A row's padding tail (after `row_tokens`) weighs 0: it is no token and no sequence,
    though SDPA pays for it over the whole row; MFU counts the model's useful work, not that.
    """
    mask = inputs.get("attention_mask")
    positions = inputs.get("position_ids")
    if mask is None and "prompt_mask" in inputs and "completion_mask" in inputs:
        # GRPO: one sequence per row, prompt then completion.
        return inputs["prompt_mask"].sum(-1) + inputs["completion_mask"].sum(-1)
    if isinstance(positions, torch.Tensor) and positions.dim() == 2 and (mask is None or mask.shape == positions.shape):
        # Boolean indexing would sync (its size depends on the data): weight padding 0 instead of dropping it.
        real = inputs.get(ROW_TOKENS)
        if mask is not None:
            weights = mask.long()
        elif isinstance(real, torch.Tensor):
            columns = torch.arange(positions.shape[1], device=positions.device)
            weights = (columns < real.to(positions.device).reshape(-1, 1)).long()
        else:
            weights = torch.ones_like(positions)
        weights = weights.reshape(-1)
        starts = positions == 0
        starts[:, 0] = True  # every row begins a sequence, whatever position it starts at
        segment = (torch.cumsum(starts.reshape(-1).long(), 0) - 1).clamp(min=0)
        return torch.zeros_like(segment).scatter_add_(0, segment, weights)
    if mask is not None:
        return mask.sum(-1)
    ids = inputs.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
        rows = ids.shape[0] if ids.dim() == 2 else 1
        return torch.full((rows,), ids.shape[-1], dtype=torch.long, device=ids.device)
    return None


def batch_counts(inputs: dict[str, Any]) -> torch.Tensor | None:
    """[tokens, sequences, Σ length²] of a micro-batch (int64, on the batch's device); None if unknown."""
    lengths = sequence_lengths(inputs)
    if lengths is None:
        return None
    lengths = lengths.long()
    return torch.stack([lengths.sum(), (lengths > 0).sum(), (lengths * lengths).sum()])


@dataclass
class StepCounts:
    tokens: int = 0
    sequences: int = 0
    sum_sq_len: int = 0

    @property
    def attention_len(self) -> float:
        """Token-weighted mean sequence length Σs²/Σs: the s that prices a token's attention in a mixed batch."""
        return self.sum_sq_len / self.tokens if self.tokens else 0.0


def data_parallel_world() -> int:
    """How many processes train together (1 outside torchrun)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def collective_device() -> torch.device:
    """Where a tensor must be for the process group's collectives: NCCL sums on the GPU, gloo on the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class TokenCountingMixin:
    """Counts the tokens and sequences each training forward sees, for tokens_per_s and MFU.

    Counts pile up on the device during a step; take_step_counts() reads them once, at the step's end.
    """

    tokens_seen: int = 0
    _pending_counts: list[torch.Tensor] | None = None

    def count_batch(self, inputs: dict[str, Any]) -> None:
        counts = batch_counts(inputs)
        if counts is None:
            return
        if self._pending_counts is None:
            self._pending_counts = []
        self._pending_counts.append(counts)

    def take_step_counts(self) -> StepCounts:
        """This step's counts (one host sync), added to tokens_seen. Under data parallelism they are
        the sum over every rank: each rank calls this at the same points (the callback's train begin
        and step end), which the sum, a collective, relies on."""
        pending, self._pending_counts = self._pending_counts or [], []
        world = data_parallel_world()
        if not pending and world == 1:
            return StepCounts()
        device = collective_device() if world > 1 else pending[0].device
        total = torch.stack([c.to(device) for c in pending]).sum(0) if pending else torch.zeros(3, dtype=torch.long, device=device)
        if world > 1:
            torch.distributed.all_reduce(total)
        tokens, sequences, sum_sq = (int(v) for v in total.tolist())
        self.tokens_seen += tokens
        return StepCounts(tokens, sequences, sum_sq)

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if model.training:
            self.count_batch(inputs)
        inputs.pop(ROW_TOKENS, None)  # counted; the model must not see it
        return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]


class ServingConfigMixin:
    """Saves the weights with the model's own `use_cache` in config.json, not the training value.

    Trainer.__init__ sets config.use_cache to TrainingArguments.use_cache (False: no KV cache while
    training); saved as it is, every full checkpoint and final/ told the stacks that serve them
    (transformers' generate, vLLM) to decode without a KV cache. The base's value is read before that.
    """

    serving_use_cache: bool | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.serving_use_cache = getattr(getattr(kwargs.get("model"), "config", None), "use_cache", None)
        super().__init__(*args, **kwargs)

    @contextmanager
    def serving_config(self) -> Iterator[None]:
        """The model's config as it is to be served, while the block runs (a save); then as training needs it."""
        config = getattr(getattr(self, "model", None), "config", None)
        if config is None or self.serving_use_cache is None:
            yield
            return
        training = config.use_cache
        config.use_cache = self.serving_use_cache
        try:
            yield
        finally:
            config.use_cache = training

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        with self.serving_config():
            super()._save(output_dir, state_dict)  # type: ignore[misc]


def follow_schedule(optimizer: Any, scheduler: Any, rep: Any) -> None:
    """On resume, the learning rate of this run's schedule at the step it resumes from. The checkpoint's
    optimizer holds the rate its own schedule gave: with max_steps raised since (a resumed run may
    train further), the first resumed step took the old schedule's rate and the next ones the new
    schedule's (0.004, then 0.0075 above it). Nothing changes where both schedules agree."""
    if optimizer is None or not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        return
    rates: list[float] = [float(base * fn(scheduler.last_epoch)) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    if all(abs(group["lr"] - rate) <= 1e-12 * max(1.0, abs(rate)) for group, rate in zip(optimizer.param_groups, rates, strict=True)):
        return
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    last: list[float | torch.Tensor] = list(rates)
    scheduler._last_lr = last  # what TRL logs as learning_rate
    rep.log(f"resume: learning rate {rates[0]:.3g} from this run's schedule at step {scheduler.last_epoch} (the checkpoint's schedule gave another)")


class StudioCallback(TrainerCallback):
    """Streams TRL's logs, per-step speed/progress and checkpoints to the reporter.

    Per step: tokens_per_s, step_time_s, eta_s; mfu (percent of the card's dense bf16 peak) where the peak
    is known; gpu_memory_gb (peak allocated during the step) on CUDA. Absent, never zero, where unknown.
    """

    def __init__(self, ctx: Context, trainer_ref: list[Any]) -> None:
        self.ctx = ctx
        self.trainer_ref = trainer_ref  # filled after the trainer exists (it needs the callback first)
        self.step_started = 0.0
        self.avg_step_s: float | None = None
        self.tokens_at_step_start = 0
        self.shape: perf.Shape | None = None
        self.peak: perf.Peak | None = None
        self.on_cuda = False

    def _trainer(self) -> Any:
        return self.trainer_ref[0] if self.trainer_ref else None

    def _tokens(self) -> int:
        return getattr(self._trainer(), "tokens_seen", 0)

    def _take_counts(self) -> StepCounts:
        take = getattr(self._trainer(), "take_step_counts", None)
        return take() if take is not None else StepCounts()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rep = self.ctx.reporter
        rep.log(f"training: max_steps={state.max_steps} starting at step {state.global_step}")
        # Until its first step ends the run shows where this attempt starts, with no speed or ETA: those
        # come from this attempt's own steps (on_step_end), never from a step before a resume.
        rep.progress({"step": state.global_step, "max_steps": state.max_steps})
        self.on_cuda = self.ctx.device.kind == "cuda" and torch.cuda.is_available()
        # A CPU run on a machine with a GPU must not borrow the GPU's peak: ask for "cpu", which only
        # the STUDIO_PEAK_TFLOPS override answers.
        self.peak = perf.device_peak(None if self.on_cuda else "cpu")
        world = self.ctx.rank.world
        if self.peak is not None and world > 1:
            # tokens_per_s counts every rank's tokens, so MFU is against every rank's card.
            self.peak = dataclasses.replace(self.peak, name=f"{world} x {self.peak.name}", tflops=self.peak.tflops * world)
        model = kwargs.get("model") or getattr(self._trainer(), "model", None)
        if self.peak is not None and model is not None:
            try:
                self.shape = perf.shape_of(model)
            except Exception as exc:  # noqa: BLE001 - a figure is not worth failing a run over
                rep.log(f"perf: cannot count this model's FLOPs ({exc}); no MFU will be reported")
        if self.shape is not None and self.peak is not None:
            rep.log(
                f"perf: {self.shape.matmul_params / 1e6:.1f}M matmul weights ({self.shape.trainable_matmul_params / 1e6:.1f}M trainable), "
                f"MFU against {self.peak.tflops:g} TFLOP/s dense bf16 ({self.peak.name})"
            )
        if state.global_step > 0:
            follow_schedule(kwargs.get("optimizer"), kwargs.get("lr_scheduler"), rep)
        # Drop whatever earlier counting left (a resumed trainer, a capture stage) so step 1 is clean.
        self._take_counts()
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._check_superseded()
        self.step_started = time.perf_counter()
        self.tokens_at_step_start = self._tokens()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rep, step = self.ctx.reporter, state.global_step
        # Reading the counts syncs with the device, so the clock below covers the step's GPU work, not
        # only the CPU's kernel launches.
        counts = self._take_counts()
        step_time = max(time.perf_counter() - self.step_started, 1e-9)
        # EMA so the ETA neither jumps on one slow step nor ignores a trend.
        self.avg_step_s = step_time if self.avg_step_s is None else 0.8 * self.avg_step_s + 0.2 * step_time
        # tokens_seen also moves for trainers that count on their own (without count_batch).
        tokens_per_s = (self._tokens() - self.tokens_at_step_start) / step_time
        eta = max(state.max_steps - step, 0) * self.avg_step_s
        rep.metric(step, "tokens_per_s", tokens_per_s)
        rep.metric(step, "step_time_s", step_time)
        rep.metric(step, "eta_s", eta)
        progress: dict[str, Any] = {
            "step": step, "max_steps": state.max_steps, "tokens_per_s": round(tokens_per_s, 3), "step_time_s": round(step_time, 4), "eta_s": round(eta, 2),
        }
        if self.shape is not None and counts.sequences:
            # Only the training forward/backward is priced. A GRPO step also generates its rollouts inside
            # the same clock, so its MFU is lower than the trainer alone achieves (rollout/tokens_per_s tells
            # that part); reference-model and old-logprob forwards (DPO, GRPO) are not counted either.
            flops_per_token = self.shape.train_flops_per_token(counts.attention_len)
            value = perf.mfu(flops_per_token, tokens_per_s, self.peak)
            if value is not None:
                rep.metric(step, "mfu", value)
                progress["mfu"] = round(value, 2)
        if self.on_cuda:
            memory = perf.gpu_memory_gb()
            for key, gb in memory.items():
                rep.metric(step, key, gb)
            if "gpu_memory_gb" in memory:
                progress["gpu_memory_gb"] = memory["gpu_memory_gb"]
            # The next reading is the peak of the next step alone.
            torch.cuda.reset_peak_memory_stats()
        rep.progress(progress)
        self._check_superseded()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs:
            return  # the trainer's end-of-training summary: averages, and the last step's epoch again
        parts = []
        for key, value in logs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or key in NOT_METRICS:
                continue
            self.ctx.reporter.metric(state.global_step, key, value)  # a NaN loss is logged, not charted
            parts.append(f"{key}={value:.5g}")
        if parts and not all(p.startswith("epoch=") for p in parts):
            self.ctx.reporter.log(f"step {state.global_step}: " + " ".join(parts))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        self.ctx.reporter.checkpoint(state.global_step, path, "checkpoint")

    def _check_superseded(self) -> None:
        if self.ctx.reporter.superseded.is_set():
            raise Superseded("ingest refused this attempt's token; stopping")


# What a trainer logs that is no figure of the run: TRL's SFT evaluation repeats the training token
# total under eval_num_tokens, which charted as if evaluation had read that many tokens.
NOT_METRICS = frozenset({"eval_num_tokens"})


def train_and_finish(trainer: Any, ctx: Context, tokenizer: Any) -> None:
    """Run the trainer (resuming if asked), then write final weights; status 'completed' comes after."""
    from transformers.trainer_callback import PrinterCallback

    from .modeling import save_final

    # Our callback already prints one line per log; Trainer's printer would duplicate it as a dict.
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=ctx.spec.resume_from)
    if not ctx.rank.is_main:
        return  # rank 0 writes and reports the final weights, once
    with trainer.serving_config():
        save_final(trainer.model, tokenizer, ctx.spec, ctx.device, trainer.state.global_step, ctx.reporter)
