from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import ConfigDict, Field


class ExperimentIn(Schema):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class ExperimentOut(Schema):
    id: int
    name: str
    slug: str
    hub_repo: str
    created_at: datetime
