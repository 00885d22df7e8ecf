"""Webhooks: listed by any member, written by owners and members; the signing secret is in the
answer that made it, and in no other."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict

from studio import webhooks
from studio.api import actor, body_schema, parse_body
from studio.models import Webhook, WebhookDelivery

router = Router(tags=["webhooks"])


class WebhookIn(Schema):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(description="Where to POST: https (http only where the Studio allows it)")
    events: list[str] | None = Field(None, description=f"Of {', '.join(webhooks.EVENT_NAMES)}; all when left out")


class WebhookActiveIn(Schema):
    model_config = ConfigDict(extra="forbid")
    active: bool = Field(description="false pauses the webhook: nothing is sent to it until it is true again")


class WebhookOut(Schema):
    id: int
    url: str
    events: list[str]
    active: bool
    created_by: str | None = Field(description="The user name of who added it")
    created_at: datetime

    @staticmethod
    def resolve_created_by(obj: Webhook) -> str | None:
        return obj.created_by.get_username() if obj.created_by else None


class WebhookCreatedOut(WebhookOut):
    secret: str = Field(description="The signing secret (whsec_…): shown this once, keep it with the receiver")


class WebhookDeliveryOut(Schema):
    id: int
    event: str
    run_id: int | None
    payload: dict
    attempts: int
    last_status_code: int | None
    last_error: str = Field(description='Why the last try failed; "" once delivered')
    created_at: datetime
    delivered_at: datetime | None
    next_try_at: datetime | None = Field(description="When the next try is due; null once delivered or given up")


def writable_webhook(request: HttpRequest, webhook_id: int) -> Webhook:
    """The current project's webhook, for a write: 404 (another project's, or none), then 403."""
    who = actor(request)
    webhook = webhooks.find_webhook(who.require_project(), webhook_id)
    who.require_write(webhook.project)
    return webhook


@router.get("", response=list[WebhookOut])
def list_webhooks(request: HttpRequest):
    project = actor(request).require_project()
    return Webhook.objects.filter(project=project).select_related("created_by")


@router.post("", response={201: WebhookCreatedOut}, openapi_extra=body_schema(WebhookIn))
def create_webhook(request: HttpRequest):
    who = actor(request)
    project = who.require_writable_project()
    payload = parse_body(request, WebhookIn)
    webhook, secret = webhooks.create_webhook(project, payload.url, payload.events, user=who.user)
    webhook.secret = secret
    return 201, webhook


@router.patch("/{int:webhook_id}", response=WebhookOut, openapi_extra=body_schema(WebhookActiveIn))
def update_webhook(request: HttpRequest, webhook_id: int):
    webhook = writable_webhook(request, webhook_id)
    return webhooks.set_webhook_active(webhook, parse_body(request, WebhookActiveIn).active)


@router.delete("/{int:webhook_id}", response={204: None})
def delete_webhook(request: HttpRequest, webhook_id: int):
    webhooks.delete_webhook(writable_webhook(request, webhook_id))
    return 204, None


@router.get("/{int:webhook_id}/deliveries", response=list[WebhookDeliveryOut])
def list_deliveries(request: HttpRequest, webhook_id: int):
    webhook = webhooks.find_webhook(actor(request).require_project(), webhook_id)
    return WebhookDelivery.objects.filter(webhook=webhook)


@router.post("/{int:webhook_id}/test", response={202: WebhookDeliveryOut})
def test_webhook(request: HttpRequest, webhook_id: int):
    """Queue a "ping" delivery; GET .../deliveries tells how it went."""
    delivery = webhooks.send_test(writable_webhook(request, webhook_id))
    delivery.refresh_from_db()
    return 202, delivery
