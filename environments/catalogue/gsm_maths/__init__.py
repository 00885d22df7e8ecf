"""Grade-school maths: multi-step word problems whose answer is one number.

Reward components (each in [0, 1]):
- ``format``: the completion gives its answer after the marker (``#### 42``);
- ``correct``: the final number equals the reference answer;
- ``close``: 1 − relative error of the final number (dense signal for small models).
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
# row ("answer": the reference number).
ROW_KEYS = ("prompt", "answer")
# What CONFIG's values must be (JSON type names; read by the Studio without importing this package,
# so it can refuse a CONFIG edit that would fail the run as it loads).
CONFIG_TYPES = {"data_file": "string", "system_prompt": "string", "answer_marker": "string", "weights": "object", "max_examples": ("integer", "null")}
# CONFIG keys naming a JSON Lines file load_environment reads (one JSON object a line): the Studio and
# the engine read it first, so a file that is not one is refused naming the key and the line.
JSONL_FILES = ("data_file",)
# The components score() returns besides total: CONFIG["weights"] gives each one its weight.
REWARD_COMPONENTS = ("correct", "close", "format")
# Each number's (min, max), None for no bound; on weights, each weight (a negative one would reward
# failing a component). max_examples 0 would silently keep every row.
CONFIG_RANGES = {"max_examples": (1, None), "weights": (0, None)}

HERE = Path(__file__).resolve().parent
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def final_number(completion: str, marker: str) -> tuple[float | None, bool]:
    """(the answer, whether it came after the marker). Without a marker, the last number counts."""
    if marker and marker in completion:
        found = NUMBER.findall(completion.rsplit(marker, 1)[1])
        if found:
            return _number(found[0]), True
    found = NUMBER.findall(completion)
    return (_number(found[-1]) if found else None), False


class MathsEnvironment:
    def __init__(self, rows: list[dict[str, Any]], system_prompt: str, answer_marker: str, weights: dict[str, float]) -> None:
        self._rows = rows
        self.system_prompt = system_prompt
        self.answer_marker = answer_marker
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
        answer = float(str(row["answer"]).replace(",", ""))
        got, marked = final_number(completion, self.answer_marker)
        correct = 1.0 if got is not None and abs(got - answer) < 1e-6 else 0.0
        close = 0.0 if got is None else max(0.0, 1.0 - abs(got - answer) / max(abs(answer), 1.0))
        parts = {"correct": correct, "close": close, "format": 1.0 if marked else 0.0}
        parts["total"] = sum(self.weights.get(k, 0.0) * v for k, v in parts.items())
        return parts


def load_rows(data_file: str, max_examples: int | None = None) -> list[dict[str, Any]]:
    path = Path(data_file) if Path(data_file).is_absolute() else HERE / data_file
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:max_examples] if max_examples else rows


def load_environment(**kwargs: Any) -> MathsEnvironment:
    cfg = {**CONFIG, **kwargs}
    rows = [{"prompt": r["question"], "answer": str(r["answer"])} for r in load_rows(cfg["data_file"], cfg.get("max_examples"))]
    return MathsEnvironment(rows, cfg["system_prompt"], cfg["answer_marker"], dict(cfg["weights"]))
