from __future__ import annotations

from pathlib import Path

import numpy as np

from training.engine import kd_format

from .conftest import IngestStub, make_spec, mean, run_inprocess

DISTILL_CONFIG = {"max_steps": 16, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64}


def _spec(tiny, out: Path, ingest: IngestStub, k: int = 16, **cfg):  # type: ignore[no-untyped-def]
    dist = {"teacher_model": tiny["teacher"], "top_k": k, "temperature": 1.0, "kd_weight": 0.5}
    return make_spec("distill", tiny["student"], [tiny["distill"]], out, {**DISTILL_CONFIG, **cfg, "distillation": dist}, ingest)


def test_distill_captures_sidecars_then_kd_loss_falls(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    assert run_inprocess(_spec(tiny, tmp_path, ingest)) == 0
    # The stages in order, as the log says them and as reported: a capture shorter than the reporter's
    # flush interval once lost "capture" to "train" in one batch (seen in CI, on 2 busy CPUs).
    assert [line.removeprefix("stage: ") for line in ingest.collect("logs") if line.startswith("stage: ")] == ["setup", "capture", "train"]
    assert ingest.scalars("stage") == ["setup", "capture", "train"]
    # The capture is the run's work: "running" (as the engine starts) and the shards' progress are reported before training starts.
    first = {what: next(i for i, b in enumerate(ingest.batches) if b[key] == value) for what, key, value in (("running", "status", "running"), ("train", "stage", "train"))}
    assert first["running"] <= first["train"], first
    assert any({"capture_shards_done": 1, "capture_shards": 1}.items() <= p.items() for p in ingest.scalars("progress")), ingest.scalars("progress")

    sidecar = tmp_path / "kd" / "shard-00000.kd"
    header, ids, logprobs = kd_format.read_sidecar(sidecar)
    tokens = np.load(tmp_path / "kd" / "shard-00000.npz")
    assert header.k == 16 and header.version == 1 and header.dtype == 0
    assert header.n_tokens == len(tokens["input_ids"]) > 0
    assert header.vocab_size == 501 or header.vocab_size > 0
    assert sidecar.stat().st_size == 1024 + 6 * 16 * header.n_tokens
    assert header.token_hash == kd_format.tokenisation_hash(tokens["input_ids"], tokens["offsets"], header.vocab_size)
    assert (np.diff(np.asarray(logprobs, dtype=np.float32), axis=1) <= 0).all()  # top-K sorted best first
    assert (np.asarray(logprobs) <= 0).all() and int(np.asarray(ids).max()) < header.vocab_size

    kd = ingest.series("kd_loss")
    ce = ingest.series("loss")
    assert len(kd) == len(ce) == 16
    assert mean(kd[-3:]) < 0.8 * mean(kd[:3]), kd
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["final"]


def test_valid_sidecar_is_not_captured_again(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    assert run_inprocess(_spec(tiny, tmp_path, ingest, max_steps=1)) == 0
    sidecar = tmp_path / "kd" / "shard-00000.kd"
    first = sidecar.stat().st_mtime_ns
    assert run_inprocess(_spec(tiny, tmp_path, ingest, max_steps=1)) == 0
    assert sidecar.stat().st_mtime_ns == first
    assert any("already valid; skipped" in line for line in ingest.collect("logs"))
    # Another K is another capture: the old sidecar does not match and is rewritten.
    assert run_inprocess(_spec(tiny, tmp_path, ingest, k=8, max_steps=1)) == 0
    assert kd_format.read_header(sidecar).k == 8


def test_a_teacher_whose_tokenizer_gives_other_ids_fails_before_capture(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # A Data Hub teacher with two token ids swapped passed START (only a local one is checked there)
    # and the run "completed", training the student on the teacher's ids read as its own.
    import json
    import shutil

    teacher = tmp_path / "teacher-swapped"
    shutil.copytree(tiny["teacher"], teacher)
    spec_file = teacher / "tokenizer.json"
    data = json.loads(spec_file.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    spec_file.write_text(json.dumps(data))
    spec = _spec(tiny, tmp_path / "out", ingest)
    spec["config"]["distillation"]["teacher_model"] = str(teacher)
    assert run_inprocess(spec) == 2  # a bad spec, before any capture
    assert not (tmp_path / "out" / "kd").exists() or not list((tmp_path / "out" / "kd").glob("*.kd"))
    assert any("the teacher's tokenizer differs from the student's (2 tokens have other ids" in line for line in ingest.collect("logs")), ingest.collect("logs")[-5:]


def test_a_restarted_run_reuses_the_last_attempts_capture_of_the_same_teacher(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def attempt(n: int, **cfg) -> list[str]:
        before = len(ingest.collect("logs"))
        spec = {**_spec(tiny, tmp_path / f"attempt-{n}" / "output", ingest, max_steps=1, **cfg), "attempt": n, "cache_dir": str(cache)}
        assert run_inprocess(spec) == 0
        return [line for line in ingest.collect("logs")[before:] if line.startswith("capture:")]

    assert any("wrote shard-00000.kd" in line for line in attempt(1))
    sidecar = cache / "kd" / "shard-00000.kd"
    first = sidecar.stat().st_mtime_ns
    again = attempt(2)
    assert any("already valid; skipped" in line for line in again) and not any("wrote" in line for line in again), again
    assert sidecar.stat().st_mtime_ns == first and not (tmp_path / "attempt-2" / "output" / "kd").exists()
    # Another K, or a teacher whose files changed, is captured anew: the old capture is not reused.
    assert any("wrote shard-00000.kd" in line for line in attempt(3, k=8))
    assert kd_format.read_header(sidecar).k == 8
    weights = next(Path(tiny["teacher"]).glob("*.safetensors"))
    weights.touch()
    assert any("wrote shard-00000.kd" in line for line in attempt(4, k=8))


def test_a_top_k_wider_than_the_vocabulary_keeps_every_token_and_says_so(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    # It was clamped silently: the log read top_k=501 for a config of 600, with no reason.
    assert run_inprocess(_spec(tiny, tmp_path, ingest, k=600, max_steps=1)) == 0
    header = kd_format.read_header(tmp_path / "kd" / "shard-00000.kd")
    assert header.k == header.vocab_size
    logs = ingest.collect("logs")
    assert any(f"top_k 600 is more than the {header.vocab_size} tokens of the vocabulary; keeping all {header.vocab_size}" in line for line in logs), logs[:20]
