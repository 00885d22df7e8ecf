"""Data Hub fixtures: blob storage in a temp dir, Celery tasks run inline, a tiny model on disk."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from datahub import repos


@pytest.fixture(autouse=True)
def hub_root(tmp_path, settings):
    root = tmp_path / "hub"
    settings.DATAHUB_ROOT = root
    return root


@pytest.fixture(autouse=True)
def hub_urls(settings):
    """The real URLconf when it imports; else only the API and /hub (another app's pages may be
    half-written in a shared checkout). Set DATAHUB_TEST_REAL_URLS=1 to insist on the real one."""
    import os
    import warnings

    try:
        import studio.urls  # noqa: F401
    except ImportError as exc:
        if os.environ.get("DATAHUB_TEST_REAL_URLS"):
            raise
        warnings.warn(f"studio.urls does not import ({exc}): testing with tests/datahub/urls.py", stacklevel=1)
        settings.ROOT_URLCONF = "tests.datahub.urls"


@pytest.fixture
def eager_celery():
    """Run Celery tasks in-process (the worker path is covered by the training dispatch tests)."""
    from studio.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield app
    app.conf.task_always_eager = before


@pytest.fixture
def browser(users):
    """A logged-in page client for a role: browser("owner")."""
    def login(role: str) -> Client:
        c = Client()
        c.force_login(users[role])
        return c

    return login


@pytest.fixture
def repo(project, users):
    return repos.create_repo(project, "my-model", "model", users["owner"])


@pytest.fixture
def dataset_repo(project, users):
    return repos.create_repo(project, "hub-data", "dataset", users["owner"])


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A real, loadable Llama (hidden 32, 2 layers) with a small BPE tokenizer, saved with save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(["hello world", "the quick brown fox jumps over the lazy dog"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    config = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out
