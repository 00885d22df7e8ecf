"""Answer one prompt with a trained model (the run page's Try it):
`python -m training.engine.generate --model M [--revision R] [--adapter A] < REQUEST.json`.

REQUEST is {"prompt": text} or {"messages": [{"role", "content"}, ...]}, with "max_new_tokens" and
"temperature" (0: greedy). The model loads as training loads it (modeling.load_model: a local folder,
an HF id, `repo@ref`), with a LoRA adapter folder over it when --adapter is given. The answer is one
JSON line on stdout: {"text", "tokens", "seconds", "device"}; what loading says goes to stderr.

Studio runs this as its own process, with a timeout, from a Celery task: the worker never holds model
weights, and a model too large for the machine cannot hang it. It runs on the GPU that
CUDA_VISIBLE_DEVICES leaves it, else on the CPU.
Exit codes: 0 answered, 2 the request cannot be answered by this model (a chat without a chat template).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .modeling import Device, load_model, load_tokenizer


class Unanswerable(ValueError):
    """The request does not fit the model (exit 2, its message on stderr)."""


def generation_device(cuda: bool) -> Device:
    """bf16 on a GPU, fp32 on the CPU: what a run trains in there by default."""
    return Device("cuda", True, "bf16") if cuda else Device("cpu", False, "fp32")


def device_name(device: Device) -> str:
    """The device as the answer names it: "cpu", or "cuda (<the GPU's name>)"."""
    if device.kind != "cuda":
        return "cpu"
    import torch

    return f"cuda ({torch.cuda.get_device_name(device.index)})"


def prompt_ids(tokenizer: Any, request: dict) -> Any:
    """The prompt as token ids: a chat through the tokenizer's chat template, ready for the assistant's
    turn; plain text as it is."""
    if request.get("messages") is not None:
        if not tokenizer.chat_template:
            raise Unanswerable("this model's tokenizer has no chat template: send a plain-text prompt instead of messages")
        return tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    return tokenizer(request["prompt"], return_tensors="pt")["input_ids"]


def answer(model_ref: str, request: dict, revision: str | None = None, adapter: str | None = None) -> dict:
    """Load the model (and adapter), then generate up to max_new_tokens new tokens for the request."""
    import torch

    device = generation_device(torch.cuda.is_available())
    tokenizer_source = adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else model_ref
    tokenizer = load_tokenizer(tokenizer_source, None if tokenizer_source == adapter else revision)
    model = load_model(model_ref, revision, device, log=lambda line: print(line, file=sys.stderr, flush=True))
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.to(device.kind).eval()
    ids = prompt_ids(tokenizer, request).to(device.kind)
    temperature = float(request["temperature"])
    sampling: dict[str, Any] = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    started = time.monotonic()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(request["max_new_tokens"]),
                             pad_token_id=tokenizer.pad_token_id, **sampling)
    new = out[0, ids.shape[1]:]
    return {"text": tokenizer.decode(new, skip_special_tokens=True), "tokens": int(new.shape[0]),
            "seconds": round(time.monotonic() - started, 3), "device": device_name(device)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.engine.generate", description=__doc__)
    parser.add_argument("--model", required=True, help="a local folder, an HF id, or repo@ref")
    parser.add_argument("--revision")
    parser.add_argument("--adapter", help="a LoRA adapter folder to apply over the model")
    args = parser.parse_args(argv)
    request = json.load(sys.stdin)
    try:
        result = answer(args.model, request, args.revision, args.adapter)
    except Unanswerable as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
