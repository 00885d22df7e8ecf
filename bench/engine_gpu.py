"""GPU benchmark: the engine against a bare loop, on the same real shapes, in one process.

`python -m bench.engine_gpu [--smoke] [--only sft,capture,rollout,fp8] [--budget-s 420]`

Three sections measured twice on one shape in one process — once by the bare library call a
user would write, once through the engine's own code — and reported as engine / bare:

- sft: a bare transformers loop (model(input_ids, labels=...) + fused AdamW, sequence 2048) against
  the engine's SFT path (`training.engine.sft.run` on a parsed Spec, its per-step `tokens_per_s`
  read back from an in-memory Reporter), at the Qwen2.5-0.5B and Qwen3-1.7B shapes.
- capture: DISTILL's top-K capture with the 1.7B-shaped teacher (`training.engine.capture.
  capture_topk`) against a batched forward + log_softmax + topk.
- rollout: GRPO generation at the 0.5B shape, 8 × 512 and 64 × 512 new tokens, `model.generate`
  against `training.engine.rollout.StaticDecoder`.
- fp8 (last, so a short budget drops it first): the engine's SFT at the 1.7B shape with `precision:
  fp8` against the same run in bf16 — whether float8 GEMMs pay at this size. Skipped without a GPU
  that has float8.

Models are random-init from configs written here (no downloads, no tokenizer: token ids are drawn
at random), bf16 with SDPA on CUDA. Without CUDA, or with --smoke, the same code runs tiny shapes on
the CPU in well under a minute and prints the same keys (MFU null: perf.py gives the CPU no peak).

The bench prints ONE JSON object on stdout (everything else goes to stderr) and, when OUT is set,
writes it to $OUT/engine_gpu.json after every section, so a run killed by its time limit still
returns what it measured. A failing section records {"error": ...} and the others still run; a
time budget (default 7 minutes of the 8 the device check allows) skips what is left.

Targets (issue 8): SFT engine/bare >= 1.5 at 0.5B and >= 1.3 at 1.7B with >= 45 % MFU; capture
>= 50 % MFU; rollout engine/generate >= 10 at 8 x 512. Anchors on the H200 (bare): 87k tokens/s at
0.5B (31 % MFU), 29k at 1.7B (35 %), capture of 328k tokens in 4.1 s (28 %), generate 88 tokens/s
at 8 x 512 and 877 at 64 x 512.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Nothing may reach a network on the device machine; say so up front instead of waiting on timeouts.
for _key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SECTIONS = ("sft", "capture", "rollout", "fp8")  # in this order; fp8 last, so a short budget drops it first
SMALL, LARGE = "qwen2.5-0.5b", "qwen3-1.7b"
DEFAULT_BUDGET_S = 420.0  # 7 of the 8 minutes the device check may take: room to write the result

TARGETS = [
    # (name, where in the result, target, what "met" means)
    ("sft_0.5b_engine_over_bare", ("sft", SMALL, "ratio"), 1.5),
    ("sft_1.7b_engine_over_bare", ("sft", LARGE, "ratio"), 1.3),
    ("sft_1.7b_engine_mfu_pct", ("sft", LARGE, "engine", "mfu"), 45.0),
    ("capture_1.7b_mfu_pct", ("capture", "engine", "mfu"), 50.0),
    ("rollout_8x512_engine_over_generate", ("rollout", "8", "ratio"), 10.0),
]


@dataclass(frozen=True)
class Scale:
    """Every size the bench uses, so smoke and full runs differ only here."""

    smoke: bool
    seq_len: int
    sft_batch: dict[str, int]
    sft_warmup: int
    sft_steps: int
    capture_seqs: int  # sequences of seq_len: 160 x 2048 = 327,680 tokens, the issue's ~328k
    capture_k: int
    capture_bare_batch: int
    rollout_prompt_len: int
    rollout_new_tokens: int
    rollout_batches: tuple[int, ...]
    rollout_warmup_tokens: int


FULL = Scale(
    smoke=False, seq_len=2048, sft_batch={SMALL: 16, LARGE: 8}, sft_warmup=3, sft_steps=8,
    capture_seqs=160, capture_k=64, capture_bare_batch=4,
    rollout_prompt_len=128, rollout_new_tokens=512, rollout_batches=(8, 64), rollout_warmup_tokens=16,
)
SMOKE = Scale(
    smoke=True, seq_len=128, sft_batch={SMALL: 2, LARGE: 2}, sft_warmup=1, sft_steps=2,
    capture_seqs=4, capture_k=16, capture_bare_batch=2,
    rollout_prompt_len=8, rollout_new_tokens=8, rollout_batches=(8, 64), rollout_warmup_tokens=2,
)


def model_config(name: str, smoke: bool) -> Any:
    """The real shapes (random weights), or tiny ones of the same families for the CPU smoke run."""
    from transformers import Qwen2Config, Qwen3Config

    common: dict[str, Any] = {"tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if smoke:
        tiny = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024, **common}
        return Qwen2Config(**tiny) if name == SMALL else Qwen3Config(head_dim=16, **tiny)
    if name == SMALL:
        return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                           num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                           rms_norm_eps=1e-6, **common)
    return Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, **common)


# ---- plumbing -------------------------------------------------------------------------------------


def say(line: str) -> None:
    print(f"[engine_gpu {time.monotonic() - _T0:6.1f}s] {line}", file=sys.stderr, flush=True)


_T0 = time.monotonic()
_ON_GPU = False  # set by main(): the measurements run on CUDA
_SKIPPED: list[str] = []  # measurements the time budget skipped, for the result's notes


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def used(self) -> float:
        return time.monotonic() - _T0

    def left(self) -> float:
        return self.seconds - self.used

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise BudgetSpent(f"skipped {what}: the time budget of {self.seconds:.0f} s was used ({self.used:.0f} s)")


class BudgetSpent(RuntimeError):
    pass


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 1e9, 3)


def device_and_dtype(scale: Scale) -> tuple[Any, Any]:
    import torch

    if scale.smoke or not torch.cuda.is_available():
        return torch.device("cpu"), torch.float32
    return torch.device("cuda"), torch.bfloat16


def build_model(name: str, scale: Scale) -> Any:
    """A random-init model built straight on the device (CPU init of 1.7B weights would cost ~20 s)."""
    import torch
    from transformers import AutoModelForCausalLM

    device, dtype = device_and_dtype(scale)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(name, scale.smoke), dtype=dtype, attn_implementation="sdpa")
    # No EOS: a rollout must run its full length on both paths for equal work.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def random_ids(n_rows: int, length: int, vocab: int, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_rows, length), generator=gen)


def mfu_of(flops_per_token: float, tokens_per_s: float | None) -> float | None:
    from training.engine import perf

    if not tokens_per_s or not _ON_GPU:
        # A CPU run has no peak to compare with (a --smoke run on a GPU machine must not borrow the GPU's).
        return None
    value = perf.mfu(flops_per_token, tokens_per_s, perf.device_peak())
    return None if value is None else round(value, 2)


def ratio(engine: dict[str, Any], bare: dict[str, Any]) -> float | None:
    e, b = engine.get("tokens_per_s"), bare.get("tokens_per_s")
    if not isinstance(e, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return None
    return round(e / b, 3)


def guarded(what: str, budget: Budget, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one measurement; a failure (or a spent budget) becomes {"error": ...} and the bench goes on."""
    try:
        budget.check(what)
        reset_peak()
        out = fn(*args, **kwargs)
        out.setdefault("peak_gpu_gb", peak_gb())
        return out
    except BudgetSpent as exc:
        say(str(exc))
        _SKIPPED.append(str(exc))
        return {"error": str(exc), "skipped": True}
    except Exception as exc:  # noqa: BLE001 - one broken measurement must not lose the others
        say(f"{what} failed:\n{traceback.format_exc()}")
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        free_memory()


# ---- SFT ------------------------------------------------------------------------------------------


def sft_bare(name: str, scale: Scale, batch: int) -> dict[str, Any]:
    """model(input_ids, labels) + fused AdamW: what a user writes without any trainer."""
    import torch

    from training.engine import perf

    model = build_model(name, scale)
    flops = perf.shape_of(model).train_flops_per_token(scale.seq_len)
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    note = None
    while True:
        try:
            tokens_per_s, step_s = _bare_steps(model, scale, batch, vocab, device)
            break
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            oom_at = batch
        # Outside the except block, so the traceback (and the tensors its frames hold) is gone first.
        # "The batch that fits": halve and measure again rather than lose the figure.
        free_memory()
        reset_peak()
        batch = oom_at // 2
        note = f"batch {oom_at} did not fit; halved to {batch}"
        say(f"sft bare {name}: {note}")
    del model
    return {"tokens_per_s": round(tokens_per_s, 1), "mfu": mfu_of(flops, tokens_per_s), "step_s": round(step_s, 4),
            "batch": batch, "seq_len": scale.seq_len, "flops_per_token": flops, "peak_gpu_gb": peak_gb(),
            **({"note": note} if note else {})}


def _bare_steps(model: Any, scale: Scale, batch: int, vocab: int, device: Any) -> tuple[float, float]:
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    data = random_ids(batch * (scale.sft_warmup + scale.sft_steps), scale.seq_len, vocab, seed=1).to(device)
    try:
        t0 = 0.0
        for step in range(scale.sft_warmup + scale.sft_steps):
            if step == scale.sft_warmup:
                sync()
                t0 = time.perf_counter()
            ids = data[step * batch:(step + 1) * batch]
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        elapsed = time.perf_counter() - t0
    finally:
        del opt
        model.zero_grad(set_to_none=True)
    return scale.sft_steps * batch * scale.seq_len / elapsed, elapsed / scale.sft_steps


def write_stand_in_tokenizer(out_dir: Path) -> None:
    """The engine loads a tokenizer from the model folder; the rows are pre-tokenised, so a small
    word-level one with EOS and PAD is all it needs (no download, nothing trained)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(6)} | {"<|endoftext|>": 6, "<|pad|>": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>").save_pretrained(str(out_dir))


def make_reporter() -> Any:
    from training.engine.reporter import Reporter

    class _Recording(Reporter):
        """No ingest URL: nothing is sent; every metric is kept with the time it was reported."""

        def __init__(self) -> None:
            super().__init__(None, None, echo=False)
            self.series: dict[str, list[tuple[int, float, float]]] = defaultdict(list)

        def metric(self, step: int, key: str, value: float) -> None:
            self.series[key].append((int(step), float(value), time.perf_counter()))

        def _add(self, key: str, value: Any) -> None:
            # No sender thread runs: keep only the latest scalar fields, not an ever-growing buffer.
            if key in ("logs", "rollouts", "checkpoints"):
                return
            super()._add(key, value)

    return _Recording()


def sft_engine(name: str, scale: Scale, batch: int, engine_config: dict[str, Any]) -> dict[str, Any]:
    """The engine's SFT path on the same shape: sft.run on a parsed Spec, figures from its Reporter."""
    from training.engine import common, modeling, perf, sft
    from training.engine.spec import parse_spec

    steps = scale.sft_warmup + scale.sft_steps
    with tempfile.TemporaryDirectory(prefix="engine-gpu-sft-") as tmp:
        root = Path(tmp)
        model = build_model(name, scale)
        flops = perf.shape_of(model).train_flops_per_token(scale.seq_len)
        vocab = model.config.vocab_size
        model.save_pretrained(str(root / "model"))
        del model
        free_memory()
        write_stand_in_tokenizer(root / "model")
        rows = random_ids(batch * steps, scale.seq_len, vocab, seed=2).tolist()
        data = root / "sft.jsonl"
        with data.open("w") as fh:
            for ids in rows:
                # `text` makes it a text-shaped dataset for the engine; `input_ids` makes TRL skip tokenising.
                fh.write(json.dumps({"text": "synthetic", "input_ids": ids}) + "\n")
        config = {"max_length": scale.seq_len, "per_device_train_batch_size": batch, "max_steps": steps,
                  "learning_rate": 1e-5, "logging_steps": 1, **engine_config}
        spec = parse_spec({
            "run_id": "bench-engine-gpu", "method": "sft", "base_model": str(root / "model"),
            "dataset": [{"path": str(data)}], "output_dir": str(root / "out"), "config": config,
            "compute": {} if cuda() and not scale.smoke else {"accelerators": "CPU"}, "ingest": None,
        })
        reporter = make_reporter()
        ctx = common.Context(spec, reporter, modeling.pick_device(spec))
        reset_peak()
        t0 = time.perf_counter()
        sft.run(ctx)
        total_s = time.perf_counter() - t0
    steady = [(s, v, t) for s, v, t in reporter.series.get("tokens_per_s", []) if s > scale.sft_warmup]
    if not steady:
        raise RuntimeError(f"the engine reported no tokens_per_s after step {scale.sft_warmup} (got {sorted(reporter.series)})")
    tokens_per_s = statistics.median(v for _, v, _ in steady)
    engine_mfu = [v for s, v, _ in reporter.series.get("mfu", []) if s > scale.sft_warmup]
    out: dict[str, Any] = {
        "tokens_per_s": round(tokens_per_s, 1),
        # The engine's own MFU when it reports one; else perf.mfu of its tokens_per_s (same formula).
        "mfu": round(statistics.median(engine_mfu), 2) if engine_mfu else mfu_of(flops, tokens_per_s),
        "mfu_source": "engine" if engine_mfu else "bench",
        "steps_measured": len(steady), "batch": batch, "seq_len": scale.seq_len, "flops_per_token": flops,
        "engine_config": config, "run_s": round(total_s, 2),
    }
    step_times = [v for s, v, _ in reporter.series.get("step_time_s", []) if s > scale.sft_warmup]
    if step_times:
        out["step_s"] = round(statistics.median(step_times), 4)
    # The engine resets the peak-memory counter every step (it reports each step's own peak), so the
    # torch counter alone would see only the last step: take the largest the engine reported too.
    engine_peaks = [v for _, v, _ in reporter.series.get("gpu_memory_gb", [])]
    torch_peak = peak_gb()
    if engine_peaks or torch_peak is not None:
        out["peak_gpu_gb"] = round(max([*engine_peaks, *([torch_peak] if torch_peak is not None else [])]), 3)
    return out


def section_sft(scale: Scale, budget: Budget, engine_config: dict[str, Any], save: Callable[[dict[str, Any]], None],
                models: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name in models:
        batch = scale.sft_batch[name]
        say(f"sft {name}: bare loop, batch {batch} x {scale.seq_len}")
        bare = guarded(f"sft {name} bare", budget, sft_bare, name, scale, batch)
        say(f"sft {name}: bare {bare.get('tokens_per_s')} tokens/s, MFU {bare.get('mfu')}")
        # The engine runs the batch the bare loop ended with, so both do the same work per step.
        say(f"sft {name}: engine")
        batch = int(bare.get("batch") or batch)
        engine = guarded(f"sft {name} engine", budget, sft_engine, name, scale, batch, engine_config)
        while "OutOfMemoryError" in str(engine.get("error", "")) and batch > 1:
            # The engine may hold more per token than the bare loop (its own metrics over the logits, say):
            # its figure at a batch that fits says more than none; the note says the batches differ.
            batch //= 2
            say(f"sft {name}: engine ran out of memory; again with batch {batch}")
            engine = guarded(f"sft {name} engine", budget, sft_engine, name, scale, batch, engine_config)
            engine["note"] = f"out of memory at the bare loop's batch; measured at batch {batch}"
        say(f"sft {name}: engine {engine.get('tokens_per_s')} tokens/s, MFU {engine.get('mfu')}")
        result[name] = {"bare": bare, "engine": engine, "ratio": ratio(engine, bare),
                        "bare_kind": "model(input_ids, labels) + fused AdamW", "engine_kind": "training.engine.sft.run"}
        save(result)
    return result


# ---- capture --------------------------------------------------------------------------------------


def _capture_inputs(scale: Scale, vocab: int) -> tuple[Any, Any]:
    import numpy as np

    ids = random_ids(scale.capture_seqs, scale.seq_len, vocab, seed=3).numpy().astype(np.uint32).reshape(-1)
    offsets = np.arange(0, ids.size + 1, scale.seq_len, dtype=np.int64)
    return ids, offsets


def capture_bare(teacher: Any, scale: Scale, flops: float) -> dict[str, Any]:
    """Batched forward, full log_softmax in fp32 and topk, results copied to the host."""
    import torch

    ids, _ = _capture_inputs(scale, teacher.config.vocab_size)
    device = next(teacher.parameters()).device
    seqs = torch.from_numpy(ids.astype("int64")).view(scale.capture_seqs, scale.seq_len)
    b = scale.capture_bare_batch

    @torch.no_grad()
    def one(rows: Any) -> None:
        logits = teacher(input_ids=rows.to(device), use_cache=False).logits.float()
        top = torch.log_softmax(logits, dim=-1).topk(scale.capture_k, dim=-1)
        top.indices.to(torch.int32).cpu(), top.values.half().cpu()

    one(seqs[:b])  # warm-up: kernels and allocator
    sync()
    t0 = time.perf_counter()
    for start in range(0, scale.capture_seqs, b):
        one(seqs[start:start + b])
    sync()
    seconds = time.perf_counter() - t0
    tokens_per_s = ids.size / seconds
    return {"tokens_per_s": round(tokens_per_s, 1), "mfu": mfu_of(flops, tokens_per_s), "seconds": round(seconds, 3),
            "tokens": int(ids.size), "batch": b}


def capture_engine(teacher: Any, scale: Scale, flops: float, **sizes: Any) -> dict[str, Any]:
    """`sizes`: capture_topk's batch_tokens / chunk_tokens, when not its defaults."""
    from training.engine.capture import capture_topk

    vocab = teacher.config.vocab_size
    ids, offsets = _capture_inputs(scale, vocab)
    warm_seqs = min(2, scale.capture_seqs)
    capture_topk(teacher, ids[: warm_seqs * scale.seq_len], offsets[: warm_seqs + 1], scale.capture_k, vocab, **sizes)
    sync()
    t0 = time.perf_counter()
    top_ids, top_lp = capture_topk(teacher, ids, offsets, scale.capture_k, vocab, **sizes)
    sync()
    seconds = time.perf_counter() - t0
    if tuple(top_ids.shape) != (ids.size, scale.capture_k) or tuple(top_lp.shape) != (ids.size, scale.capture_k):
        raise RuntimeError(f"capture_topk returned shapes {tuple(top_ids.shape)} / {tuple(top_lp.shape)}, expected ({ids.size}, {scale.capture_k})")
    tokens_per_s = ids.size / seconds
    return {"tokens_per_s": round(tokens_per_s, 1), "mfu": mfu_of(flops, tokens_per_s), "seconds": round(seconds, 3),
            "tokens": int(ids.size), **sizes}


def section_capture(scale: Scale, budget: Budget, fused: bool) -> dict[str, Any]:
    """`fused` (the engine config's use_liger, as DISTILL passes it): the teacher gets liger's kernels
    (`liger.fuse_for_inference`) before the engine's capture. liger patches the model classes for the
    whole process, so a fused run measures no bare loop: the default run's bare figure is the one."""
    from training.engine import perf

    budget.check("capture")
    reset_peak()
    teacher = build_model(LARGE, scale).eval()
    try:
        flops = perf.shape_of(teacher).forward_flops_per_token(scale.seq_len)
        variants: dict[str, Any] = {}
        if fused:
            from training.engine.liger import fuse_for_inference

            _, why = fuse_for_inference(teacher, "cuda" if cuda() and not scale.smoke else "cpu")
            say(f"capture: {why}")
            bare = {"skipped": True, "reason": "liger patches the model classes process-wide: the bare figure is the default run's"}
        say(f"capture: engine, {scale.capture_seqs} x {scale.seq_len} tokens, k={scale.capture_k}")
        engine = guarded("capture engine", budget, capture_engine, teacher, scale, flops)
        if fused:
            engine["liger"] = why
        say(f"capture: engine {engine.get('tokens_per_s')} tokens/s, MFU {engine.get('mfu')}")
        if not fused:
            bare = guarded("capture bare", budget, capture_bare, teacher, scale, flops)
            say(f"capture: bare {bare.get('tokens_per_s')} tokens/s, MFU {bare.get('mfu')}")
            # Whether larger forwards and head chunks pay on a large card (the defaults are sized for 24 GB).
            sizes = {"batch_tokens": 8 * scale.seq_len * 4, "chunk_tokens": 8192}
            variants["larger_batches"] = guarded("capture engine, larger batches", budget, capture_engine, teacher, scale, flops, **sizes)
            say(f"capture: engine with {sizes}: {variants['larger_batches'].get('tokens_per_s')} tokens/s")
    finally:
        del teacher
        free_memory()
    return {"teacher": LARGE, "k": scale.capture_k, "seq_len": scale.seq_len, "tokens": scale.capture_seqs * scale.seq_len,
            "flops_per_token": flops, "engine": engine, "bare": bare, "ratio": ratio(engine, bare), "variants": variants,
            "engine_kind": "training.engine.capture.capture_topk" + (", teacher fused by liger" if fused else ""),
            "bare_kind": f"batched forward ({scale.capture_bare_batch} seqs) + fp32 log_softmax + topk"}


# ---- fp8 ------------------------------------------------------------------------------------------


def section_fp8(scale: Scale, budget: Budget, engine_config: dict[str, Any], sft: dict[str, Any]) -> dict[str, Any]:
    """The engine's SFT at the 1.7B shape with `precision: fp8` (training/engine/fp8.py) against the
    same run in bf16 (the sft section's figure when it ran, else measured here). MFU stays against the
    card's bf16 peak, so fp8 can show above the bf16 ceiling; the ratio is what says whether it pays."""
    import torch

    from training.engine import fp8

    ok, why = (False, "smoke run on the CPU") if scale.smoke else fp8.capability("cuda" if torch.cuda.is_available() else "cpu")
    if not ok:
        say(f"fp8: skipped ({why})")
        return {"skipped": True, "reason": why}
    bf16 = (sft.get(LARGE) or {}).get("engine") or {}
    batch = int(bf16.get("batch") or scale.sft_batch[LARGE])
    if not isinstance(bf16.get("tokens_per_s"), (int, float)):
        say(f"fp8: engine bf16 at {LARGE}, batch {batch}")
        bf16 = guarded(f"fp8 {LARGE} bf16", budget, sft_engine, LARGE, scale, batch, engine_config)
    say(f"fp8: engine fp8 at {LARGE}, batch {batch}")
    engine = guarded(f"fp8 {LARGE} fp8", budget, sft_engine, LARGE, scale, batch, {**engine_config, "precision": "fp8"})
    say(f"fp8: {engine.get('tokens_per_s')} tokens/s against bf16 {bf16.get('tokens_per_s')}")
    return {"model": LARGE, "fp8": engine, "bf16": bf16, "ratio": ratio(engine, bf16), "why": why,
            "engine_kind": "training.engine.sft.run, precision fp8 vs bf16"}


# ---- rollout --------------------------------------------------------------------------------------


def rollout_bare(model: Any, prompts: Any, scale: Scale) -> dict[str, Any]:
    """Plain `generate` with sampling; no EOS, so every row makes all its tokens."""
    import torch

    new = scale.rollout_new_tokens
    mask = torch.ones_like(prompts)
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": 0}
    with torch.no_grad():
        model.generate(prompts, attention_mask=mask, max_new_tokens=scale.rollout_warmup_tokens,
                       min_new_tokens=scale.rollout_warmup_tokens, **kwargs)
        sync()
        t0 = time.perf_counter()
        out = model.generate(prompts, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **kwargs)
        sync()
    seconds = time.perf_counter() - t0
    made = int(out.shape[0]) * (int(out.shape[1]) - int(prompts.shape[1]))
    return {"tokens_per_s": round(made / seconds, 1), "seconds": round(seconds, 3), "new_tokens": made}


def rollout_engine(model: Any, prompts: Any, scale: Scale) -> dict[str, Any]:
    from training.engine.rollout import StaticDecoder  # helper 1's module

    rows = int(prompts.shape[0])
    total = int(prompts.shape[1]) + scale.rollout_new_tokens
    prompt_ids = prompts.tolist()
    # An id past the vocabulary is never sampled: every row makes all its tokens, as generate does here.
    never = int(model.config.vocab_size)
    t0 = time.perf_counter()
    decoder = StaticDecoder(model, max_batch=rows, max_total_len=total, eos_token_ids=[never], pad_token_id=0)
    # The first call captures the decode step's CUDA graph; the timed call replays it.
    decoder.generate(prompt_ids, scale.rollout_warmup_tokens, temperature=1.0)
    sync()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = decoder.generate(prompt_ids, scale.rollout_new_tokens, temperature=1.0)
    sync()
    seconds = time.perf_counter() - t0
    made = _count_new_tokens(batch)
    del decoder
    out: dict[str, Any] = {"tokens_per_s": round(made / seconds, 1), "seconds": round(seconds, 3), "new_tokens": made,
           "setup_and_warmup_s": round(warmup_s, 3)}
    own = getattr(batch, "seconds", None)
    if isinstance(own, (int, float)) and own > 0:
        out["engine_reported_tokens_per_s"] = round(made / own, 1)
    if made != rows * scale.rollout_new_tokens:
        out["note"] = f"{made} tokens made, {rows * scale.rollout_new_tokens} asked: some rows stopped early"
    return out


def _count_new_tokens(batch: Any) -> int:
    new = getattr(batch, "new_tokens", None)
    if new is None:
        return int(sum(len(c) for c in batch.completion_ids))
    if isinstance(new, int):
        return new
    return int(sum(int(n) for n in new))  # per-row counts (a list or a tensor)


def section_rollout(scale: Scale, budget: Budget, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    budget.check("rollout")
    reset_peak()
    model = build_model(SMALL, scale).eval()
    device = next(model.parameters()).device
    result: dict[str, Any] = {"model": SMALL, "prompt_len": scale.rollout_prompt_len, "new_tokens": scale.rollout_new_tokens,
                              "bare_kind": "model.generate(do_sample=True), no EOS", "engine_kind": "training.engine.rollout.StaticDecoder"}
    try:
        for rows in scale.rollout_batches:
            prompts = random_ids(rows, scale.rollout_prompt_len, model.config.vocab_size, seed=4 + rows).to(device)
            say(f"rollout {rows} x {scale.rollout_new_tokens}: engine")
            engine = guarded(f"rollout {rows} engine", budget, rollout_engine, model, prompts, scale)
            say(f"rollout {rows} x {scale.rollout_new_tokens}: engine {engine.get('tokens_per_s')} tokens/s; generate")
            bare = guarded(f"rollout {rows} generate", budget, rollout_bare, model, prompts, scale)
            say(f"rollout {rows} x {scale.rollout_new_tokens}: generate {bare.get('tokens_per_s')} tokens/s")
            result[str(rows)] = {"rows": rows, "engine": engine, "bare": bare, "ratio": ratio(engine, bare)}
            save(result)
    finally:
        del model
        free_memory()
    return result


# ---- the report -----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    from training.engine import perf

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    for pkg in ("trl", "datasets", "peft", "liger_kernel"):
        try:
            info[pkg] = importlib.metadata.version(pkg.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:  # absent is an answer
            info[pkg] = None
    peak = perf.device_peak()
    info["peak_tflops"] = peak.tflops if peak else None
    info["peak_tb_per_s"] = peak.tb_per_s if peak else None
    return info


def largest_peak(node: Any, current: float | None) -> float | None:
    """The section's peak: the largest of its measurements' peaks (each reset its counter) and the counter now."""
    found = [current] if current is not None else []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            value = item.get("peak_gpu_gb")
            if isinstance(value, (int, float)):
                found.append(float(value))
            stack.extend(v for v in item.values() if isinstance(v, dict))
    return max(found) if found else None


def _dig(result: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def targets(sections: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, path, target in TARGETS:
        value = _dig(sections, path)
        out.append({"name": name, "value": value, "target": target, "met": None if value is None else value >= target,
                    "why": ""})  # "why": for the human who reads the device run
    return out


def run(scale: Scale, only: list[str], budget: Budget, engine_config: dict[str, Any], notes: list[str],
        sft_models: list[str] = [SMALL, LARGE]) -> dict[str, Any]:  # noqa: B006 - read, never changed
    result: dict[str, Any] = {"bench": "engine_gpu", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "mode": "smoke" if scale.smoke else "full", "machine": machine_info(), "sections": {},
                              "targets": [], "notes": notes, "budget_s": budget.seconds}
    for name in SECTIONS:
        if name not in only:
            continue
        say(f"section {name}")
        started = time.monotonic()
        reset_peak()

        def save(partial: dict[str, Any], name: str = name) -> None:
            # What a section has so far reaches $OUT at once: a run killed by its limit keeps it.
            result["sections"][name] = {**partial, "partial": True}
            result["elapsed_s"] = round(budget.used, 1)
            write_out(result)

        try:
            if name == "sft":
                section = section_sft(scale, budget, engine_config, save, sft_models)
            elif name == "capture":
                section = section_capture(scale, budget, bool(engine_config.get("use_liger")))
            elif name == "fp8":
                section = section_fp8(scale, budget, engine_config, result["sections"].get("sft") or {})
            else:
                section = section_rollout(scale, budget, save)
        except BudgetSpent as exc:
            section = {"error": str(exc), "skipped": True}
            _SKIPPED.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - record it, run the next section
            say(f"section {name} failed:\n{traceback.format_exc()}")
            section = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        notes.extend(_SKIPPED)
        _SKIPPED.clear()
        section["section_s"] = round(time.monotonic() - started, 2)
        section["peak_gpu_gb"] = largest_peak(section, peak_gb())
        result["sections"][name] = section
        free_memory()
        result["targets"] = targets(result["sections"])
        result["elapsed_s"] = round(budget.used, 1)
        write_out(result)
    return result


def write_out(result: dict[str, Any]) -> None:
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "engine_gpu.json").write_text(json.dumps(result, indent=2))


def main(argv: list[str] | None = None) -> int:
    global _ON_GPU
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ",".join(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="skip what is left after this many seconds")
    parser.add_argument("--sft-models", default=f"{SMALL},{LARGE}", help=f"the SFT section's shapes: {SMALL}, {LARGE} or both")
    parser.add_argument("--engine-config", default="{}", help='extra engine config keys for the SFT run, as JSON (e.g. {"use_liger": true})')
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    try:
        engine_config = json.loads(args.engine_config)
        if not isinstance(engine_config, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        parser.error(f"--engine-config: expected a JSON object ({exc})")
    sft_models = [m.strip() for m in args.sft_models.split(",") if m.strip()]
    if not sft_models or set(sft_models) - {SMALL, LARGE}:
        parser.error(f"--sft-models: choose from {SMALL}, {LARGE}")
    notes: list[str] = []
    real_stdout = sys.stdout
    # Libraries print; the one JSON object must be all that stdout carries.
    with contextlib.redirect_stdout(sys.stderr):
        import torch

        smoke = args.smoke or not torch.cuda.is_available()
        _ON_GPU = not smoke
        if not args.smoke and smoke:
            notes.append("no CUDA device: ran the smoke shapes on the CPU")
        if smoke:
            # Tiny matmuls gain nothing from threads, and a shared CI machine loses a lot to oversubscription.
            torch.set_num_threads(1)
        result = run(SMOKE if smoke else FULL, only, Budget(args.budget_s), engine_config, notes, sft_models)
    real_stdout.write(json.dumps(result, indent=2) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
