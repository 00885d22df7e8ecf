"""Loading the spec's datasets into one `datasets.Dataset`, and recognising row shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .spec import DatasetRef, SpecError

_EXT_TO_BUILDER = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_one(ref: DatasetRef, index: int) -> Any:
    import datasets

    path = Path(ref.path)
    if path.is_file():
        builder = _EXT_TO_BUILDER.get(path.suffix.lower())
        if builder is None:
            raise SpecError(f"dataset[{index}].path: unsupported file type {path.suffix!r} (use .jsonl, .json, .parquet or .csv)")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in _EXT_TO_BUILDER)
        if files:
            builder = _EXT_TO_BUILDER[files[0].suffix.lower()]
            same = [str(p) for p in files if _EXT_TO_BUILDER[p.suffix.lower()] == builder]
            return datasets.load_dataset(builder, data_files=same, split="train")
        return datasets.load_from_disk(str(path))
    if path.is_absolute() or ref.path.startswith("."):
        raise SpecError(f"dataset[{index}].path: {ref.path!r} does not exist")
    # Anything else is a hub dataset id; the container's HF cache/mirror decides whether it resolves.
    return datasets.load_dataset(ref.path, revision=ref.revision, split="train")


def load_rows(refs: list[DatasetRef]) -> Any:
    import datasets

    parts = [_load_one(ref, i) for i, ref in enumerate(refs)]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def detect_shape(columns: Any) -> str:
    """The row shape from the column names: 'preference', 'chat', 'prompt_completion', 'prompts'
    (prompts only, for GRPO), 'text' or 'unknown'. Studio's dataset validation uses the same rule."""
    cols = set(columns)
    if {"prompt", "chosen", "rejected"} <= cols:
        return "preference"
    if "messages" in cols:
        return "chat"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if "prompt" in cols:
        return "prompts"
    if "text" in cols:
        return "text"
    return "unknown"


def row_format(dataset: Any) -> str:
    """'chat' (messages), 'text', 'prompt_completion' or 'preference': the shapes the trainers read."""
    cols = set(dataset.column_names)
    shape = detect_shape(cols)
    if shape == "prompts" and "text" in cols:
        return "text"
    if shape not in ("prompts", "unknown"):
        return shape
    raise SpecError(f"dataset: rows need messages, text, prompt/completion or prompt/chosen/rejected columns; got {sorted(cols)}")


def with_system_prompt(dataset: Any, system_prompt: str | None) -> Any:
    """Prepend the run's system prompt to chat rows that have none of their own."""
    if not system_prompt or "messages" not in dataset.column_names:
        return dataset

    def add(row: dict[str, Any]) -> dict[str, Any]:
        msgs = row["messages"]
        if msgs and msgs[0].get("role") == "system":
            return row
        return {"messages": [{"role": "system", "content": system_prompt}, *msgs]}

    return dataset.map(add)


def with_system_prompt_in_pairs(dataset: Any, system_prompt: str | None) -> Any:
    """Give preference rows the run's system prompt: a conversational prompt without a system turn of
    its own gets one first; a text pair becomes a chat (system + user prompt, assistant answers), as
    GRPO's text prompts do, so the model's chat template applies to both answers alike."""
    if not system_prompt:
        return dataset
    system = {"role": "system", "content": system_prompt}

    def add(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return {"prompt": [system, {"role": "user", "content": prompt}],
                    "chosen": _as_answer(row["chosen"]), "rejected": _as_answer(row["rejected"])}
        if prompt and prompt[0].get("role") == "system":
            return row
        return {"prompt": [system, *prompt]}

    return dataset.map(add)


def _as_answer(completion: Any) -> Any:
    return [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
