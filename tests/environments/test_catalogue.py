"""Each catalogue environment scores known-good and known-bad completions correctly, offline, through
the same loader the engine uses for a staged package."""
from __future__ import annotations

import json

import pytest

from tests.environments.conftest import CATALOGUE
from training.engine.packages import load_package


def load(name: str, **overrides):
    return load_package(CATALOGUE / name, f"builtin/{name}@main", overrides)


def test_every_package_has_config_data_and_load_environment():
    names = sorted(p.name for p in CATALOGUE.iterdir() if (p / "__init__.py").is_file())
    assert names == ["calculator", "gsm_maths", "multiple_choice", "science_qa"]
    for name in names:
        assert (CATALOGUE / name / "config.py").is_file() and (CATALOGUE / name / "data.jsonl").is_file()
        env = load(name)
        rows = env.prompts(50, seed=1)
        assert len(rows) == 50 and all(isinstance(r["prompt"], str) and r["prompt"] for r in rows)
        assert env.system_prompt and env.config["weights"]


def test_gsm_maths():
    env = load("gsm_maths")
    row = {"prompt": "Tom has 3 boxes...", "answer": "10"}
    good = env.score(row, "3 boxes of 4 is 12, minus 2 is 10.\n#### 10")
    assert good == {"correct": 1.0, "close": 1.0, "format": 1.0, "total": pytest.approx(1.0)}
    unmarked = env.score(row, "The answer is 10")
    assert unmarked["correct"] == 1.0 and unmarked["format"] == 0.0 and unmarked["total"] == pytest.approx(0.9)
    wrong = env.score(row, "#### 12")
    assert wrong["correct"] == 0.0 and wrong["format"] == 1.0 and 0 < wrong["close"] < 1 and wrong["total"] < 0.5
    assert env.score(row, "I do not know")["total"] == 0.0
    assert env.score({"prompt": "x", "answer": "1,200"}, "#### 1,200")["correct"] == 1.0


def test_gsm_maths_config_is_what_runs():
    env = load("gsm_maths", weights={"correct": 1.0}, max_examples=3)
    assert len({r["prompt"] for r in env.prompts(30, 0)}) == 3
    assert env.score({"prompt": "x", "answer": "4"}, "#### 4")["total"] == 1.0


def test_multiple_choice():
    env = load("multiple_choice")
    row = next(r for r in env.prompts(100, 0) if "Red Planet" in r["prompt"])
    assert row["answer"] == "B" and "B) Mars" in row["prompt"]
    for good in ("Answer: B", "B", "(B) Mars", "The answer is B."):
        assert env.score(row, good) == {"correct": 1.0, "format": 1.0, "total": pytest.approx(1.0)}, good
    assert env.score(row, "Answer: C") == {"correct": 0.0, "format": 1.0, "total": pytest.approx(0.2)}
    assert env.score(row, "A planet is red")["total"] == 0.0  # the article 'A' is not an answer
    assert env.score(row, "Mars")["total"] == 0.0


def test_science_qa():
    env = load("science_qa")
    row = next(r for r in env.prompts(100, 0) if "absorb" in r["prompt"])
    assert json.loads(row["aliases"]) == ["carbon dioxide", "CO2"]
    assert env.score(row, "Answer: carbon dioxide") == {"correct": 1.0, "mentions": 1.0, "concise": 1.0, "total": pytest.approx(1.0)}
    assert env.score(row, "CO2")["correct"] == 1.0
    rambling = env.score(row, "Plants take in many gases from the air around them every day, and the most important one is carbon dioxide.")
    assert rambling["correct"] == 0.0 and rambling["mentions"] == 1.0 and rambling["concise"] == 0.0
    wrong = env.score(row, "Answer: oxygen")
    assert wrong["correct"] == 0.0 and wrong["mentions"] == 0.0 and wrong["total"] == pytest.approx(0.1)
    # A run's own dataset may give the aliases as a real JSON list (a TypeError before).
    assert env.score({"prompt": "What is gold's symbol?", "aliases": ["Au", "au"]}, "Answer: Au")["correct"] == 1.0


def test_calculator_scores_and_tool():
    env = load("calculator")
    row = {"prompt": "What is 53 times 7?", "answer": "371"}
    assert env.tool_stop == "</calc>" and env.max_tool_calls == 3
    # the tool answers the LAST call in the text, safely
    assert env.call_tool("Let me compute <calc>53*7</calc>") == "<result>371</result>"
    assert env.call_tool("<calc>1+1</calc> then <calc>(2+3)*4</calc>") == "<result>20</result>"
    assert env.call_tool("<calc>__import__('os')</calc>").startswith("<result>error")
    assert env.call_tool("no call") is None
    good = env.score(row, "<calc>53*7</calc><result>371</result> Answer: 371")
    assert good == {"correct": 1.0, "tool_use": 1.0, "format": 1.0, "total": pytest.approx(1.0)}
    no_tool = env.score(row, "Answer: 371")
    assert no_tool["correct"] == 1.0 and no_tool["tool_use"] == 0.0 and no_tool["total"] == pytest.approx(0.8)
    too_many = env.score(row, "<calc>1</calc>" * 4 + " Answer: 371")
    assert too_many["tool_use"] == 0.0
    wrong = env.score(row, "<calc>53+7</calc><result>60</result> Answer: 60")
    assert wrong["correct"] == 0.0 and wrong["tool_use"] == 1.0 and wrong["total"] == pytest.approx(0.3)
    assert env.score(row, "")["total"] == 0.0
