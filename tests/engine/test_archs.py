"""Architectures beyond Llama: LoRA on GPT-2's Conv1D layers, Gemma 2 without SDPA, DISTILL's BOS.

Each model is built tiny here from its config (nothing is downloaded), like the tiny fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from training.engine.distill import _tokenise_row
from training.engine.modeling import LORA_TARGETS, Device, load_model, wrap_lora
from training.engine.spec import parse_spec

from .conftest import IngestStub, make_spec, run_inprocess

CPU = Device("cpu", False, "fp32")


def _adapted(model: Any) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


def _lora(model: Any, tmp_path: Path) -> tuple[Any, list[str]]:
    spec = parse_spec(make_spec("sft", "unused", ["unused.jsonl"], tmp_path / "out", {"lora": True, "lora_rank": 4}))
    lines: list[str] = []
    return wrap_lora(model, spec, CPU, four_bit=False, log=lines.append), lines


def test_lora_adapts_gpt2s_conv1d_layers_and_says_which(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model, lines = _lora(GPT2LMHeadModel(GPT2Config(vocab_size=64, bos_token_id=0, eos_token_id=0, n_embd=32, n_layer=2, n_head=4, n_positions=64)), tmp_path)
    assert _adapted(model) == {"c_attn", "c_proj", "c_fc"}
    assert "lm_head" not in _adapted(model)
    assert any(line.startswith("lora: adapting c_attn, c_fc, c_proj") for line in lines), lines
    # The adapters learn: one step moves them.
    ids = torch.randint(0, 64, (2, 16))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_B" in n)


def test_dpo_trains_a_gpt2_with_lora(tiny, ingest: IngestStub, tmp_path: Path) -> None:
    """DPO needs LoRA; with the old Llama-only targets a GPT-2 could not be trained at all."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny["student"])
    ids = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=128, **ids))
    model.save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    cfg = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 8, "max_length": 64, "lora_rank": 4, "loss": {"type": "dpo", "dpo_beta": 0.1}}
    assert run_inprocess(make_spec("dpo", str(tmp_path / "gpt2"), [tiny["dpo"]], tmp_path / "run", cfg, ingest)) == 0
    assert len(ingest.series("rewards/margins")) == 3
    assert any(line.startswith("lora: adapting c_attn, c_fc, c_proj") for line in ingest.collect("logs"))
    assert [c["kind"] for c in ingest.collect("checkpoints")] == ["adapter", "merged"]
    adapter_cfg = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert set(adapter_cfg["target_modules"]) == {"c_attn", "c_proj", "c_fc"}


def test_lora_on_llama_adapts_the_same_projections_as_before(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model, lines = _lora(LlamaForCausalLM(config), tmp_path)
    assert _adapted(model) == set(LORA_TARGETS)
    assert any(line.startswith("lora: adapting down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj") for line in lines), lines


def test_gemma2_without_sdpa_support_loads_with_eager_attention(tmp_path: Path) -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    Gemma2ForCausalLM(config).save_pretrained(tmp_path / "gemma2")
    lines: list[str] = []
    model = load_model(str(tmp_path / "gemma2"), None, CPU, log=lines.append)
    assert model.config._attn_implementation == "eager"
    assert any("falling back to eager" in line for line in lines), lines
    assert lines[-1].startswith("attention: eager ("), lines
    ids = torch.randint(0, 64, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()


def _bos_tokenizer(chat_template: str | None = None) -> Any:
    """A Llama tokenizer that adds BOS to plain text, as Llama 2/3 and Mistral's do."""
    from transformers import LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("▁abcdefghijklmnopqrstuvwxyz?")}}
    tokenizer = LlamaTokenizer(vocab=vocab, merges=[], add_bos_token=True)
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.mark.parametrize(
    ("fmt", "row"),
    [("text", {"text": "hello world"}), ("prompt_completion", {"prompt": "say hi?", "completion": " hi"})],
)
def test_distill_rows_start_with_bos_like_sft(fmt: str, row: dict[str, str]) -> None:
    tokenizer = _bos_tokenizer()
    ids, mask = _tokenise_row(row, fmt, tokenizer, 512)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids[-1] == tokenizer.eos_token_id and len(mask) == len(ids)
    # SFT tokenises the same text with the tokenizer's special tokens: the sequences agree.
    text = row.get("text") or row["prompt"] + row["completion"]
    assert ids[:-1] == tokenizer(text)["input_ids"]
    if fmt == "prompt_completion":
        assert mask[0] == 0 and mask[-1] == 1


def test_distill_chat_rows_keep_the_templates_single_bos() -> None:
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    tokenizer = _bos_tokenizer(template)
    ids, _ = _tokenise_row({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "chat", tokenizer, 512)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


def test_distill_adds_no_bos_for_a_tokenizer_that_never_adds_one() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "hello": 1, "world": 2}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    ids, _ = _tokenise_row({"text": "hello world"}, "text", tokenizer, 512)
    assert ids == [1, 2, 0]
