"""What a run's commits hold beside its weights (datahub.services commits them):

- on its branch run-<id>, with each checkpoint: metrics.jsonl and (GRPO) rollouts.jsonl up to that
  checkpoint's step, and training_config.json, so a run that is stopped or fails after a step still
  has them on its branch, not only through the API;
- in the model repo it publishes: training_config.json and the model card README.md, which names
  each input with the commit START pinned it to and the settings it trained with.
"""

from __future__ import annotations

import json
from typing import Any

from datahub.refs import RESERVED_NAMESPACES
from training.methods import get_method
from training.refs import HF_ID, ref_kind

CARD_METRICS = ("loss", "eval_loss", "reward", "kd_loss")

# rollouts.jsonl holds the run's rollouts in step order up to this size: a GRPO run stores every
# completion it made (no cap in the database), and each checkpoint commits the file again. Once cut,
# later commits store the same bytes (one blob); GET .../rollouts serves them all.
ROLLOUTS_FILE_BYTES = 16 * 1024 * 1024


def metrics_export(run, up_to_step: int) -> bytes:
    """The run's metric points up to `up_to_step`, one JSON object a line, by key then step."""
    from training.models import MetricPoint

    rows = MetricPoint.objects.filter(run=run, step__lte=up_to_step).order_by("key", "step").values_list("key", "step", "value")
    return "".join(json.dumps({"key": k, "step": s, "value": v}) + "\n" for k, s, v in rows.iterator()).encode()


def rollouts_export(run, up_to_step: int) -> tuple[bytes, int, int]:
    """The run's rollouts up to `up_to_step` as JSON lines in (step, id) order, cut at
    ROLLOUTS_FILE_BYTES: (the bytes, rollouts written, rollouts up to the step)."""
    from training.models import Rollout

    rows = Rollout.objects.filter(run=run, step__lte=up_to_step).order_by("step", "id")
    lines: list[bytes] = []
    size = 0
    for step, prompt, completion, reward, advantage, components in rows.values_list(
        "step", "prompt", "completion", "reward", "advantage", "components"
    ).iterator():
        line = (
            json.dumps({"step": step, "prompt": prompt, "completion": completion, "reward": reward, "advantage": advantage, "components": components}) + "\n"
        ).encode()
        if size + len(line) > ROLLOUTS_FILE_BYTES:
            return b"".join(lines), len(lines), rows.count()
        lines.append(line)
        size += len(line)
    return b"".join(lines), len(lines), len(lines)


def branch_files(run, checkpoint) -> tuple[dict[str, bytes], str]:
    """The files a checkpoint's commit on the run's branch carries beside its weights, and a note
    for the commit message ("" or why rollouts.jsonl is cut). Not for a Merge of an earlier step
    (datahub.services.is_earlier_merge): it lands at the branch's head, whose metrics are newer."""
    files = {"metrics.jsonl": metrics_export(run, checkpoint.step), "training_config.json": training_config(run, checkpoint)}
    note = ""
    if run.method == "grpo":
        files["rollouts.jsonl"], written, total = rollouts_export(run, checkpoint.step)
        if written < total:
            note = (
                f"\n\nrollouts.jsonl holds the first {written} of the {total} rollouts up to step {checkpoint.step} "
                f"(at most {ROLLOUTS_FILE_BYTES // 2**20} MiB); GET /api/training-runs/{run.pk}/rollouts lists them all."
            )
    return files, note


def final_metrics(run) -> dict[str, float]:
    """The last value of each headline metric the run logged (loss, reward, kd_loss...)."""
    from training.models import MetricPoint

    out = {}
    for key in CARD_METRICS:
        point = MetricPoint.objects.filter(run=run, key=key).order_by("-step").values_list("value", flat=True).first()
        if point is not None:
            out[key] = point
    return out


def _inputs(run, checkpoint) -> dict[str, Any]:
    """What the checkpoint's attempt trained with (its RunAttempt: the run may have been edited
    since), each Data Hub ref with the repo and commit START pinned it to."""
    from training.services import attempt_record

    source = attempt_record(run, checkpoint.attempt)
    pinned = source.pinned or {}
    config = source.config if isinstance(source.config, dict) else {}

    def described(field: str, value: str) -> dict[str, Any]:
        pin = pinned.get(field)
        if isinstance(pin, dict) and pin.get("ref") == value and pin.get("commit"):
            return {"ref": value, "kind": "data_hub", "repo": pin["repo"], "commit": pin["commit"]}
        kind = ref_kind(value)
        if kind == "hub" and value.partition("/")[0] in RESERVED_NAMESPACES:
            return {"ref": value, "kind": "builtin"}  # builtin/<name>@ref: the catalogue's or the engine's, never pinned
        return {"ref": value, "kind": {"path": "local_path", "hub": "data_hub"}.get(kind, "hf")}

    items = source.dataset if isinstance(source.dataset, list) else [source.dataset] if source.dataset else []
    datasets = []
    for i, item in enumerate(items):
        ref = item.get("ref") if isinstance(item, dict) else item
        if isinstance(ref, str):  # START let through only such entries
            entry = described(f"dataset[{i}]" if isinstance(source.dataset, list) else "dataset", ref)
            if isinstance(item, dict) and item.get("type"):
                entry["type"] = item["type"]
            datasets.append(entry)
    distillation = config.get("distillation")
    teacher = distillation.get("teacher_model") if isinstance(distillation, dict) else None
    environment = config.get("environment_id")
    ruler = run.method == "grpo" and config.get("rl_mode") == "ruler"
    ruler_args = config.get("ruler_task_args")
    ruler_dataset = ruler_args.get("dataset") if isinstance(ruler_args, dict) else None
    return {
        "base_model": described("base_model", source.base_model) if source.base_model else None,
        "datasets": datasets,
        "teacher_model": described("config.distillation.teacher_model", teacher) if isinstance(teacher, str) and teacher else None,
        "environment": described("config.environment_id", environment)
        if run.method == "grpo" and not ruler and isinstance(environment, str) and environment
        else None,
        "ruler_dataset": described("config.ruler_task_args.dataset", ruler_dataset) if ruler and isinstance(ruler_dataset, str) else None,
        "config": config,
        "compute": source.compute if isinstance(source.compute, dict) else {},
    }


def run_url(run) -> str:
    return f"{studio_url()}/training/runs/{run.pk}/"


def training_config(run, checkpoint) -> bytes:
    """training_config.json: the method, inputs with their pins, config and compute the checkpoint's
    attempt trained with, as plain JSON (the branch's training_args.bin is TRL's pickle)."""
    record = {
        "studio_run_id": run.pk,
        "studio_run_url": run_url(run),
        "name": run.name,
        "method": run.method,
        "attempt": checkpoint.attempt,
        "step": checkpoint.step,
        "weights": checkpoint.kind,
        "resumed_from": _resumed_from(run),
        **_inputs(run, checkpoint),
    }
    return (json.dumps(record, indent=2, sort_keys=False) + "\n").encode()


def _named(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "none"
    if entry.get("commit"):
        return f"{entry['ref']} (pinned {entry['repo']}@{entry['commit'][:12]})"
    notes = {"local_path": "local path, not versioned", "hf": "Hugging Face id, not pinned", "data_hub": "not pinned", "builtin": "built in, not versioned"}
    return f"{entry['ref']} ({notes[entry['kind']]})"


def card_base_model(base: dict[str, Any] | None) -> list[str]:
    """The card's `base_model:` front matter: only a value the Hub's model tree reads as a repo id.
    An HF id as it is; a Data Hub ref as the repo id it was pinned to (`demo/demo-student`), which
    resolves only against this Studio's /hub (HF_ENDPOINT), as the comment says. A local path, or a
    ref that was not pinned, has none: the card's body names it."""
    if base is None:
        return []
    if base["kind"] == "hf" and HF_ID.match(base["ref"]):
        return [f"base_model: {base['ref']}"]
    if base.get("commit") and HF_ID.match(base["repo"]):
        return [f"# a Data Hub repo: resolves with HF_ENDPOINT={studio_url()}/hub, at commit {base['commit']}", f"base_model: {base['repo']}"]
    return []


def studio_url() -> str:
    from django.conf import settings

    return getattr(settings, "STUDIO_PUBLIC_URL", "").rstrip("/")


def _lora(config: dict[str, Any]) -> str:
    if config.get("lora_rank") is None and not config.get("lora"):
        return "none (full fine-tune)"
    rank = config.get("lora_rank")
    alpha = config.get("lora_alpha")
    return f"rank {rank}" + (f", alpha {alpha:g}" if isinstance(alpha, int | float) else "") + (", 4-bit base (QLoRA)" if config.get("load_in_4bit") else "")


def _resumed_from(run) -> dict[str, Any] | None:
    """The run and saved step a run made with "resume from here" continues (every attempt of it starts
    there), None for a run trained from its base. The step is None once that checkpoint was deleted."""
    if run.parent_id is None and run.resume_checkpoint_id is None:
        return None
    checkpoint = run.resume_checkpoint if run.resume_checkpoint_id else None
    return {"run": checkpoint.run_id if checkpoint else run.parent_id, "step": checkpoint.step if checkpoint else None}


def _steps(run, checkpoint) -> str:
    """How far the weights are trained: a resumed run's step numbers go on from the step it resumed."""
    resumed = _resumed_from(run)
    if resumed is None:
        return f"steps trained: {checkpoint.step}"
    if resumed["step"] is None:
        return f"trained to step {checkpoint.step} (resumed from a checkpoint of run #{resumed['run']} that was deleted since)"
    if checkpoint.step <= resumed["step"]:
        return f"trained to step {checkpoint.step} (none in this run, resumed from run #{resumed['run']} step {resumed['step']})"
    return f"trained to step {checkpoint.step} (steps {resumed['step'] + 1}–{checkpoint.step} in this run, resumed from run #{resumed['run']} step {resumed['step']})"


def model_card(run, checkpoint, source_branch: str) -> str:
    """The published model repo's README.md: front matter the Hub reads, then the run's provenance
    (each input with its pinned commit), its settings and its final metrics."""
    inputs = _inputs(run, checkpoint)
    config = inputs["config"]
    lines = [
        "---",
        *card_base_model(inputs["base_model"]),
        "library_name: transformers",
        f"tags: [studio, {run.method}]",
        "---",
        "",
        f"# {run.name}",
        "",
        f"Fine-tuned by Studio run #{run.pk}.",
        "",
        f"- **Base model:** {_named(inputs['base_model']) if inputs['base_model'] else 'unknown'}",
        f"- **Method:** {run.method}",
    ]
    if inputs["datasets"] or not (inputs["environment"] or inputs["ruler_dataset"]):
        lines.append(f"- **Datasets:** {', '.join(_named(d) for d in inputs['datasets']) or 'none'}")
    if inputs["teacher_model"]:
        lines.append(f"- **Teacher:** {_named(inputs['teacher_model'])}")
    if inputs["environment"]:
        lines.append(f"- **Environment (rewards and prompts):** {_named(inputs['environment'])}")
    if inputs["ruler_dataset"]:
        lines.append(f"- **Rewards:** RULER judge, prompts from {_named(inputs['ruler_dataset'])}")
    lines += [
        f"- **Weights:** {checkpoint.kind} (step {checkpoint.step}, attempt {checkpoint.attempt})",
        f"- **Run:** [{run.name}]({run_url(run)})",
        f"- **Source branch:** {source_branch}",
        "",
        "## Training settings",
        "",
    ]
    method = get_method(run.method)
    lines += (
        [f"- {key}: {json.dumps(value, ensure_ascii=False)}{' (default)' if default else ''}" for key, value, default in method.settings(config)]
        if method
        else []
    )
    lines += [
        f"- LoRA: {_lora(config)}",
        f"- {_steps(run, checkpoint)}",
        f"- compute: {json.dumps(inputs['compute'], sort_keys=True) if inputs['compute'] else 'the Studio default'}",
        "",
        "Every setting the run stored is listed. One marked (default) holds the value the Studio fills in when the setting is left "
        "out (a setting given that same value reads the same); a setting not listed was the trainer's own default. "
        "training_config.json has every setting and input as the run stored them.",
        "",
        "## Final metrics",
        "",
    ]
    lines += [f"- {k}: {v:.4g}" for k, v in final_metrics(run).items()] or ["No metrics logged."]
    return "\n".join(lines) + "\n"
