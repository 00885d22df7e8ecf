"""Merge a LoRA checkpoint into its base model: `python -m training.engine.merge --base B --adapter A --out O`.

Studio runs this as its own process (from a Celery task) so the worker never holds model weights.
Exit codes: 0 merged, 2 the adapter directory is not a LoRA adapter.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .modeling import Device, load_model, load_tokenizer


def merge_adapter(base_model: str, adapter_dir: str | Path, out_dir: str | Path, revision: str | None = None) -> Path:
    """Load the base unquantised, apply the adapter, merge it in, and save model + tokenizer to out_dir."""
    import torch
    from peft import PeftModel

    adapter, out = Path(adapter_dir), Path(out_dir)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter} has no adapter_config.json: it is not a LoRA checkpoint")
    device = Device("cuda", True, "bf16") if torch.cuda.is_available() else Device("cpu", False, "fp32")
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
    args = parser.parse_args(argv)
    try:
        out = merge_adapter(args.base, args.adapter, args.out, args.revision)
    except FileNotFoundError as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
