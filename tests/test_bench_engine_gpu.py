"""bench/engine_gpu.py on the CPU: the smoke run prints one JSON object with every section measured.

The figures themselves mean nothing on the CPU (tiny shapes, a shared machine); what is checked is that
the script runs the engine's real code paths end to end, keeps stdout to the one JSON object, reports no
MFU without a GPU peak, and computes each ratio as engine / bare. Speed belongs to the device run.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# Section → the module the engine side of it needs (both are other pieces of issue 8).
ENGINE_MODULES = {"capture": "training.engine.capture", "rollout": "training.engine.rollout"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("engine-gpu-out")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_PEAK_")}  # an override would give the CPU an MFU
    env.update({"OUT": str(out), "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "bench.engine_gpu", "--smoke"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:  # anything else on stdout breaks the one-object contract
        raise AssertionError(f"stdout is not one JSON object ({exc}):\n{proc.stdout[:2000]}") from exc
    return result, out


def measured_pairs(result: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(section, label, {bare, engine, ratio}) for every engine-vs-bare comparison in the result."""
    sections = result["sections"]
    pairs = [("sft", name, sections["sft"][name]) for name in ("qwen2.5-0.5b", "qwen3-1.7b")]
    pairs.append(("capture", "1.7b teacher", sections["capture"]))
    pairs += [("rollout", rows, sections["rollout"][rows]) for rows in ("8", "64")]
    return pairs


def module_missing(section: str) -> bool:
    name = ENGINE_MODULES.get(section)
    return name is not None and importlib.util.find_spec(name) is None


def test_smoke_runs_every_section_on_the_cpu(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    assert result["bench"] == "engine_gpu"
    assert result["mode"] == "smoke"
    assert result["machine"]["device"] == "cpu"
    assert set(result["sections"]) == {"sft", "capture", "rollout", "fp8"}
    for section in result["sections"].values():
        assert "error" not in section, section["error"]
    # float8 needs a GPU that has it: on the CPU the section says so instead of failing.
    assert result["sections"]["fp8"]["skipped"] is True and result["sections"]["fp8"]["reason"] == "smoke run on the CPU"


def test_each_pair_has_positive_tokens_per_s_or_names_the_missing_module(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    for section, label, pair in measured_pairs(result):
        bare = pair["bare"]
        assert "error" not in bare, f"{section} {label} bare: {bare.get('error')}"
        assert isinstance(bare["tokens_per_s"], float) and bare["tokens_per_s"] > 0
        engine = pair["engine"]
        if module_missing(section):
            assert "error" in engine, f"{section} {label}: the engine module is missing, so an error must say so"
            continue
        assert "error" not in engine, f"{section} {label} engine: {engine.get('error')}"
        assert isinstance(engine["tokens_per_s"], float) and engine["tokens_per_s"] > 0


def test_ratios_are_engine_over_bare(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    for section, label, pair in measured_pairs(result):
        if "error" in pair["engine"]:
            assert pair["ratio"] is None
            continue
        expected = pair["engine"]["tokens_per_s"] / pair["bare"]["tokens_per_s"]
        assert pair["ratio"] == pytest.approx(expected, rel=1e-3, abs=1e-3), f"{section} {label}"


def test_no_mfu_and_no_gpu_memory_without_a_gpu(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    for section, label, pair in measured_pairs(result):
        for side in ("bare", "engine"):
            assert pair[side].get("mfu") is None, f"{section} {label} {side}"
            assert pair[side].get("peak_gpu_gb") is None
    assert result["machine"]["peak_tflops"] is None
    targets = {t["name"]: t for t in result["targets"]}
    assert targets["sft_1.7b_engine_mfu_pct"]["value"] is None and targets["sft_1.7b_engine_mfu_pct"]["met"] is None
    assert targets["capture_1.7b_mfu_pct"]["met"] is None


def test_the_engine_side_ran_the_engines_sft_and_full_length_rollouts(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    for name in ("qwen2.5-0.5b", "qwen3-1.7b"):
        engine = result["sections"]["sft"][name]["engine"]
        # Read back from the engine's own reporter: one figure per timed step.
        assert engine["steps_measured"] >= 1
        assert engine["engine_config"]["per_device_train_batch_size"] == result["sections"]["sft"][name]["bare"]["batch"]
    rollout = result["sections"]["rollout"]
    for rows in ("8", "64"):
        # No row may stop early on either side: both make rows × new_tokens tokens.
        assert rollout[rows]["bare"]["new_tokens"] == int(rows) * rollout["new_tokens"]
        if not module_missing("rollout"):
            assert rollout[rows]["engine"]["new_tokens"] == int(rows) * rollout["new_tokens"]


def test_targets_are_listed_with_value_target_met_and_why(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    names = [t["name"] for t in result["targets"]]
    assert names == ["sft_0.5b_engine_over_bare", "sft_1.7b_engine_over_bare", "sft_1.7b_engine_mfu_pct",
                     "capture_1.7b_mfu_pct", "rollout_8x512_engine_over_generate"]
    for t in result["targets"]:
        assert set(t) == {"name", "value", "target", "met", "why"}
        assert t["met"] is None if t["value"] is None else t["met"] == (t["value"] >= t["target"])
    ratio_target = result["targets"][0]
    assert ratio_target["value"] == result["sections"]["sft"]["qwen2.5-0.5b"]["ratio"]


def test_the_same_object_is_written_to_out(smoke: tuple[dict[str, Any], Path]) -> None:
    result, out = smoke
    assert json.loads((out / "engine_gpu.json").read_text()) == result
