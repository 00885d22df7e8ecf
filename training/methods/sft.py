from __future__ import annotations

from training.methods.base import BOOL, TrainingMethod


class SFT(TrainingMethod):
    """Supervised fine-tuning on chat, prompt/completion or plain-text rows."""

    name = "sft"
    label = "SFT"
    trl_config = "SFTConfig"
    keys = {"packing": BOOL}  # padding-free packing of rows into full sequences (default on)
