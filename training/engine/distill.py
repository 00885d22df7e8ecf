"""DISTILL: capture the teacher's top-K logprobs into `.kd` sidecars, then train the student on them.

Phase 1 (stage "capture") tokenises the dataset into shards and runs the teacher once over each shard;
a shard whose sidecar is already valid (same tokenisation hash and K) is skipped, so an interrupted
capture resumes, and with the spec's ``cache_dir`` a restarted run (a new attempt) reuses the last
attempt's capture of the same teacher. The teacher is freed before phase 2.
Phase 2 (stage "train") minimises ``ce_weight·CE + kd_weight·τ²·KL(q‖p_τ)`` where q is the teacher's
top-K renormalised at temperature τ and p_τ the student's full softmax at τ. `loss` reports plain CE
and `kd_loss` the τ²-scaled KL, so the two curves can be read separately.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Trainer
from trl import SFTConfig
from trl.chat_template_utils import has_generation_markers

from . import kd_format
from .capture import capture_shards
from .common import ROW_TOKENS, Context, ServingConfigMixin, StudioCallback, TokenCountingMixin, build_config, packed_positions, train_and_finish
from .data import load_rows, row_format, with_system_prompt
from .fit import max_length
from .modeling import load_policy, load_tokenizer
from .spec import SpecError

ROWS_PER_SHARD = 256


@dataclass
class Shard:
    tokens_path: Path
    kd_path: Path
    input_ids: np.ndarray  # concatenated token stream of the shard's sequences
    loss_mask: np.ndarray  # 1 where the token is a training target
    offsets: np.ndarray  # sequence i is stream[offsets[i]:offsets[i+1]]
    token_hash: str


def _bos_prefix(tokenizer: Any) -> list[int]:
    """[BOS] when the tokenizer puts one in front of plain text (as SFT's tokenisation does), else [].

    Asked of the tokenizer itself rather than read from ``bos_token``: GPT-2 has a BOS token it never adds.
    """
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    with_special = tokenizer("a")["input_ids"]
    return [bos] if with_special[:1] == [bos] and tokenizer("a", add_special_tokens=False)["input_ids"][:1] != [bos] else []


def _tokenise_row(row: dict[str, Any], fmt: str, tokenizer: Any, max_length: int) -> tuple[list[int], list[int]]:
    """A row's ids and loss mask, as SFT tokenises it: chat rows through the template alone (which writes any
    BOS itself), text and prompt/completion rows with the tokenizer's BOS in front and EOS at the end."""
    if fmt == "chat":
        enc = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        if not any(mask):  # a template without generation markers: learn the whole conversation
            mask = [1] * len(ids)
    elif fmt == "prompt_completion":
        p = _bos_prefix(tokenizer) + tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        c = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids, mask = p + c, [0] * len(p) + [1] * len(c)
    else:
        ids = _bos_prefix(tokenizer) + tokenizer(row["text"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        mask = [1] * len(ids)
    return ids[:max_length], mask[:max_length]


def capture_dir(spec: Any, teacher_ref: str, k: int, precision: str) -> Path:
    """Where the sidecars go: under output_dir, or with a ``cache_dir`` (kept across a run's attempts)
    in its ``kd`` folder, whose key.json names the teacher (a local one by its files' sizes and times),
    K and precision. A different key empties the folder first, so a changed teacher is never reused;
    each shard is still checked against its own tokenisation (dataset, tokenizer, max_length)."""
    if spec.cache_dir is None:
        return spec.output_dir / "kd"
    teacher = Path(teacher_ref)
    files = sorted([f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in teacher.iterdir() if f.is_file()) if teacher.is_dir() else None
    key = {"teacher": teacher_ref, "teacher_files": files, "top_k": k, "precision": precision, "sidecar_version": kd_format.VERSION}
    folder, text = spec.cache_dir / "kd", json.dumps(key, sort_keys=True)
    key_file = folder / "key.json"
    if folder.exists() and (not key_file.is_file() or key_file.read_text() != text):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key_file.write_text(text)
    return folder


def tokenise_shards(dataset: Any, fmt: str, tokenizer: Any, max_length: int, kd_dir: Path) -> list[Shard]:
    kd_dir.mkdir(parents=True, exist_ok=True)
    vocab = len(tokenizer)
    shards = []
    for n, start in enumerate(range(0, len(dataset), ROWS_PER_SHARD)):
        ids_all: list[int] = []
        mask_all: list[int] = []
        offsets = [0]
        for row in dataset.select(range(start, min(start + ROWS_PER_SHARD, len(dataset)))):
            ids, mask = _tokenise_row(row, fmt, tokenizer, max_length)
            ids_all += ids
            mask_all += mask
            offsets.append(len(ids_all))
        input_ids = np.asarray(ids_all, dtype=np.uint32)
        offs = np.asarray(offsets, dtype=np.int64)
        token_hash = kd_format.tokenisation_hash(input_ids, offs, vocab)
        tokens_path = kd_dir / f"shard-{n:05d}.npz"
        np.savez(tokens_path, input_ids=input_ids, loss_mask=np.asarray(mask_all, dtype=np.uint8), offsets=offs)
        shards.append(Shard(tokens_path, kd_dir / f"shard-{n:05d}.kd", input_ids, np.asarray(mask_all, dtype=np.uint8), offs, token_hash))
    for stale in kd_dir.glob("shard-*"):  # a longer dataset's shards from an earlier attempt
        if int(stale.name[6:11]) >= len(shards):
            stale.unlink()
    return shards


class KDDataset(torch.utils.data.Dataset):
    """One item per sequence, with the matching rows of its shard's sidecar."""

    def __init__(self, shards: list[Shard]) -> None:
        self.items: list[tuple[Shard, int, int, np.ndarray, np.ndarray]] = []
        for s in shards:
            _, ids, lps = kd_format.read_sidecar(s.kd_path)
            for a, b in zip(s.offsets[:-1], s.offsets[1:], strict=True):
                self.items.append((s, int(a), int(b), ids, lps))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s, a, b, ids, lps = self.items[i]
        return {
            "input_ids": torch.from_numpy(s.input_ids[a:b].astype(np.int64)),
            "loss_mask": torch.from_numpy(s.loss_mask[a:b].astype(np.int64)),
            "kd_ids": torch.from_numpy(np.asarray(ids[a:b], dtype=np.int64)),
            "kd_logprobs": torch.from_numpy(np.asarray(lps[a:b], dtype=np.float32)),
        }


def collate(batch: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    longest = max(x["input_ids"].size(0) for x in batch)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        extra = longest - t.size(0)
        return F.pad(t, (0, 0, 0, extra) if t.dim() == 2 else (0, extra), value=value)

    return {
        "input_ids": torch.stack([pad(x["input_ids"], pad_id) for x in batch]),
        "attention_mask": torch.stack([pad(torch.ones_like(x["input_ids"]), 0) for x in batch]),
        "loss_mask": torch.stack([pad(x["loss_mask"], 0) for x in batch]),
        "kd_ids": torch.stack([pad(x["kd_ids"], 0) for x in batch]),
        "kd_logprobs": torch.stack([pad(x["kd_logprobs"], 0.0) for x in batch]),
    }


def collate_packed(batch: list[dict[str, torch.Tensor]], *, flash: bool = False, row_length: int | None = None, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch packed padding-free: sequences end to end, position_ids restarting at 0 for each.

    There is no attention mask: the attention kernel keeps the sequences apart and kd_losses drops the
    target at every sequence start, so nothing is predicted across a boundary.
    - flash: one row for the whole batch plus cu_seq_lens for the varlen kernels (cost Σ length²).
    - otherwise (SDPA, eager): transformers builds a block-diagonal mask from the position_ids, over the
      whole row; one long row would cost (Σ length)², so sequences are first-fit into rows of at most
      `row_length` tokens (the run's max_length) and a short row's padding tail is a sequence of its own
      (positions from 0, no loss), nothing attends to it; `row_tokens` says where each row's tail begins.
    """
    lengths = [x["input_ids"].size(0) for x in batch]
    keys = ("input_ids", "loss_mask", "kd_ids", "kd_logprobs")
    if flash or row_length is None:
        rows = [list(range(len(batch)))]
    else:
        rows = []
        room: list[int] = []  # the tokens left in each row
        for i, n in enumerate(lengths):
            slot = next((r for r, left in enumerate(room) if left >= n), None)
            if slot is None:
                rows.append([i])
                room.append(max(row_length, n) - n)
            else:
                rows[slot].append(i)
                room[slot] -= n
    longest = max(sum(lengths[i] for i in row) for row in rows)
    pad_value = {"input_ids": pad_id, "loss_mask": 0, "kd_ids": 0, "kd_logprobs": 0.0}
    out: dict[str, Any] = {}
    for key in keys:
        parts = []
        for row in rows:
            t = torch.cat([batch[i][key] for i in row])
            extra = longest - t.size(0)
            parts.append(F.pad(t, (0, 0, 0, extra) if t.dim() == 2 else (0, extra), value=pad_value[key]))
        out[key] = torch.stack(parts)
    out["position_ids"] = torch.stack([packed_positions([lengths[i] for i in row], longest) for row in rows])
    out[ROW_TOKENS] = torch.tensor([sum(lengths[i] for i in row) for row in rows])  # without the tail, for counting
    if flash:
        # Sequence boundaries for the varlen kernels, computed here on the CPU: derived from position_ids inside
        # the model they would cost a device-to-host sync in every layer.
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(lengths).cumsum(0)]).to(torch.int32)
        out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = cu
        out["max_length_q"] = out["max_length_k"] = max(lengths)
    return out


# The model inputs of a KD batch; the rest (loss_mask, kd_*) feed the loss only.
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def kd_losses(logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE, τ²·KL(q‖p_τ)) averaged over target positions. Position t predicts token t+1.

    Padded batches mask their padding with attention_mask; packed batches (position_ids, no attention mask)
    mask each target that starts a new sequence: the previous sequence's last token must not predict it."""
    logits = logits[:, :-1].float()
    targets = batch["input_ids"][:, 1:]
    mask = batch["loss_mask"][:, 1:].float()
    if "attention_mask" in batch:
        mask = mask * batch["attention_mask"][:, 1:].float()
    if "position_ids" in batch:
        mask = mask * (batch["position_ids"][:, 1:] != 0).float()
    denom = mask.sum().clamp(min=1.0)
    ce = (F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask).sum() / denom
    q = torch.softmax(batch["kd_logprobs"][:, :-1] / temperature, dim=-1)  # renormalised top-K at τ
    log_p = torch.log_softmax(logits / temperature, dim=-1).gather(-1, batch["kd_ids"][:, :-1])
    kl = (q * (torch.log(q.clamp(min=1e-12)) - log_p)).sum(-1)
    kd = temperature**2 * (kl * mask).sum() / denom
    return ce, kd


class KDTrainer(TokenCountingMixin, ServingConfigMixin, Trainer):
    def __init__(self, *args: Any, temperature: float, kd_weight: float, ce_weight: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.temperature, self.kd_weight, self.ce_weight = temperature, kd_weight, ce_weight
        self._kd_metrics: dict[str, list[float]] = defaultdict(list)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        if model.training:
            self.count_batch(inputs)
        # No KV cache in training: with one, transformers would not derive the packed block-diagonal mask.
        outputs = model(**{key: inputs[key] for key in MODEL_INPUTS if key in inputs}, use_cache=False)
        ce, kd = kd_losses(outputs.logits, inputs, self.temperature)
        self._kd_metrics["ce"].append(ce.item())
        self._kd_metrics["kd"].append(kd.item())
        loss = self.ce_weight * ce + self.kd_weight * kd
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # Trainer's `loss` is the weighted objective; Studio's `loss` is plain CE, beside `kd_loss`.
        if "loss" in logs and self._kd_metrics["ce"]:
            logs["objective"] = logs["loss"]
            logs["loss"] = float(np.mean(self._kd_metrics["ce"]))
            logs["kd_loss"] = float(np.mean(self._kd_metrics["kd"]))
            self._kd_metrics.clear()
        super().log(logs, start_time)


def check_teacher_tokenizer(ctx: Context, student: Any, teacher_ref: str) -> None:
    """The teacher must give every student token the same id: capture records the teacher's top-K by
    id and training reads them as the student's. Studio checks a local teacher at START; one from the
    Data Hub or the HF Hub is checked here, before the teacher is loaded (it trained on wrong ids)."""
    try:
        teacher = load_tokenizer(teacher_ref)
    except (OSError, ValueError) as exc:
        ctx.reporter.log(f"distill: the teacher's tokenizer could not be loaded to compare ({exc}); comparing vocabulary sizes only")
        return
    theirs = teacher.get_vocab()
    differ = [token for token, index in student.get_vocab().items() if theirs.get(token) != index]
    if differ:
        raise SpecError(f"config.distillation.teacher_model: the teacher's tokenizer differs from the student's ({len(differ)} tokens have "
                        f"other ids, e.g. {differ[0]!r}): distillation compares token ids, so pick a teacher of the student's family")


def run(ctx: Context) -> None:
    spec = ctx.spec
    dist = dict(spec.cfg("distillation", {}))
    k = int(dist.get("top_k") or 64)
    temperature = float(dist.get("temperature") or 1.0)
    kd_weight = float(0.5 if dist.get("kd_weight") is None else dist["kd_weight"])
    ce_weight = float(1.0 - kd_weight if dist.get("ce_weight") is None else dist["ce_weight"])
    tokenizer = load_tokenizer(spec.base_model, spec.base_model_revision)
    dataset = load_rows(spec.datasets, ctx.reporter.log)
    fmt = row_format(dataset)
    if fmt == "preference":
        raise SpecError("dataset: DISTILL needs SFT-shaped rows (messages, text or prompt/completion)")
    dataset = with_system_prompt(dataset, spec.cfg("system_prompt"))
    vocab_size = len(tokenizer)
    if k > vocab_size:  # a top-K wider than the vocabulary keeps every token: say so, the config still reads k
        ctx.reporter.log(f"capture: top_k {k} is more than the {vocab_size} tokens of the vocabulary; keeping all {vocab_size} (top_k={vocab_size})")
        k = vocab_size
    check_teacher_tokenizer(ctx, tokenizer, str(dist["teacher_model"]))

    ctx.reporter.stage("capture")
    kd_dir = capture_dir(spec, str(dist["teacher_model"]), k, ctx.device.precision)
    if fmt == "chat" and tokenizer.chat_template and not has_generation_markers(tokenizer.chat_template):
        ctx.reporter.log("distill: the chat template has no {% generation %} markers, so it cannot mark the assistant's turns: "
                         "the student learns whole conversations (system and user turns too)")
    row_length = max_length(spec, ctx.reporter.log)
    shards = tokenise_shards(dataset, fmt, tokenizer, row_length, kd_dir)
    n_tokens = sum(int(s.offsets[-1]) for s in shards)
    ctx.reporter.log(f"capture: {len(shards)} shard{'' if len(shards) == 1 else 's'}, {n_tokens} tokens, top_k={k}, sidecars ~{kd_format.expected_size(k, n_tokens) / 1e6:.1f} MB")
    capture_shards(ctx, shards, str(dist["teacher_model"]), k, vocab_size, fused=bool(spec.config.get("use_liger")))

    ctx.reporter.stage("train")
    ctx.reporter.log(f"distill: tau={temperature} kd_weight={kd_weight} ce_weight={ce_weight}")
    packing = bool(spec.cfg("packing", True))
    # The KD loss needs the student's logits, so liger (when on) must not swap in its fused linear cross-entropy.
    args = build_config(
        SFTConfig,
        ctx,
        max_length=row_length,
        remove_unused_columns=False,
        liger_kernel_config={"fused_linear_cross_entropy": False},
    )
    model = load_policy(spec, ctx.device, log=ctx.reporter.log)
    pad_id = tokenizer.pad_token_id
    flash = str(getattr(model.config, "_attn_implementation", "")).startswith("flash")
    layout = "one padding-free row per batch" if flash else f"padding-free rows of up to {row_length} tokens"
    ctx.reporter.log(f"distill: packing={f'on ({layout})' if packing else 'off (padded batches)'}")
    ref: list[Any] = []
    trainer = KDTrainer(
        model=model,
        args=args,
        train_dataset=KDDataset(shards),
        processing_class=tokenizer,  # saved with every step, as SFT/DPO/GRPO save theirs: a step loads alone
        data_collator=(lambda b: collate_packed(b, flash=flash, row_length=row_length, pad_id=pad_id)) if packing else (lambda b: collate(b, pad_id)),
        callbacks=[StudioCallback(ctx, ref)],
        temperature=temperature,
        kd_weight=kd_weight,
        ce_weight=ce_weight,
    )
    ref.append(trainer)
    train_and_finish(trainer, ctx, tokenizer)
