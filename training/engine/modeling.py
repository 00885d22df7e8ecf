"""Device/precision choice, model + tokenizer loading, LoRA/QLoRA wrapping and final-weight saving."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .launch import Rank
from .spec import Spec, SpecError

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Device:
    kind: str  # "cuda" | "cpu"
    bf16: bool
    precision: str  # what the run actually trains in
    index: int = 0  # the CUDA device of this process: its LOCAL_RANK under torchrun

    @property
    def torch_dtype(self) -> Any:
        import torch

        return torch.bfloat16 if self.bf16 else torch.float32


def pick_device(spec: Spec, rank: Rank | None = None) -> Device:
    """bf16 on CUDA when available, fp32 on the CPU. fp8/nvfp4 need a GPU; fp8 is switched on per
    layer once the model is loaded (fp8.enable, which may still fall back to bf16 and says why).
    A data-parallel rank trains on the GPU of its LOCAL_RANK, made the current device here so that
    everything that asks for "the GPU" (bitsandbytes, the peak tables, memory figures) gets its own."""
    device = _pick_device(spec)
    if device.kind == "cuda" and rank is not None and rank.world > 1:
        import torch

        torch.cuda.set_device(rank.local)
        device.index = rank.local
    return device


def _pick_device(spec: Spec) -> Device:
    import torch

    accelerators = str(spec.compute.get("accelerators") or "").upper()
    wants_cpu = accelerators == "CPU"
    precision = spec.cfg("precision", "bf16")
    if accelerators and not wants_cpu and not torch.cuda.is_available():
        # Silently training a GPU-sized job on the CPU would look like a hang; fail loudly instead.
        raise RuntimeError(f"compute.accelerators is {accelerators!r} but no CUDA device is visible to the engine")
    if torch.cuda.is_available() and not wants_cpu:
        if precision == "fp32":
            return Device("cuda", False, "fp32")
        if precision == "fp8":
            return Device("cuda", True, "fp8")
        # nvfp4 needs Transformer Engine, which Studio refuses at START when the image lacks it (it does).
        return Device("cuda", True, "bf16")
    if precision in ("fp8", "nvfp4"):
        raise SpecError(f"config.precision: {precision} needs a GPU; use bf16 or fp32 on CPU")
    return Device("cpu", False, "fp32")


def _split_ref(ref: str, revision: str | None) -> tuple[str, str | None]:
    """Accept `repo@ref` (Data Hub style) as well as a path or HF id plus a separate revision."""
    if "@" in ref and not Path(ref).exists():
        name, _, rev = ref.rpartition("@")
        return name, revision or rev
    return ref, revision


def load_tokenizer(ref: str, revision: str | None = None) -> Any:
    from transformers import AutoTokenizer

    name, rev = _split_ref(ref, revision)
    tok = AutoTokenizer.from_pretrained(name, revision=rev)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def attention_implementation(device: Device) -> tuple[str, str]:
    """(implementation, why) for this device.

    flash_attention_2 on a CUDA device that can run it (Ampere or newer, bf16, the flash_attn package
    importable): its varlen kernels take packed sequences as they are. Everywhere else SDPA, which
    transformers 5 turns into a block-diagonal mask when packed sequences arrive with position_ids and no
    attention mask (masking_utils.find_packed_sequence_indices), so packing stays correct on the CPU too.
    """
    if device.kind != "cuda":
        return "sdpa", "CPU"
    import torch

    if not device.bf16:
        return "sdpa", "fp32 run (flash attention needs bf16/fp16)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return "sdpa", f"GPU capability {major}.{minor} (flash attention 2 needs 8.0+)"
    if importlib.util.find_spec("flash_attn") is None:
        return "sdpa", "the flash_attn package is not installed (optional, see requirements-gpu.txt)"
    return "flash_attention_2", f"flash_attn installed, GPU capability {major}.{minor}"


def load_model(ref: str, revision: str | None, device: Device, *, four_bit: bool = False, log: Callable[[str], None] | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    say = log or (lambda line: print(line, flush=True))
    name, rev = _split_ref(ref, revision)
    attn, why = attention_implementation(device)
    kwargs: dict[str, Any] = {"revision": rev, "dtype": device.torch_dtype, "attn_implementation": attn}
    if four_bit:
        if importlib.util.find_spec("bitsandbytes") is None:
            # transformers' own ImportError says "pip install", which a user of a trainer image cannot do mid-run.
            raise SpecError("config.load_in_4bit: QLoRA loads the base in 4 bits with the bitsandbytes package, which this trainer image lacks: "
                            "install it in the image (requirements.txt pins it) or remove load_in_4bit to train a 16-bit LoRA")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=device.torch_dtype,
            bnb_4bit_use_double_quant=True,
        )
        kwargs["device_map"] = {"": device.index} if device.kind == "cuda" else {"": "cpu"}
    while True:
        try:
            model = AutoModelForCausalLM.from_pretrained(name, **{**kwargs, "attn_implementation": attn})
            break
        except (ImportError, ValueError) as exc:
            # A flash_attn build that does not match this torch/GPU, or an architecture without FA2 support:
            # SDPA is slower, not wrong. An architecture without SDPA support (Gemma 2) gets eager attention.
            if attn == "flash_attention_2":
                fallback = "sdpa"
            elif attn == "sdpa" and "scaled_dot_product_attention" in str(exc):
                fallback = "eager"
            else:
                raise
            say(f"attention: {attn} failed to load ({type(exc).__name__}: {exc}); falling back to {fallback}")
            attn, why = fallback, "the architecture does not support sdpa" if fallback == "eager" else "fallback"
    say(f"attention: {attn} ({why}) for {name}")
    return model


def wrap_lora(model: Any, spec: Spec, device: Device, *, four_bit: bool, log: Callable[[str], None] | None = None) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    say = log or (lambda line: print(line, flush=True))
    if four_bit:
        # Gradient checkpointing stays a TrainingArguments decision, not a side effect of quantisation.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if device.kind == "cuda":
        # On GPU we checkpoint activations; with a frozen base the checkpointed segments would otherwise
        # see no input that requires grad and the adapters would get no gradient.
        model.enable_input_require_grads()
    config = LoraConfig(
        r=spec.lora_rank,
        # peft annotates an int, and scales by lora_alpha / r: a fractional alpha is taken as stored.
        lora_alpha=spec.lora_alpha,  # type: ignore[arg-type]
        lora_dropout=0.0,
        target_modules=lora_targets(model),
        task_type="CAUSAL_LM",
        revision=base_revision(spec, model),
    )
    model = get_peft_model(model, config)
    adapted = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")})
    say(f"lora: adapting {', '.join(adapted)} (rank {spec.lora_rank}, alpha {spec.lora_alpha})")
    return model


def base_revision(spec: Spec, model: Any) -> str | None:
    """The commit of the base an adapter names as its `revision` (with base_model_name_or_path, the repo id
    the model loaded as): peft and AutoPeftModel outside Studio load that commit, not the branch head, which
    may have moved since. The commit the weights were resolved to (a Data Hub base's pinned commit, an HF
    id's commit at the ref it named), else the revision asked for; none for a local folder."""
    name, rev = _split_ref(spec.base_model, spec.base_model_revision)
    if Path(name).exists():
        return None
    return getattr(model.config, "_commit_hash", None) or rev


def lora_targets(model: Any) -> list[str]:
    """Every linear layer of the blocks, the LM head left out (what peft's "all-linear" picks), by short name:
    exactly LORA_TARGETS on Llama/Qwen/Mistral, so their adapter_config.json reads as it always did, and
    GPT-2's c_attn/c_proj/c_fc (Conv1D), GPT-NeoX's query_key_value/dense..., Phi's fc1/fc2 elsewhere."""
    import torch
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear | Conv1D) and module is not head})


def seed_run(spec: Spec) -> None:
    """Seed Python, NumPy and torch (every device) with the run's seed.

    The Trainer seeds only when it is built, after the policy exists: a LoRA adapter's A matrices (and any
    weight the checkpoint lacks) were drawn from an unseeded generator, so two runs with the same seed
    trained different adapters. Called at the start of the run and again just before the policy loads,
    so its initialisation does not depend on what ran in between (a capture, an environment's code).
    """
    from transformers import set_seed

    set_seed(spec.seed)


def load_policy(spec: Spec, device: Device, log: Callable[[str], None] | None = None) -> Any:
    """The model to train: full weights, LoRA over a full-precision base, or LoRA over a 4-bit base."""
    seed_run(spec)
    four_bit = bool(spec.cfg("load_in_4bit", False))
    model = load_model(spec.base_model, spec.base_model_revision, device, four_bit=four_bit, log=log)
    if device.precision == "fp8":
        from . import fp8

        if not fp8.enable(model, "cuda", log or (lambda line: print(line, flush=True))):
            device.precision = "bf16"
    if spec.use_lora:
        model = wrap_lora(model, spec, device, four_bit=four_bit, log=log)
    return model


def save_final(model: Any, tokenizer: Any, spec: Spec, device: Device, step: int, reporter: Any) -> None:
    """Full fine-tunes write `final/`; LoRA runs write `adapter/` and the merged weights in `merged/`."""
    out = spec.output_dir
    if not spec.use_lora:
        path = out / "final"
        model.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        reporter.checkpoint(step, str(path), "final")
        return
    adapter = out / "adapter"
    model.save_pretrained(str(adapter))
    tokenizer.save_pretrained(str(adapter))
    reporter.checkpoint(step, str(adapter), "adapter")
    # Merge into a freshly loaded, unquantised base: merging into NF4 weights would round the result.
    from peft import PeftModel

    base = load_model(spec.base_model, spec.base_model_revision, device, four_bit=False, log=reporter.log)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    path = out / "merged"
    merged.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    reporter.checkpoint(step, str(path), "merged")
