"""Environment mode for GRPO: an environment supplies prompt rows and scores completions.

`score` returns a dict of reward components plus ``total``; only ``total`` drives the advantage, the
components are reported with each rollout so a user can see *why* a completion scored what it did.
Environments are looked up by id (``builtin/arith@main``; the ``@ref`` names a version and is ignored by
built-ins). The catalogue of user environments comes later and plugs in through ``register``.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from typing import Any

from .spec import SpecError


class Environment(ABC):
    id: str = ""

    @abstractmethod
    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        """Rows with at least a ``prompt`` string; other keys are passed back to `score`."""

    @abstractmethod
    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        """Reward components for one completion, including ``total``."""


class ArithEnvironment(Environment):
    """Two-number addition with a dense reward, so even a tiny random model climbs it.

    Components: ``format`` = share of the first characters that are digits; ``digits`` = share of the
    answer's digits right in place; ``exact`` = 1 when the first word is exactly the answer.
    """

    id = "builtin/arith"
    _pattern = re.compile(r"(\d+)\s*\+\s*(\d+)")

    def __init__(self, max_operand: int = 9) -> None:
        self.max_operand = max_operand

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            rows.append({"prompt": f"What is {a}+{b}? Answer with digits only.", "answer": str(a + b)})
        return rows

    def answer_for(self, row: dict[str, Any]) -> str:
        if row.get("answer") not in (None, ""):
            return str(row["answer"])
        match = self._pattern.search(str(row.get("prompt", "")))
        if not match:
            raise ValueError(f"builtin/arith: cannot find 'a+b' in prompt {row.get('prompt')!r}")
        return str(int(match.group(1)) + int(match.group(2)))

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        answer = self.answer_for(row)
        text = completion.strip()
        head = text[: max(len(answer), 4)]
        fmt = sum(ch.isdigit() for ch in head) / len(head) if head else 0.0
        digits = sum(1 for i, ch in enumerate(answer) if i < len(text) and text[i] == ch) / len(answer)
        words = text.split()
        exact = 1.0 if words and words[0].rstrip(".") == answer else 0.0
        total = 0.4 * fmt + 0.4 * digits + 0.2 * exact
        return {"format": fmt, "digits": digits, "exact": exact, "total": total}


_REGISTRY: dict[str, type[Environment]] = {ArithEnvironment.id: ArithEnvironment}


def register(env_cls: type[Environment]) -> type[Environment]:
    _REGISTRY[env_cls.id] = env_cls
    return env_cls


def load_environment(environment_id: str) -> Environment:
    name = environment_id.split("@", 1)[0]
    if name not in _REGISTRY:
        raise SpecError(f"config.environment_id: unknown environment {environment_id!r}; built-in ones are {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()
