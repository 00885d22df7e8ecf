"""SFT: chat, plain-text and prompt/completion rows through TRL's SFTTrainer; full, LoRA or QLoRA."""

from __future__ import annotations

from typing import Any

from trl import SFTConfig, SFTTrainer

from .common import Context, StudioCallback, TokenCountingMixin, build_config, train_and_finish
from .data import load_rows, row_format, with_system_prompt
from .modeling import load_policy, load_tokenizer
from .spec import SpecError


class StudioSFTTrainer(TokenCountingMixin, SFTTrainer):
    pass


def run(ctx: Context) -> None:
    spec = ctx.spec
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = load_rows(spec.datasets)
    fmt = row_format(dataset)
    if fmt == "preference":
        raise SpecError("dataset: preference rows (prompt/chosen/rejected) belong to a DPO run, not SFT")
    dataset = with_system_prompt(dataset, spec.cfg("system_prompt"))
    ctx.reporter.log(f"sft: {len(dataset)} {fmt} rows, adapter={'qlora' if spec.cfg('load_in_4bit') else 'lora' if spec.use_lora else 'full'}")
    method_kwargs: dict[str, Any] = {
        "max_length": int(spec.cfg("max_length", 1024)),
        # Loss on the assistant turns only: the prompt is given, not something to imitate.
        "assistant_only_loss": fmt == "chat",
        "dataset_text_field": "text",
    }
    args = build_config(SFTConfig, ctx, **method_kwargs)
    model = load_policy(spec, ctx.device)
    ref: list[Any] = []
    trainer = StudioSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StudioCallback(ctx, ref)],
    )
    ref.append(trainer)
    ctx.reporter.stage("train")
    train_and_finish(trainer, ctx, tokenizer)
