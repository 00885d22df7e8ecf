"""DISTILL capture at speed: the teacher's top-K next-token logprobs for a shard's token stream.

The naive path (one sequence per forward, full-vocab float32 logits, log_softmax, topk) is dominated
by launch overhead and by a [tokens, vocab] float32 tensor per sequence. Here:

- Sequences are sorted by length and grouped into batches of at most `batch_tokens` tokens
  (rows × longest row). Rows are right-padded and run with *no* attention mask: under causal attention
  a real token only attends to earlier positions, which are all real, so the outputs at real positions
  are exactly the per-sequence ones, and SDPA keeps its mask-free (flash) kernel. The padded positions
  are computed and thrown away; sorting keeps them few.
- The base model gives hidden states; the output head, logsumexp and top-K then run over `chunk_tokens`
  positions at a time, so the [tokens, vocab] logits never exist for a whole batch. top-K of the logits
  equals top-K of the logprobs (they differ by one constant per row), so the logprobs are
  ``topk(logits) - logsumexp(logits)`` with the logsumexp taken in float32.
- On CUDA, results go to the host through pinned buffers with non-blocking copies, and a writer thread
  scatters them into the output arrays while the GPU computes the next chunk. On the CPU the same code
  runs synchronously.

Memory, for a 1.7B teacher (Qwen3-1.7B: hidden 2048, 28 layers, MLP 6144, vocab 151 936) in bf16 on a
24 GB card, with the defaults batch_tokens=16384 and chunk_tokens=4096:
  weights                 ~1.7-2.0 B params × 2 B                          ≈ 3.4-4.1 GB
  forward activations     inference mode keeps one layer alive: residual 4 KB + q/k/v/o ~12 KB +
                          MLP gate/up/act 3 × 12 KB ≈ 52 KB/token × 16 384 ≈ 0.9 GB
  last hidden states      16 384 × 2048 × 2 B                               ≈ 0.07 GB
  one head chunk          bf16 logits 4096 × 151 936 × 2 B = 1.2 GB, float32 copy for the
                          logsumexp (reduced in place) 2.5 GB              ≈ 3.7 GB
  total                                                                     ≈ 9 GB, well inside 24 GB.
On an 80-141 GB card the same defaults leave room; raising batch_tokens past ~16k buys little because
one 16k-token forward of a 1.7B model is already ~66 TFLOP of large GEMMs.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from . import kd_format, perf
from .fit import CAPTURE_BATCH_TOKENS, CAPTURE_CHUNK_TOKENS
from .spec import SpecError

if TYPE_CHECKING:
    from .common import Context
    from .distill import Shard

BATCH_TOKENS = CAPTURE_BATCH_TOKENS  # shared with fit.py, whose memory estimate assumes them
CHUNK_TOKENS = CAPTURE_CHUNK_TOKENS
PROBE_TOKENS = 32


@dataclass
class CaptureStats:
    tokens: int
    seconds: float
    tokens_per_s: float
    mfu: float | None


# ---- the output head --------------------------------------------------------------------------------


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


@dataclass
class OutputHead:
    """How the teacher turns last hidden states into logits, split from its CausalLM forward.

    `transform` is the model's post-projection step (softcapping, scaling) applied to float32 logits,
    or None for a plain projection.
    """

    decoder: Any
    head: Any
    transform: Callable[[torch.Tensor], torch.Tensor] | None
    description: str

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(input_ids=input_ids, use_cache=False).last_hidden_state


def _logit_transform(teacher: Any) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, str]:
    """The post-projection steps of the CausalLM forwards we know. Anything else is caught by the probe."""
    cfg = _text_config(teacher.config)
    model_type = str(getattr(cfg, "model_type", "") or getattr(teacher.config, "model_type", ""))
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3/4 and friends: cap · tanh(logits / cap)
        cap = float(cap)
        return (lambda x: torch.tanh(x / cap) * cap), f"softcap {cap:g}"
    if model_type.startswith("granite") and getattr(cfg, "logits_scaling", None):
        scale = float(cfg.logits_scaling)  # Granite divides (HyperCLOVA X multiplies: the probe sends it to the slow path)
        return (lambda x: x / scale), f"logits / {scale:g}"
    if model_type.startswith("cohere") and getattr(teacher, "logit_scale", None) is not None:
        scale = float(teacher.logit_scale)
        return (lambda x: x * scale), f"logits × {scale:g}"
    return None, "plain projection"


def _logits(head: OutputHead, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 logits over the first `vocab_size` ids (the student's tokenizer), transform applied."""
    logits = head.head(hidden)[..., :vocab_size]
    return head.transform(logits.float()) if head.transform is not None else logits


@torch.inference_mode()
def output_head(teacher: Any, vocab_size: int, probe_ids: np.ndarray) -> OutputHead | None:
    """Split the teacher into decoder + head, and check the split against its own forward on a probe.

    None when the teacher has no separable head or the split does not reproduce its logits (a model
    whose forward does something to the logits that `_logit_transform` does not know): the caller then
    takes the slow full-logits path, which is always right.
    """
    head_module = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") else None
    try:
        decoder = teacher.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        decoder = getattr(teacher, "model", None)
    if head_module is None or decoder is None or decoder is teacher:
        return None
    transform, description = _logit_transform(teacher)
    head = OutputHead(decoder, head_module, transform, description)
    probe = probe_ids[:PROBE_TOKENS]
    if len(probe) == 0:
        return head
    device = next(teacher.parameters()).device
    seq = torch.from_numpy(probe.astype(np.int64)).unsqueeze(0).to(device)
    try:
        ours = _logits(head, head.hidden(seq), vocab_size).float()
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return None
    ref = teacher(input_ids=seq, use_cache=False).logits[..., :vocab_size].float()
    # The two paths run the same kernels on the same shapes, so they agree to a few units in the last
    # place of the run's dtype; a missed softcap or scale moves logits by far more.
    eps = torch.finfo(head_module.weight.dtype).eps if hasattr(head_module, "weight") else torch.finfo(torch.float32).eps
    tol = 1e-3 + 4.0 * eps * float(ref.abs().max())
    if ours.shape != ref.shape or float((ours - ref).abs().max()) > tol:
        return None
    return head


# ---- the capture ------------------------------------------------------------------------------------


def _batches(offsets: np.ndarray, batch_tokens: int) -> list[list[int]]:
    """Sequence indices grouped so that rows × longest row ≤ batch_tokens (a longer sequence goes alone)."""
    lengths = np.diff(offsets)
    order = [int(i) for i in np.argsort(-lengths, kind="stable") if lengths[i] > 0]
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = int(lengths[current[0]]) if current else int(lengths[i])  # descending: the first is the longest
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class _Sink:
    """Moves (ids, logprobs) chunks from the device into the output arrays.

    Threaded (the default on CUDA): a non-blocking copy into pinned host memory and an event per chunk;
    a writer thread waits on the event and scatters, so the device never waits for the host. Otherwise
    synchronous: on the CPU there is nothing to overlap.
    """

    def __init__(self, ids_out: np.ndarray, lp_out: np.ndarray, device: torch.device, threaded: bool | None = None) -> None:
        self.ids_out, self.lp_out = ids_out, lp_out
        self.cuda = device.type == "cuda"
        self.threaded = self.cuda if threaded is None else threaded
        self.error: BaseException | None = None
        if self.threaded:
            # Bounded, so the host does not queue unbounded pinned memory ahead of the writer.
            self.queue: queue.Queue[Any] = queue.Queue(maxsize=16)
            self.thread = threading.Thread(target=self._drain, name="capture-writer", daemon=True)
            self.thread.start()

    def put(self, ids: torch.Tensor, logprobs: torch.Tensor, rows: np.ndarray) -> None:
        if not self.threaded:
            self._store(ids.cpu().numpy(), logprobs.cpu().numpy(), rows)
            return
        if self.error is not None:
            raise RuntimeError("capture: the writer thread failed") from self.error
        event = None
        if self.cuda:
            ids_h = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            lp_h = torch.empty(logprobs.shape, dtype=logprobs.dtype, pin_memory=True)
            ids_h.copy_(ids, non_blocking=True)
            lp_h.copy_(logprobs, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            ids_h, lp_h = ids.clone(), logprobs.clone()
        self.queue.put((event, ids_h, lp_h, rows))

    def _store(self, ids: np.ndarray, logprobs: np.ndarray, rows: np.ndarray) -> None:
        # int32 ids are non-negative vocabulary indices: the same bits as uint32.
        self.ids_out[rows] = ids.view(np.uint32)
        self.lp_out[rows] = logprobs

    def _drain(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # keep draining so the producer never blocks on a full queue
            event, ids_h, lp_h, rows = item
            try:
                if event is not None:
                    event.synchronize()
                self._store(ids_h.numpy(), lp_h.numpy(), rows)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the capturing thread
                self.error = exc

    def close(self) -> None:
        """Wait for every chunk to land; raise if the writer failed."""
        if self.threaded:
            self.queue.put(None)
            self.thread.join()
            if self.error is not None:
                raise RuntimeError("capture: the writer thread failed") from self.error


@torch.inference_mode()
def _capture_naive(teacher: Any, input_ids: np.ndarray, offsets: np.ndarray, k: int, vocab_size: int, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """One sequence per forward with the model's own full logits: slow, but right for any head."""
    n_tokens = int(offsets[-1])
    ids_out = np.zeros((n_tokens, k), dtype=np.uint32)
    lp_out = np.zeros((n_tokens, k), dtype=np.float16)
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        if b <= a:
            continue
        seq = torch.from_numpy(input_ids[a:b].astype(np.int64)).unsqueeze(0).to(device)
        logits = teacher(input_ids=seq, use_cache=False).logits[0, :, :vocab_size].float()
        top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        ids_out[a:b] = top.indices.cpu().numpy().astype(np.uint32)
        lp_out[a:b] = top.values.cpu().numpy().astype(np.float16)
    return ids_out, lp_out


@torch.inference_mode()
def capture_topk(
    teacher: Any,
    input_ids: np.ndarray,
    offsets: np.ndarray,
    k: int,
    vocab_size: int,
    *,
    batch_tokens: int = BATCH_TOKENS,
    chunk_tokens: int = CHUNK_TOKENS,
    device: torch.device | str | None = None,
    head: OutputHead | Literal["auto", "naive"] = "auto",
    threaded_writes: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(n_tokens, k) uint32 ids and fp16 logprobs for a shard's token stream; identical (to fp16 rounding) to the naive per-sequence path.

    Row i is the teacher's top-K over the first `vocab_size` ids predicting token i+1 of its sequence,
    best first. `head`: "auto" probes the teacher for a separable output head (`output_head`) and falls
    back to the full-logits path without one; an `OutputHead` skips the probe; "naive" forces the
    full-logits path. `threaded_writes`: hand results to a writer thread (default: on CUDA only).
    """
    if not 0 < k <= vocab_size:
        raise ValueError(f"k must be in 1..vocab_size ({vocab_size}), got {k}")
    if batch_tokens < 1 or chunk_tokens < 1:
        raise ValueError("batch_tokens and chunk_tokens must be positive")
    device = torch.device(device) if device is not None else next(teacher.parameters()).device
    input_ids = np.asarray(input_ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    if head == "auto":
        a, b = _first_nonempty(offsets)
        head = output_head(teacher, vocab_size, input_ids[int(offsets[a]) : int(offsets[b])]) or "naive"
    if not isinstance(head, OutputHead):
        return _capture_naive(teacher, input_ids, offsets, k, vocab_size, device)

    n_tokens = int(offsets[-1])
    ids_out = np.zeros((n_tokens, k), dtype=np.uint32)
    lp_out = np.zeros((n_tokens, k), dtype=np.float16)
    lengths = np.diff(offsets)
    sink = _Sink(ids_out, lp_out, device, threaded_writes)
    try:
        for batch in _batches(offsets, batch_tokens):
            longest = int(lengths[batch[0]])
            rows = np.zeros((len(batch), longest), dtype=np.int64)  # pad id 0: padded positions are discarded
            for r, i in enumerate(batch):
                rows[r, : lengths[i]] = input_ids[offsets[i] : offsets[i + 1]]
            hidden = head.hidden(_to_device(rows, device))
            hidden = hidden.reshape(len(batch) * longest, hidden.shape[-1])
            # Flat positions of the real tokens in the padded batch, and the stream rows they fill.
            flat = np.concatenate([r * longest + np.arange(lengths[i]) for r, i in enumerate(batch)])
            dest = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in batch])
            if len(flat) < hidden.shape[0]:
                hidden = hidden.index_select(0, _to_device(flat, device))
            for c0 in range(0, len(dest), chunk_tokens):
                logits = _logits(head, hidden[c0 : c0 + chunk_tokens], vocab_size)
                # Top-K on the logits in their own dtype: the cast to float32 is exact and monotonic, so
                # the ids are those of topk(log_softmax(logits.float())), for half the bytes read.
                top = logits.topk(k, dim=-1)
                # logsumexp in place over the float32 copy (or over the logits themselves when they are
                # already float32: top-K is taken), so no second [chunk, vocab] temporary exists.
                x = logits.float()
                m = x.amax(dim=-1, keepdim=True)
                lse = x.sub_(m).exp_().sum(dim=-1).log_().add_(m.squeeze(-1))
                values = (top.values.float() - lse.unsqueeze(-1)).to(torch.float16)
                del logits, x
                sink.put(top.indices.to(torch.int32), values, dest[c0 : c0 + chunk_tokens])
            del hidden
    finally:
        sink.close()
    return ids_out, lp_out


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    # From pageable memory a host-to-device copy first waits for the stream to drain, which would stall
    # the host until the previous batch finished; from pinned memory it is queued like any kernel.
    return tensor.pin_memory().to(device, non_blocking=True)


def _first_nonempty(offsets: np.ndarray) -> tuple[int, int]:
    for i in range(len(offsets) - 1):
        if offsets[i + 1] > offsets[i]:
            return i, i + 1
    return 0, 0


# ---- the DISTILL stage ------------------------------------------------------------------------------


def capture_shards(ctx: Context, shards: list[Shard], teacher_ref: str, k: int, vocab_size: int, *, fused: bool = False) -> CaptureStats:
    """Capture every shard whose sidecar is not already valid; free the teacher after.

    `fused` (the run's `use_liger`): liger's fused RMSNorm/SwiGLU/RoPE kernels in the teacher's forward
    where they can run (`liger.fuse_for_inference`); on the H200 they took a 1.7B teacher's capture from
    31 % to 42 % MFU (bench/RESULTS.md).

    Sidecars are written atomically (`kd_format.write_sidecar`) by a background thread while the next
    shard computes, so an interrupted capture leaves only valid sidecars or none, and a resumed run
    skips the valid ones.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    from .modeling import load_model

    rep = ctx.reporter
    todo = [s for s in shards if not kd_format.is_valid(s.kd_path, s.token_hash, k)]
    if len(todo) < len(shards):  # one line, not one per shard: a large dataset has thousands
        rep.log(f"capture: {len(shards) - len(todo)} of {len(shards)} shards already valid; skipped")
    if not todo:
        return CaptureStats(tokens=0, seconds=0.0, tokens_per_s=0.0, mfu=None)
    # The teacher's pass is the run's own work, often its longest part (the run is running since its
    # engine started, run_spec): its progress is the shards done.
    done = len(shards) - len(todo)
    rep.progress({"capture_shards_done": done, "capture_shards": len(shards)})
    device = torch.device(ctx.device.kind)
    teacher = load_model(teacher_ref, None, ctx.device, log=ctx.reporter.log).to(device).eval()
    if fused:
        from .liger import fuse_for_inference

        rep.log("capture: " + fuse_for_inference(teacher, ctx.device.kind)[1])
    teacher_vocab = int(getattr(_text_config(teacher.config), "vocab_size", 0) or teacher.config.vocab_size)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kd-sidecar")
    head: OutputHead | None = None
    try:
        if teacher_vocab < vocab_size:
            raise SpecError("config.distillation.teacher_model: the teacher's vocabulary is smaller than the student's tokenizer")
        first = todo[0]
        a, b = _first_nonempty(first.offsets)
        head = output_head(teacher, vocab_size, first.input_ids[int(first.offsets[a]) : int(first.offsets[b])])
        if head is None:
            rep.log(f"capture: {type(teacher).__name__}'s output head is not a plain projection this engine can split; using the slower full-logits path")
        else:
            rep.log(f"capture: batched teacher forward, output head in chunks ({head.description}), {ctx.device.precision}")
        tokens = squares = 0
        pending: tuple[Future[None], Shard, int] | None = None
        started = time.perf_counter()
        for s in todo:
            ids, lps = capture_topk(teacher, s.input_ids, s.offsets, k, vocab_size, device=device, head=head or "naive")
            n_tokens = int(s.offsets[-1])
            tokens += n_tokens
            squares += int((np.diff(s.offsets).astype(np.int64) ** 2).sum())
            if pending is not None:
                _finish(pending, k, rep)
            pending = (writer.submit(kd_format.write_sidecar, s.kd_path, ids, lps, vocab_size, s.token_hash), s, n_tokens)
            done += 1
            rep.progress({"capture_shards_done": done, "capture_shards": len(shards),
                          "capture_tokens_per_s": round(tokens / max(time.perf_counter() - started, 1e-9))})
        if pending is not None:
            _finish(pending, k, rep)
        seconds = time.perf_counter() - started
        stats = _stats(teacher, tokens, squares, seconds, device)
    finally:
        # A shard already captured is still written (atomically) if the capture stops on an error.
        writer.shutdown(wait=True)
        # The teacher must not share memory with the student's training (the head holds its modules too).
        del teacher, head
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    rep.metric(0, "capture/tokens_per_s", stats.tokens_per_s)
    mfu_text = "n/a"
    if stats.mfu is not None:
        rep.metric(0, "capture/mfu", stats.mfu)
        mfu_text = f"{stats.mfu:.1f}%"
    rep.log(f"capture: {stats.tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_s:.0f} tokens/s, MFU {mfu_text})")
    return stats


def _finish(pending: tuple[Any, Shard, int], k: int, rep: Any) -> None:
    future, shard, n_tokens = pending
    future.result()
    rep.log(f"capture: wrote {shard.kd_path.name} ({n_tokens} tokens, k={k})")


def _stats(teacher: Any, tokens: int, squares: int, seconds: float, device: torch.device) -> CaptureStats:
    tokens_per_s = tokens / seconds if seconds > 0 else 0.0
    # A token in a sequence of s tokens attends over ~s positions, so the attention term of the mean
    # per-token cost takes the token-weighted mean length Σs²/Σs, not the plain mean over sequences.
    mean_len = squares / max(tokens, 1)
    flops = perf.shape_of(teacher).forward_flops_per_token(mean_len)
    # A capture on the CPU is priced against the CPU (no peak unless declared), even beside a GPU.
    peak = perf.device_peak(None if device.type == "cuda" else "cpu")
    return CaptureStats(tokens=tokens, seconds=seconds, tokens_per_s=tokens_per_s, mfu=perf.mfu(flops, tokens_per_s, peak))
