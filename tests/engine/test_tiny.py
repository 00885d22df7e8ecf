from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from training.engine.tiny import build_demo_datasets, build_tiny_models


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_fast_and_deterministic(tmp_path: Path) -> None:
    start = time.monotonic()
    a = build_tiny_models(tmp_path / "a")
    assert time.monotonic() - start < 20
    b = build_tiny_models(tmp_path / "b")
    for role in ("student", "teacher"):
        for name in ("model.safetensors", "tokenizer.json"):
            assert _digest(Path(a[role]) / name) == _digest(Path(b[role]) / name), (role, name)


def test_student_and_teacher_share_a_tokenizer_whose_ids_survive_reload(tiny) -> None:
    student, teacher = tiny["student"], tiny["teacher"]
    assert _digest(Path(student) / "tokenizer.json") == _digest(Path(teacher) / "tokenizer.json")
    s_cfg, t_cfg = AutoConfig.from_pretrained(student), AutoConfig.from_pretrained(teacher)
    assert (s_cfg.hidden_size, s_cfg.num_hidden_layers) == (64, 2)
    assert (t_cfg.hidden_size, t_cfg.num_hidden_layers) == (128, 3)
    assert s_cfg.vocab_size == t_cfg.vocab_size

    tok = AutoTokenizer.from_pretrained(student)
    raw = Tokenizer.from_file(str(Path(student) / "tokenizer.json"))
    text = "What is 12+7? The cat is red.<|im_end|>"
    assert tok(text)["input_ids"] == raw.encode(text).ids
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert "{% generation %}" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(student)
    assert model.config.vocab_size >= len(tok)


def test_assistant_mask_covers_only_the_assistant_turn(tiny) -> None:
    tok = AutoTokenizer.from_pretrained(tiny["student"])
    msgs = [{"role": "user", "content": "What colour is the cat?"}, {"role": "assistant", "content": "The cat is red."}]
    enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tok.decode(masked) == "The cat is red.<|im_end|>"


def test_demo_datasets_have_each_method_shape(tmp_path: Path) -> None:
    paths = build_demo_datasets(tmp_path)
    first = {k: json.loads(Path(p).read_text().splitlines()[0]) for k, p in paths.items()}
    assert set(first["sft"]) == {"messages"}
    assert set(first["sft_text"]) == {"text"}
    assert set(first["dpo"]) == {"prompt", "chosen", "rejected"}
    assert set(first["distill"]) == {"messages"}
    assert set(first["grpo"]) == {"prompt"}


def test_tiny_cli_builds_models_and_datasets(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "training.engine.tiny", str(tmp_path)], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert Path(out["models"]["student"], "config.json").is_file()
    assert set(out["datasets"]) >= {"sft", "dpo", "distill", "grpo"}
