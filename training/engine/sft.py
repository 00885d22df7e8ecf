"""SFT: chat, plain-text and prompt/completion rows through TRL's SFTTrainer; full, LoRA or QLoRA.

Packing (config `packing`, on by default): TRL's best-fit-decreasing packing fills rows of `max_length`
tokens with whole sequences, and its padding-free collator concatenates a batch into one row with
position_ids restarting at 0 per sequence and no attention mask. The attention kernel keeps sequences
apart (flash-attention varlen on a GPU, a block-diagonal SDPA mask that transformers derives from the
position_ids elsewhere), and the collator masks the label at each sequence start so no token is
predicted across a boundary. Loss masks (assistant-only, completion-only) are built into the labels
before packing, so they survive it. With packing, `per_device_train_batch_size` counts packed rows of
up to `max_length` tokens, so an epoch has fewer, fuller steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sized
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from trl import SFTConfig, SFTTrainer

from .common import (
    ROW_TOKENS,
    Context,
    ServingConfigMixin,
    StudioCallback,
    TokenCountingMixin,
    build_config,
    eval_callbacks,
    packed_positions,
    train_and_finish,
)
from .data import load_eval_rows, load_rows, row_format, with_system_prompt
from .fit import max_length
from .modeling import load_policy, load_tokenizer
from .spec import SpecError

# TRL keeps num_tokens' running total on the trainer, which a checkpoint does not save: a resumed run
# counted from zero again. It is written into each checkpoint and read back from the one resumed.
TOKEN_TOTAL_FILE = "num_tokens.json"


def token_total_at(checkpoint: Path) -> int | None:
    """num_tokens' running total at a checkpoint: the one saved in it, or for a checkpoint an older
    engine saved without it, the last one its trainer state logged (None if neither)."""
    saved = checkpoint / TOKEN_TOTAL_FILE
    if saved.is_file():
        return int(json.loads(saved.read_text())["num_tokens"])
    state = checkpoint / "trainer_state.json"
    history = json.loads(state.read_text()).get("log_history", []) if state.is_file() else []
    logged = [entry["num_tokens"] for entry in history if "num_tokens" in entry]
    return int(logged[-1]) if logged else None


class StudioSFTTrainer(TokenCountingMixin, ServingConfigMixin, SFTTrainer):
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(resume_from_checkpoint, str):
            total = token_total_at(Path(resume_from_checkpoint))
            if total is not None:
                self._total_train_tokens = total
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        if self.args.should_save and folder.is_dir():  # every rank holds the same (global) total; one writes it
            (folder / TOKEN_TOTAL_FILE).write_text(json.dumps({"num_tokens": int(self._total_train_tokens)}))

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        # TRL counts a batch without an attention mask as one padding-free row (position_ids.size(1) tokens):
        # of collate_packed_rows' [batch, longest row] it counted one row. Its count of such a batch is
        # replaced by the rows' real tokens. (TokenCountingMixin counts them too, then drops the key.)
        rows = inputs.get(ROW_TOKENS)
        counted = self._total_train_tokens
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if rows is not None and model.training:
            self._total_train_tokens = counted + int(self.accelerator.gather_for_metrics(rows.sum()).sum().item())
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return result


def collate_packed_rows(examples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Packed rows kept as rows, for attention without varlen kernels (SDPA, eager).

    TRL's padding-free collator joins a whole batch into one row. Flash-attention's varlen kernels cost
    Σ length² over the sequences in it, but SDPA materialises a mask over the joined row and pays
    (batch·max_length)², which made packing slower than padding on the CPU. Here each packed row stays
    a row ([batch, longest row]) with its own position_ids and no attention mask: transformers still
    builds the block-diagonal mask per row, and the cost per row is bounded by max_length². A row's
    padding tail is a sequence of its own (positions from 0) with no labels, so nothing attends to it.
    `row_tokens` holds each row's tokens without that tail, for num_tokens, tokens_per_s and MFU.
    """
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    positions = torch.zeros((len(examples), longest), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        labels[row, :n] = torch.tensor(e.get("labels", e["input_ids"]))
        positions[row] = packed_positions(list(e.get("seq_lengths") or [n]), longest)
    # The first token of each sequence is not a target of the token before it (another sequence).
    labels[positions == 0] = -100
    lengths = torch.tensor([len(e["input_ids"]) for e in examples], dtype=torch.long)
    return {"input_ids": ids, "labels": labels, "position_ids": positions, ROW_TOKENS: lengths}


def counted_one_row(collate: Callable[[list[dict[str, Any]]], dict[str, Any]], examples: list[dict[str, Any]]) -> dict[str, Any]:
    """TRL's one padding-free row with its real token count as `row_tokens`.

    With `pad_to_multiple_of`, TRL pads the joined row with position 0 at every padding token, so each
    one read as a 1-token sequence: tokens_per_s, MFU and num_tokens counted the padding. The count
    here is the examples' own tokens, the rest of the row is the padding tail, which weighs nothing.
    """
    batch = collate(examples)
    batch[ROW_TOKENS] = torch.tensor([sum(len(e["input_ids"]) for e in examples)], dtype=torch.long)
    return batch


def build_trainer(ctx: Context) -> tuple[StudioSFTTrainer, Any]:
    """The configured trainer and its tokenizer, ready to train (tests build it to inspect batches)."""
    spec = ctx.spec
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = load_rows(spec.datasets, ctx.reporter.log)
    fmt = row_format(dataset)
    if fmt == "preference":
        raise SpecError("dataset: preference rows (prompt/chosen/rejected) belong to a DPO run, not SFT")
    dataset, held = load_eval_rows(spec, dataset, ctx.reporter.log)  # held out before packing: no packed row mixes the two
    dataset = with_system_prompt(dataset, spec.cfg("system_prompt"))
    held = with_system_prompt(held, spec.cfg("system_prompt")) if held is not None else None
    packing = bool(spec.cfg("packing", True))
    adapter = "qlora" if spec.cfg("load_in_4bit") else "lora" if spec.use_lora else "full"
    ctx.reporter.log(f"sft: {len(dataset)} {fmt} rows, adapter={adapter}, packing={'on' if packing else 'off'}")
    method_kwargs: dict[str, Any] = {
        "max_length": max_length(spec, ctx.reporter.log),
        # Loss on the assistant turns only: the prompt is given, not something to imitate.
        "assistant_only_loss": fmt == "chat",
        "dataset_text_field": "text",
        # "bfd" keeps every sequence whole (overflow is truncated, as without packing) and implies padding-free.
        "packing": packing,
        "packing_strategy": "bfd",
        "padding_free": packing,
    }
    args = build_config(SFTConfig, ctx, **method_kwargs)
    model = load_policy(spec, ctx.device, log=ctx.reporter.log)
    ref: list[Any] = []
    trainer = StudioSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=held,
        processing_class=tokenizer,
        callbacks=[StudioCallback(ctx, ref), *eval_callbacks(spec)],
    )
    ref.append(trainer)
    if packing:
        rows = len(cast(Sized, trainer.train_dataset))  # SFTTrainer's prepared dataset; TRL types it Optional
        layout = "one padding-free row per batch (varlen flash attention)"
        if str(getattr(model.config, "_attn_implementation", "")).startswith("flash"):
            trainer.data_collator = partial(counted_one_row, trainer.data_collator)
        else:
            # Swapped after construction: TRL refuses a custom collator with padding-free, which bfd implies.
            trainer.data_collator = partial(collate_packed_rows, pad_id=tokenizer.pad_token_id)
            layout = "batches of packed rows (block-diagonal attention per row)"
        ctx.reporter.log(f"sft: packed {len(dataset)} rows into {rows} rows of up to {args.max_length} tokens; {layout}")
    return trainer, tokenizer


def run(ctx: Context) -> None:
    trainer, tokenizer = build_trainer(ctx)
    ctx.reporter.stage("train")
    train_and_finish(trainer, ctx, tokenizer)
