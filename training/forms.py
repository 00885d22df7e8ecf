"""The NEW RUN form: the posted fields → create_run's arguments, and the DISTILL planning aids
(storage estimate, "does the teacher fit on one card"). Validation itself stays in
training/validation.py: this module only turns strings into typed values."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.http import QueryDict

from studio.errors import ApiError, Finding
from training.compute import GPU_MEMORY_GIB, parse_accelerators
from training.dataset_tokens import dataset_tokens
from training.methods.base import Draft
from training.refs import DATASET_TYPES, check_dataset, dataset_entries, local_model_dir

METHOD_CHOICES = [("sft", "SFT"), ("dpo", "DPO"), ("grpo", "GRPO"), ("distill", "DISTILL")]
PRECISION_CHOICES = [("", "Default (bf16 on a GPU, fp32 on the CPU)"), ("bf16", "BF16"), ("fp8", "FP8"), ("nvfp4", "NVFP4")]
BACKEND_CHOICES = [("local", "local"), ("dstack", "dstack"), ("modal", "Modal")]
RL_MODE_CHOICES = [("environment", "Environment"), ("ruler", "RULER")]
JUDGE_MODE_CHOICES = [("external", "External (your endpoint + API key)"), ("colocated", "Colocated (vLLM on the fleet)")]
# Issue 8's GPU throughput levers. "Default" writes no key at all, so a run made without touching them
# has exactly the config it had before these fields existed, and the engine's own default applies.
LIGER_CHOICES = [("", "Default (off)"), ("true", "On"), ("false", "Off")]
CHECKPOINTING_CHOICES = [("", "Default (auto)"), ("true", "On"), ("false", "Off")]
PACKING_CHOICES = [("", "Default (on)"), ("true", "On"), ("false", "Off")]
ROLLOUT_ENGINE_CHOICES = [("", "Default (auto)"), ("static", "Static"), ("generate", "Generate")]
PERFORMANCE_FIELDS = ("config.use_liger", "config.gradient_checkpointing", "config.packing", "config.rollout_engine")
# Selects whose options are the only values they can show: a stored value outside them (precision
# fp32, gradient_checkpointing "auto") stays in the YAML box when a run is edited, so saving keeps it.
SELECT_CHOICES = {
    "config.precision": PRECISION_CHOICES, "config.use_liger": LIGER_CHOICES, "config.gradient_checkpointing": CHECKPOINTING_CHOICES,
    "config.packing": PACKING_CHOICES, "config.rollout_engine": ROLLOUT_ENGINE_CHOICES,
}

# Form field → type. Dotted names are the config/compute paths the validator's findings use.
# "tristate" is a Default / On / Off select: "" leaves the key out, "true" / "false" write the bool.
COMMON_FIELDS = {
    "config.max_steps": "int", "config.learning_rate": "float", "config.precision": "str",
    "config.use_liger": "tristate", "config.gradient_checkpointing": "tristate",
    "compute.backend": "str", "compute.accelerators": "str", "compute.spot": "bool", "compute.region": "str",
}
# Every method's but GRPO's, which refuses them (training/methods/grpo.py UNUSED_BY_GRPO): its form hides them.
EPOCH_BATCH_FIELDS = {"config.num_epochs": "float", "config.per_device_train_batch_size": "int", "config.gradient_accumulation_steps": "int"}
# Held-out evaluation, SFT's and DPO's (training.validation.EVAL_METHODS): one eval dataset ref here; a
# list of them, or {ref, type}, in the YAML box.
EVAL_FIELDS = {"config.eval_split": "float", "config.eval_dataset": "str", "config.eval_steps": "int"}
METHOD_FIELDS: dict[str, dict[str, str]] = {
    "sft": {"config.packing": "tristate", **EVAL_FIELDS},
    "dpo": {**EVAL_FIELDS, "config.loss.type": "str", "config.loss.dpo_beta": "float", "config.loss.reference_free": "bool",
            "config.loss.target_margin": "float", "config.loss.length_norm": "bool", "config.loss.span_mask": "bool"},
    "distill": {"config.distillation.teacher_model": "str", "config.distillation.top_k": "int", "config.distillation.temperature": "float",
                "config.distillation.kd_weight": "float", "config.distillation.ce_weight": "float", "config.packing": "tristate"},
    "grpo": {"config.rl_mode": "str", "config.inference_blocks": "int", "config.trainer_blocks": "int",
             "config.rollouts_per_prompt": "int", "config.kl_coef": "float", "config.max_response_length": "int",
             "config.rollout_engine": "str"},
}
# GRPO's fields that the fit estimate's answer can swap in (#grpo-numbers), having fitted the length.
GRPO_NUMBER_FIELDS = ("config.rollouts_per_prompt", "config.kl_coef", "config.max_response_length")
GRPO_MODE_FIELDS = {
    "environment": {"config.environment_id": "str"},
    "ruler": {"config.ruler_task_args.dataset": "str", "config.ruler_task_args.system_prompt": "str", "config.judge.mode": "str",
              "config.judge.endpoint": "str", "config.judge.model": "str", "config.judge.api_key_secret": "str", "config.judge_blocks": "int"},
}
TOP_FIELDS = ("name", "method", "experiment", "base_model", "dataset", "dataset_type", "config_text")
DATASET_TYPE_CHOICES = [("", "Not set (the method's default)")] + [(t, t) for t in DATASET_TYPES]
DEFAULT_CONFIG_TEXT = {
    "sft": "# Adapter: LoRA rank (delete for a full fine-tune; add load_in_4bit: true for QLoRA)\nlora_rank: 16\n",
    "dpo": "# DPO needs LoRA: the frozen base is the reference\nlora_rank: 16\n",
    # Seed 002: GRPO full-finetunes by default, and its default learning rate (1e-6) is sized for that.
    "grpo": "# Full fine-tune (GRPO's default). For LoRA adapters add lora_rank: 16 and a LoRA-scale learning rate (e.g. 2e-5)\n",
    "distill": "lora_rank: 16\n",
}
# GRPO's environment as the form first shows it: a value, not a placeholder, so a run made from the
# untouched form names one (the engine's builtin arithmetic task, which Quick try fills in as well).
DEMO_ENVIRONMENT = "builtin/arith@main"
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "dpo": {"config.loss.type": "dpo", "config.loss.dpo_beta": "0.1"},
    "distill": {"config.distillation.top_k": "64", "config.distillation.temperature": "1.0", "config.distillation.kd_weight": "0.5"},
    "grpo": {"config.rl_mode": "environment", "config.environment_id": DEMO_ENVIRONMENT, "config.rollouts_per_prompt": "8", "config.kl_coef": "0.0",
             "config.max_response_length": "2048", "config.judge.mode": "external"},
}

# What a blank learning rate trains at: TRL's default for the method's config (the engine's for GRPO).
LEARNING_RATE_DEFAULTS = {"sft": "2e-5", "dpo": "1e-6", "grpo": "1e-6", "distill": "2e-5"}

# GRPO's "Quick try" preset: seed 002's defaults (8 × up-to-2048-token rollouts) take minutes a step on a
# CPU. These finish 40 steps on the tiny demo model in seconds, and with a full fine-tune the arith reward
# rises from ≈ 0.15 to ≈ 0.5 (tests/test_local_training.py). With LoRA it stays flat there: the demo
# model's random output layer gives near-uniform logits that only the (unadapted) head could sharpen.
GRPO_QUICK_TRY = {"config.rollouts_per_prompt": "8", "config.max_response_length": "8", "config.max_steps": "40", "config.learning_rate": "2e-2"}


def fit_response_length(values: dict[str, Any], project=None) -> str:
    """GRPO's default max_response_length (2048) where the base model attends over no more positions
    (the demo model's 512): START refuses it, so the field holds half the model's positions instead,
    the other half left for the prompt, and `fitted_response_length` (a hidden input) remembers that
    length. Only the untouched default changes, or a length fitted so and left as it was: another base
    model fits it again, and one with more positions brings the default back. A length the user typed
    stays. Returns the field's note saying so ("" when nothing is fitted)."""
    default = METHOD_DEFAULTS["grpo"]["config.max_response_length"]
    length = str(values.get("config.max_response_length") or "").strip()
    fitted = str(values.pop("fitted_response_length", "") or "").strip()
    if values.get("method") != "grpo" or length not in {default, fitted or default}:
        return ""
    from training.validation import context_limit  # validation reads forms' Data Hub helpers

    values["config.max_response_length"] = default
    base_model = (values.get("base_model") or "").strip()
    known = context_limit(base_model, project) if base_model else None
    if known is None or known[1] > int(default):
        return ""
    values["config.max_response_length"] = values["fitted_response_length"] = str(max(known[1] // 2, 1))
    return (f"{base_model} attends over {known[1]} positions, too few for the default {default}: "
            f"this starts at half of them, the rest left for the prompt.")


def fields_for(method: str, rl_mode: str | None = None) -> dict[str, str]:
    out = {**COMMON_FIELDS, **METHOD_FIELDS.get(method, {})}
    if method == "grpo":
        out.update(GRPO_MODE_FIELDS.get(rl_mode or "environment", {}))
    else:
        out.update(EPOCH_BATCH_FIELDS)
    return out


def all_field_names(method: str, rl_mode: str | None = None) -> set[str]:
    return set(TOP_FIELDS) | set(fields_for(method, rl_mode))


def finding_fields(values: dict[str, Any], method: str) -> set[str]:
    """The fields the form shows findings beside (studio.views.errors_by_field): the method's, less
    each one left empty whose key the config box sets. The value checked is then the box's, so its
    finding goes under the box with its path ("config.use_liger: ..."), not under a field that shows
    Default and says nothing of where the value came from."""
    typed, _ = parse_config_text(values.get("config_text") or "")
    return {name for name in all_field_names(method, values.get("config.rl_mode"))
            if values.get(name) not in (None, "") or not name.startswith("config.") or not sets_path(typed, name.removeprefix("config."))}


def sets_path(config: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def initial_values(method: str = "sft", experiment: str = "") -> dict[str, Any]:
    return {"method": method, "experiment": experiment, "compute.backend": "local", "compute.accelerators": "CPU",
            "config_text": DEFAULT_CONFIG_TEXT.get(method, ""), **METHOD_DEFAULTS.get(method, {})}


def other_methods_values(values: dict[str, Any], method: str) -> list[tuple[str, Any]]:
    """What was typed in the cards of other methods than `method`, which the picker's swap removes:
    carried along as hidden inputs, so switching DPO → SFT → DPO keeps β and reference-free instead of
    starting from the defaults again. The form reads only the picked method's fields on submit."""
    shown = fields_for(method, values.get("config.rl_mode"))
    others = {name for fields in (*METHOD_FIELDS.values(), *GRPO_MODE_FIELDS.values(), EPOCH_BATCH_FIELDS) for name in fields}
    return [(name, values[name]) for name in sorted(others - set(shown)) if values.get(name) not in (None, "")]


def holds_default_config(values: dict[str, Any]) -> bool:
    """Whether the config box is empty or holds a method's default text, which the picker replaces."""
    text = (values.get("config_text") or "").replace("\r\n", "\n")
    return not text.strip() or text in DEFAULT_CONFIG_TEXT.values()


def with_method_defaults(values: dict[str, Any], method: str) -> dict[str, Any]:
    """Switching the picker: keep what was typed, fill the new method's card with its defaults."""
    merged = {**METHOD_DEFAULTS.get(method, {}), **{k: v for k, v in values.items() if v not in (None, "")}}
    if holds_default_config(values):
        merged["config_text"] = DEFAULT_CONFIG_TEXT.get(method, "")
    merged["method"] = method
    return merged


def set_path(target: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            return
    target[leaf] = value


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class ConfigLoader(yaml.SafeLoader):
    """YAML as the config box reads it. Three departures from PyYAML's YAML 1.1:
    - `2e-4` is a number (YAML 1.2, JSON and Python agree; 1.1 wants `2.0e-4` and read it as the text
      "2e-4", so `learning_rate: 2e-4` was refused as not a number);
    - no aliases (`*name`): a few lines of nested aliases expand into billions of values, and walking
      them held a web worker for minutes. A run's config has no use for them;
    - a key given twice in one mapping is an error (YAML 1.2 says so; PyYAML kept the last, as the
      API's JSON reader refuses)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"aliases (*{event.anchor}) are not allowed in a run's config: write the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                continue  # an unhashable key is super()'s ConstructorError
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} appears twice in one mapping: keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


@dataclass
class ParsedRun:
    values: dict[str, Any]  # what was posted, to show again
    kwargs: dict[str, Any] = field(default_factory=dict)  # create_run's keyword arguments
    findings: list[Finding] = field(default_factory=list)  # what could not even be parsed


def parse_config_text(text: str) -> tuple[dict, list[Finding]]:
    if not text.strip():
        return {}, []
    try:
        data = yaml.load(text, Loader=ConfigLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        if isinstance(exc, (yaml.composer.ComposerError, yaml.constructor.ConstructorError)) and exc.problem and exc.problem.startswith(("aliases", "the key")):
            return {}, [Finding("config_text", f"{exc.problem}{where}")]
        return {}, [Finding("config_text", f"this is not valid YAML or JSON{where}: fix the syntax")]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [Finding("config_text", "the config must be a mapping of settings, e.g. lora_rank: 16")]
    return data, []


def same_setting(box: Any, field: Any) -> bool:
    """Whether the config box and a form field say the same: 8 and 8.0 do, True and 1 do not."""
    return box == field and isinstance(box, bool) == isinstance(field, bool)


def box_conflicts(box: dict, fields: dict, prefix: str = "") -> list[Finding]:
    """The keys that both the config box and the form's fields set, to different values. One of the
    two would be silently dropped (the box's `max_steps: 0`, say, never even validated), so the form
    is refused until they agree; a key both set to the same value is fine."""
    findings = []
    for key, value in fields.items():
        if key not in box:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(box[key], dict):
            findings += box_conflicts(box[key], value, f"{path}.")
        elif not same_setting(box[key], value):
            where = f"the form's fields under config.{path}" if isinstance(value, dict) else f"the form's field config.{path}"
            findings.append(Finding("config_text", (
                f"{path} is {json.dumps(box[key], default=str)} here but {json.dumps(value, default=str)} in {where}: "
                f"remove {path} from this box or change the field, so that one value is left")))
    return findings


def parse_run_form(data: QueryDict) -> ParsedRun:
    values: dict[str, Any] = {k: data.get(k, "") for k in data.keys() if k != "csrfmiddlewaretoken"}
    method = values.get("method", "")
    parsed = ParsedRun(values=values)
    config, parsed.findings = parse_config_text(values.get("config_text", ""))
    compute: dict[str, Any] = {}
    form_config: dict[str, Any] = {}
    for name, kind in fields_for(method, values.get("config.rl_mode")).items():
        raw: Any = (values.get(name) or "").strip() if kind != "bool" else values.get(name)  # text, or a checkbox's value as sent
        if kind == "bool":
            if raw:
                value: Any = True
            elif name == "compute.spot":
                value = False
            else:
                continue
        elif raw == "":
            continue
        elif kind == "tristate":
            if raw not in ("true", "false"):
                parsed.findings.append(Finding(name, f"choose Default, On or Off, not {raw!r}"))
                continue
            value = raw == "true"
        elif kind == "int":
            try:
                value = int(raw)
            except ValueError:
                parsed.findings.append(Finding(name, f"give a whole number, not {raw!r}"))
                continue
        elif kind == "float":
            try:
                value = float(raw)
            except ValueError:
                parsed.findings.append(Finding(name, f"give a number, not {raw!r}"))
                continue
        else:
            value = raw
        root, _, rest = name.partition(".")
        set_path(compute if root == "compute" else form_config, rest, value)
    parsed.findings += box_conflicts(config, form_config)
    dataset = posted_dataset(values)
    parsed.kwargs = {
        "name": (values.get("name") or "").strip(),
        "method": method,
        "experiment": values.get("experiment") or None,
        "base_model": (values.get("base_model") or "").strip() or None,
        "dataset": dataset,
        # A key in both says the same in both (box_conflicts refuses the form otherwise).
        "config": deep_merge(config, form_config),
        "compute": compute,
    }
    if not parsed.kwargs["name"]:
        parsed.findings.append(Finding("name", "give the run a name"))
    return parsed


def dataset_from_fields(refs: str, kind: str) -> Any:
    """The Dataset field (one ref, or several separated by commas) and its entry type → a run's dataset."""
    kind = kind.strip()
    entries = [{"ref": ref, "type": kind} if kind else ref for ref in (r.strip() for r in refs.split(",")) if ref]
    return None if not entries else entries[0] if len(entries) == 1 else entries


def dataset_fields(dataset: Any) -> dict[str, str]:
    """A run's dataset as the Dataset fields show it, and, where they cannot show it exactly (entries
    of different types, an entry without a type written as {"ref": …}, a list of one entry), the
    dataset itself as JSON in `dataset_kept`: a copy or an edit submitted with those fields untouched
    keeps it (posted_dataset), instead of dropping the entries' types."""
    entries = dataset_entries(dataset)
    kinds = {entry.type or "" for entry in entries}
    fields = {"dataset": ", ".join(entry.ref for entry in entries), "dataset_type": kinds.pop() if len(kinds) == 1 else ""}
    if dataset_from_fields(fields["dataset"], fields["dataset_type"]) != dataset:
        fields["dataset_kept"] = json.dumps(dataset)
    return fields


def kept_dataset(values: dict[str, Any]) -> Any:
    """The dataset the form was filled with (`dataset_kept`) while the Dataset fields still show it as
    they did, else None. A value that is not a dataset as dataset_fields wrote it counts as changed:
    the fields, which the user sees, win."""
    try:
        kept = json.loads(values.get("dataset_kept") or "null")
    except ValueError:
        return None
    if kept is None or check_dataset(kept):
        return None
    shown = dataset_fields(kept)
    return kept if all((values.get(k) or "").strip() == shown[k] for k in ("dataset", "dataset_type")) else None


def posted_dataset(values: dict[str, Any]) -> Any:
    """The run's dataset from the form: the one it was filled with while its fields are untouched,
    else what the Dataset fields say."""
    kept = kept_dataset(values)
    return kept if kept is not None else dataset_from_fields(values.get("dataset") or "", values.get("dataset_type") or "")


def kept_dataset_note(values: dict[str, Any]) -> str:
    """What the Dataset fields cannot show of the dataset they were filled with: each entry and its type."""
    kept = kept_dataset(values)
    if kept is None:
        return ""
    entries = ", ".join(f"{entry.ref} ({entry.type or 'type not set'})" for entry in dataset_entries(kept))
    return f"Kept as stored while these fields stay as they are: {entries}. Change them to replace it."


def draft_of_values(values: dict[str, Any], project=None) -> tuple[Draft, list[Finding]]:
    """The form's values as the validator sees a run, for the live GPU memory estimate, and what is
    wrong with the config box. Fields that do not parse are left out (the engine's defaults stand in),
    as create_run would never see them; a config box that does not parse is not left out: the estimate
    of an empty box would be for another run."""
    parsed = parse_run_form(values)  # type: ignore[arg-type]  # a dict answers keys() and get() like a QueryDict
    kwargs = parsed.kwargs
    method = kwargs["method"] if kwargs["method"] in dict(METHOD_CHOICES) else "sft"
    draft = Draft(method=method, base_model=kwargs["base_model"], dataset=kwargs["dataset"], config=kwargs["config"],
                  compute=kwargs["compute"], project=project)
    return draft, [finding for finding in parsed.findings if finding.field == "config_text"]


def shown_value(name: str, kind: str, value: Any) -> Any:
    """A stored value as its form field shows it, or None when the field has no way to show it."""
    if kind == "bool":
        return True if value is True else None  # an unticked box posts nothing: a stored false stays in the YAML box
    if kind == "tristate":
        return ("true" if value else "false") if isinstance(value, bool) else None
    if isinstance(value, (list, dict)):
        return None  # a list of eval datasets, say: the YAML box shows it
    text = "" if value is None else str(value)
    if name in SELECT_CHOICES and text not in {key for key, _ in SELECT_CHOICES[name] if key}:
        return None
    return text


def performance_open(values: dict[str, Any], errors: dict[str, list[str]] | None = None) -> bool:
    """Open the collapsed Performance (GPU) fieldset when it holds a choice or a finding to see."""
    return any(values.get(name) not in (None, "") or (errors or {}).get(name) for name in PERFORMANCE_FIELDS)


def values_from_run(run) -> dict[str, Any]:
    """The form's values for an existing run: known fields pulled out, the rest as YAML."""
    config = json.loads(json.dumps(run.config or {}))
    values: dict[str, Any] = {"name": run.name, "method": run.method, "experiment": str(run.experiment_id),
                              "base_model": run.base_model, **dataset_fields(run.dataset)}
    for name, kind in fields_for(run.method, config.get("rl_mode")).items():
        root, _, rest = name.partition(".")
        source = run.compute if root == "compute" else config
        *parents, leaf = rest.split(".")
        holder = source
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and leaf in holder:
            shown = shown_value(name, kind, holder[leaf])
            if shown is None:
                continue  # the field cannot show it: it stays in the YAML box, so saving keeps it
            values[name] = shown
            if root == "config":
                holder.pop(leaf)
    for key in [k for k, v in config.items() if v == {}]:
        config.pop(key)
    values["config_text"] = yaml.safe_dump(config, sort_keys=True) if config else ""
    return values


NUMBERED_NAME = re.compile(r"^(?P<base>.*) \((?P<n>\d{1,6})\)$")
RESUMED_NAME = re.compile(r" \(from step \d+\)$")  # checkpoints.resume_run's suffix: a copy trains from step 0


def like_name(project, name: str) -> str:
    """A name for a copy of run `name` that no run of `project` has: "name (2)", "name (3)"...;
    the copy of "name (2)" is "name (3)", and of a resumed "name (from step 3)", "name (2)": a copy does not resume."""
    from training.models import TrainingRun

    name = RESUMED_NAME.sub("", name) or name
    match = NUMBERED_NAME.match(name)
    base, n = (match["base"], int(match["n"]) + 1) if match else (name, 2)
    taken = set(TrainingRun.objects.filter(project=project, name__startswith=base[:150]).values_list("name", flat=True))
    while True:
        suffix = f" ({n})"
        candidate = base[:200 - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


# ---- DISTILL planning aids ---------------------------------------------------------------------

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float8_e4m3fn": 1, "fp8": 1, "int8": 1, "int4": 0.5}
SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([bBmM])(?![A-Za-z0-9])")


# Seed 001's example dataset size: the estimate falls back to it, and says so, when the dataset's own
# tokens are neither given nor readable here (an HF id, a ref that does not resolve yet).
SEED_DATASET_TOKENS = 295_000


@dataclass(frozen=True)
class EstimateTokens:
    tokens: Any  # as typed, or counted
    source: str  # where the figure comes from, as the estimate shows it
    fallback: bool = False  # seed 001's figure, not this dataset's


def estimate_tokens(values: dict[str, Any], project=None) -> EstimateTokens:
    """The dataset tokens the storage estimate prices: the number typed in the form, the chosen
    dataset's own count, or (labelled as such) seed 001's figure."""
    typed = str(values.get("distill_tokens") or "").strip()
    if typed:
        return EstimateTokens(typed, "as given in the form")
    dataset = posted_dataset(values)
    counted = dataset_tokens(project, dataset, (values.get("base_model") or "").strip() or None)
    if counted is not None:
        return EstimateTokens(counted.tokens, counted.source)
    why = "the Studio cannot read the chosen dataset here" if dataset else "no dataset is chosen yet"
    return EstimateTokens(SEED_DATASET_TOKENS, f"an example figure (a small chat dataset's), not this dataset's: {why}; give the dataset's tokens above", fallback=True)


def distill_storage_estimate(values: dict[str, Any], project=None) -> dict[str, Any] | None:
    tokens = estimate_tokens(values, project)
    estimate = storage_estimate(values.get("config.distillation.top_k"), tokens.tokens)
    return {**estimate, "tokens_source": tokens.source, "fallback": tokens.fallback} if estimate else None


def storage_estimate(top_k: Any, tokens: Any) -> dict[str, Any] | None:
    """Seed 001: a .kd sidecar holds ≈ 6 × top_k bytes per token."""
    try:
        k, n = int(top_k), int(float(tokens))
    except (TypeError, ValueError):
        return None
    if k < 1 or n < 1:
        return None
    per_token = 6 * k
    return {"top_k": k, "tokens": n, "bytes_per_token": per_token, "total_bytes": per_token * n}


def params_from_config(cfg: dict) -> int | None:
    """Approximate parameter count of a decoder-only transformer from its config.json."""
    cfg = cfg.get("text_config", cfg)
    h, layers, vocab = cfg.get("hidden_size"), cfg.get("num_hidden_layers"), cfg.get("vocab_size")
    if not (isinstance(h, int) and isinstance(layers, int) and isinstance(vocab, int) and min(h, layers, vocab) > 0):
        return None
    heads = cfg.get("num_attention_heads") or max(1, h // 64)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    attention = h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim
    intermediate = cfg.get("intermediate_size") or 4 * h
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    gated = cfg.get("model_type") not in ("gpt_neox", "gpt2", "opt")
    mlp_one = (3 if gated else 2) * h * (cfg.get("moe_intermediate_size") or intermediate if experts else intermediate)
    mlp = mlp_one * experts if experts else mlp_one
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return int(layers * (attention + mlp) + embeddings)


def hub_ref_tree(project, ref: str) -> dict | None:
    """The files (path → blob) of the commit a Data Hub ref of `project` resolves to; None if it does not."""
    from datahub.refs import parse_ref
    from datahub.repos import tree

    try:
        _, commit = parse_ref(project, ref, "ref")
    except ApiError:
        return None
    return tree(commit)


def hub_model_files(project, ref: str) -> tuple[dict, int | None] | None:
    """config.json and the weight files' total size of a Data Hub model ref; None if it does not resolve."""
    from datahub.storage import open_blob

    files = hub_ref_tree(project, ref)
    if files is None:
        return None
    cfg: dict = {}
    blob = files.get("config.json")
    if blob is not None and blob.size < 1_000_000:
        with open_blob(blob.storage_name) as fh:
            try:
                cfg = json.loads(fh.read())
            except ValueError:
                cfg = {}
    weights = sum(b.size for path, b in files.items() if "/" not in path and path.endswith((".safetensors", ".bin")))
    return cfg, weights or None


def footprint_from_config(cfg: dict, weights: int | None, source: str) -> dict[str, Any] | None:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or (cfg.get("text_config") or {}).get("torch_dtype") or "bfloat16").lower()
    per_param = DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    params = cfg.get("num_parameters") if isinstance(cfg.get("num_parameters"), int) else params_from_config(cfg)
    total = weights or (int(params * per_param) if params else None)
    if not total:
        return None
    return {"params": params, "dtype": dtype, "bytes": total, "source": source}


def teacher_footprint(teacher: str | None, project=None) -> dict[str, Any] | None:
    """Weight bytes of the teacher: from its config.json (params, dtype) and weight files when it
    resolves here (a local path, the HF cache, or a Data Hub repo@ref of `project`), else from a
    size in its name (e.g. "-32B"), assuming bf16."""
    if not teacher:
        return None
    found = None
    if "@" in teacher and project is not None:
        hub_files = hub_model_files(project, teacher)
        if hub_files is not None:
            found = footprint_from_config(hub_files[0], hub_files[1], "its config.json in the Data Hub")
    else:
        directory = local_model_dir(teacher)
        if directory is not None:
            try:
                cfg = json.loads((directory / "config.json").read_text())
            except (OSError, ValueError):
                cfg = {}
            weights = None
            index = directory / "model.safetensors.index.json"
            if index.is_file():
                try:
                    weights = int(json.loads(index.read_text())["metadata"]["total_size"])
                except (OSError, ValueError, KeyError, TypeError):
                    weights = None
            found = footprint_from_config(cfg, weights, "its config.json")
    if found:
        return found
    match = SIZE_IN_NAME.search(teacher.split("@")[0].rsplit("/", 1)[-1].replace("_", "-"))
    if match:
        params = float(match[1]) * (1e9 if match[2].lower() == "b" else 1e6)
        return {"params": int(params), "dtype": "bfloat16 (assumed)", "bytes": int(params * 2), "source": "the size in its name"}
    return None


def teacher_fit(teacher: str | None, accelerators: str | None, project=None) -> dict[str, Any] | None:
    """Does the teacher fit on ONE card of the selected GPU? Capture does not shard it (seed 001)."""
    footprint = teacher_footprint(teacher, project)
    if footprint is None:
        return None
    gib = footprint["bytes"] / 2**30
    accel = parse_accelerators(accelerators or "")
    gpu = accel.gpu_type if accel else None
    card = GPU_MEMORY_GIB.get(gpu or "")
    result = {**footprint, "gib": gib, "gpu": gpu, "card_gib": card, "too_large": False}
    # Weights alone above ~90% of the card leave no room for activations during capture.
    if card is not None and gib > 0.9 * card:
        result["too_large"] = True
        bigger = sorted((size, name) for name, size in GPU_MEMORY_GIB.items() if size * 0.9 > gib)
        result["suggestion"] = bigger[0][1] if bigger else None
    return result
