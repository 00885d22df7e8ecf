"""Data Hub seams. The Data Hub issue fills these in; the rest of Studio already calls them.

- provision_experiment_repo: an experiment's repo is created on first use.
- create_run_branch: each run is a branch `run-<id>` in its experiment's repo, made at create time.
- resolve_ref: `[project/]repo@ref` → a pinned commit and a path or URL the engine can load.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResolvedRef:
    ref: str
    commit: str | None
    location: str  # what the engine loads: a local path, or an HF id / Hub URL


def provision_experiment_repo(experiment) -> None:
    """Make sure `experiment` has its Data Hub repo. Until the Data Hub lands, record its name."""
    if not experiment.hub_repo:
        experiment.hub_repo = f"{experiment.project.slug}/experiment-{experiment.slug}"
        experiment.save(update_fields=["hub_repo"])


def create_run_branch(run) -> None:
    """Create branch `run-<id>` in the run's experiment repo. No-op until the Data Hub lands."""


def resolve_ref(project, value: str) -> ResolvedRef | None:
    """Resolve a Data Hub ref; None means "not resolvable here yet" (the Data Hub issue)."""
    return None


def dataset_findings(project, method: str, dataset) -> list:
    """Row-level checks of a run's Data Hub datasets against its method (422 findings naming the
    row and field, e.g. `row 57: "chosen" is empty`). Empty until the Data Hub lands."""
    return []


def pin_refs(run) -> dict:
    """At START: resolve the run's Data Hub refs (base model, datasets, teacher, environment) to
    commit ids, returned as {field: {"ref", "commit"}} and stored on run.pinned."""
    return {}


def record_checkpoint(run, checkpoint) -> None:
    """Commit a reported checkpoint's files to the run's branch. No-op until the Data Hub lands."""
