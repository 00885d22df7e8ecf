"""Calculator tool use: the model may call a calculator up to ``max_tool_calls`` times within one
rollout and continue after each result, then states its answer.

Protocol: the model writes ``<calc>12*(3+4)</calc>``; generation stops at ``</calc>`` (``tool_stop``),
the engine appends ``call_tool(text)`` — ``<result>84</result>`` — and generation continues. The
expression is evaluated safely (numbers and + - * / // % ** and parentheses only).

Reward components (each in [0, 1]):
- ``correct``: the number after 'Answer:' equals the reference;
- ``tool_use``: the calculator was called (1..max_tool_calls times) and every call parsed;
- ``format``: an 'Answer:' line is present.
``total`` is the CONFIG-weighted sum.
"""

from __future__ import annotations

import ast
import json
import operator
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
CONFIG_TYPES = {"data_file": "string", "system_prompt": "string", "max_tool_calls": "integer", "weights": "object", "max_examples": ("integer", "null")}
# CONFIG keys naming a JSON Lines file load_environment reads (one JSON object a line): the Studio and
# the engine read it first, so a file that is not one is refused naming the key and the line.
JSONL_FILES = ("data_file",)
# The components score() returns besides total: CONFIG["weights"] gives each one its weight.
REWARD_COMPONENTS = ("correct", "tool_use", "format")
# Each number's (min, max), None for no bound; on weights, each weight (a negative one would reward
# failing a component). max_examples 0 would silently keep every row.
CONFIG_RANGES = {"max_tool_calls": (1, None), "max_examples": (1, None), "weights": (0, None)}

HERE = Path(__file__).resolve().parent
CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
ANSWER = re.compile(r"answer\s*:?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}


def evaluate(expression: str) -> float:
    """A safe arithmetic evaluator; raises ValueError on anything else."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    try:
        return ev(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ZeroDivisionError, OverflowError, TypeError) as exc:
        raise ValueError(str(exc)) from exc


def fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class CalculatorEnvironment:
    tool_stop = "</calc>"

    def __init__(self, rows: list[dict[str, Any]], system_prompt: str, max_tool_calls: int, weights: dict[str, float]) -> None:
        self._rows = rows
        self.system_prompt = system_prompt
        self.max_tool_calls = max_tool_calls
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

    def call_tool(self, text: str) -> str | None:
        """The tool's reply to the last call in `text` (which ends at tool_stop), or None."""
        calls = CALL.findall(text)
        if not calls:
            return None
        try:
            return f"<result>{fmt(evaluate(calls[-1]))}</result>"
        except ValueError as exc:
            return f"<result>error: {exc}</result>"

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        calls = CALL.findall(completion)
        parsed = 0
        for expr in calls:
            try:
                evaluate(expr)
                parsed += 1
            except ValueError:
                pass
        tool_use = 1.0 if calls and len(calls) <= self.max_tool_calls and parsed == len(calls) else 0.0
        answers = ANSWER.findall(completion)
        correct = 0.0
        if answers:
            try:
                correct = 1.0 if abs(float(answers[-1].replace(",", "")) - float(row["answer"])) < 1e-6 else 0.0
            except ValueError:
                correct = 0.0
        parts = {"correct": correct, "tool_use": tool_use, "format": 1.0 if answers else 0.0}
        parts["total"] = sum(self.weights.get(k, 0.0) * v for k, v in parts.items())
        return parts


def load_environment(**kwargs: Any) -> CalculatorEnvironment:
    cfg = {**CONFIG, **kwargs}
    path = Path(cfg["data_file"]) if Path(cfg["data_file"]).is_absolute() else HERE / cfg["data_file"]
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if cfg.get("max_examples"):
        raw = raw[: cfg["max_examples"]]
    rows = [{"prompt": r["question"], "answer": fmt(evaluate(r["expression"]))} for r in raw]
    return CalculatorEnvironment(rows, cfg["system_prompt"], int(cfg["max_tool_calls"]), dict(cfg["weights"]))
