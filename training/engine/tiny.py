"""Tiny, offline-built models and demo datasets for demos and tests.

Nothing here downloads anything: the tokenizer is trained with `tokenizers` on a small synthetic corpus,
and the student/teacher are randomly initialised Llama-shaped models that share that tokenizer.

Run as ``python -m training.engine.tiny OUT_DIR``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

# The `{% generation %}` markers let TRL build an assistant-only loss mask for chat rows.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
VOCAB_SIZE = 1024

_COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
_ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "hen", "yak"]


def _qa_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        animal, colour = rng.choice(_ANIMALS), rng.choice(_COLOURS)
        pairs.append((f"What colour is the {animal}?", f"The {animal} is {colour}."))
    return pairs


def _arith_lines(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"{a}+{b}={a + b}" for a, b in ((rng.randint(0, 49), rng.randint(0, 49)) for _ in range(n))]


def _corpus() -> list[str]:
    lines = [f"{q} {a}" for q, a in _qa_pairs(400)]
    lines += _arith_lines(400)
    lines += [f"What is {a}+{b}? Answer with digits only." for a, b in ((i % 50, (i * 7) % 50) for i in range(100))]
    lines += ["You are a helpful assistant. Be brief and answer with the number only."] * 10
    return lines


def build_tokenizer(out_dir: str | Path) -> Any:
    """Train a ByteLevel BPE and wrap it as a generic fast tokenizer.

    We declare ``PreTrainedTokenizerFast`` (TokenizersBackend in transformers 5) rather than a model-specific
    class: model-specific classes (Qwen2, Llama) rebuild the pre-tokenizer on load, which changes token ids.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    fast.save_pretrained(str(out_dir))
    return fast


def _save_model(out: Path, tokenizer: Any, hidden: int, layers: int, init_range: float, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # Generation defaults live in generation_config; keep them consistent with the tokenizer.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def build_tiny_models(out_dir: str | Path) -> dict[str, str]:
    """Build a tiny student (hidden 64, 2 layers) and teacher (hidden 128, 3 layers) sharing one tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out / "tokenizer")
    student, teacher = out / "tiny-student", out / "tiny-teacher"
    _save_model(student, tokenizer, hidden=64, layers=2, init_range=0.02, seed=0)
    # A wider init gives the random teacher a peaked, context-dependent distribution worth distilling.
    _save_model(teacher, tokenizer, hidden=128, layers=3, init_range=0.3, seed=1)
    return {"student": str(student), "teacher": str(teacher)}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return str(path)


def build_demo_datasets(out_dir: str | Path) -> dict[str, str]:
    """Small demo datasets per method, as JSONL."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = _qa_pairs(64, seed=2)
    chat = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs]
    text = [{"text": f"{q} {a}"} for q, a in pairs]
    prompt_completion = [{"prompt": q, "completion": " " + a} for q, a in pairs]
    rng = random.Random(3)
    dpo = []
    for q, a in pairs:
        wrong = a.replace(a.split()[-1], rng.choice(_COLOURS) + "?")
        dpo.append({"prompt": q, "chosen": " " + a, "rejected": " " + wrong + " no"})
    grpo = [{"prompt": f"What is {a}+{b}? Answer with digits only."} for a, b in ((i % 10, (i * 3) % 10) for i in range(32))]
    return {
        "sft": _write_jsonl(out / "sft_chat.jsonl", chat),
        "sft_text": _write_jsonl(out / "sft_text.jsonl", text),
        "sft_prompt_completion": _write_jsonl(out / "sft_prompt_completion.jsonl", prompt_completion),
        "dpo": _write_jsonl(out / "dpo.jsonl", dpo),
        "distill": _write_jsonl(out / "distill.jsonl", chat),
        "grpo": _write_jsonl(out / "grpo.jsonl", grpo),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m training.engine.tiny OUT_DIR", file=sys.stderr)
        return 2
    models = build_tiny_models(Path(args[0]) / "models")
    datasets = build_demo_datasets(Path(args[0]) / "datasets")
    print(json.dumps({"models": models, "datasets": datasets}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
