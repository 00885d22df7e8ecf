from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import ConfigDict, Field

from experiments.compare import COMPARE_LIMIT
from training.views import MAX_POINTS


class ExperimentIn(Schema):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class ExperimentOut(Schema):
    id: int
    name: str
    slug: str
    hub_repo: str = Field(description="<project>/<repo>: the Data Hub repo of its runs' checkpoints (a branch run-<id> each); \"\" before its "
                                      "first run and once the repo was deleted. /api/hub/repos/{name} takes the name alone: hub_repo_name")
    hub_repo_name: str = Field(description="The repo's name alone (hub_repo without its project), as /api/hub/repos/{name} takes it")
    created_at: datetime

    @staticmethod
    def resolve_hub_repo_name(obj) -> str:
        return obj.hub_repo.partition("/")[2]


class CompareQuery(Schema):
    metric: str | None = Field(None, description="A metric key the compared runs report (GET /api/training-runs/{id}/metrics lists them); loss when absent")
    runs: str | None = Field(None, description=f"Comma-separated run ids of this experiment, at most {COMPARE_LIMIT}; "
                                               "the newest runs with points of the metric when absent")


class ComparedRunOut(Schema):
    id: int
    name: str
    status: str
    last: float | None = Field(description="The run's last value of the metric")
    best: float | None = Field(description="Its lowest value for a loss-like metric, its highest for a reward-like one; null for other metrics")
    points: list[tuple[int, float]] = Field(description=f"(step, value), downsampled to at most {MAX_POINTS} points as the run page's charts are")
    settings: dict[str, str] = Field(description="Its value of each setting that differs between the compared runs (— where it has none), "
                                                "the commits START pinned its Data Hub refs to among them (\"environment commit\": \"sci-ui@main → commit 28060f47a1b2\")")


class ComparisonOut(Schema):
    metric: str
    metrics: list[str] = Field(description="The metric keys the compared runs report")
    chosen: bool = Field(description="Whether the runs were chosen with ?runs= (else the newest with points of the metric)")
    runs: list[ComparedRunOut]
