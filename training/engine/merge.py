"""Merge a LoRA checkpoint into its base model:
`python -m training.engine.merge --base B --adapter A --out O [--precision P]`.

Studio runs this as its own process (from a Celery task) so the worker never holds model weights, and
passes the precision the run trained in, which the merged weights keep.
Exit codes: 0 merged, 2 the adapter directory is not a LoRA adapter.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .modeling import Device, load_model, load_tokenizer
from .spec import PRECISIONS


def merge_device(precision: str | None, cuda: bool) -> Device:
    """The device and dtype the base loads in to be merged: the dtype the run trained in, so the merged
    weights are its base + adapter as it trained them. An fp32 run (every CPU run is one) merges in fp32;
    the others trained bf16 weights (fp8 and nvfp4 compute over bf16 weights). With no precision given
    (an older caller), bf16 where CUDA is, as the engine trains a run that does not say."""
    if precision is None:
        precision = "bf16" if cuda else "fp32"
    bf16 = precision != "fp32"
    return Device("cuda" if cuda else "cpu", bf16, "bf16" if bf16 else "fp32")


def merge_adapter(base_model: str, adapter_dir: str | Path, out_dir: str | Path, revision: str | None = None, precision: str | None = None) -> Path:
    """Load the base unquantised in the run's precision, apply the adapter, merge it in, and save model +
    tokenizer to out_dir."""
    import torch
    from peft import PeftModel

    adapter, out = Path(adapter_dir), Path(out_dir)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter} has no adapter_config.json: it is not a LoRA checkpoint")
    device = merge_device(precision, torch.cuda.is_available())
    base = load_model(base_model, revision, device, four_bit=False)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    # A trainer checkpoint carries the tokenizer; fall back to the base's when it does not.
    tokenizer_source = str(adapter) if (adapter / "tokenizer_config.json").is_file() else base_model
    load_tokenizer(tokenizer_source, None if tokenizer_source == str(adapter) else revision).save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.engine.merge", description=__doc__)
    parser.add_argument("--base", required=True)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--revision")
    parser.add_argument("--precision", choices=PRECISIONS, help="what the run trained in (a CPU run: fp32); the merged weights keep it")
    args = parser.parse_args(argv)
    try:
        out = merge_adapter(args.base, args.adapter, args.out, args.revision, args.precision)
    except FileNotFoundError as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
