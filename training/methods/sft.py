from __future__ import annotations

from studio.errors import Finding
from training.methods.base import BOOL, Draft, TrainingMethod
from training.refs import dataset_entries

# The types of rows SFT (and DISTILL) train on; the engine reads no type and trains on every entry.
SFT_TYPES = ("sft", "chat", "text", "prompt_completion")


def entry_type_findings(draft: Draft, label: str) -> list[Finding]:
    """A dataset entry typed as something SFT does not train on ({"ref": ..., "type": "eval"}) was
    trained on all the same: the engine joins every entry into the training rows, whatever its type
    (held-out rows are config.eval_dataset's)."""
    field = (lambda i: f"dataset[{i}]") if isinstance(draft.dataset, list) else (lambda i: "dataset")
    return [Finding(f"{field(index)}.type", f'{label} trains on every dataset entry as chat, text or prompt/completion rows: set type to '
                                              f'{", ".join(SFT_TYPES)} or leave it out (got "{entry.type}"); a run trains on every entry, '
                                              "so move an entry that is for evaluation to config.eval_dataset")
            for index, entry in enumerate(dataset_entries(draft.dataset)) if entry.type is not None and entry.type not in SFT_TYPES]


class SFT(TrainingMethod):
    """Supervised fine-tuning on chat, prompt/completion or plain-text rows."""

    name = "sft"
    label = "SFT"
    trl_config = "SFTConfig"
    keys = {"packing": BOOL}  # padding-free packing of rows into full sequences (default on)

    def start_findings(self, draft: Draft) -> list[Finding]:
        return entry_type_findings(draft, self.label)
