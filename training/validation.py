"""The one validator. Create and PATCH use `validate_draft` (400); START, the form and the Start
button use `start_findings` (422). Plan limits (402) live in training/services.py."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from datahub.datasets import RULER, SHAPE_LABELS, RowNeeds, RowsCheck, entries_findings, local_check
from datahub.models import Repo
from datahub.refs import dataset_findings, dataset_refs, ref_findings, ruler_dataset_findings, run_refs
from environments.services import builtin_ref_findings, dataset_row_needs, environment_findings
from studio.errors import BadRequest, Finding
from studio.parsing import control_character, hidden_character_problem, invisible
from training.backends import get_backend
from training.chat_templates import template_findings
from training.compute import GPU_MEMORY_GIB, accelerators_of, check_compute, normalise_compute, precision_findings
from training.engine import fit, liger
from training.engine.data import split_advice
from training.engine.spec import EVAL_METHODS
from training.forms import hub_model_files, hub_ref_tree
from training.keys import EVAL_KEYS, is_number, json_findings, normalise_block
from training.methods import NOT_YET_SUPPORTED, get_method
from training.methods.base import Draft, TrainingMethod, recheck_findings
from training.refs import (
    DATASET_INSTEAD,
    EVAL_DATASET,
    HUB_REF,
    MODEL_INSTEAD,
    LocalRead,
    check_dataset,
    check_ref,
    dataset_entries,
    entry_fields,
    inside_local_roots,
    local_model_dir,
    local_reads,
    ref_kind,
    studio_data_problem,
)

NAME_MAX = 200  # TrainingRun.name's column


def method_or_400(name: Any) -> TrainingMethod:
    if isinstance(name, str) and name.lower() in NOT_YET_SUPPORTED:
        raise BadRequest(NOT_YET_SUPPORTED[name.lower()], [Finding("method", NOT_YET_SUPPORTED[name.lower()] + ": use sft, dpo, grpo or distill")])
    method = get_method(name) if isinstance(name, str) else None
    if method is None:
        raise BadRequest(f"Unknown method {name!r}.", [Finding("method", "method must be one of sft, dpo, grpo, distill")])
    return method


def validate_draft(draft: Draft) -> Draft:
    """Check a run's fields (400 with every finding) and return it with defaults applied."""
    method = method_or_400(draft.method)
    findings: list[Finding] = []
    if not isinstance(draft.config, dict):
        findings.append(Finding("config", "config must be an object of trainer settings"))
    if not isinstance(draft.compute, dict):
        findings.append(Finding("compute", "compute must be an object: {backend, accelerators, spot, region}"))
    if findings:
        raise BadRequest("The run has invalid fields.", findings)
    findings = json_findings("config", draft.config) + json_findings("compute", draft.compute) + json_findings("dataset", draft.dataset)
    if findings:
        raise BadRequest("The run has values JSON cannot store.", findings)
    if draft.base_model is not None:
        findings += check_ref("base_model", draft.base_model)
    findings += check_dataset(draft.dataset)
    findings += check_compute(draft.compute)
    findings += method.check_types(draft.config)
    findings += check_dataset(draft.config.get("eval_dataset"), EVAL_DATASET)
    if not findings:
        draft.config = normalise_block(draft.config, {**method.trl_keys(), **method.known_keys()})
        findings += method.create_findings(draft)
        findings += eval_key_findings(draft)
        findings += foreign_ref_findings(draft)
        findings += studio_data_findings(draft)
        findings += builtin_ref_findings(draft)
        findings += liger_findings(draft)
        findings += single_gpu_findings(draft)
    if findings:
        raise BadRequest("The run has invalid fields.", findings)
    draft.config = method.apply_defaults(draft.config)
    draft.compute = normalise_compute(draft.compute)
    return draft


def foreign_ref_findings(draft: Draft) -> list[Finding]:
    """Data Hub refs naming another project: START refused them (422) after a create that took them."""
    if draft.project is None:
        return []
    findings = []
    for field, value in run_refs(draft.base_model, draft.dataset, draft.config):
        match = HUB_REF.match(value)
        if match and match["project"] and match["project"] != draft.project.slug:
            findings.append(Finding(field, f'"{value}" names project {match["project"]}: a run can only use repos of its own project '
                                           f'({draft.project.slug}); copy the repo into this project, or write {match["repo"]}@{match["ref"]} for one of its own'))
    return findings


def name_findings(name: Any) -> list[Finding]:
    """A run's name, as create, PATCH and the form check it: 1 to 200 characters once trimmed, one
    line, with something to see, and nothing that changes how it shows (hidden_character_problem)."""
    if not isinstance(name, str) or not name.strip():
        return [Finding("name", "give the run a name (1 to 200 characters)")]
    if len(name.strip()) > NAME_MAX:
        return [Finding("name", f"a run name has at most {NAME_MAX} characters; this one has {len(name.strip())}")]
    control = control_character(name.strip())
    if control is not None:
        return [Finding("name", f"a run name is one line of text: remove the control character U+{ord(control):04X} (a newline or tab, say)")]
    if invisible(name):
        return [Finding("name", "a run name needs a visible character: this one has only invisible formatting characters "
                                f"({', '.join(f'U+{ord(c):04X}' for c in dict.fromkeys(name.strip()))}), which show as nothing")]
    if hidden := hidden_character_problem(name, "a run name"):
        return [Finding("name", hidden)]
    return []


def start_findings(draft: Draft) -> list[Finding]:
    """Everything that stops a valid run from starting (422). The run itself is not changed. What the
    checks left out, which refuses nothing, is start_notices(draft) afterwards."""
    method = method_or_400(draft.method)
    findings: list[Finding] = []
    if not draft.base_model:
        findings.append(Finding("base_model", "set the base model: an HF id (org/name) or a Data Hub repo@ref"))
    if method.needs_dataset and not draft.dataset:
        findings.append(Finding("dataset", f"{method.label} trains on a dataset: set dataset to a Data Hub repo@ref or an HF dataset id"))
    findings += method.start_findings(draft)
    findings += recheck_findings(draft.config)
    accel = accelerators_of(draft.compute)
    findings += precision_findings(draft.config.get("precision"), accel)
    findings += fit_findings(draft)
    findings += context_findings(draft)
    backend = get_backend(draft.compute.get("backend", "local"))
    if backend is None:
        findings.append(Finding("compute.backend", "unknown backend: use local, dstack or modal"))
    else:
        findings += backend.check(draft.project, draft.compute)
        findings += image_findings(draft, backend.image_has)
        findings += environment_findings(draft, backend.image_has)
    findings += teacher_tokenizer_findings(draft)
    needs = dataset_row_needs(draft)  # a GRPO environment's columns, in the run's own dataset
    notices: list[Finding] = []
    checks: list[tuple[str, RowsCheck]] = []  # each dataset entry's rows check, local or Data Hub
    findings += local_path_findings(draft, needs, notices, checks)
    if draft.project is not None:
        findings += ref_findings(draft.project, draft.base_model, draft.config, draft.pinned)
        findings += dataset_findings(draft.project, draft.method, draft.dataset, needs, notices, checks, system_prompt_set(draft), draft.pinned)
        if evaluates(draft.method):
            findings += dataset_findings(draft.project, draft.method, draft.config.get("eval_dataset"), None, notices, None,
                                         system_prompt_set(draft), draft.pinned, EVAL_DATASET)
        findings += ruler_dataset_findings(draft.project, ruler_dataset(draft), notices)
        findings += bare_repo_name_findings(draft)
    findings += template_findings(draft, checks, model_file_reader(draft.project, draft.base_model))
    fields = [field.removesuffix(".ref") for field, _ in dataset_refs(draft.dataset)]  # the entries' order, local and Data Hub alike
    findings += entries_findings(sorted(checks, key=lambda check: fields.index(check[0])), draft.method)
    findings += declared_type_findings(draft, checks, {f.field for f in findings})
    findings += eval_findings(draft, checks)
    draft.memo["notices"] = notices
    return findings


def declared_type_findings(draft: Draft, checks: list[tuple[str, RowsCheck]], refused: set[str]) -> list[Finding]:
    """A dataset entry whose type names another shape than its rows have ({"type": "prompt_completion"}
    on chat rows): the engine reads each entry by its rows, not its type, so the run trained on
    something else than the entry said, and nothing told. A type the method refuses (in `refused`) is
    not said twice."""
    types = {field.removesuffix(".ref"): entry.type for (field, _), entry in zip(dataset_refs(draft.dataset), dataset_entries(draft.dataset), strict=False)}
    findings = []
    for field, check in checks:
        declared = types.get(field)
        if declared not in SHAPE_LABELS or check.shape is None or check.shape[1] == declared or f"{field}.type" in refused:
            continue
        path, shape, columns = check.shape
        findings.append(Finding(f"{field}.type", (
            f'type says {SHAPE_LABELS[declared]} rows, and the rows of {path} are {SHAPE_LABELS[shape]} (columns: {", ".join(columns)}): '
            f'the run trains on an entry as its rows are, whatever its type; set type to "{shape}", or leave it out')))
    return findings


# What a method without held-out evaluation offers instead, for the finding that refuses its eval keys.
EVAL_INSTEAD = {
    "grpo": "GRPO learns from rewards on its own rollouts, which the run's reward metrics chart as it trains; remove it",
    "distill": "DISTILL has no held-out evaluation yet; remove it, or evaluate the distilled model in an SFT run of its own",
}


def evaluates(method: str) -> bool:
    return method in EVAL_METHODS


def eval_key_findings(draft: Draft) -> list[Finding]:
    """Eval keys that cannot work whatever the rows: on a method that does not evaluate, both sources of
    eval rows at once, or eval_steps / per_device_eval_batch_size with neither (nothing would be
    evaluated, without a word). 400 at create and PATCH, 422 at START for a run stored before."""
    config = draft.config
    given = [key for key in EVAL_KEYS if config.get(key) is not None]
    if not evaluates(draft.method):
        return [Finding(f"config.{key}", f"{draft.method.upper()} does not evaluate held-out rows: {EVAL_INSTEAD[draft.method]}") for key in given]
    sources = [key for key in ("eval_split", "eval_dataset") if config.get(key) is not None]
    if len(sources) == 2:
        why = "give eval_split (a fraction of the training rows held out) or eval_dataset (rows of their own), not both"
        return [Finding("config.eval_split", why), Finding(EVAL_DATASET, why)]
    if not sources:
        return [Finding(f"config.{key}", f"{key} sets how the run evaluates held-out rows, and it has none: add eval_split (e.g. 0.1) "
                                         "or an eval_dataset, or remove it") for key in given]
    return []


def eval_findings(draft: Draft, checks: list[tuple[str, RowsCheck]]) -> list[Finding]:
    """Held-out evaluation that cannot run (422): eval_key_findings, or an eval_split that holds out no
    row of a dataset whose rows the Studio counted (`checks`: the training entries' row checks; an HF
    id's rows it cannot count, and the engine refuses such a split itself)."""
    findings = eval_key_findings(draft)
    split = draft.config.get("eval_split")
    rows = [check.rows for _, check in checks]
    if findings or split is None or not rows or None in rows or len(rows) != len(dataset_entries(draft.dataset)):
        return findings
    total = sum(row for row in rows if row is not None)
    if int(total * split) < 1:
        return [Finding("config.eval_split", f"{split} of the dataset's {total} rows holds out no row: {split_advice(total)}")]
    return []


def start_notices(draft: Draft) -> list[Finding]:
    """What start_findings(draft), which must have run on this draft, did not check: the rows of a
    dataset file past DATAHUB_VALIDATE_MAX_ROWS. The run page says so beside the Start button; it
    refuses nothing."""
    return draft.memo.get("notices", [])


def ruler_dataset(draft: Draft) -> Any:
    """The prompts dataset the engine loads in RULER mode (config.ruler_task_args.dataset), else None."""
    ruler = draft.config.get("ruler_task_args") if draft.method == "grpo" and draft.config.get("rl_mode") == "ruler" else None
    return ruler.get("dataset") if isinstance(ruler, dict) else None


def bare_repo_name_findings(draft: Draft) -> list[Finding]:
    """A model or dataset written as a bare name (no org, no @ref) that is also one of the project's
    Data Hub repos: it reads as a Hugging Face id, so the engine looked for it on the Hub and the run
    failed after START. Almost surely the repo was meant; an HF id written with its org still works."""
    teacher = (draft.config.get("distillation") or {}).get("teacher_model") if isinstance(draft.config.get("distillation"), dict) else None
    named = [("base_model", draft.base_model), ("config.distillation.teacher_model", teacher), *dataset_refs(draft.dataset)]
    bare = {field: value for field, value in named if isinstance(value, str) and ref_kind(value) == "hf" and "/" not in value}
    if not bare:
        return []
    repos = dict(Repo.objects.filter(project=draft.project, name__in=set(bare.values())).values_list("name", "type"))
    return [Finding(field, f"{value} reads as a Hugging Face id, and this project has a Data Hub {repos[value]} repo {value}: "
                           f"write {value}@main (or @<branch, tag or commit>) to use the repo, or the HF id with its org (org/{value})")
            for field, value in bare.items() if value in repos]


def image_findings(draft: Draft, image_has) -> list[Finding]:
    """Options the trainer image cannot run: a 422 "not available in this image", never a fallback."""
    config, findings = draft.config, []
    off = "turn it off"
    wants = [
        ("config.use_unsloth", config.get("use_unsloth"), "unsloth", "use_unsloth", off),
        ("config.use_vllm", config.get("use_vllm"), "vllm", "vLLM", off),
        # A judge cannot be turned off: the other mode is the way out, named as the form and the API name it.
        ("config.judge.mode", (config.get("judge") or {}).get("mode") == "colocated" and config.get("rl_mode") == "ruler", "vllm", "a colocated judge (vLLM)",
         'choose External in the Judge select (config.judge.mode "external") and give its endpoint and API key secret'),
        ("config.precision", config.get("precision") == "nvfp4", "transformer_engine", "NVFP4 (Transformer Engine)", off),
        ("config.load_in_4bit", config.get("load_in_4bit"), "bitsandbytes", "QLoRA (load_in_4bit)", "remove load_in_4bit (a 16-bit LoRA needs lora_rank alone)"),
    ]
    if config.get("use_liger") and accelerators_of(draft.compute).is_cpu:
        findings.append(Finding("config.use_liger", "liger kernels need a GPU and this run asks for the CPU: remove use_liger"))
    else:
        wants.append(("config.use_liger", config.get("use_liger"), "liger_kernel", "use_liger (liger kernels)", off))
    for field, wanted, module, label, fix in wants:
        if wanted and not image_has(module):
            findings.append(Finding(field, f"{label} is not available in this image (no {module} package): {fix}"))
    return findings


# Seed 002: what runs on one GPU only, with what to do instead.
SINGLE_GPU = {
    "use_liger": "liger kernels are single-GPU: remove use_liger or ask for one GPU",
    "use_unsloth": "Unsloth is single-GPU: remove use_unsloth or ask for one GPU",
    "load_in_4bit": "QLoRA (load_in_4bit) runs on one GPU: ask for one GPU, or for several train 16-bit LoRA (lora_rank without load_in_4bit)",
}


def single_gpu_findings(draft: Draft) -> list[Finding]:
    """Seed 002's single-GPU options, for every method (400 at create and PATCH)."""
    count = accelerators_of(draft.compute).count
    if count <= 1:
        return []
    return [Finding(f"config.{key}", f"{why} (asked for {count})") for key, why in SINGLE_GPU.items() if draft.config.get(key)]


def liger_findings(draft: Draft) -> list[Finding]:
    """Seed 002's liger restrictions, for every method (400 at create and PATCH). The model rule is the
    engine's own (training/engine/liger.py), so what Studio refuses and what the engine turns off agree."""
    config = draft.config
    if not config.get("use_liger"):
        return []
    findings = []
    if config.get("use_unsloth"):
        findings.append(Finding("config.use_liger", "use_liger cannot be combined with use_unsloth (Unsloth patches the model with kernels of its own): "
                                                "remove use_liger or use_unsloth"))
    model_type = (model_config(draft.base_model, draft.project) or {}).get("model_type")
    why = liger.refusal(model_type if isinstance(model_type, str) else None, draft.base_model)
    if why:
        findings.append(Finding("config.use_liger", f"{why}: remove use_liger"))
    return findings


def model_config(ref: str | None, project=None) -> dict | None:
    """A model's config.json as far as the Studio can read it without downloading: a Data Hub
    repo@ref of `project`, a local path or the HF cache, else the table of well-known HF ids."""
    if not isinstance(ref, str) or not ref:
        return None
    if "@" in ref:
        found = hub_model_files(project, ref) if project is not None else None
        return found[0] if found and found[0] else None
    directory = local_model_dir(ref)
    if directory is not None:
        try:
            return json.loads((directory / "config.json").read_text())
        except (OSError, ValueError):
            pass
    return fit.known_config(ref)


CONTEXT_KEYS = fit.CONTEXT_KEYS  # the engine caps a default max_length by the same keys


def context_limit(base_model: Any, project=None) -> tuple[str, int] | None:
    """The config key and the number of positions the base model attends over, where the Studio can
    read its config (as the fit check); None where it cannot."""
    model = model_config(base_model, project) or {}
    key = next((key for key in CONTEXT_KEYS if is_number(model.get(key)) and model[key] > 0), None)
    return (key, int(model[key])) if key is not None else None


def context_findings(draft: Draft) -> list[Finding]:
    """Lengths longer than the base model's context: the run got as far as its first long batch. Only
    where the Studio can read the model's config (as the fit check); the engine is not asked."""
    known = context_limit(draft.base_model, draft.project)
    if known is None:
        return []
    (key, limit), config = known, draft.config
    where = f"{draft.base_model} attends over at most {limit} positions (its config's {key})"
    if draft.method != "grpo":
        length = config.get("max_length")
        if is_number(length) and length > limit:
            return [Finding("config.max_length", f"{where}, and max_length is {length}: set max_length to {limit} or less")]
        return []
    response, prompt = config.get("max_response_length"), config.get("max_prompt_length") if config.get("use_unsloth") else None
    if is_number(response) and response >= limit:
        return [Finding("config.max_response_length", f"{where}, and a completion of max_response_length {response} tokens leaves no room for the prompt: "
                                                      f"set max_response_length below {limit}")]
    if is_number(response) and is_number(prompt) and prompt + response > limit:
        return [Finding("config.max_prompt_length", f"{where}, and with use_unsloth the context is max_prompt_length + max_response_length = "
                                                    f"{prompt + response}: lower max_prompt_length to {limit - response} or less")]
    return []


@dataclass(frozen=True)
class FitCheck:
    """fit.check's verdict for a draft, or `why` there is none: "cpu", "generic_gpu" (GPU:n),
    "unknown_gpu" (a type without a memory size here) or "unknown_model"."""

    verdict: fit.Verdict | None
    gpu: str | None = None
    count: int = 0
    card_gib: float | None = None
    why: str | None = None


def fit_check(draft: Draft) -> FitCheck:
    """The fit check of a draft, shared by the START refusal (fit_findings) and the estimate the
    pages and GET /fit show (training/fit_report.py); worked out once per draft."""
    if "fit" not in draft.memo:
        draft.memo["fit"] = _fit_check(draft)
    return draft.memo["fit"]


def _fit_check(draft: Draft) -> FitCheck:
    accel = accelerators_of(draft.compute)
    if accel.is_cpu:
        return FitCheck(None, why="cpu")
    if accel.gpu_type is None:
        return FitCheck(None, count=accel.count, why="generic_gpu")
    card_gib = GPU_MEMORY_GIB.get(accel.gpu_type)
    if card_gib is None:
        return FitCheck(None, accel.gpu_type, accel.count, why="unknown_gpu")
    shape = fit.ModelShape.from_config(model_config(draft.base_model, draft.project))
    if shape is None:
        return FitCheck(None, accel.gpu_type, accel.count, card_gib, why="unknown_model")
    teacher = None
    if draft.method == "distill" and isinstance(draft.config.get("distillation"), dict):
        teacher = fit.ModelShape.from_config(model_config(draft.config["distillation"].get("teacher_model"), draft.project))
    verdict = fit.check(shape, draft.method, draft.config, card_gib=card_gib, gpu_label=accel.gpu_type,
                        teacher_shape=teacher, cards=GPU_MEMORY_GIB)
    return FitCheck(verdict, accel.gpu_type, accel.count, card_gib)


def fit_findings(draft: Draft) -> list[Finding]:
    """Issue 8: a GPU run that cannot fit on one card even with activation checkpointing is refused
    before it starts, on the field of the best lever, with the estimate (training/engine/fit.py).
    What cannot be estimated is never refused: the CPU, a generic GPU:n, an unknown model."""
    verdict = fit_check(draft).verdict
    if verdict is None or verdict.status != "too_big" or verdict.field is None or verdict.message is None:
        return []
    return [Finding(verdict.field, verdict.message)]


TOKENIZER_MAX_BYTES = 100_000_000  # a tokenizer.json is a few MB; a file far larger is not compared


def tokenizer_fingerprint(read: Callable[[str], bytes | None]) -> str | None:
    """A hash of the vocabulary, so two tokenizers compare equal when their ids mean the same.
    `read(name)` gives a file of the model folder (None when it has none)."""
    raw = read("tokenizer.json")
    if raw is not None:
        data = json.loads(raw)
        vocab = (data.get("model") or {}).get("vocab")
        added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens", []))
        return hashlib.sha256(json.dumps([vocab, added], sort_keys=True).encode()).hexdigest()
    vocab_file = read("vocab.json")
    return hashlib.sha256(vocab_file).hexdigest() if vocab_file is not None else None


def model_file_reader(project, ref: str | None) -> Callable[[str], bytes | None] | None:
    """Reads files of a model the Studio can see: a local folder, or a Data Hub repo@ref (the files of
    the commit it resolves to). None for an HF id or a ref that does not resolve: the engine checks."""
    folder = local_model_dir(ref)
    if folder is not None:
        return lambda name: (folder / name).read_bytes() if (folder / name).is_file() else None
    if project is None or not isinstance(ref, str) or ref_kind(ref) != "hub":
        return None
    from datahub.storage import open_blob

    files = hub_ref_tree(project, ref)
    if files is None:
        return None

    def read(name: str) -> bytes | None:
        blob = files.get(name)
        if blob is None or blob.size > TOKENIZER_MAX_BYTES:
            return None
        with open_blob(blob.storage_name) as fh:
            return fh.read()

    return read


def teacher_tokenizer_findings(draft: Draft) -> list[Finding]:
    teacher = (draft.config.get("distillation") or {}).get("teacher_model") if draft.method == "distill" else None
    student, teacher_files = model_file_reader(draft.project, draft.base_model), model_file_reader(draft.project, teacher)
    if not (student and teacher_files):
        return []  # not both readable here (an HF id): the engine checks again before capture
    try:
        student_fp, teacher_fp = tokenizer_fingerprint(student), tokenizer_fingerprint(teacher_files)
    except (ValueError, AttributeError, TypeError):
        return []  # a tokenizer.json that does not parse, or not as a tokenizer: the engine's loader says so
    if student_fp and teacher_fp and student_fp != teacher_fp:
        return [Finding("config.distillation.teacher_model", "the teacher's tokenizer differs from the student's: distillation compares token ids, so pick a teacher of the same family")]
    return []


def system_prompt_set(draft: Draft) -> bool:
    """Whether the run gives a system prompt, which DPO's engine puts before text prompts as a chat."""
    return bool(draft.config.get("system_prompt"))


def local_paths(draft: Draft) -> list[LocalRead]:
    """Each local path the run's engine would read (training.refs.local_reads)."""
    datasets = [(field, entry.ref) for field, entry in entry_fields(draft.dataset)]
    return local_reads(draft.method, draft.base_model, draft.config, datasets)


def studio_data_findings(draft: Draft) -> list[Finding]:
    """A local path into the Studio's own data (another project's run output, the Data Hub's blobs):
    the engine would read it as the Studio's user, past every project check (400 at create and PATCH;
    START refuses it too, in local_path_findings, for a run stored before)."""
    return [Finding(read.field, problem) for read in local_paths(draft) if (problem := studio_data_problem(read.value, read.instead))]


def local_path_findings(draft: Draft, needs: RowNeeds | None = None, notices: list[Finding] | None = None,
                        checks: list[tuple[str, RowsCheck]] | None = None) -> list[Finding]:
    """A local path names a file on the Studio's machine: only the local backend can read it, and
    there it must be an absolute path to what the engine will load (a missing one would fail the run
    only after the job started). A dataset's rows are checked; what was not goes to `notices`, and
    each dataset entry's check to `checks` (its field and RowsCheck)."""
    paths = local_paths(draft)
    backend = draft.compute.get("backend", "local")
    if backend != "local":
        return [
            Finding(field, f"{value} is a path on the Studio's machine, which the {backend} backend cannot read: push it to the Data Hub and use repo@ref")
            for field, value, _ in paths
        ]
    findings = []
    for field, value, is_model in paths:
        path = Path(value).expanduser()
        if not path.is_absolute():
            findings.append(Finding(field, f"{value} is a relative path: give the absolute path on the Studio's machine (e.g. /data/models/my-model)"))
        elif problem := studio_data_problem(value, MODEL_INSTEAD if is_model else DATASET_INSTEAD):  # a run stored before create refused it
            findings.append(Finding(field, problem))
        elif not inside_local_roots(path):
            roots = ", ".join(str(root) for root in settings.STUDIO_LOCAL_ROOTS)
            findings.append(Finding(field, f"{value} is outside the folders this Studio lets runs read ({roots}): put it under one of them, or push it to the Data Hub and use repo@ref"))
        elif is_model and not (path / "config.json").is_file():
            findings.append(Finding(field, f"{value} is not a model folder on the Studio's machine (no config.json in it): give the folder save_pretrained wrote, an HF id or a Data Hub repo@ref"))
        elif not is_model and not path.exists():
            findings.append(Finding(field, f"{value} does not exist on the Studio's machine: give the path of a .jsonl/.json/.parquet/.csv file or a folder of them"))
        elif not is_model:
            # The rows, as a Data Hub dataset's are checked: the row and field of each problem.
            method = RULER if field == "config.ruler_task_args.dataset" else draft.method
            check = local_check(path, method, field, needs if field.startswith("dataset") else None, system_prompt_set(draft))
            findings += check.findings
            if notices is not None:
                notices += check.notices
            if checks is not None and field.startswith("dataset"):
                checks.append((field, check))
    return findings


def local_image_has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def remote_image_has(module: str) -> bool:
    return module in settings.STUDIO_IMAGE_PACKAGES
