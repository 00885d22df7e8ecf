"""What NEW RUN suggests in its model and dataset fields (the <datalist>s): the tiny demo models and
datasets `manage.py bootstrapdemo` built, the current project's Data Hub repos as refs, and the base
models of its recent runs. Every query is filtered by the one project and bounded: another project's
names never reach the page, and a project with thousands of repos or runs renders the same few rows."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from django.conf import settings
from django.db.models import Max

from datahub.models import Repo, RepoType
from studio.models import Project
from training.models import TrainingRun
from training.refs import inside_local_roots

REPO_LIMIT = 50  # per repo type, the newest
RECENT_LIMIT = 20  # distinct base models, the most recently used first


@dataclass(frozen=True)
class Suggestion:
    value: str
    label: str


def demo_marker() -> Path:
    """Where bootstrapdemo records what it built: {name: absolute path}, the tiny models' folders
    (student, teacher) and a JSONL dataset per method (sft, sft_text, ..., dpo, distill, grpo)."""
    return settings.VAR_DIR / "demo" / "built.json"


def demo_recorded() -> dict[str, str]:
    """What built.json lists, {name: path} as written; empty when there is none or it is unreadable."""
    try:
        built = json.loads(demo_marker().read_text())
    except (OSError, ValueError):
        return {}
    return {str(name): value for name, value in built.items() if isinstance(value, str)} if isinstance(built, dict) else {}


def demo_repo_name(name: str) -> str:
    """The Data Hub repo bootstrapdemo commits the demo's `name` (built.json's key) to: demo-sft-text."""
    return "demo-" + name.replace("_", "-")


def for_method(name: str, method: str) -> bool:
    """A demo dataset `name` (built.json's key: sft, sft_text, dpo, ...) holds rows `method` trains on."""
    return name == method or name.startswith(f"{method}_")


def demo_elsewhere(recorded: dict[str, str]) -> list[str]:
    """The paths of `recorded` that are not this Studio's demo files: gone, or outside its var/demo.
    built.json keeps absolute paths, so a var/ moved or copied from another place lists that place's
    folders, which are gone or, worse, another Studio's files: bootstrapdemo builds them again here."""
    own = demo_marker().parent.resolve()
    return [value for value in recorded.values()
            if not (Path(value).is_absolute() and Path(value).exists() and Path(value).resolve().is_relative_to(own))]


def demo_built() -> dict[str, Path]:
    """The demo's models and datasets that still exist in this var/demo and that runs may read (inside
    STUDIO_LOCAL_ROOTS); empty when bootstrapdemo never built them (no engine, or not the embedded
    default). A path of another var/ this one was copied from is never suggested (demo_elsewhere)."""
    recorded = demo_recorded()
    elsewhere = set(demo_elsewhere(recorded))
    return {name: Path(value) for name, value in recorded.items() if value not in elsewhere and inside_local_roots(Path(value))}


def _unique(items: list[Suggestion]) -> list[Suggestion]:
    """`items` without repeats of a value, the first of each kept, in order."""
    seen: set[str] = set()
    unique: list[Suggestion] = []
    for item in items:
        if item.value not in seen:
            seen.add(item.value)
            unique.append(item)
    return unique


class RefSuggestions:
    """Lazy: a part of the form that shows no datalist (the live estimates) reads nothing."""

    def __init__(self, project: Project, method: str) -> None:
        self.project, self.method = project, method

    @cached_property
    def demo(self) -> dict[str, Path]:
        return demo_built()

    @cached_property
    def demo_models(self) -> list[Suggestion]:
        # A model is a folder save_pretrained wrote: what START accepts as a local model path.
        return [Suggestion(str(path), f"demo {name} model (bootstrapdemo)") for name, path in self.demo.items() if (path / "config.json").is_file()]

    def repo_refs(self, repo_type: str) -> list[Suggestion]:
        rows = Repo.objects.filter(project=self.project, type=repo_type).order_by("-created_at", "-id").values_list("name", "default_branch")[:REPO_LIMIT]
        return [Suggestion(f"{name}@{branch}", f"Data Hub {repo_type} repo") for name, branch in sorted(rows)]

    def recent_base_models(self) -> list[Suggestion]:
        rows = (TrainingRun.objects.filter(project=self.project).exclude(base_model="").values("base_model")
                .annotate(last=Max("created_at")).order_by("-last").values_list("base_model", flat=True)[:RECENT_LIMIT])
        return [Suggestion(value, "used by a recent run") for value in rows]

    @cached_property
    def models(self) -> list[Suggestion]:
        return _unique(self.demo_models + self.repo_refs(RepoType.MODEL) + self.recent_base_models())

    @cached_property
    def demo_datasets(self) -> list[Suggestion]:
        return [Suggestion(str(path), f"demo {name} dataset (bootstrapdemo)") for name, path in self.demo.items()
                if path.is_file() and for_method(name, self.method)]

    @cached_property
    def datasets(self) -> list[Suggestion]:
        # The demo's dataset repos as its files: each for its own method (DPO's pairs are no SFT data).
        other_methods = {demo_repo_name(name) for name in demo_recorded() if not for_method(name, self.method)}
        repos = [s for s in self.repo_refs(RepoType.DATASET) if s.value.split("@")[0] not in other_methods]
        return _unique(self.demo_datasets + repos)

    @property
    def model_help(self) -> str:
        example = self.demo_models[0].value if self.demo_models else "/data/models/my-model"
        return f"An HF id (Qwen/Qwen2.5-0.5B-Instruct), a Data Hub repo@ref (my-model@main, project/repo@ref) or, on the local backend, a folder: {example}"

    @property
    def dataset_help(self) -> str:
        # This method's demo file: another method's (SFT chats for DPO) would be refused at START.
        example = self.demo_datasets[0].value if self.demo_datasets else "/data/my-data.jsonl"
        return (f"An HF id (org/dataset), a Data Hub repo@ref (my-data@main) or, on the local backend, a file: {example}. "
                "Several: separate with commas. GRPO: optional, rows with a prompt column and the columns the environment "
                "scores against (its page lists them); without it the environment makes the prompts (RULER reads the prompts "
                "dataset in its card).")
