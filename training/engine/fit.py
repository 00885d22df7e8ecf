"""Will this run fit in GPU memory? A readable model of training memory, shared by the web process
(the fit check before START, a 422 naming the lever) and the engine (gradient checkpointing only
when memory needs it; the lever in an `oom` error).

Pure Python: no torch and no Django at module level, so both sides import it. The two helpers at the
bottom that read a live model config or the visible GPU import transformers / torch lazily and are
only called inside the engine.

The model of memory, per GPU, in bytes (each term is a field of `Estimate.parts`):

- weights: parameters × bytes per parameter of what the engine loads: bf16 2, fp32 4; a 4-bit
  (QLoRA) base keeps its linear layers in NF4 (≈ 0.5 B + ≈ 0.02 B of double-quantised scales) and
  its embeddings and output head in bf16. An fp8 run keeps its weights in bf16 and casts them per
  matmul (fp8.py), so it is counted at 2 B, and its activations as bf16 ones although the converted
  layers keep their inputs in 1 B (an over-estimate on the safe side); nvfp4 is counted at 2 B too.
- gradients and optimizer: every trainable parameter has a gradient and AdamW's two moments, in the
  dtype of the parameter. The engine loads the policy in bf16 and the Trainer keeps it there (no fp32
  master copy), so a full fine-tune costs 2 + 2 + 4 = 8 B per parameter (16 B in fp32). A LoRA
  adapter (PEFT keeps it in fp32) costs 4 + 4 + 8 = 16 B per adapter parameter, and the adapter has
  rank × (in + out) parameters on each of the 7 projections of every layer.
- activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", §4.1: the tensors each layer keeps for its backward pass, per token. Adapted to today's
  decoders: RMSNorm, grouped-query attention, a gated (SwiGLU) MLP, no dropout, and a fused
  (flash / memory-efficient SDPA) attention kernel that keeps no s × s score matrix. Per layer and
  token that is 4·h (two norm inputs, two projection inputs) + 2·heads·head_dim (q and the attention
  output) + 2·kv_heads·head_dim (k and v) + 4·I (gate, up, act(gate), act(gate)·up) elements. With
  activation checkpointing a layer keeps only its input (h elements, Korthikanti's "full
  recomputation"), plus one layer's full set while it is recomputed. Gradient accumulation runs its
  micro-batches one after another, so it adds nothing to the peak.
- logits: batch × sequence × vocabulary (batch in rows: a DPO pair is two), as the model's bf16
  output (2 B), its fp32 upcast for the loss (4 B) and that upcast's gradient (4 B); GRPO keeps only the completion's logits and takes
  log-probs row by row, so it holds the bf16 logits and their gradient (4 B). Liger's fused linear cross-entropy (use_liger, GPU
  only) never materialises them, so it drops the term for the methods whose TRL trainer uses it.
- reference: a frozen copy of the weights where the method scores against one and no adapter can be
  switched off to get it: DPO without LoRA (unless reference_free), GRPO with kl_coef > 0 without LoRA.
- kv_cache: GRPO's rollouts: rollouts × (prompt + response) × layers × 2 (k, v) × kv_heads ×
  head_dim × 2 B. Generation and the training step take turns, so the peak is the larger of the two
  on top of what stays resident (weights, optimizer, reference).
- capture: DISTILL runs the teacher alone first (capture) and trains the student after; the peak is
  the larger of the two phases. Capture holds the teacher's weights and one sequence's logits.
- overhead: the CUDA context, cuBLAS workspaces and allocator slack: a fixed 1.5 GiB.

Per GPU means per replica: the engine runs one process that holds the whole model (capture does not
shard the teacher either), so more GPUs of the same kind do not lower these figures.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

GIB = 2**30
OVERHEAD_BYTES = int(1.5 * GIB)
# DISTILL capture's working set (capture.py uses these): a batch of tokens through the teacher, the head in chunks.
CAPTURE_BATCH_TOKENS = 16384
CAPTURE_CHUNK_TOKENS = 4096
# A run "fits" under this share of the card: the allocator fragments, and the estimate is an estimate.
FIT_SHARE = 0.90
# The engine's "auto" checkpointing turns on a little earlier than the refusal line: cheaper than an OOM.
CHECKPOINT_SHARE = 0.85
NF4_BYTES = 0.5 + 0.02  # 4-bit weights plus double-quantised absmax scales (one per 64 weights)
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2, "nvfp4": 2}  # see the docstring for fp8 / nvfp4
DEFAULT_LORA_RANK = 16
# Where a config.json states how many positions the model can attend over (GPT-2 and Falcon name it differently).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
DEFAULT_MAX_LENGTH = 1024  # SFT, DPO and DISTILL's max_length when the run sets none
DEFAULT_PROMPT_LENGTH = 512  # GRPO prompts: their length is not known before START; max_prompt_length overrides
LIGER_METHODS = ("sft", "dpo", "grpo")  # TRL trainers that use Liger's fused linear losses


# ---- model shapes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read from a Hugging Face config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    gated: bool = True  # SwiGLU-style MLP (gate, up, down); GPT-2 / NeoX have two matrices
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0  # MoE: routed experts per layer (0 = dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # MoE: a shared expert's intermediate size (Qwen2-MoE)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> ModelShape | None:
        """None when the config lacks the numbers (an unknown architecture is not estimated)."""
        if not isinstance(cfg, Mapping):
            return None
        cfg = cfg.get("text_config") or cfg
        h, layers, vocab = cfg.get("hidden_size"), cfg.get("num_hidden_layers"), cfg.get("vocab_size")
        if not (isinstance(h, int) and isinstance(layers, int) and isinstance(vocab, int) and min(h, layers, vocab) > 0):
            return None
        heads = _int(cfg.get("num_attention_heads")) or max(1, h // 64)
        kv_heads = _int(cfg.get("num_key_value_heads")) or heads
        head_dim = _int(cfg.get("head_dim")) or h // heads
        intermediate = _int(cfg.get("intermediate_size")) or 4 * h
        model_type = str(cfg.get("model_type") or "")
        experts = _int(cfg.get("num_experts")) or _int(cfg.get("num_local_experts")) or _int(cfg.get("n_routed_experts"))
        return cls(
            hidden=h, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
            vocab=vocab, tied=bool(cfg.get("tie_word_embeddings", False)),
            gated=model_type not in ("gpt2", "gpt_neox", "opt", "gpt_bigcode"),
            qkv_bias=bool(cfg.get("attention_bias")) or model_type in ("qwen2", "qwen2_moe"),
            qk_norm=model_type.startswith("qwen3"),
            experts=experts,
            experts_per_token=_int(cfg.get("num_experts_per_tok")) or (2 if experts else 0),
            expert_intermediate=_int(cfg.get("moe_intermediate_size")) or (intermediate if experts else 0),
            shared_intermediate=_int(cfg.get("shared_expert_intermediate_size")),
        )

    # -- parameter counts (the same arithmetic as the modules' in × out) --

    @property
    def attn_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def _mlp(self, intermediate: int) -> int:
        return (3 if self.gated else 2) * self.hidden * intermediate

    @property
    def layer_linear_params(self) -> int:
        """The weights of one layer's linear layers: what LoRA targets and what 4-bit quantises."""
        h = self.hidden
        attention = 2 * h * self.attn_dim + 2 * h * self.kv_dim
        if not self.experts:
            return attention + self._mlp(self.intermediate)
        mlp = self.experts * self._mlp(self.expert_intermediate) + h * self.experts  # experts + router
        if self.shared_intermediate:
            mlp += self._mlp(self.shared_intermediate) + h  # the shared expert and its gate
        return attention + mlp

    @property
    def embedding_params(self) -> int:
        """Input embeddings plus the output head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        per_layer = self.layer_linear_params + 2 * self.hidden  # + the two RMSNorms
        if self.qkv_bias:
            per_layer += self.attn_dim + 2 * self.kv_dim
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        return self.layers * per_layer + self.embedding_params + self.hidden  # + the final norm

    def lora_params(self, rank: int) -> int:
        """rank × (in + out) over q, k, v, o, gate, up, down of every layer (every expert's, on MoE)."""
        h = self.hidden
        attention = (h + self.attn_dim) * 2 + (h + self.kv_dim) * 2
        mlp_one = lambda i: (3 if self.gated else 2) * (h + i)  # noqa: E731 - a formula, named once
        if self.experts:
            mlp = self.experts * mlp_one(self.expert_intermediate) + (mlp_one(self.shared_intermediate) if self.shared_intermediate else 0)
        else:
            mlp = mlp_one(self.intermediate)
        return rank * self.layers * (attention + mlp)

    @property
    def mlp_width(self) -> int:
        """Intermediate activations one token carries through the MLP (the routed experts on MoE)."""
        if not self.experts:
            return self.intermediate
        return self.experts_per_token * self.expert_intermediate + self.shared_intermediate

    def activation_elements_per_token_layer(self) -> int:
        """Korthikanti §4.1 adapted (see the module docstring): elements kept per token per layer."""
        return 4 * self.hidden + 2 * self.attn_dim + 2 * self.kv_dim + 4 * self.mlp_width


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _cfg(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool, model_type: str, head_dim: int | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
                           "intermediate_size": inter, "vocab_size": vocab, "tie_word_embeddings": tied, "model_type": model_type}
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


# Well-known bases, copied from their config.json on the Hugging Face hub: the web process cannot
# download anything, and these are what most runs name. Instruct / chat variants share the shape.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen/qwen2.5-0.5b": _cfg(896, 24, 14, 2, 4864, 151936, True, "qwen2"),
    "qwen/qwen2.5-1.5b": _cfg(1536, 28, 12, 2, 8960, 151936, True, "qwen2"),
    "qwen/qwen2.5-3b": _cfg(2048, 36, 16, 2, 11008, 151936, True, "qwen2"),
    "qwen/qwen2.5-7b": _cfg(3584, 28, 28, 4, 18944, 152064, False, "qwen2"),
    "qwen/qwen2.5-14b": _cfg(5120, 48, 40, 8, 13824, 152064, False, "qwen2"),
    "qwen/qwen2.5-32b": _cfg(5120, 64, 40, 8, 27648, 152064, False, "qwen2"),
    "qwen/qwen2.5-72b": _cfg(8192, 80, 64, 8, 29568, 152064, False, "qwen2"),
    "qwen/qwen3-0.6b": _cfg(1024, 28, 16, 8, 3072, 151936, True, "qwen3", 128),
    "qwen/qwen3-1.7b": _cfg(2048, 28, 16, 8, 6144, 151936, True, "qwen3", 128),
    "qwen/qwen3-4b": _cfg(2560, 36, 32, 8, 9728, 151936, True, "qwen3", 128),
    "qwen/qwen3-8b": _cfg(4096, 36, 32, 8, 12288, 151936, False, "qwen3", 128),
    "qwen/qwen3-14b": _cfg(5120, 40, 40, 8, 17408, 151936, False, "qwen3", 128),
    "qwen/qwen3-32b": _cfg(5120, 64, 64, 8, 25600, 151936, False, "qwen3", 128),
    "meta-llama/llama-3.2-1b": _cfg(2048, 16, 32, 8, 8192, 128256, True, "llama", 64),
    "meta-llama/llama-3.2-3b": _cfg(3072, 28, 24, 8, 8192, 128256, True, "llama", 128),
    "meta-llama/llama-3.1-8b": _cfg(4096, 32, 32, 8, 14336, 128256, False, "llama"),
    "meta-llama/llama-3.1-70b": _cfg(8192, 80, 64, 8, 28672, 128256, False, "llama"),
    "mistralai/mistral-7b-v0.3": _cfg(4096, 32, 32, 8, 14336, 32768, False, "mistral"),
    "google/gemma-2-2b": _cfg(2304, 26, 8, 4, 9216, 256000, True, "gemma2", 256),
    "google/gemma-2-9b": _cfg(3584, 42, 16, 8, 14336, 256000, True, "gemma2", 256),
}
_VARIANT = re.compile(r"-(instruct|chat|it|base)$")


def known_config(model_id: str | None) -> dict[str, Any] | None:
    """The config of a well-known HF id (any case, instruct / -it / -Base variants included)."""
    if not isinstance(model_id, str):
        return None
    key = model_id.strip().lower()
    key = key.replace("meta-llama/meta-llama-3.1-", "meta-llama/llama-3.1-")
    return KNOWN_CONFIGS.get(key) or KNOWN_CONFIGS.get(_VARIANT.sub("", key))


# ---- the estimate -------------------------------------------------------------------------------

PART_LABELS = {
    "weights": "weights", "gradients": "gradients", "optimizer": "optimizer", "activations": "activations",
    "logits": "logits", "reference": "reference model", "kv_cache": "rollout KV cache", "overhead": "CUDA overhead",
}


@dataclass(frozen=True)
class Estimate:
    """Peak bytes per GPU, with the breakdown of the phase that sets the peak."""

    parts: dict[str, int]
    phase: str = "train"  # "train", "rollouts" (GRPO generation) or "capture" (DISTILL's teacher)
    checkpointing: bool = False
    other: Estimate | None = None  # the other phase (DISTILL's train when capture is the peak, and so on)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def gib(self) -> float:
        return self.total / GIB

    def describe(self) -> str:
        """"about 31.4 GiB per GPU (weights 3.1, optimizer 12.4, ...)": the parts over 0.05 GiB."""
        shown = ", ".join(f"{PART_LABELS.get(k, k)} {v / GIB:.1f}" for k, v in self.parts.items() if v >= 0.05 * GIB and k != "overhead")
        during = {"capture": " during capture (the teacher alone)", "rollouts": " while generating rollouts"}.get(self.phase, "")
        return f"about {self.gib:.1f} GiB per GPU{during} ({shown})"


def _weights(shape: ModelShape, precision: str, four_bit: bool) -> int:
    per = WEIGHT_BYTES.get(precision, 2)
    if four_bit:
        linear = shape.layers * shape.layer_linear_params  # quantised; embeddings, head and norms are not
        return int(linear * NF4_BYTES + (shape.params - linear) * per)
    return shape.params * per


def _activations(shape: ModelShape, tokens: int, act_bytes: int, checkpointing: bool) -> int:
    per_layer = shape.activation_elements_per_token_layer()
    if checkpointing:
        # Each layer keeps its input; the layer being recomputed holds its full set for a moment.
        elements = shape.layers * shape.hidden + per_layer
    else:
        elements = shape.layers * per_layer
    elements += 2 * shape.hidden  # the final norm's input and the head's input
    return tokens * elements * act_bytes


def _logits(shape: ModelShape, tokens: int, precision: str, method: str) -> int:
    if method == "grpo":
        # TRL's GRPO takes log-probs row by row (selective_log_softmax) instead of upcasting the whole
        # tensor: the logits and their gradient, in the model's dtype.
        per = 8 if precision == "fp32" else 4
    else:
        per = 4 + 4 if precision == "fp32" else 2 + 4 + 4
    return tokens * shape.vocab * per


def estimate(
    shape: ModelShape,
    *,
    method: str = "sft",
    adapter: str = "full",
    precision: str = "bf16",
    batch: int = 1,
    seq_len: int = 1024,
    grad_accum: int = 1,
    lora_rank: int = DEFAULT_LORA_RANK,
    rollouts: int = 8,
    prompt_length: int = DEFAULT_PROMPT_LENGTH,
    max_response_length: int = 2048,
    kl_coef: float = 0.0,
    reference_free: bool = False,
    teacher_shape: ModelShape | None = None,
    liger: bool = False,
    checkpointing: bool = True,
) -> Estimate:
    """Peak GPU memory of one training process. `batch` is per_device_train_batch_size, in rows (a DPO
    pair is two; GRPO trains on one group of `rollouts` at a time and ignores it); `seq_len` is
    max_length (GRPO: prompt_length + max_response_length). `grad_accum` is accepted for completeness:
    micro-batches run one after the other and do not raise the peak."""
    del grad_accum  # see the docstring
    precision = precision if precision in WEIGHT_BYTES else "bf16"
    act_bytes = 4 if precision == "fp32" else 2
    param_bytes = WEIGHT_BYTES[precision]
    lora = adapter in ("lora", "qlora")
    weights = _weights(shape, precision, adapter == "qlora")
    if lora:
        trainable = shape.lora_params(lora_rank)
        gradients, optimizer = trainable * 4, trainable * 8  # PEFT keeps adapters in fp32
        weights += trainable * 4
    else:
        gradients, optimizer = shape.params * param_bytes, shape.params * 2 * param_bytes
    reference = 0
    if method == "dpo" and not lora and not reference_free:
        reference = shape.params * param_bytes
    if method == "grpo" and kl_coef > 0 and not lora:
        reference = shape.params * param_bytes
    resident = {"weights": weights, "gradients": gradients, "optimizer": optimizer, "reference": reference, "overhead": OVERHEAD_BYTES}

    if method == "grpo":
        group, seq = max(rollouts, 1), prompt_length + max_response_length
        train_tokens = group * seq
        logit_tokens = group * max_response_length  # TRL keeps only the completion's logits
    else:
        # DPO's batch already counts rows (seed 001: 2 per pair; the engine hands TRL batch // 2 pairs,
        # whose chosen and rejected rows share one forward), so every method holds `batch` sequences.
        train_tokens = logit_tokens = batch * seq_len
    logits = 0 if liger and method in LIGER_METHODS else _logits(shape, logit_tokens, precision, method)
    train = Estimate(
        {**resident, "activations": _activations(shape, train_tokens, act_bytes, checkpointing), "logits": logits},
        "train", checkpointing,
    )
    phases = [train]
    if method == "grpo":
        kv = group * seq * shape.layers * 2 * shape.kv_dim * act_bytes
        step_logits = group * shape.vocab * 4  # one decode step's logits, upcast for sampling
        phases.append(Estimate({**resident, "kv_cache": kv, "logits": step_logits}, "rollouts", checkpointing))
    if method == "distill" and teacher_shape is not None:
        # capture.py batches sequences up to CAPTURE_BATCH_TOKENS (one longer sequence goes alone) and runs
        # the output head over CAPTURE_CHUNK_TOKENS positions at a time, so the full logits never exist.
        batch_tokens = max(seq_len, CAPTURE_BATCH_TOKENS)
        capture_parts = {
            "weights": teacher_shape.params * param_bytes,
            # no_grad: one layer's activations at a time, plus the final hidden states the head reads.
            "activations": batch_tokens * (teacher_shape.activation_elements_per_token_layer() + teacher_shape.hidden) * act_bytes,
            # one chunk of logits (model dtype) and its fp32 log-softmax
            "logits": min(batch_tokens, CAPTURE_CHUNK_TOKENS) * teacher_shape.vocab * (act_bytes + 4),
            "overhead": OVERHEAD_BYTES,
        }
        phases.append(Estimate(capture_parts, "capture", False))
    peak = max(phases, key=lambda e: e.total)
    rest = [p for p in phases if p is not peak]
    return replace(peak, other=rest[0] if rest else None)


# ---- a run's config → the estimate, the verdict and the lever ----------------------------------

def adapter_of(config: Mapping[str, Any]) -> str:
    if not (config.get("lora") or config.get("lora_rank") is not None):
        return "full"
    return "qlora" if config.get("load_in_4bit") else "lora"


def _num(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


def estimate_run(shape: ModelShape, method: str, config: Mapping[str, Any], *, teacher_shape: ModelShape | None = None,
                 checkpointing: bool = True, on_gpu: bool = True) -> Estimate:
    """The estimate for a run's config, with the engine's defaults for what is unset."""
    loss = config.get("loss")
    if not isinstance(loss, Mapping):
        loss = {}
    return estimate(
        shape,
        method=method,
        adapter=adapter_of(config),
        precision=str(config.get("precision") or "bf16").lower(),
        batch=int(_num(config, "per_device_train_batch_size", 1)),
        seq_len=int(_num(config, "max_length", 1024)),
        grad_accum=int(_num(config, "gradient_accumulation_steps", 1)),
        lora_rank=int(_num(config, "lora_rank", DEFAULT_LORA_RANK)),
        rollouts=int(_num(config, "rollouts_per_prompt", 8)),
        prompt_length=int(_num(config, "max_prompt_length", DEFAULT_PROMPT_LENGTH)),
        max_response_length=int(_num(config, "max_response_length", 2048)),
        kl_coef=float(config.get("kl_coef") or 0.0) if isinstance(config.get("kl_coef"), (int, float)) else 0.0,
        reference_free=bool(loss.get("reference_free")),
        teacher_shape=teacher_shape,
        liger=bool(config.get("use_liger")) and on_gpu,
        checkpointing=checkpointing,
    )


@dataclass(frozen=True)
class Lever:
    field: str
    advice: str  # what to do, as a clause: 'train a LoRA adapter (set lora_rank: 16)'
    fits: bool  # does this change alone bring the run under the line?


@dataclass(frozen=True)
class Verdict:
    """`fits` (nothing to say), `needs_checkpointing` (fits only with it: the engine turns it on) or
    `too_big` (refused, with `message` on `field`)."""

    status: str
    without_checkpointing: Estimate
    with_checkpointing: Estimate
    card_bytes: int
    field: str | None = None
    message: str | None = None
    levers: tuple[Lever, ...] = ()


def _halve_until(fits: Any, start: int, floor: int) -> int | None:
    """The largest of start/2, start/4, ... (not below floor) for which fits(value) holds."""
    value = start // 2
    while value >= floor:
        if fits(value):
            return value
        value //= 2
    return None


def levers(shape: ModelShape, method: str, config: Mapping[str, Any], *, card_bytes: int | None, teacher_shape: ModelShape | None = None,
           cards: Mapping[str, int] | None = None, on_gpu: bool = True) -> list[Lever]:
    """What the user can change, best first: the lever that attacks the biggest part of the estimate
    comes first, and among those the first that makes the run fit alone. `cards` (GPU type → GiB)
    lets the last lever name the smallest card that fits."""
    config = dict(config)
    limit = card_bytes * FIT_SHARE if card_bytes else None

    def fits(patch: Mapping[str, Any], teacher: ModelShape | None = teacher_shape) -> bool:
        if limit is None:
            return False
        return estimate_run(shape, method, {**config, **patch}, teacher_shape=teacher, on_gpu=on_gpu).total <= limit

    current = estimate_run(shape, method, config, teacher_shape=teacher_shape, on_gpu=on_gpu)
    found: list[Lever] = []
    if current.phase == "capture" and teacher_shape is not None:
        found.append(Lever("config.distillation.teacher_model", "pick a smaller teacher (capture loads the whole teacher onto one card and does not shard it)", False))
    else:
        adapter = adapter_of(config)
        adapters: list[Lever] = []
        rank = int(_num(config, "lora_rank", DEFAULT_LORA_RANK))
        if adapter == "full":
            adapters.append(Lever("config.lora_rank", f"train a LoRA adapter (set lora_rank: {rank})", fits({"lora_rank": rank})))
        if adapter != "qlora":
            adapters.append(Lever("config.load_in_4bit", "load the base in 4 bits with an adapter (QLoRA: load_in_4bit: true with lora_rank)",
                                  fits({"lora_rank": rank, "load_in_4bit": True})))
        lengths: list[Lever] = []
        if method == "grpo":
            response = int(_num(config, "max_response_length", 2048))
            best = _halve_until(lambda v: fits({"max_response_length": v}), response, 64)
            lengths.append(Lever("config.max_response_length", f"shrink max_response_length (now {response}" + (f"; {best} fits)" if best else ")"), best is not None))
            group = int(_num(config, "rollouts_per_prompt", 8))
            best = _halve_until(lambda v: fits({"rollouts_per_prompt": v}), group, 2)
            lengths.append(Lever("config.rollouts_per_prompt", f"fewer rollouts_per_prompt (now {group}" + (f"; {best} fits)" if best else ")"), best is not None))
        else:
            length = int(_num(config, "max_length", 1024))
            best = _halve_until(lambda v: fits({"max_length": v}), length, 128)
            lengths.append(Lever("config.max_length", f"shrink max_length (now {length}" + (f"; {best} fits)" if best else ")"), best is not None))
            batch = int(_num(config, "per_device_train_batch_size", 1))
            if batch > 1:
                # DPO halves pairs, so every batch it tries is even (START refuses an odd one).
                unit = 2 if method == "dpo" else 1
                best = _halve_until(lambda v: fits({"per_device_train_batch_size": v * unit}), batch // unit, 1)
                lengths.append(Lever("config.per_device_train_batch_size",
                                     f"lower per_device_train_batch_size (now {batch}; raise gradient_accumulation_steps to keep the effective batch)", best is not None))
        parts = current.parts
        resident = parts.get("weights", 0) + parts.get("gradients", 0) + parts.get("optimizer", 0) + parts.get("reference", 0)
        transient = parts.get("activations", 0) + parts.get("logits", 0) + parts.get("kv_cache", 0)
        found += adapters + lengths if resident >= transient else lengths + adapters
    bigger = _bigger_card(cards or {}, lambda gib: _fits_card(shape, method, config, teacher_shape, gib, on_gpu))
    found.append(Lever("compute.accelerators", f'pick a GPU with more memory (compute.accelerators: "{bigger}")' if bigger else "pick a GPU with more memory", bigger is not None))
    if current.phase != "capture":
        found.append(Lever("base_model", "drop to a smaller base", False))
    if current.phase == "capture":
        return found  # the teacher is the problem: it leads even when only a bigger card would do
    # The lever that fits alone leads; otherwise keep the order (biggest part first).
    return sorted(found, key=lambda lever: not lever.fits)


def _fits_card(shape: ModelShape, method: str, config: Mapping[str, Any], teacher: ModelShape | None, gib: float, on_gpu: bool) -> bool:
    return estimate_run(shape, method, config, teacher_shape=teacher, on_gpu=on_gpu).total <= gib * GIB * FIT_SHARE


def _bigger_card(cards: Mapping[str, int], fits_gib: Any) -> str | None:
    for gib, name in sorted((gib, name) for name, gib in cards.items()):
        if fits_gib(gib):
            return name
    return None


def check(shape: ModelShape, method: str, config: Mapping[str, Any], *, card_gib: float, gpu_label: str,
          teacher_shape: ModelShape | None = None, cards: Mapping[str, int] | None = None) -> Verdict:
    """The fit check before START, for one card of `card_gib` GiB."""
    card = int(card_gib * GIB)
    without = estimate_run(shape, method, config, teacher_shape=teacher_shape, checkpointing=False)
    with_ckpt = estimate_run(shape, method, config, teacher_shape=teacher_shape, checkpointing=True)
    if without.total <= card * FIT_SHARE:
        return Verdict("fits", without, with_ckpt, card)
    if with_ckpt.total <= card * FIT_SHARE and config.get("gradient_checkpointing") is not False:
        return Verdict("needs_checkpointing", without, with_ckpt, card)
    # gradient_checkpointing: false forces it off, so the figure the user gets is the one without it.
    shown = without if config.get("gradient_checkpointing") is False else with_ckpt
    found = levers(shape, method, config, card_bytes=card, teacher_shape=teacher_shape, cards=cards)
    if config.get("gradient_checkpointing") is False and with_ckpt.total <= card * FIT_SHARE:
        found.insert(0, Lever("config.gradient_checkpointing", 'turn activation checkpointing back on (gradient_checkpointing: "auto")', True))
    message = f"this run needs {shown.describe()} and {_article(gpu_label)} {gpu_label} has {card_gib:g} GiB: {advice_text(found)}"
    return Verdict("too_big", without, with_ckpt, card, found[0].field, message, tuple(found))


def advice_text(found: list[Lever]) -> str:
    clauses = [lever.advice for lever in found]
    if len(clauses) == 1:
        return clauses[0]
    return ", ".join(clauses[:-1]) + ", or " + clauses[-1]


def _article(word: str) -> str:
    # "an L4", "an H100", "an A100", "a T4": by the letter's sound, not its spelling.
    return "an" if word[:1].upper() in "AEFHILMNORSX" else "a"


def oom_advice(method: str, config: Mapping[str, Any], shape: ModelShape | None, *, card_bytes: int | None, gpu_name: str | None,
               checkpointing: bool = True, cards: Mapping[str, int] | None = None) -> str:
    """The sentence an `oom` error ends with: the estimate (when the shape is known) and the levers,
    the same text as the fit check's. `checkpointing`: whether the run had it on; when it did not,
    turning it on is the first lever."""
    first = [] if checkpointing else [Lever("config.gradient_checkpointing", "turn on activation checkpointing (gradient_checkpointing: true)", False)]
    if shape is None:
        lever_list = [
            Lever("config.lora_rank", "train a LoRA adapter (set lora_rank)", False) if adapter_of(config) == "full" else None,
            Lever("config.load_in_4bit", "load_in_4bit with lora_rank (QLoRA)", False) if adapter_of(config) != "qlora" else None,
            Lever("config.max_response_length" if method == "grpo" else "config.max_length",
                  "shrink max_response_length or rollouts_per_prompt" if method == "grpo" else "shrink max_length / per_device_train_batch_size", False),
            Lever("compute.accelerators", "pick a GPU with more memory", False),
            Lever("base_model", "drop to a smaller base", False),
        ]
        return advice_text(first + [lever for lever in lever_list if lever is not None])
    found = first + levers(shape, method, config, card_bytes=card_bytes, cards=cards)
    est = estimate_run(shape, method, config, checkpointing=checkpointing)
    where = f" and {_article(gpu_name)} {gpu_name} has {card_bytes / GIB:.0f} GiB" if gpu_name and card_bytes else ""
    return f"the fit estimate is {est.describe()}{where}: {advice_text(found)}"


# ---- the engine side (lazy imports: never called in the web process) ---------------------------

def shape_of_model(ref: str, revision: str | None = None) -> ModelShape | None:
    """The shape from the model's config.json as the engine will load it (a path, an HF id served by
    the Studio's hub, a repo@ref), else from the table of well-known ids; None when neither works."""
    try:
        from transformers import AutoConfig

        from .modeling import _split_ref  # the loader's own reading of repo@ref, so the estimate sees what loads

        name, rev = _split_ref(ref, revision)
        shape = ModelShape.from_config(AutoConfig.from_pretrained(name, revision=rev).to_dict())
        if shape is not None:
            return shape
    except Exception as exc:  # noqa: BLE001 - no estimate is better than a failed run
        log.info("fit: could not read %s's config (%s)", ref, exc)
    return ModelShape.from_config(known_config(ref))


def max_length(spec: Any, say: Callable[[str], None]) -> int:
    """The run's config.max_length, else DEFAULT_MAX_LENGTH capped at the positions the model learned:
    a GPT-2 with n_positions 256 failed its first long batch (IndexError in its position table) on a
    default the user never set. A max_length the user set is START's to refuse (training/validation.py)."""
    if spec.cfg("max_length") is not None:
        return int(spec.cfg("max_length"))
    try:
        from transformers import AutoConfig

        from .modeling import _split_ref

        name, rev = _split_ref(spec.base_model, spec.base_model_revision)
        config = AutoConfig.from_pretrained(name, revision=rev).to_dict()
    except Exception as exc:  # noqa: BLE001 - the loader that follows says what is wrong with the model
        log.info("max_length: could not read %s's config (%s)", spec.base_model, exc)
        return DEFAULT_MAX_LENGTH
    limit = next((int(config[k]) for k in CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0), None)
    if limit is None or limit >= DEFAULT_MAX_LENGTH:
        return DEFAULT_MAX_LENGTH
    say(f"max_length: {spec.base_model} attends over {limit} positions, fewer than the default max_length {DEFAULT_MAX_LENGTH}: "
        f"rows are cut at {limit} tokens (set config.max_length to choose another length up to {limit})")
    return limit


def visible_gpu() -> tuple[str, int] | None:
    """(name, total bytes) of the first visible CUDA device; None on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.name, int(props.total_memory)


def auto_checkpointing(without: Estimate, card_bytes: int) -> bool:
    """The "auto" rule, one copy for the engine and the Studio's estimate: checkpointing goes on when
    the estimate without it is over CHECKPOINT_SHARE of the card."""
    return without.total > CHECKPOINT_SHARE * card_bytes


def decide_checkpointing(method: str, config: Mapping[str, Any], base_model: str, revision: str | None, device_kind: str) -> tuple[bool, str]:
    """config.gradient_checkpointing: true / false force it; "auto" (the default) turns it on only when
    the estimate without it is over CHECKPOINT_SHARE of the visible GPU. Always off on the CPU, where
    it would only cost time. Returns (on, the log line that says why, with the figures)."""
    wanted = config.get("gradient_checkpointing", "auto")
    if device_kind != "cuda":
        forced = " (config.gradient_checkpointing: true applies to GPU runs)" if wanted is True else ""
        return False, f"gradient checkpointing: off on the CPU{forced}"
    if isinstance(wanted, bool):
        return wanted, f"gradient checkpointing: {'on' if wanted else 'off'} (config.gradient_checkpointing: {str(wanted).lower()})"
    gpu, shape = visible_gpu(), shape_of_model(base_model, revision)
    if gpu is None or shape is None:
        # Without figures the safe side is the old default: memory over speed.
        return True, "gradient checkpointing: on (auto; the model's memory could not be estimated)"
    name, total = gpu
    without = estimate_run(shape, method, config, checkpointing=False)
    on = auto_checkpointing(without, total)
    relation = "over" if on else "under"
    return on, (f"gradient checkpointing: {'on' if on else 'off'} (auto): without it this run needs {without.describe()}, "
                f"{relation} {CHECKPOINT_SHARE:.0%} of the {name}'s {total / GIB:.1f} GiB")
