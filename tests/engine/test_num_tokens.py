"""num_tokens, the running total of tokens trained on: every real token of a packed batch, and it
carries on from a checkpoint when a run resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from training.engine.sft import TOKEN_TOTAL_FILE

from .conftest import IngestStub, make_spec, run_inprocess


def _num_tokens(tiny: dict[str, str], method: str, data: str, out: Path, config: dict[str, Any], **extra: Any) -> dict[int, float]:
    stub = IngestStub()
    try:
        assert run_inprocess(make_spec(method, tiny["student"], [tiny[data]], out, config, stub, **extra)) == 0
        return dict(stub.metrics()["num_tokens"])
    finally:
        stub.close()


def test_an_epoch_counts_the_same_tokens_packed_or_padded(tiny: Any, tmp_path: Path) -> None:
    # Packed rows go to SDPA as [batch, longest row] without an attention mask: TRL counted one row of them.
    config = {"per_device_train_batch_size": 4, "max_length": 32}
    packed = _num_tokens(tiny, "sft", "sft_text", tmp_path / "packed", {**config, "packing": True})
    padded = _num_tokens(tiny, "sft", "sft_text", tmp_path / "padded", {**config, "packing": False})
    assert len(packed) < len(padded)  # fewer, fuller steps: the rows really were packed
    assert packed[max(packed)] == padded[max(padded)]


RESUMED = {"max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 4, "max_length": 32}


@pytest.mark.parametrize("saved", [True, False])
def test_a_resumed_run_counts_on_from_its_checkpoint(tiny: Any, tmp_path: Path, saved: bool) -> None:
    full = _num_tokens(tiny, "sft", "sft_text", tmp_path / "full", RESUMED)
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / TOKEN_TOTAL_FILE).is_file()
    if not saved:  # a checkpoint an older engine saved: the total last logged in its trainer state
        (checkpoint / TOKEN_TOTAL_FILE).unlink()
    resumed = _num_tokens(tiny, "sft", "sft_text", tmp_path / "resumed", RESUMED, resume_from=str(checkpoint))
    assert full[2] > 0
    assert resumed == {3: full[3], 4: full[4]}
