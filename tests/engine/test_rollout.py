"""The static rollout decoder (training/engine/rollout.py) on the CPU, against plain generate and a recomputed forward.

The greedy comparisons use the tiny teacher: its wider init gives peaked next-token distributions, so an
argmax never hinges on float rounding. The CUDA-graph path needs a GPU and is exercised by bench/ there.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.engine.rollout import StaticDecoder, static_decoder_support

from .conftest import IngestStub, make_spec, run_inprocess

TEXTS = ["What is 3+4?", "The cat is red. What colour is the dog?", "7+5=", "You are a helpful assistant. Be brief and answer"]


@pytest.fixture(scope="module")
def tok(tiny: dict[str, str]) -> Any:
    return AutoTokenizer.from_pretrained(tiny["teacher"])


@pytest.fixture(scope="module")
def prompts(tok: Any) -> list[list[int]]:
    ids = [tok(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in ids}) == len(ids)  # different lengths: left padding is exercised
    return ids


def _model(path: str) -> Any:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _decoder(model: Any, tok: Any, **kw: Any) -> StaticDecoder:
    kw.setdefault("max_batch", 6)
    kw.setdefault("max_total_len", 64)
    kw.setdefault("eos_token_ids", [tok.eos_token_id])
    return StaticDecoder(model, pad_token_id=tok.pad_token_id, **kw)


def _reference_greedy(model: Any, tok: Any, prompts: list[list[int]], new: int, eos: list[int]) -> list[list[int]]:
    """Plain `model.generate(do_sample=False)` on the same left-padded batch, each row cut after its first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    rows = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:end])
    return rows


def test_greedy_matches_generate_token_for_token_on_prompts_of_different_lengths(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["teacher"])
    out = _decoder(model, tok).generate(prompts, 16, temperature=0)
    assert out.completion_ids == _reference_greedy(model, tok, prompts, 16, [tok.eos_token_id])
    assert out.new_tokens == sum(len(c) for c in out.completion_ids)
    assert [len(lp) for lp in out.logprobs] == [len(c) for c in out.completion_ids]
    assert out.seconds > 0


def test_eos_ends_a_row_and_nothing_after_it_is_returned(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["teacher"])
    full = _decoder(model, tok).generate(prompts, 16, temperature=0).completion_ids
    assert all(len(c) == 16 for c in full), "choose an EOS below that the free run does not already hit"
    stop = full[0][3]  # declare row 0's fourth token the end of sequence
    out = _decoder(model, tok, eos_token_ids=[stop]).generate(prompts, 16, temperature=0)
    for free, row, lps in zip(full, out.completion_ids, out.logprobs, strict=True):
        expected = free[: free.index(stop) + 1] if stop in free else free
        assert row == expected
        assert len(lps) == len(row)
    assert out.completion_ids[0][-1] == stop and len(out.completion_ids[0]) <= 4
    assert out.completion_ids == _reference_greedy(model, tok, prompts, 16, [stop])


def test_top_k_one_sampling_is_greedy(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["teacher"])
    decoder = _decoder(model, tok)
    greedy = decoder.generate(prompts, 12, temperature=0).completion_ids
    assert decoder.generate(prompts, 12, temperature=1.3, top_k=1, seed=5).completion_ids == greedy


def test_same_seed_same_samples_other_seed_other_samples(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["student"])  # near-flat distributions: two seeds all but surely disagree somewhere
    decoder = _decoder(model, tok)
    a = decoder.generate(prompts, 16, temperature=1.0, seed=7)
    b = decoder.generate(prompts, 16, temperature=1.0, seed=7)
    c = decoder.generate(prompts, 16, temperature=1.0, seed=8)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_match_a_recomputed_forward_pass(tiny: dict[str, str], tok: Any, prompts: list[list[int]], temperature: float) -> None:
    model = _model(tiny["student"])
    out = _decoder(model, tok).generate(prompts, 12, temperature=temperature, seed=3)
    for prompt, completion, logprobs in zip(prompts, out.completion_ids, out.logprobs, strict=True):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=1e-4)


def test_lora_model_decodes_like_its_merged_weights_without_merging(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(_model(tiny["teacher"]), config).eval()
    base_out = _decoder(_model(tiny["teacher"]), tok).generate(prompts, 12, temperature=0).completion_ids
    decoder = _decoder(peft_model, tok)
    out = decoder.generate(prompts, 12, temperature=0).completion_ids
    merged = copy.deepcopy(peft_model).merge_and_unload()
    assert out == _decoder(merged, tok).generate(prompts, 12, temperature=0).completion_ids
    assert out != base_out  # the adapter matters, so the equality above says something
    lora_layers = [m for m in peft_model.modules() if hasattr(m, "merged")]
    assert lora_layers and not any(m.merged for m in lora_layers)  # decoding never merged the adapter

    # Weights are shared, not copied: an in-place update (what the optimizer does) shows in the next call.
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    flipped = copy.deepcopy(peft_model).merge_and_unload()
    assert decoder.generate(prompts, 12, temperature=0).completion_ids == _decoder(flipped, tok).generate(prompts, 12, temperature=0).completion_ids


def test_one_decoder_serves_calls_of_different_batch_sizes(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["teacher"])
    decoder = _decoder(model, tok, max_batch=4, max_total_len=40)
    small = decoder.generate(prompts[:2], 10, temperature=0).completion_ids
    full = decoder.generate(prompts, 10, temperature=0).completion_ids
    again = decoder.generate(prompts[1:2], 10, temperature=0).completion_ids
    reference = _reference_greedy(model, tok, prompts, 10, [tok.eos_token_id])
    assert full == reference
    assert small == reference[:2]
    assert again == reference[1:2]


def test_too_many_prompts_or_tokens_raise_a_clear_value_error(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    decoder = _decoder(_model(tiny["student"]), tok, max_batch=2, max_total_len=24)
    with pytest.raises(ValueError, match="max_batch=2"):
        decoder.generate(prompts[:3], 4)
    longest = max(len(p) for p in prompts[:2])
    with pytest.raises(ValueError, match="max_total_len=24"):
        decoder.generate(prompts[:2], 24 - longest + 1)
    assert decoder.generate(prompts[:2], 24 - longest, temperature=0).new_tokens > 0  # exactly full still fits


def test_decoding_restores_the_training_flag(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["student"]).train()
    _decoder(model, tok).generate(prompts, 4, temperature=1.0, seed=1)
    assert model.training
    model.eval()
    _decoder(model, tok).generate(prompts, 4, temperature=1.0, seed=1)
    assert not model.training


def test_unsupported_attention_is_named() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(config)
    assert static_decoder_support(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in (static_decoder_support(model) or "")
    with pytest.raises(ValueError, match="flash_attention_2"):
        StaticDecoder(model, max_batch=1, max_total_len=8, eos_token_ids=[1], pad_token_id=0)


def test_grpo_with_the_static_rollout_engine_completes_and_reports_rollouts(tiny: dict[str, str], ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {
        "max_steps": 3,
        "learning_rate": 2e-2,
        "rollouts_per_prompt": 4,
        "max_response_length": 6,
        "environment_id": "builtin/arith@main",
        "rollout_log_steps": 1,
        "rollout_engine": "static",
        "lora_rank": 4,
    }
    spec = make_spec("grpo", tiny["student"], [tiny["grpo"]], tmp_path, cfg, ingest)
    assert run_inprocess(spec) == 0
    logs = ingest.collect("logs")
    assert any("rollout engine static" in line for line in logs), logs
    assert len(ingest.series("rollout/tokens_per_s")) == 3
    assert all(v > 0 for v in ingest.series("rollout/tokens_per_s"))
    rollouts = ingest.collect("rollouts")
    assert len(rollouts) == 3 * 4
    assert {r["step"] for r in rollouts} == {1, 2, 3}
    assert len(ingest.series("reward")) == 3


def test_grpo_with_the_generate_rollout_engine_reports_no_static_figures(tiny: dict[str, str], ingest: IngestStub, tmp_path: Path) -> None:
    cfg = {"max_steps": 2, "rollouts_per_prompt": 2, "max_response_length": 4, "environment_id": "builtin/arith@main", "rollout_engine": "generate"}
    spec = make_spec("grpo", tiny["student"], [tiny["grpo"]], tmp_path, cfg, ingest)
    assert run_inprocess(spec) == 0
    assert any("rollout engine generate" in line for line in ingest.collect("logs"))
    assert "rollout/tokens_per_s" not in ingest.metrics()


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph, which cannot run without a GPU: replay runs the recorded step eagerly."""

    captures = 0

    def __init__(self) -> None:
        _FakeGraph.captures += 1
        self.step: Any = None

    def replay(self) -> None:
        self.step()


class _NoStream:
    def wait_stream(self, other: Any) -> None:
        pass


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> None:
    """Replace the torch.cuda graph/stream calls the decoder makes; only the capture bookkeeping is under test."""
    import contextlib

    def graph(g: Any, **kw: Any) -> Any:
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "Stream", lambda **kw: _NoStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _NoStream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def _graphed(decoder: StaticDecoder) -> StaticDecoder:
    decoder.use_cuda_graph = True  # the constructor refuses graphs off CUDA; the fakes above stand in
    real = decoder._capture

    def capture() -> Any:
        graph = real()
        graph.step = decoder._step
        return graph

    decoder._capture = capture  # type: ignore[method-assign]
    return decoder


def test_graph_bookkeeping_warm_up_and_capture_leave_no_trace_and_capture_once(
    tiny: dict[str, str], tok: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny["student"])
    eager = _decoder(model, tok).generate(prompts, 12, temperature=1.0, seed=4)
    _fake_cuda(monkeypatch)
    _FakeGraph.captures = 0
    decoder = _graphed(_decoder(model, tok))
    first = decoder.generate(prompts, 12, temperature=1.0, seed=4)
    second = decoder.generate(prompts[:2], 12, temperature=1.0, seed=4)
    assert first.completion_ids == eager.completion_ids and first.logprobs == eager.logprobs
    assert second.completion_ids == eager.completion_ids[:2]
    assert _FakeGraph.captures == 1  # same sampling settings, same weights: the graph is reused
    decoder.generate(prompts, 4, temperature=0)
    assert _FakeGraph.captures == 2  # new sampling settings bake into a new graph
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()  # storage moved (as a .to() would): the old graph reads stale addresses
    decoder.generate(prompts, 4, temperature=0)
    assert _FakeGraph.captures == 3


def test_failed_capture_is_logged_and_decoding_goes_on_eagerly(
    tiny: dict[str, str], tok: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny["teacher"])
    expected = _decoder(model, tok).generate(prompts, 8, temperature=0).completion_ids
    _fake_cuda(monkeypatch, fail=True)
    lines: list[str] = []
    decoder = _graphed(_decoder(model, tok, log=lines.append))
    assert decoder.generate(prompts, 8, temperature=0).completion_ids == expected
    assert decoder.generate(prompts, 8, temperature=0).completion_ids == expected
    assert len(lines) == 1 and "capture" in lines[0] and "eagerly" in lines[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU; the bookkeeping is covered above with a stand-in")
def test_on_cuda_the_captured_graph_decodes_exactly_like_eager_decoding(tiny: dict[str, str], tok: Any, prompts: list[list[int]]) -> None:
    model = _model(tiny["teacher"]).cuda()
    lines: list[str] = []
    graphed = _decoder(model, tok, log=lines.append)
    eager = _decoder(model, tok, use_cuda_graph=False)
    assert graphed.use_cuda_graph
    for kw in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 4}):
        a, b = graphed.generate(prompts, 24, **kw), eager.generate(prompts, 24, **kw)
        assert a.completion_ids == b.completion_ids, kw
        torch.testing.assert_close(torch.tensor(sum(a.logprobs, [])), torch.tensor(sum(b.logprobs, [])))
    assert graphed._graph is not None and not lines, lines  # captured, and no fallback was logged
    assert graphed.generate(prompts, 16, temperature=0).completion_ids == _reference_greedy(model, tok, prompts, 16, [tok.eos_token_id])


def test_grpo_rollout_func_reuses_one_decoder_and_grows_it_only_when_a_step_needs_more(tiny: dict[str, str], tok: Any) -> None:
    from types import SimpleNamespace

    from accelerate import Accelerator

    from training.engine.grpo import make_static_rollout_func

    class Reporter:
        def __init__(self) -> None:
            self.lines: list[str] = []
            self.metrics: list[tuple[int, str, float]] = []

        def log(self, line: str) -> None:
            self.lines.append(line)

        def metric(self, step: int, key: str, value: float) -> None:
            self.metrics.append((step, key, value))

    model = _model(tiny["student"]).train()
    reporter = Reporter()
    trainer = SimpleNamespace(
        model=model, model_wrapped=model, accelerator=Accelerator(cpu=not torch.cuda.is_available()), args=SimpleNamespace(gradient_checkpointing_kwargs=None),
        _tokenize_prompts=lambda texts: ([tok(t)["input_ids"] for t in texts], None, {}),
        eos_token_ids=[tok.eos_token_id], temperature=1.0, top_p=1.0, top_k=0, state=SimpleNamespace(global_step=0),
    )  # fmt: skip
    rollout = make_static_rollout_func(SimpleNamespace(reporter=reporter), tok, 5)  # type: ignore[arg-type]
    out = rollout(["What is 3+4?"] * 4, trainer)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs"}
    assert len(out["completion_ids"]) == len(out["logprobs"]) == len(out["prompt_ids"]) == 4
    assert all(1 <= len(c) <= 5 and len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"], strict=True))
    assert model.training  # handed back to training mode
    trainer.state.global_step = 1
    rollout(["7+5="] * 2, trainer)  # smaller and shorter: the same decoder
    assert not reporter.lines
    rollout(["You are a helpful assistant. " * 12] * 4, trainer)  # a much longer prompt: one resize
    rollout(["What is 3+4?"] * 6, trainer)  # more rows: another
    assert len(reporter.lines) == 2 and all("resizing" in line for line in reporter.lines)
    assert [(s, k) for s, k, _ in reporter.metrics] == [(1, "rollout/tokens_per_s")] + [(2, "rollout/tokens_per_s")] * 3
