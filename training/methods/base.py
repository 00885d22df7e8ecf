"""What every training method shares: config key types, the LoRA contract, and the method base.

A method owns its config keys, its defaults, its create-time checks (400) and its pre-start
checks (422). Adding a method means adding a module and registering it in training/methods/__init__.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from studio.errors import Finding
from training.engine.spec import HEARTBEAT_INTERVAL_DEFAULT, HEARTBEAT_TIMEOUT_DEFAULT, HEARTBEAT_TIMEOUT_FLOOR, STUDIO_MANAGED, studio_managed_value
from training.keys import BOOL, EVAL_KEYS, INT0, INT1, NON_NEGATIVE, PRECISIONS, TEXT, Key, check_block, is_number, json_findings, shown  # noqa: F401 - re-exported for methods

TRL_FIELDS_FILE = Path(__file__).with_name("trl_fields.json")


@lru_cache(maxsize=1)
def trl_config_fields() -> dict[str, dict[str, Key]]:
    """The fields of TRL's config classes and the type of each, snapshotted so the web process never
    imports TRL (training/methods/trl_snapshot.py writes the file; tests/test_trl_snapshot.py checks it
    against the installed TRL)."""
    return {config: {name: trl_key(name, spec) for name, spec in fields.items()} for config, fields in json.loads(TRL_FIELDS_FILE.read_text()).items()}


def trl_key(name: str, spec: dict[str, Any]) -> Key:
    kind = spec["kind"]
    if kind == "str":
        return Key("str", nullable=spec["nullable"], hint="a string")
    # An integer TRL field is an int64 or smaller in the trainer: a bound against overflow, not a limit.
    low, high = TRL_BOUNDS.get(name, (None, None))
    if kind == "int" and high is None:
        high = 2**31 - 1
    hint = TRL_ABOVE_ZERO.get(name, "")
    return Key(kind, choices=tuple(spec.get("choices", ())), nullable=spec["nullable"], minimum=low, maximum=high, positive=bool(hint), hint=hint)


# Upper bounds catch values that parse but cannot run (a max_steps that never ends, an epoch count
# that overflows the trainer, a seed numpy refuses); the seeds' own limits are checked at START.
MAX_STEPS = 10**8
SEED_MAX = 2**32 - 1  # numpy.random.seed's range, which the trainer seeds from config.seed
COMMON_KEYS: dict[str, Key] = {
    "num_epochs": Key("number", minimum=0, positive=True, maximum=10_000, hint="a positive number of epochs, at most 10000"),
    "max_steps": Key("int", minimum=1, maximum=MAX_STEPS),
    "learning_rate": Key("number", minimum=0, positive=True, maximum=1, hint="a positive number, at most 1 (typical: 1e-5 to 1e-3)"),
    "per_device_train_batch_size": Key("int", minimum=1, maximum=65_536),
    "gradient_accumulation_steps": Key("int", minimum=1, maximum=65_536),
    "max_length": Key("int", minimum=1, maximum=2**22),
    "precision": Key("choice", choices=PRECISIONS),
    "seed": Key("int", minimum=0, maximum=SEED_MAX),
    "system_prompt": TEXT,
    "lora": BOOL,
    "lora_rank": Key("int", minimum=1, maximum=65_536, nullable=True),
    # Trained exactly as stored (training/engine/spec.py Spec.lora_alpha), a fraction included; 0 would scale the adapter to nothing.
    "lora_alpha": Key("number", minimum=0, positive=True, maximum=1e6, nullable=True,
                      hint="a number greater than 0 and at most 1000000 (the adapter is scaled by lora_alpha / lora_rank; default: lora_rank)"),
    "load_in_4bit": BOOL,
    "heartbeat_timeout_seconds": Key("int", minimum=1, maximum=7 * 24 * 3600),
    "heartbeat_interval_seconds": Key("int", minimum=1, maximum=24 * 3600),
    "save_steps": Key("int", minimum=1, maximum=MAX_STEPS),
    "logging_steps": Key("int", minimum=1, maximum=MAX_STEPS),
    # GPU throughput levers (issue 8). "auto" checkpoints activations only when the fit check says memory needs it.
    "use_liger": BOOL,
    "gradient_checkpointing": Key("auto_bool"),
    **EVAL_KEYS,  # SFT and DPO read them; GRPO and DISTILL refuse them at START, saying what to use instead
}

DEFAULT_LORA_RANK = 16


def lora_enabled(config: dict) -> bool:
    return bool(config.get("lora")) or config.get("lora_rank") is not None


ADAPTER_FIELDS = {"config.lora", "config.lora_rank", "config.lora_alpha", "config.load_in_4bit"}


def adapter_findings(config: dict) -> list[Finding]:
    """Adapter settings that train something else than they say: each would be taken and not obeyed."""
    findings = []
    if config.get("load_in_4bit") and not lora_enabled(config):
        findings.append(Finding("config.load_in_4bit", "QLoRA trains LoRA adapters on a 4-bit base: also set lora_rank (e.g. 16)"))
    if config.get("lora_alpha") is not None and not lora_enabled(config):
        findings.append(Finding("config.lora_alpha", "lora_alpha needs lora_rank: it scales a LoRA adapter, and without lora_rank the run is a full fine-tune; "
                                                     "also set lora_rank (e.g. 16), or remove lora_alpha"))
    if config.get("lora") is False and config.get("lora_rank") is not None:
        findings.append(Finding("config.lora", f"lora is false but lora_rank is {config['lora_rank']}, and a lora_rank trains a LoRA adapter: "
                                               "remove lora_rank (and lora_alpha) for a full fine-tune, or remove lora: false for LoRA"))
    return findings


# Keys whose rule create tightened after runs were stored with values it now refuses (lora_alpha 0 was
# taken and trained as the rank): START checks them again with the same Key, so a stored run cannot start
# with what create and PATCH refuse.
RECHECKED_AT_START = ("lora_alpha",)


def recheck_findings(config: dict) -> list[Finding]:
    return [f for key in RECHECKED_AT_START if key in config for f in COMMON_KEYS[key].check(f"config.{key}", config[key])]


def heartbeat_findings(config: dict) -> list[Finding]:
    """A heartbeat deadline a healthy run can miss (training/engine/spec.py HEARTBEAT_TIMEOUT_FLOOR says why
    these bounds): the Studio failed and killed the run as stopped."""
    timeout, interval = config.get("heartbeat_timeout_seconds"), config.get("heartbeat_interval_seconds") or HEARTBEAT_INTERVAL_DEFAULT
    if timeout is not None and timeout < HEARTBEAT_TIMEOUT_FLOOR:
        return [Finding("config.heartbeat_timeout_seconds", f"{timeout} s is under the {HEARTBEAT_TIMEOUT_FLOOR} s floor: a run loading its model or reporting "
                                                            f"to a slow Studio would be failed as stopped; use {max(HEARTBEAT_TIMEOUT_FLOOR, 2 * interval)} or more "
                                                            f"(default {HEARTBEAT_TIMEOUT_DEFAULT})")]
    if timeout is not None and timeout < 2 * interval:
        return [Finding("config.heartbeat_timeout_seconds", f"the engine sends a heartbeat every {interval} s (heartbeat_interval_seconds), so a {timeout} s "
                                                            f"deadline fails a run that misses one: set it to {2 * interval} or more, or heartbeat_interval_seconds "
                                                            f"to {timeout // 2} or less")]
    if timeout is None and HEARTBEAT_TIMEOUT_DEFAULT < 2 * interval:
        return [Finding("config.heartbeat_interval_seconds", f"a heartbeat every {interval} s misses the default {HEARTBEAT_TIMEOUT_DEFAULT} s deadline "
                                                             f"(heartbeat_timeout_seconds): use {HEARTBEAT_TIMEOUT_DEFAULT // 2} or less, "
                                                             f"or set heartbeat_timeout_seconds to {2 * interval} or more")]
    return []


_MISSING = object()


def _leaf_paths(config: dict, prefix: tuple = ()) -> list[tuple]:
    paths: list[tuple] = []
    for key, value in config.items():
        paths += _leaf_paths(value, (*prefix, key)) if isinstance(value, dict) and value else [(*prefix, key)]
    return paths


def _at(config: Any, path: tuple) -> Any:
    for key in path:
        if not isinstance(config, dict) or key not in config:
            return _MISSING
        config = config[key]
    return config


def _without(config: dict, path: tuple) -> dict:
    """A copy of `config` without the value at `path` (the dicts along it copied, the rest shared)."""
    head, *rest = path
    copy = dict(config)
    if rest:
        copy[head] = _without(copy[head], tuple(rest))
    else:
        del copy[head]
    return copy


def _same(a: Any, b: Any) -> bool:
    return a is not _MISSING and type(a) is type(b) and a == b  # True is not 1, 1.0 is not 1


@dataclass
class Draft:
    """A run as validation sees it: the create body, or a stored run (with its project)."""

    method: str
    base_model: str | None
    dataset: Any
    config: dict
    compute: dict
    project: Any = None
    # The commits a stored run's refs were pinned to before (training.services.earlier_pins): START's
    # finding for a ref whose repo was deleted since says so (datahub.refs.parse_ref).
    pinned: dict = field(default_factory=dict, repr=False, compare=False)
    # Answers computed once per draft and asked for twice (the fit check: START's findings and the
    # estimate beside the Start button).
    memo: dict = field(default_factory=dict, repr=False, compare=False)


# TRL fields the engine sets from a Studio key: passed through as well, one overrode the other and the
# run trained with a mix (GRPO's max_completion_length beside max_response_length was ignored by the
# rollouts and obeyed by the trainer). Each is refused naming the key to use.
TRL_ALIASES = {
    "num_train_epochs": "num_epochs", "use_liger_kernel": "use_liger", "activation_checkpointing": "gradient_checkpointing",
    "save_strategy": "save_steps", "use_cpu": "compute.accelerators", "bf16": "precision", "fp16": "precision",
}

# Ranges of TRL fields the trainer refuses outside them, after the job started (the snapshot has types only).
TRL_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "warmup_steps": (0, None), "dataloader_num_workers": (0, 64), "weight_decay": (0, None), "max_grad_norm": (0, None),
    "adam_beta1": (0, 1), "adam_beta2": (0, 1), "adam_epsilon": (0, None), "label_smoothing_factor": (0, 1),
    "save_total_limit": (0, None), "dataloader_prefetch_factor": (1, None),
    # GRPOConfig's sampling and generation batch: out of range, the run failed inside the trainer with a
    # message naming no field (a ZeroDivisionError for temperature 0, the static decoder's ValueError).
    "temperature": (0, None), "top_p": (0, 1), "top_k": (0, None), "min_p": (0, 1), "repetition_penalty": (0, None),
    "generation_batch_size": (1, None), "steps_per_generation": (1, None),
}
# Of TRL_BOUNDS, those whose lower bound 0 is itself refused, with how the message describes the range.
TRL_ABOVE_ZERO = {
    "temperature": "a number greater than 0 (default 1.0; lower samples closer to the most likely token)",
    "top_p": "a number greater than 0 and at most 1 (default 1.0, no nucleus filtering)",
    "repetition_penalty": "a number greater than 0 (default 1.0, no penalty)",
}

# Settings that need TRL's own evaluation, which the Studio does not run (its eval_split, eval_dataset and
# eval_steps set eval_strategy itself): they failed the run after it started.
NEEDS_EVAL = {
    "eval_strategy": lambda v: v != "no", "do_eval": bool, "load_best_model_at_end": bool,
    "lr_scheduler_type": lambda v: v == "reduce_lr_on_plateau",
}


class TrainingMethod:
    name: ClassVar[str]
    label: ClassVar[str]
    trl_config: ClassVar[str]
    trl_aliases: ClassVar[dict[str, str]] = {}  # the method's own, beside TRL_ALIASES
    keys: ClassVar[dict[str, Key]] = {}
    needs_dataset: ClassVar[bool] = True
    # option → the defaults it implies, filled in while the option is on (GRPO: use_unsloth's
    # max_prompt_length). They are stored like any default, and go with the option (see below).
    implied_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # Keys every method takes that this method's engine never reads, with what to use instead: taken and
    # stored, the trainer did something else. Refused with the type checks, so the form's estimate waits too.
    unread_keys: ClassVar[dict[str, str]] = {}

    def known_keys(self) -> dict[str, Key]:
        return {**COMMON_KEYS, **self.keys}

    def trl_keys(self) -> dict[str, Key]:
        """The fields of the method's TRL config a run may set, by type (the rest the Studio sets)."""
        aliases = {**TRL_ALIASES, **self.trl_aliases}
        return {name: key for name, key in trl_config_fields().get(self.trl_config, {}).items() if name not in STUDIO_MANAGED and name not in aliases}

    def check_types(self, config: dict) -> list[Finding]:
        not_json = json_findings("config", config)
        if not_json:
            return not_json  # the type checks below quote values as JSON
        findings: list[Finding] = []
        known = self.known_keys()
        passthrough = self.trl_keys()
        for name, value in config.items():
            if name in known:
                findings.extend(known[name].check(f"config.{name}", value))
            elif name in passthrough:
                found = passthrough[name].check(f"config.{name}", value)
                if not found and name in NEEDS_EVAL and NEEDS_EVAL[name](value):
                    found = [Finding(f"config.{name}", f"{shown(value)} needs an evaluation split of TRL's own, which the Studio does not run: remove it "
                                                       "(held-out evaluation is eval_split or eval_dataset, every eval_steps)")]
                elif not found and (instead := studio_managed_value(name, value)):
                    found = [Finding(f"config.{name}", f"{shown(value)} is refused: {instead}")]
                findings.extend(found)
            elif name in STUDIO_MANAGED:
                findings.append(Finding(f"config.{name}", f"the Studio sets this itself: {STUDIO_MANAGED[name]}; remove it"))
            elif name in (aliases := {**TRL_ALIASES, **self.trl_aliases}):
                findings.append(Finding(f"config.{name}", f"{self.label} sets TRL's {name} from {aliases[name]}: use {aliases[name]} instead"))
            else:
                findings.append(
                    Finding(
                        f"config.{name}",
                        f"{self.label} does not know this setting: remove it, or use a Studio key "
                        f"({', '.join(sorted(known))}) or a field of TRL's {self.trl_config}",
                    )
                )
        findings += [Finding(f"config.{key}", why) for key, why in self.unread_keys.items() if key in config]
        # A mistyped adapter key gets its own type error only: read as a truthy value, load_in_4bit: "yes"
        # also asked for a lora_rank, about a setting the user never made.
        if not any(f.field in ADAPTER_FIELDS for f in findings):
            findings += adapter_findings(config)
        if not any(f.field.startswith("config.heartbeat_") for f in findings):
            findings += heartbeat_findings(config)
        return findings

    def create_findings(self, draft: Draft) -> list[Finding]:
        """Method-specific 400s at create (and PATCH)."""
        return []

    def apply_defaults(self, config: dict) -> dict:
        """The config with the seeds' defaults filled in, so they are visible on the run."""
        config = dict(config)
        if config.get("lora") and config.get("lora_rank") is None:
            config["lora_rank"] = DEFAULT_LORA_RANK
        if config.get("lora_rank") is not None and config.get("lora_alpha") is None:
            config["lora_alpha"] = config["lora_rank"]
        for option, implied in self.implied_defaults.items():
            if config.get(option):
                for key, value in implied.items():
                    config.setdefault(key, value)
        return config

    def without_defaults(self, config: dict) -> dict:
        """A stored config less every value apply_defaults would fill in anyway, for a PATCH to merge
        into: a default that follows another setting (lora_alpha = lora_rank, ce_weight = 1 − kd_weight,
        an option's implied_defaults) is worked out again from the patched config instead of keeping
        the old one, and turning an option off takes its implied values with it. A value the user set
        to anything else stays (and is refused if it needs what was turned off). One the user set equal
        to its default cannot be told apart, and dropping it loses nothing: apply_defaults brings it back."""
        if not isinstance(config, dict):
            return config
        trimmed = config
        for path in _leaf_paths(config):
            if self.is_default(trimmed, path):
                trimmed = _without(trimmed, path)
        return trimmed

    def is_default(self, config: dict, path: tuple) -> bool:
        """Whether the value at `path` is the one apply_defaults fills in when it is left out. A run
        does not record whether its creator typed it: one set to its default reads the same."""
        return _same(_at(self.apply_defaults(_without(config, path)), path), _at(config, path))

    def settings(self, config: dict) -> list[tuple[str, Any, bool]]:
        """Every setting a stored config holds as (dotted key, value, is the default), by key; a
        block's settings each by its own key (`loss.dpo_beta`), an empty block as its value."""
        return sorted(((".".join(path), _at(config, path), self.is_default(config, path)) for path in _leaf_paths(config)), key=lambda item: item[0])

    def start_findings(self, draft: Draft) -> list[Finding]:
        """Method-specific 422s at START."""
        return []
