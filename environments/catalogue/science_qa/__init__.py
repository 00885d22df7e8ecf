"""Science questions with short answers; each question lists the aliases that count as right.

Reward components (each in [0, 1]):
- ``correct``: the stated answer (after 'Answer:', else the first line) is one of the aliases;
- ``mentions``: an alias appears anywhere in the completion;
- ``concise``: the completion is at most ``max_words`` words.
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
# row ("aliases": the answers that count, a list or a JSON-encoded one).
ROW_KEYS = ("prompt", "aliases")
# What CONFIG's values must be (JSON type names; read by the Studio without importing this package,
# so it can refuse a CONFIG edit that would fail the run as it loads).
CONFIG_TYPES = {"data_file": "string", "system_prompt": "string", "max_words": "integer", "weights": "object", "max_examples": ("integer", "null")}
# CONFIG keys naming a JSON Lines file load_environment reads (one JSON object a line): the Studio and
# the engine read it first, so a file that is not one is refused naming the key and the line.
JSONL_FILES = ("data_file",)
# The components score() returns besides total: CONFIG["weights"] gives each one its weight.
REWARD_COMPONENTS = ("correct", "mentions", "concise")
# Each number's (min, max), None for no bound; on weights, each weight (a negative one would reward
# failing a component). max_examples 0 would silently keep every row.
CONFIG_RANGES = {"max_words": (1, None), "max_examples": (1, None), "weights": (0, None)}

HERE = Path(__file__).resolve().parent


def normalise(text: str) -> str:
    text = re.sub(r"[^a-z0-9.\- ]+", " ", text.lower())
    text = re.sub(r"\b(the|a|an)\b", " ", text)
    return " ".join(text.split()).strip(" .")


def stated_answer(completion: str) -> str:
    match = re.search(r"answer\s*(?:is|:)\s*(.+)", completion, flags=re.IGNORECASE)
    text = match.group(1) if match else (completion.strip().splitlines() or [""])[0]
    return normalise(text.splitlines()[0] if text else "")


class ScienceEnvironment:
    def __init__(self, rows: list[dict[str, Any]], system_prompt: str, max_words: int, weights: dict[str, float]) -> None:
        self._rows = rows
        self.system_prompt = system_prompt
        self.max_words = max_words
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
        listed = row["aliases"]  # the catalogue's rows carry them JSON-encoded; a dataset's may be a real list
        aliases = [normalise(a) for a in (json.loads(listed) if isinstance(listed, str) else listed)]
        said = stated_answer(completion)
        whole = f" {normalise(completion)} "
        parts = {
            "correct": 1.0 if said in aliases else 0.0,
            "mentions": 1.0 if any(f" {a} " in whole for a in aliases) else 0.0,
            "concise": 1.0 if 0 < len(completion.split()) <= self.max_words else 0.0,
        }
        parts["total"] = sum(self.weights.get(k, 0.0) * v for k, v in parts.items())
        return parts


def load_environment(**kwargs: Any) -> ScienceEnvironment:
    cfg = {**CONFIG, **kwargs}
    path = Path(cfg["data_file"]) if Path(cfg["data_file"]).is_absolute() else HERE / cfg["data_file"]
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if cfg.get("max_examples"):
        raw = raw[: cfg["max_examples"]]
    # aliases travel as a JSON string so every row has the same flat column types
    rows = [{"prompt": r["question"], "answer": r["answers"][0], "aliases": json.dumps(r["answers"])} for r in raw]
    return ScienceEnvironment(rows, cfg["system_prompt"], int(cfg["max_words"]), dict(cfg["weights"]))
