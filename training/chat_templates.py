"""What START can tell from a base model's chat template, read from its files (a local folder, the HF
cache or a Data Hub repo@ref) without loading it: runs whose rows need a template the model lacks, or
assistant-only loss on a template that cannot mark the assistant's turns, failed in TRL after the job
started ("chat_template is not set", "The chat template is not training-compatible")."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from datahub.datasets import RowsCheck
from studio.errors import Finding
from training.methods.base import Draft
from training.methods.trl_snapshot import TEMPLATES_FILE

# TRL's own test (trl.chat_template_utils.has_generation_markers), whitespace-trim variants included.
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
NO_TOKENIZER = object()  # the files say nothing about a tokenizer: nothing to judge


def read_template(read: Callable[[str], bytes | None]) -> Any:
    """The model's chat template (its default variant), None when its tokenizer has none, or
    NO_TOKENIZER when the folder has no tokenizer_config.json (the engine's loader says what is missing)."""
    jinja = read("chat_template.jinja")  # where transformers 5 saves it
    if jinja is not None:
        return jinja.decode("utf-8", "replace")
    raw = read("tokenizer_config.json")
    if raw is None:
        return NO_TOKENIZER
    try:
        template = json.loads(raw).get("chat_template")
    except (ValueError, AttributeError):
        return NO_TOKENIZER
    if isinstance(template, list):  # named variants: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) and template else None


def trl_can_patch(template: str) -> bool:
    """Whether TRL swaps in a training template with generation markers for this one."""
    return hashlib.sha256(template.encode()).hexdigest() in set(json.loads(TEMPLATES_FILE.read_text()))


def chat_fields(draft: Draft, checks: list[tuple[str, RowsCheck]]) -> list[str]:
    """The dataset entries whose checked rows the engine renders with the chat template: chat
    `messages` rows, or prompts written as a list of messages (DPO, GRPO)."""
    fields = []
    for field, check in checks:
        if check.shape is None:
            continue
        shape, texts = check.shape[1], check.forms[2] if check.forms else ()
        if shape == "chat" or not all(texts):
            fields.append(field)
    return fields


def template_findings(draft: Draft, checks: list[tuple[str, RowsCheck]], read: Callable[[str], bytes | None] | None) -> list[Finding]:
    """`read`: the base model's files (training.validation.model_file_reader), None when the Studio
    cannot see them (an HF id not in the cache): then the engine finds out, as before."""
    if read is None:
        return []
    template = read_template(read)
    if template is NO_TOKENIZER:
        return []
    chats = chat_fields(draft, checks)
    # DPO and GRPO put a system prompt before a text prompt as a chat; SFT and DISTILL only into chat rows.
    system = draft.method in ("dpo", "grpo") and bool(draft.config.get("system_prompt"))
    if template is None:
        needs = [f"the rows of {field} are chats" for field in chats] + (["config.system_prompt is set"] if system else [])
        if not needs:
            return []
        return [Finding("base_model", f"{draft.base_model} has no chat template, and {', and '.join(needs)}: chat rows and system_prompt need one; "
                                      "use text or prompt/completion rows (and no system_prompt), or a model with a chat template")]
    # The engine asks TRL for assistant-only loss on chat `messages` rows (training/engine/sft.py).
    messages = [field for field, check in checks if check.shape is not None and check.shape[1] == "chat"]
    if (draft.method == "sft" and messages and draft.config.get("assistant_only_loss") is not False
            and not GENERATION.search(template) and not trl_can_patch(template)):
        return [Finding("base_model", f"{draft.base_model}'s chat template cannot mark the assistant's turns (it has no {{% generation %}} markers, "
                                      f"and TRL has no training version of it), and SFT on the chat rows of {messages[0]} learns from the assistant's "
                                      "turns only: set config.assistant_only_loss to false to train on whole conversations, or use a model whose "
                                      "template has generation markers")]
    return []
