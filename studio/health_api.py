"""GET /api/health: readiness, for a load balancer or Kubernetes' readinessProbe, and for a person
asking what to start. No authentication: it names what is down and what to do, never an address,
a host or a secret (studio.health)."""

from __future__ import annotations

from typing import Literal

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from studio import health

router = Router(tags=["health"], auth=None)


class HealthCheckOut(Schema):
    ok: bool
    detail: str = Field(description="A sentence: what answers, or what is down and what to start or check")


class HealthOut(Schema):
    status: Literal["ok", "degraded", "down"] = Field(
        description='"ok": everything answers; "degraded": the database answers but something else does not (200 all the '
        'same); "down": the database cannot be reached (503)'
    )
    checks: dict[str, HealthCheckOut] = Field(description="database, broker, worker, answers_worker, reconciler")


@router.get("", response={200: HealthOut, 503: HealthOut}, summary="Readiness: the database, Redis, the workers, the reconciler")
def get_health(request: HttpRequest):
    found = health.health()
    return found.http_status, found.body()
