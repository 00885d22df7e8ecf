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
from studio.errors import ApiError, joined
from studio.models import Project, Webhook, WebhookDelivery
from studio.parsing import isolated
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
    messages.success(
        request,
        f"Added {_named(webhook)}: {_what_it_is_sent(webhook)} from now on; what happened before is not sent. "
        "Its signing secret is below, shown this once: copy it to the receiver now. Send test checks that the receiver answers.",
    )
    return render(request, "studio/webhooks.html", _context(request, project, created={"webhook": webhook, "secret": secret}))


def _writable_webhook(request: HttpRequest, webhook_id: int) -> Webhook:
    actor = web_actor(request)
    webhook = webhooks.find_webhook(actor.require_project(), webhook_id)
    actor.require_write(webhook.project)
    return webhook


def webhooks_url(request: HttpRequest, *args, **kwargs) -> str:
    return reverse("webhooks")


def _done(request: HttpRequest, sentence: str, level: int = messages.SUCCESS) -> HttpResponse:
    messages.add_message(request, level, sentence)
    return redirect("webhooks")


def _named(webhook: Webhook, first: bool = False) -> str:
    """How a message names a webhook: as its card does, by number and URL (`first` in a sentence)."""
    return f"{'W' if first else 'w'}ebhook {webhook.pk} ({isolated(webhook.url)})"


def _what_it_is_sent(webhook: Webhook) -> str:
    """Its events, and those it is not sent: a message says what the user's choice means."""
    left_out = [name for name in webhooks.EVENT_NAMES if name not in webhook.events]
    if not left_out:
        return f"it is sent every event ({joined(webhooks.EVENT_NAMES)})"
    return f"it is sent {joined(webhook.events)} (not {joined(left_out, 'or')})"


# What pausing means, said where it happens: set_webhook_active and attempt_delivery drop what falls
# due while a webhook is disabled, and queue_event makes nothing for one.
DISABLED_MEANS = (
    "nothing is sent to it until you enable it again: events meanwhile are not sent later, and retries that fall due "
    "meanwhile are dropped. Send test still pings it."
)


@studio_page
@form_action(webhooks_url)
def toggle_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = _writable_webhook(request, webhook_id)
    was_active, active = webhook.active, request.POST.get("active") != "0"
    webhooks.set_webhook_active(webhook, active)
    if was_active == active:
        state = f"{_what_it_is_sent(webhook)}." if active else DISABLED_MEANS
        return _done(request, f"{_named(webhook, first=True)} was already {'enabled' if active else 'disabled'}: {state}", messages.INFO)
    if active:
        return _done(request, f"Enabled {_named(webhook)}: {_what_it_is_sent(webhook)} again from now on; events while it was disabled are not sent.")
    return _done(request, f"Disabled {_named(webhook)}: {DISABLED_MEANS}")


@studio_page
@form_action(webhooks_url)
def test_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    delivery = webhooks.send_test(_writable_webhook(request, webhook_id))
    disabled = " (sent although the webhook is disabled)" if not delivery.webhook.active else ""
    return _done(
        request,
        f"Queued a ping to {_named(delivery.webhook)} as delivery {delivery.pk}{disabled}: it is listed in the webhook's deliveries below; "
        "reload the page to see how the receiver answered.",
    )


@studio_page
@form_action(webhooks_url)
def delete_webhook(request: HttpRequest, webhook_id: int) -> HttpResponse:
    webhook = _writable_webhook(request, webhook_id)
    named = _named(webhook)  # its pk is gone once deleted
    webhooks.delete_webhook(webhook)
    return _done(
        request,
        f"Deleted {named} and its deliveries: nothing more is sent to it, retries included, and its signing secret signs nothing now. "
        "To send to the URL again, add it again: it gets a new secret.",
    )
