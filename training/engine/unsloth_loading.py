"""GRPO with `use_unsloth`: the policy loaded through Unsloth's FastLanguageModel, and prompts cut to
`max_prompt_length` tokens.

Unsloth is not part of the trainer stack this repository tests with; the Studio refuses use_unsloth at
START unless the image has it (STUDIO_IMAGE_PACKAGES). A spec that asks for it where the package is
missing fails before the model loads, naming config.use_unsloth, instead of training without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .modeling import LORA_TARGETS, Device, seed_run
from .spec import Spec, SpecError

T = TypeVar("T")
MAX_PROMPT_LENGTH = 1024  # seed 002's default, as the Studio fills it in with use_unsloth


def keep_prompt_end(prompt_ids: Sequence[T], max_prompt_length: int) -> Sequence[T]:
    """The last `max_prompt_length` tokens of a prompt: cut from the left, so the end of the prompt
    (the question and the generation prompt the completion follows) survives."""
    if max_prompt_length < 1:
        raise SpecError(f"config.max_prompt_length: must be at least 1, got {max_prompt_length}")
    return prompt_ids[-max_prompt_length:] if len(prompt_ids) > max_prompt_length else prompt_ids


def prompt_limit(spec: Spec) -> int | None:
    """How many prompt tokens a rollout sees: max_prompt_length with use_unsloth, else the whole prompt."""
    if not spec.cfg("use_unsloth", False):
        return None
    return int(spec.cfg("max_prompt_length", MAX_PROMPT_LENGTH))


def require_unsloth() -> None:
    if importlib.util.find_spec("unsloth") is None:
        raise SpecError("config.use_unsloth: the unsloth package is not installed in this trainer image: "
                        "remove use_unsloth, or run on an image that has unsloth")


def load_unsloth_policy(spec: Spec, device: Device, log: Callable[[str], None]) -> Any:
    """The policy through FastLanguageModel: its context is max_prompt_length + max_response_length, its
    base 4-bit with load_in_4bit, and LoRA (when asked for) through Unsloth's get_peft_model."""
    require_unsloth()
    seed_run(spec)
    from unsloth import FastLanguageModel

    max_seq_length = int(spec.cfg("max_prompt_length", MAX_PROMPT_LENGTH)) + int(spec.cfg("max_response_length", 2048))
    four_bit = bool(spec.cfg("load_in_4bit", False))
    revision = {"revision": spec.base_model_revision} if spec.base_model_revision else {}
    model, _tokenizer = FastLanguageModel.from_pretrained(
        model_name=spec.base_model, max_seq_length=max_seq_length, dtype=device.torch_dtype, load_in_4bit=four_bit,
        full_finetuning=not spec.use_lora, **revision,
    )
    log(f"unsloth: loaded {spec.base_model} with max_seq_length {max_seq_length}{', 4-bit' if four_bit else ''}")
    if not spec.use_lora:
        return model
    return FastLanguageModel.get_peft_model(
        model, r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=0.0, target_modules=LORA_TARGETS,
        bias="none", random_state=spec.seed,
    )
