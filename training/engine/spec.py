"""The run spec: parsing and validation of the JSON that Studio's backend writes for one attempt.

Validation errors name the field (``config.loss.dpo_beta: ...``) so the run's error tells the user what to fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHODS = ("sft", "dpo", "grpo", "distill")
PRECISIONS = ("bf16", "fp8", "nvfp4", "fp32")
SEED_DEFAULT = 42  # seed 002's default for config.seed

# Product-contract config keys the engine interprets itself; they never pass through to a TRL config.
ENGINE_KEYS = {
    "num_epochs",
    "max_steps",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "precision",
    "seed",
    "system_prompt",
    "save_steps",
    "logging_steps",
    "lora",
    "lora_rank",
    "lora_alpha",
    "load_in_4bit",
    "loss",
    "distillation",
    "rl_mode",
    "environment_id",
    "ruler_task_args",
    "judge",
    "inference_blocks",
    "trainer_blocks",
    "judge_blocks",
    "rollouts_per_prompt",
    "kl_coef",
    "max_response_length",
    "rollout_log_steps",
    "heartbeat_interval_seconds",
    "heartbeat_timeout_seconds",
    "use_liger",
    "packing",
    "rollout_engine",
    "gradient_checkpointing",
    "use_unsloth",
    "max_prompt_length",
    # Held-out evaluation (SFT and DPO): the engine sets TRL's eval_strategy, eval_steps and eval batch from them.
    "eval_dataset",
    "eval_split",
    "eval_steps",
    "per_device_eval_batch_size",
}
EVAL_SPLIT_MAX = 0.5  # at most half the rows held out: the rest must still train
EVAL_METHODS = ("sft", "dpo")  # the methods that evaluate held-out rows

# seed 000: heartbeat_timeout means the worker really stopped (default 300 s). A healthy engine posts at
# least every heartbeat_interval_seconds, so a deadline needs room for one late or lost heartbeat (twice the
# interval) and for a heartbeat held up while the engine starts: imports and model loading hold the
# interpreter for seconds at a time, a retried post waits out a slow Studio, and the reconciler only looks
# every RECONCILE_INTERVAL_SECONDS (15). 60 s covers those; below it a live run was failed and killed.
HEARTBEAT_INTERVAL_DEFAULT = 10
HEARTBEAT_TIMEOUT_DEFAULT = 300
HEARTBEAT_TIMEOUT_FLOOR = 60


def heartbeat_interval(config: dict[str, Any]) -> float:
    return float(config.get("heartbeat_interval_seconds") or HEARTBEAT_INTERVAL_DEFAULT)


def heartbeat_timeout(config: dict[str, Any]) -> int:
    """The heartbeat deadline a run lives by: the Studio fails it after this much silence, and the engine
    retries its last reports as long. Create refuses a value under the floor or under twice the interval;
    one stored before it did is raised to them here, so the reconciler and the engine agree."""
    asked = int(config.get("heartbeat_timeout_seconds") or HEARTBEAT_TIMEOUT_DEFAULT)
    return max(asked, HEARTBEAT_TIMEOUT_FLOOR, int(2 * heartbeat_interval(config)))


_HUB = "what a run makes is committed to its Data Hub branch (run-<id>); nothing is pushed anywhere else"
_TRACKING = "metrics, logs and rollouts stream to the Studio"
_LOADING = "the engine loads the model itself, and runs no code from its repo"
_VLLM_SERVER = "a run's job reaches no vLLM server outside it (use vllm_mode: colocate)"
_DISTRIBUTED = "the engine spreads the model over the run's compute.accelerators itself, with no DeepSpeed, FSDP or Accelerate config of its own"
# TRL/transformers fields the Studio sets itself, or that would reach outside the run's folder and its
# Data Hub branch (another folder on the machine, another hub, a tracker, a server): refused at create,
# and never passed through by the engine (a spec from elsewhere). The value says what to do instead.
STUDIO_MANAGED = {
    "output_dir": "each run writes under its own folder, and its checkpoints go to its Data Hub branch",
    "resume_from_checkpoint": "resume from a saved step with POST /api/training-runs/{id}/checkpoints/{step}/resume (Resume on the Checkpoints tab)",
    "push_to_hub": _HUB, "hub_model_id": _HUB, "hub_token": _HUB, "hub_strategy": _HUB, "hub_private_repo": _HUB,
    "hub_always_push": _HUB, "hub_revision": _HUB, "log_completions_hub_repo": _HUB,
    "report_to": _TRACKING, "trackio_space_id": _TRACKING, "trackio_bucket_id": _TRACKING, "trackio_static_space_id": _TRACKING,
    "model_init_kwargs": _LOADING, "ref_model_init_kwargs": _LOADING, "teacher_model_init_kwargs": _LOADING, "trust_remote_code": _LOADING,
    "chat_template_path": "the engine uses the base model's own chat template: put the template in the base model's tokenizer_config.json (chat_template)",
    "deepspeed": _DISTRIBUTED, "fsdp": _DISTRIBUTED, "fsdp_config": _DISTRIBUTED, "accelerator_config": _DISTRIBUTED, "parallelism_config": _DISTRIBUTED,
    "logging_dir": _TRACKING,
    "vllm_server_host": _VLLM_SERVER, "vllm_server_port": _VLLM_SERVER, "vllm_server_base_url": _VLLM_SERVER, "vllm_group_port": _VLLM_SERVER,
}

# Values of a TRL field that would reach outside the run, the field's other values being fine; refused
# and ignored like STUDIO_MANAGED's fields. vllm_mode "server" sends rollouts to a vLLM server at
# vllm_server_host:vllm_server_port (0.0.0.0:8000 unless set): whatever listens there on the machine.
STUDIO_MANAGED_VALUES = {"vllm_mode": {"server": _VLLM_SERVER}}


def studio_managed_value(key: str, value: Any) -> str | None:
    """What to do instead, when `value` of the TRL field `key` is one the Studio refuses."""
    return STUDIO_MANAGED_VALUES.get(key, {}).get(value) if isinstance(value, str) else None


class SpecError(ValueError):
    """A spec that cannot be run; the message starts with the offending field's path."""


@dataclass
class DatasetRef:
    path: str
    type: str | None = None
    revision: str | None = None
    # A Data Hub dataset repo (path is its repo id, revision its pinned commit): the engine trains on
    # every data file of it, as START checked them, rather than on the Hub's "train" split.
    data_hub: bool = False


@dataclass
class Spec:
    run_id: int | str
    attempt: int
    method: str
    base_model: str
    base_model_revision: str | None
    datasets: list[DatasetRef]
    config: dict[str, Any]
    compute: dict[str, Any]
    ingest_url: str | None
    ingest_token: str | None
    output_dir: Path
    resume_from: str | None = None
    # A folder that outlives the attempt (the local backend's runs/<id>/cache), for work a restarted
    # run can reuse: DISTILL's teacher capture. None: everything goes under output_dir.
    cache_dir: Path | None = None
    # Held-out rows to evaluate on (config.eval_dataset, pinned like `datasets`); empty without one.
    eval_datasets: list[DatasetRef] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates held-out rows: an eval dataset, or an eval_split of its rows."""
        return bool(self.eval_datasets) or self.config.get("eval_split") is not None

    def cfg(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    @property
    def seed(self) -> int:
        return int(self.cfg("seed", SEED_DEFAULT))

    @property
    def use_lora(self) -> bool:
        return bool(self.config.get("lora")) or self.config.get("lora_rank") is not None

    @property
    def lora_rank(self) -> int:
        return int(self.config.get("lora_rank") or 16)

    @property
    def lora_alpha(self) -> int | float:
        """The adapter's scale numerator (peft scales by lora_alpha / lora_rank), exactly as stored: a
        fractional alpha is a valid choice, and `int(alpha or rank)` trained 0.5 as 0 (no update at
        all) and 0 as the rank, neither what the run said. Unset, it is the rank."""
        return self.cfg("lora_alpha", self.lora_rank)


def _require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj or obj[key] is None:
        raise SpecError(f"{where}{key}: is required")
    if not isinstance(obj[key], kind):
        raise SpecError(f"{where}{key}: expected {_kind_name(kind)}, got {type(obj[key]).__name__}")
    return obj[key]


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _number(config: dict[str, Any], key: str, where: str, *, positive: bool = False, minimum: float | None = None) -> None:
    value = config.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}{key}: expected a number, got {value!r}")
    if positive and value <= 0:
        raise SpecError(f"{where}{key}: must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(f"{where}{key}: must be >= {minimum}, got {value!r}")


def _validate_config(method: str, config: dict[str, Any]) -> None:
    w = "config."
    for key in ("learning_rate",):
        _number(config, key, w, positive=True)
    for key in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_length",
        "save_steps",
        "logging_steps",
        "lora_rank",
        "rollouts_per_prompt",
        "max_response_length",
        "rollout_log_steps",
        "heartbeat_interval_seconds",
        "num_epochs",
    ):
        _number(config, key, w, positive=True)
    _number(config, "max_steps", w)
    _number(config, "lora_alpha", w, positive=True)
    _number(config, "kl_coef", w, minimum=0)
    precision = config.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise SpecError(f"{w}precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if config.get("load_in_4bit") and not (config.get("lora") or config.get("lora_rank")):
        raise SpecError(f"{w}load_in_4bit: QLoRA needs an adapter; set lora_rank (or lora: true)")
    if method == "dpo":
        loss = config.get("loss")
        if not isinstance(loss, dict) or loss.get("type") != "dpo":
            raise SpecError(f'{w}loss.type: DPO needs a loss block with type "dpo"')
        _number(loss, "dpo_beta", f"{w}loss.", positive=True)
        _number(loss, "target_margin", f"{w}loss.", minimum=0)
        if loss.get("target_margin") and not loss.get("reference_free"):
            raise SpecError(f"{w}loss.target_margin: needs reference_free: true (the margin is on the reference-free score)")
        if not (config.get("lora") or config.get("lora_rank")) and not loss.get("reference_free"):
            raise SpecError(f"{w}lora_rank: DPO scores against the frozen base, so it needs a LoRA adapter")
        batch = config.get("per_device_train_batch_size")
        if batch is not None and batch % 2:  # a number > 0: checked above
            raise SpecError(f"{w}per_device_train_batch_size: counts rows and a chosen/rejected pair is two, so DPO's batch must be even, got {batch}")
        eval_batch = config.get("per_device_eval_batch_size")
        if isinstance(eval_batch, int) and eval_batch % 2:
            raise SpecError(f"{w}per_device_eval_batch_size: counts rows and a chosen/rejected pair is two, so DPO's batch must be even, got {eval_batch}")
    if method == "distill":
        dist = config.get("distillation")
        if not isinstance(dist, dict) or not dist.get("teacher_model"):
            raise SpecError(f"{w}distillation.teacher_model: DISTILL needs a distillation block naming the teacher")
        d = f"{w}distillation."
        _number(dist, "top_k", d, positive=True)
        if dist.get("top_k") is not None and dist["top_k"] > 1024:
            raise SpecError(f"{d}top_k: must be between 1 and 1024, got {dist['top_k']!r}")
        _number(dist, "temperature", d, positive=True)
        _number(dist, "kd_weight", d, minimum=0)
        _number(dist, "ce_weight", d, minimum=0)
    if method == "grpo":
        mode = config.get("rl_mode", "environment")
        if mode not in ("environment", "ruler"):
            raise SpecError(f'{w}rl_mode: must be "environment" or "ruler", got {mode!r}')


def _dataset_refs(method: str, raw: Any, name: str) -> list[DatasetRef]:
    """The entries of the spec's `dataset` or `eval_dataset` list."""
    raw = raw or []
    if not isinstance(raw, list):
        raise SpecError(f"{name}: expected a list of {{path, type, revision}}")
    refs = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not entry["path"]:
            raise SpecError(f"{name}[{i}].path: is required")
        dtype = entry.get("type")
        if method == "dpo" and dtype not in (None, "preference"):
            raise SpecError(f'{name}[{i}].type: DPO datasets are type "preference" or untyped, got {dtype!r}')
        data_hub = entry.get("data_hub", False)
        if not isinstance(data_hub, bool):
            raise SpecError(f"{name}[{i}].data_hub: true for a Data Hub repo, false for a Hugging Face id; got {data_hub!r}")
        refs.append(DatasetRef(entry["path"], dtype, entry.get("revision"), data_hub))
    return refs


def _validate_eval(method: str, config: dict[str, Any], eval_datasets: list[DatasetRef]) -> None:
    """Held-out evaluation is SFT's and DPO's: one source of eval rows, a split of at most half."""
    w = "config."
    split = config.get("eval_split")
    if method not in EVAL_METHODS and (eval_datasets or any(config.get(k) is not None for k in ("eval_split", "eval_steps", "per_device_eval_batch_size"))):
        raise SpecError(f"{w}eval_split: held-out evaluation is for SFT and DPO runs, not {method.upper()}")
    if split is not None and eval_datasets:
        raise SpecError(f"{w}eval_split: give eval_split or eval_dataset, not both")
    if split is not None and (isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 < split <= EVAL_SPLIT_MAX):
        raise SpecError(f"{w}eval_split: a fraction of the rows greater than 0 and at most {EVAL_SPLIT_MAX}, got {split!r}")
    for key in ("eval_steps", "per_device_eval_batch_size"):
        _number(config, key, w, positive=True)


def parse_spec(data: dict[str, Any]) -> Spec:
    if not isinstance(data, dict):
        raise SpecError("spec: expected a JSON object")
    method = _require(data, "method", str, "")
    if method not in METHODS:
        raise SpecError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    base_model = _require(data, "base_model", str, "")
    output_dir = _require(data, "output_dir", str, "")
    if not Path(output_dir).is_absolute():
        raise SpecError(f"output_dir: must be an absolute path, got {output_dir!r}")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError("config: expected an object")
    datasets = _dataset_refs(method, data.get("dataset"), "dataset")
    eval_datasets = _dataset_refs(method, data.get("eval_dataset"), "eval_dataset")
    if method != "grpo" and not datasets:
        raise SpecError(f"dataset: {method.upper()} needs at least one dataset")
    _validate_config(method, config)
    _validate_eval(method, config, eval_datasets)
    ingest = data.get("ingest")
    url = token = None
    if ingest is not None:
        if not isinstance(ingest, dict):
            raise SpecError("ingest: expected {url, token} or null")
        url = _require(ingest, "url", str, "ingest.")
        token = ingest.get("token") or ""
    resume = data.get("resume_from")
    if resume is not None and not Path(resume).is_dir():
        raise SpecError(f"resume_from: checkpoint directory {resume!r} does not exist")
    cache_dir = data.get("cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not Path(cache_dir).is_absolute()):
        raise SpecError(f"cache_dir: must be an absolute path or null, got {cache_dir!r}")
    return Spec(
        run_id=data.get("run_id", 0),
        attempt=int(data.get("attempt") or 1),
        method=method,
        base_model=base_model,
        base_model_revision=data.get("base_model_revision"),
        datasets=datasets,
        config=config,
        compute=data.get("compute") or {},
        ingest_url=url,
        ingest_token=token,
        output_dir=Path(output_dir),
        resume_from=resume,
        cache_dir=Path(cache_dir) if cache_dir else None,
        eval_datasets=eval_datasets,
        raw=data,
    )


def load_spec(path: str | Path) -> Spec:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise SpecError(f"--spec: file {str(path)!r} not found") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"--spec: not valid JSON ({exc})") from exc
    return parse_spec(data)
