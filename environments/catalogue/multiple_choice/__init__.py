"""Multiple choice: a question with lettered options; the reward checks the chosen letter.

Reward components (each in [0, 1]):
- ``format``: exactly one option letter is given (``Answer: B``, ``(B)`` or a bare ``B``);
- ``correct``: that letter is the right option.
``total`` is the CONFIG-weighted sum.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from .config import CONFIG

# The columns score() reads from a row: a GRPO run that brings its own dataset needs them in every
# row ("answer": the right letter).
ROW_KEYS = ("prompt", "answer")
# What CONFIG's values must be (JSON type names; read by the Studio without importing this package,
# so it can refuse a CONFIG edit that would fail the run as it loads).
CONFIG_TYPES = {"data_file": "string", "system_prompt": "string", "letters": "string", "shuffle_options": "boolean", "weights": "object",
                "max_examples": ("integer", "null")}
# CONFIG keys naming a JSON Lines file load_environment reads (one JSON object a line): the Studio and
# the engine read it first, so a file that is not one is refused naming the key and the line.
JSONL_FILES = ("data_file",)
# The components score() returns besides total: CONFIG["weights"] gives each one its weight.
REWARD_COMPONENTS = ("correct", "format")
# Each number's (min, max), None for no bound; on weights, each weight (a negative one would reward
# failing a component). max_examples 0 would silently keep every row.
CONFIG_RANGES = {"max_examples": (1, None), "weights": (0, None)}

HERE = Path(__file__).resolve().parent


def chosen_letter(completion: str, letters: str) -> str | None:
    """The option the completion picks: 'Answer: X' wins; else a completion that is just a letter."""
    cls = f"[{re.escape(letters)}]"
    explicit = re.findall(rf"answer\s*(?:is|:)?\s*\(?({cls})\)?(?![A-Za-z])", completion, flags=re.IGNORECASE)
    if explicit:
        return explicit[-1].upper()
    # "(B) ...", "B." / "B:" / "B)" or a lone "B"; "A planet ..." is an article, not an answer
    lead = re.match(rf"^\s*(?:\(({cls})\)|({cls})(?:[.):]|\s*$|\s*\n))", completion)
    return (lead.group(1) or lead.group(2)) if lead else None


def render(question: str, options: list[str], letters: str) -> str:
    lines = [question] + [f"{letters[i]}) {opt}" for i, opt in enumerate(options)]
    return "\n".join(lines)


class MultipleChoiceEnvironment:
    def __init__(self, rows: list[dict[str, Any]], system_prompt: str, letters: str, weights: dict[str, float]) -> None:
        self._rows = rows
        self.system_prompt = system_prompt
        self.letters = letters
        self.weights = weights

    def rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows]

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        out: list[dict[str, Any]] = []
        while len(out) < n:
            batch = self.rows()
            rng.shuffle(batch)
            out += batch
        return out[:n]

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        got = chosen_letter(completion, self.letters)
        parts = {"correct": 1.0 if got == row["answer"] else 0.0, "format": 1.0 if got else 0.0}
        parts["total"] = sum(self.weights.get(k, 0.0) * v for k, v in parts.items())
        return parts


def load_environment(**kwargs: Any) -> MultipleChoiceEnvironment:
    cfg = {**CONFIG, **kwargs}
    letters = cfg["letters"]
    path = Path(cfg["data_file"]) if Path(cfg["data_file"]).is_absolute() else HERE / cfg["data_file"]
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if cfg.get("max_examples"):
        raw = raw[: cfg["max_examples"]]
    rng = random.Random(0)
    rows = []
    for r in raw:
        options, right = list(r["options"]), r["options"][r["answer"]]
        if cfg.get("shuffle_options"):
            rng.shuffle(options)
        rows.append({"prompt": render(r["question"], options, letters), "answer": letters[options.index(right)]})
    return MultipleChoiceEnvironment(rows, cfg["system_prompt"], letters, dict(cfg["weights"]))
