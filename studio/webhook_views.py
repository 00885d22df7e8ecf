"""Settings → Webhooks: the project's webhooks with their recent deliveries; owners and members add,
pause, test and delete them (viewers read). A new webhook's signing secret is shown once, on the page
that answers the POST that made it, which no cache keeps."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from studio import webhooks
from studio.errors import ApiError
from studio.models import Project, Webhook, WebhookDelivery
from studio.views import errors_by_field, form_action, refuse_form, refused_forms, studio_page, web_actor

FIELDS = {"url", "events"}
DELIVERIES_SHOWN = 10


def _context(request: HttpRequest, project: Project, **shown) -> dict:
    hooks = list(
        Webhook.objects.filter(project=project)
        .select_related("created_by")
        .prefetch_related(Prefetch("deliveries", queryset=WebhookDelivery.objects.order_by("-created_at", "-id"), to_attr="all_deliveries"))
    )
    for hook in hooks:
        hook.recent = hook.all_deliveries[:DELIVERIES_SHOWN]
    return {
        "section": "webhooks",
        "project": project,
        "webhooks": hooks,
        "event_names": webhooks.EVENT_NAMES,
        "url_help": webhooks.accepted_urls(),
        "can_write": web_actor(request).can_write(project),
        "errors": {},
        "url": "",
        "events": webhooks.EVENT_NAMES,
        "created": None,
        **shown,
    }


@studio_page
@require_GET
def webhooks_page(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_project()
    refused = refused_forms(request).get("webhook", {})
    values = refused.get("values", {})
    return render(
        request,
        "studio/webhooks.html",
        _context(request, project, errors=refused.get("errors", {}), url=values.get("url", ""), events=values.get("events", webhooks.EVENT_NAMES)),
    )


@never_cache  # the answer holds the signing secret
@studio_page
@form_action("webhooks")
def create_webhook(request: HttpRequest) -> HttpResponse:
    project = web_actor(request).require_writable_project()
    url, events = request.POST.get("url", "").strip(), request.POST.getlist("events")
    try:
        webhook, secret = webhooks.create_webhook(project, url, events, user=request.user)
    except ApiError as exc:
        return refuse_form(request, reverse("webhooks"), "webhook", errors_by_field(exc, FIELDS), {"url": url, "events": events})
    return render(request, "studio/webhooks.html", _context(request, project, created={"webhook": webhook, "secret": secret}))


def _writable_webhook(request: HttpRequest, webhook_id: int) -> Webhook:
    actor = web_actor(request)
    webhook = webhooks.find_webhook(actor.require_project(), webhook_id)
    actor.require_write(webhook.project)
    return webhook


def webhooks_url(request: HttpRequest, *args, **kwargs) -> str:
    return reverse("webhooks")


def _done(request: HttpRequest, sentence: str) -> HttpResponse:
    messages.success(request, sentence)
    return redirect("webhooks")


@studio_page
@form_action(webhooks_url)
def toggle_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = webhooks.set_webhook_active(_writable_webhook(request, webhook_id), request.POST.get("active") != "0")
    return _done(request, f"{'Enabled' if webhook.active else 'Disabled'} the webhook to {webhook.url}.")


@studio_page
@form_action(webhooks_url)
def test_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    delivery = webhooks.send_test(_writable_webhook(request, webhook_id))
    return _done(request, f"Sent a ping to {delivery.webhook.url}: its delivery is listed below.")


@studio_page
@form_action(webhooks_url)
def delete_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = _writable_webhook(request, webhook_id)
    webhooks.delete_webhook(webhook)
    return _done(request, f"Deleted the webhook to {webhook.url}.")
