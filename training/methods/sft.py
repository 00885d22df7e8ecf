from __future__ import annotations

from training.methods.base import TrainingMethod


class SFT(TrainingMethod):
    """Supervised fine-tuning on chat, prompt/completion or plain-text rows."""

    name = "sft"
    label = "SFT"
    trl_config = "SFTConfig"
