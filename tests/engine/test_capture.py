"""Batched, chunked top-K capture gives what the naive per-sequence full-logits capture gave."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from training.engine import kd_format
from training.engine.capture import CaptureStats, OutputHead, _Sink, capture_shards, capture_topk, output_head
from training.engine.distill import Shard
from training.engine.modeling import Device
from training.engine.reporter import Reporter

from .conftest import IngestStub, make_spec, run_inprocess

# Very different lengths, a single-token sequence among them, so batches pad and group unevenly.
LENGTHS = [37, 1, 200, 5, 64, 3, 129, 18, 2, 77]


@torch.no_grad()
def naive_capture(teacher: Any, input_ids: np.ndarray, offsets: np.ndarray, k: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine's original capture, one sequence at a time over full float32 logits; plus the full logprobs."""
    n_tokens = int(offsets[-1])
    ids_out = np.zeros((n_tokens, k), dtype=np.uint32)
    lp_out = np.zeros((n_tokens, k), dtype=np.float16)
    full = np.zeros((n_tokens, vocab_size), dtype=np.float32)
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        if b <= a:
            continue  # the original raised on an empty sequence (a 0-token forward)
        seq = torch.from_numpy(input_ids[a:b].astype(np.int64)).unsqueeze(0)
        logits = teacher(input_ids=seq).logits[0, :, :vocab_size].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        top = logprobs.topk(k, dim=-1)
        ids_out[a:b] = top.indices.cpu().numpy().astype(np.uint32)
        lp_out[a:b] = top.values.cpu().numpy().astype(np.float16)
        full[a:b] = logprobs.numpy()
    return ids_out, lp_out, full


def assert_same_capture(got: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    ids, lps = got
    ref_ids, ref_lps, full = ref
    assert ids.dtype == np.uint32 and lps.dtype == np.float16 and ids.shape == ref_ids.shape == lps.shape
    # fp16 rounding: half a unit in the last place is ~2.4e-4 relative; allow a few.
    tol = 2e-3 + 2e-3 * np.abs(ref_lps.astype(np.float32))
    assert (np.abs(lps.astype(np.float32) - ref_lps.astype(np.float32)) <= tol).all()
    rows, cols = np.nonzero(ids != ref_ids)
    # Ids may differ only where two tokens tie: then both have the same logprob in the full reference.
    got_lp = full[rows, ids[rows, cols].astype(np.int64)]
    ref_lp = full[rows, ref_ids[rows, cols].astype(np.int64)]
    assert (np.abs(got_lp - ref_lp) <= 1e-4 + 1e-5 * np.abs(ref_lp)).all(), list(zip(got_lp, ref_lp, strict=True))[:5]
    assert len(rows) <= 0.01 * ids.size, f"{len(rows)} of {ids.size} ids differ: more than ties explain"
    for row in ids:
        assert len(set(row.tolist())) == len(row)  # no id twice in a row


@pytest.fixture(scope="module")
def teacher(tiny: dict[str, str]) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny["teacher"], dtype=torch.float32).eval()


def stream(vocab_size: int, lengths: list[int] = LENGTHS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return rng.integers(0, vocab_size, size=int(offsets[-1])).astype(np.uint32), offsets


@pytest.mark.parametrize(
    ("batch_tokens", "chunk_tokens"),
    [
        (16384, 4096),  # the defaults: every sequence in one padded batch, one chunk
        (256, 7),  # several batches; chunks that do not divide any batch
        (200, 200),  # the longest sequence fills a batch exactly
        (1, 1),  # one sequence per batch, one position per chunk
        (150, 333),  # a sequence longer than batch_tokens goes alone; chunk larger than a batch
    ],
)
def test_batched_chunked_capture_equals_the_naive_path(teacher: Any, batch_tokens: int, chunk_tokens: int) -> None:
    vocab = teacher.config.vocab_size
    ids, offsets = stream(vocab)
    got = capture_topk(teacher, ids, offsets, 16, vocab, batch_tokens=batch_tokens, chunk_tokens=chunk_tokens)
    assert_same_capture(got, naive_capture(teacher, ids, offsets, 16, vocab))


def test_the_writer_thread_path_gives_the_same_arrays(teacher: Any) -> None:
    # On CUDA results reach the arrays through a writer thread; the same thread runs here without pinning.
    vocab = teacher.config.vocab_size
    ids, offsets = stream(vocab)
    threaded = capture_topk(teacher, ids, offsets, 16, vocab, batch_tokens=128, chunk_tokens=13, threaded_writes=True)
    inline = capture_topk(teacher, ids, offsets, 16, vocab, batch_tokens=128, chunk_tokens=13, threaded_writes=False)
    assert np.array_equal(threaded[0], inline[0]) and np.array_equal(threaded[1], inline[1])


def test_a_writer_thread_failure_is_raised_in_the_capturing_thread() -> None:
    sink = _Sink(np.zeros((4, 2), np.uint32), np.zeros((4, 2), np.float16), torch.device("cpu"), threaded=True)
    sink.put(torch.ones(2, 2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.float16), np.array([0, 1]))
    sink.put(torch.ones(2, 2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.float16), np.array([2, 9]))  # row 9 does not exist
    with pytest.raises(RuntimeError, match="writer thread failed"):
        sink.close()
    assert (sink.ids_out[:2] == 1).all()


def test_k_equal_to_the_vocabulary_and_a_smaller_student_vocabulary(teacher: Any) -> None:
    # The student's tokenizer may cover fewer ids than the teacher's head: only those are ranked.
    vocab = teacher.config.vocab_size - 24
    ids, offsets = stream(vocab, [9, 30, 4])
    got = capture_topk(teacher, ids, offsets, vocab, vocab, batch_tokens=40, chunk_tokens=16)
    assert_same_capture(got, naive_capture(teacher, ids, offsets, vocab, vocab))
    assert (np.sort(got[0], axis=1) == np.arange(vocab, dtype=np.uint32)).all()  # a permutation of the vocabulary
    lse = np.logaddexp.reduce(got[1].astype(np.float64), axis=1)
    assert np.allclose(lse, 0.0, atol=2e-2)  # all of the mass
    with pytest.raises(ValueError, match="k must be in 1..vocab_size"):
        capture_topk(teacher, ids, offsets, vocab + 1, vocab)


def test_empty_sequences_leave_no_rows_and_do_not_break_batching(teacher: Any) -> None:
    vocab = teacher.config.vocab_size
    ids, offsets = stream(vocab, [0, 6, 0, 11])
    got = capture_topk(teacher, ids, offsets, 8, vocab, batch_tokens=12, chunk_tokens=5)
    assert_same_capture(got, naive_capture(teacher, ids, offsets, 8, vocab))


def _gemma2_teacher(tmp_path: Path, vocab: int) -> Any:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=512, final_logit_softcapping=2.0, initializer_range=0.1, sliding_window=16,
    )  # fmt: skip
    return Gemma2ForCausalLM(config).eval()


def test_logit_softcapping_is_applied_in_the_chunked_head(tmp_path: Path) -> None:
    # Raw logits reach ~±5 here; a cap of 2 squeezes them into (-2, 2), so missing it shows.
    model = _gemma2_teacher(tmp_path, 300)
    ids, offsets = stream(300, [40, 3, 25])
    head = output_head(model, 300, ids[:10])
    assert head is not None and "softcap" in head.description
    ref = naive_capture(model, ids, offsets, 12, 300)
    assert_same_capture(capture_topk(model, ids, offsets, 12, 300, batch_tokens=64, chunk_tokens=9), ref)
    uncapped = capture_topk(model, ids, offsets, 12, 300, head=OutputHead(head.decoder, head.head, None, "no cap"))
    assert np.abs(uncapped[1].astype(np.float32) - ref[1].astype(np.float32)).max() > 0.1


def test_an_unknown_logit_transform_falls_back_to_the_full_logits_path(teacher: Any) -> None:
    class Scaled(torch.nn.Module):
        """A CausalLM whose forward scales its logits: nothing in its config says so."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_output_embeddings(self) -> Any:
            return self.inner.get_output_embeddings()

        def get_decoder(self) -> Any:
            return self.inner.get_decoder()

        def forward(self, input_ids: torch.Tensor, **kw: Any) -> Any:
            out = self.inner(input_ids=input_ids, **kw)
            return SimpleNamespace(logits=out.logits * 3.0)

    model = Scaled(teacher).eval()
    vocab = teacher.config.vocab_size
    ids, offsets = stream(vocab, [12, 30])
    assert output_head(model, vocab, ids[:12]) is None
    got = capture_topk(model, ids, offsets, 8, vocab, batch_tokens=64, chunk_tokens=5)
    assert_same_capture(got, naive_capture(model, ids, offsets, 8, vocab))


def _shard(tmp_path: Path, name: str, vocab: int, lengths: list[int], seed: int) -> Shard:
    ids, offsets = stream(vocab, lengths, seed)
    return Shard(tmp_path / f"{name}.npz", tmp_path / f"{name}.kd", ids, np.ones(len(ids), np.uint8), offsets, kd_format.tokenisation_hash(ids, offsets, vocab))


def test_capture_shards_skips_valid_sidecars_writes_the_rest_and_reports_speed(tiny: dict[str, str], teacher: Any, tmp_path: Path) -> None:
    vocab = teacher.config.vocab_size
    done, todo = _shard(tmp_path, "a", vocab, [10, 20], 1), _shard(tmp_path, "b", vocab, LENGTHS, 2)
    kd_format.write_sidecar(done.kd_path, *naive_capture(teacher, done.input_ids, done.offsets, 8, vocab)[:2], vocab, done.token_hash)
    before = done.kd_path.stat().st_mtime_ns
    reporter = Reporter(None, None, echo=False)
    ctx = SimpleNamespace(reporter=reporter, device=Device("cpu", False, "fp32"))

    stats = capture_shards(ctx, [done, todo], tiny["teacher"], 8, vocab)  # type: ignore[arg-type]

    assert isinstance(stats, CaptureStats) and stats.tokens == sum(LENGTHS) and stats.seconds > 0 and stats.tokens_per_s > 0
    assert done.kd_path.stat().st_mtime_ns == before
    assert kd_format.is_valid(todo.kd_path, todo.token_hash, 8)
    _, ids, lps = kd_format.read_sidecar(todo.kd_path)
    assert_same_capture((np.asarray(ids), np.asarray(lps)), naive_capture(teacher, todo.input_ids, todo.offsets, 8, vocab))
    assert not list(tmp_path.glob("*.tmp"))
    lines = list(reporter.log_tail)
    assert "capture: 1 of 2 shards already valid; skipped" in lines
    assert f"capture: wrote b.kd ({sum(LENGTHS)} tokens, k=8)" in lines
    assert any(line.startswith(f"capture: {sum(LENGTHS)} tokens in ") and "tokens/s, MFU n/a)" in line for line in lines), lines
    assert stats.mfu is None  # no MFU on the CPU without a declared peak

    # Everything valid now: nothing is loaded or captured, and no speed is reported.
    again = capture_shards(ctx, [done, todo], tiny["teacher"], 8, vocab)  # type: ignore[arg-type]
    assert again.tokens == 0


def test_a_fused_capture_on_the_cpu_says_liger_is_off_and_captures_the_same(teacher: Any, tiny: dict[str, str], tmp_path: Path) -> None:
    # use_liger fuses the teacher's forward on a GPU only (measured there: bench/RESULTS.md); elsewhere it says why not.
    vocab = teacher.config.vocab_size
    shard = _shard(tmp_path, "c", vocab, LENGTHS, 4)
    reporter = Reporter(None, None, echo=False)
    ctx = SimpleNamespace(reporter=reporter, device=Device("cpu", False, "fp32"))
    capture_shards(ctx, [shard], tiny["teacher"], 8, vocab, fused=True)  # type: ignore[arg-type]
    assert "capture: liger: off (no CUDA device; liger's kernels are GPU-only)" in list(reporter.log_tail)
    _, ids, lps = kd_format.read_sidecar(shard.kd_path)
    assert_same_capture((np.asarray(ids), np.asarray(lps)), naive_capture(teacher, shard.input_ids, shard.offsets, 8, vocab))


def test_a_failed_capture_leaves_no_valid_sidecar(teacher: Any, tiny: dict[str, str], tmp_path: Path) -> None:
    # An id outside the teacher's vocabulary makes the forward raise part-way through the shard.
    vocab = teacher.config.vocab_size
    bad = _shard(tmp_path, "bad", vocab, [5, 5], 3)
    bad.input_ids[7] = vocab + 10_000
    ctx = SimpleNamespace(reporter=Reporter(None, None, echo=False), device=Device("cpu", False, "fp32"))
    with pytest.raises(IndexError):
        capture_shards(ctx, [bad], tiny["teacher"], 8, vocab)  # type: ignore[arg-type]
    assert not bad.kd_path.exists() and not kd_format.is_valid(bad.kd_path, bad.token_hash, 8)


def test_distill_run_reports_capture_speed_and_mfu_with_a_declared_peak(
    tiny: dict[str, str], ingest: IngestStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUDIO_PEAK_TFLOPS", "1.0")  # perf's override gives the CPU a peak
    dist = {"teacher_model": tiny["teacher"], "top_k": 8}
    config = {"max_steps": 1, "per_device_train_batch_size": 4, "max_length": 64, "distillation": dist}
    assert run_inprocess(make_spec("distill", tiny["student"], [tiny["distill"]], tmp_path, config, ingest)) == 0
    metrics = ingest.metrics()
    [(step, tps)] = metrics["capture/tokens_per_s"]
    [(_, mfu)] = metrics["capture/mfu"]
    assert step == 0 and tps > 0 and 0 < mfu
    assert any(line.startswith("capture: ") and "tokens/s, MFU " in line and "%)" in line for line in ingest.collect("logs"))
