"""Webhooks: the only functions that create, change and send them.

A run that ends (training.status.transition), and a run whose weights are published to its model repo
(datahub.services.publish_model), get one WebhookDelivery per active webhook of its project that wants
the event, made in that transaction and handed to the task queue once it commits
(studio.tasks.deliver_webhook). Each try POSTs the payload signed with the webhook's
secret; a non-2xx answer or a connection error is tried again later (RETRY_DELAYS_S), and every try is
recorded on the delivery. A worker claims a try before it sends it (claim_try), so two tasks for one
delivery (the reconciler's resend of a slow try, a task the broker hands out again) never both POST it,
and a task names the try it is for, so one that comes after that try was made does not send the next
one before its time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from studio import audit, crypto
from studio.errors import BadRequest, Finding, NotFound
from studio.models import SUBSCRIBABLE_EVENTS, AuditEvent, Project, Webhook, WebhookDelivery, WebhookEvent
from studio.queue import send, send_after_commit

SECRET_PREFIX = "whsec"
TIMEOUT_S = 5
# Waits before the 2nd to 5th try: five tries over about 31 minutes.
RETRY_DELAYS_S = (60, 300, 600, 900)
MAX_TRIES = len(RETRY_DELAYS_S) + 1
DELIVERIES_KEPT = 50
URL_MAX = Webhook._meta.get_field("url").max_length
EVENT_NAMES = [str(event) for event in SUBSCRIBABLE_EVENTS]
# The deliver_webhook task's hard time limit: a worker still on a try past it has been killed.
TRY_TIME_LIMIT_S = 45
# How long a claimed try is its worker's alone (claim_try): past the hard time limit, so a worker
# still sending holds it, and a try whose worker was killed is taken again once it runs out.
CLAIM_S = TRY_TIME_LIMIT_S + 15

log = logging.getLogger(__name__)


class UnsafeAddress(ValueError):
    """A webhook URL whose host is, or resolves to, an address the Studio does not send to."""


def ip_of(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address, without an IPv6 zone; an IPv4-mapped IPv6 one as the IPv4 address it maps."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def unsafe_address(address: str) -> bool:
    """Loopback, private, link-local (169.254.169.254, the clouds' metadata service), multicast,
    reserved or unspecified: an address inside the Studio's own network, not a team's receiver."""
    ip = ip_of(address)
    return not ip.is_global or ip.is_multicast


def check_host(host: str, port: int) -> str:
    """The address to connect to for `host`: raise UnsafeAddress unless every address it resolves to
    is a public one (STUDIO_WEBHOOK_ALLOW_PRIVATE allows loopback and private ones too, never a
    link-local one). An IPv4 one first, as most receivers listen there."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeAddress(f"its host {host!r} cannot be resolved ({exc}): check the name") from exc
    addresses = [str(sockaddr[0]) for *_, sockaddr in found]
    chosen = next((a for a in addresses if ":" not in a), addresses[0])
    for address in addresses:
        # A receiver is never link-local: 169.254.0.0/16 and fe80::/10 hold the clouds' metadata
        # service (169.254.169.254), whose answers carry the machine's credentials.
        if ip_of(address).is_link_local:
            raise UnsafeAddress(
                f"its host {host!r} resolves to {address}, a link-local address (such as the clouds' metadata service), which the "
                "Studio never sends to: give the receiver's own address or name"
            )
    if settings.STUDIO_WEBHOOK_ALLOW_PRIVATE:
        return chosen
    for address in addresses:
        if unsafe_address(address):
            raise UnsafeAddress(
                f"its host {host!r} resolves to {address}, a loopback, private or link-local address, which the "
                "Studio does not send to: give a public URL (an administrator can allow private ones with "
                "STUDIO_WEBHOOK_ALLOW_PRIVATE=1)"
            )
    return chosen


def accepted_urls() -> str:
    """What validate_url accepts on this Studio, in a sentence: the Add a webhook form's help."""
    schemes = "An https or http URL" if settings.DEBUG or settings.STUDIO_WEBHOOK_ALLOW_HTTP else "An https URL"
    where = (
        "on the public internet or at a loopback or private address (never a link-local one)"
        if settings.STUDIO_WEBHOOK_ALLOW_PRIVATE
        else "on the public internet"
    )
    return f"{schemes} {where}; redirects are not followed."


def validate_url(url: str) -> str:
    """`url`, stripped, or a 400 naming `url` that says what to change."""
    url = (url or "").strip()
    allow_http = settings.DEBUG or settings.STUDIO_WEBHOOK_ALLOW_HTTP
    schemes = "https or http" if allow_http else "https"
    if not url or len(url) > URL_MAX or any(c.isspace() or ord(c) < 32 for c in url):
        raise BadRequest("The webhook URL is not valid.", [Finding("url", f"give an {schemes} URL of at most {URL_MAX} characters, without spaces")])
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise BadRequest("The webhook URL is not valid.", [Finding("url", f"{exc}: give a URL such as https://hooks.example.com/studio")]) from exc
    if parts.scheme not in ("https", "http") or (parts.scheme == "http" and not allow_http):
        raise BadRequest(
            "The webhook URL is not valid.",
            [
                Finding(
                    "url",
                    "use an https:// URL (an administrator can allow http with STUDIO_WEBHOOK_ALLOW_HTTP=1)"
                    if parts.scheme == "http"
                    else f"use an {schemes}:// URL",
                )
            ],
        )
    if not parts.hostname:
        raise BadRequest("The webhook URL is not valid.", [Finding("url", "give the receiver's host, e.g. https://hooks.example.com/studio")])
    if parts.username or parts.password:
        raise BadRequest(
            "The webhook URL is not valid.",
            [Finding("url", "remove the user name and password: the URL is shown to every member; check the Studio-Signature header instead")],
        )
    try:
        check_host(parts.hostname, port)
    except UnsafeAddress as exc:
        raise BadRequest("The webhook URL is not allowed.", [Finding("url", str(exc))]) from exc
    return url


def validate_events(events: list[str] | None) -> list[str]:
    """The run events asked for, in a fixed order; all of them when none are named."""
    if events is None:
        return list(EVENT_NAMES)
    unknown = [
        Finding(f"events[{i}]", f"unknown event {event!r}: choose among {', '.join(EVENT_NAMES)}") for i, event in enumerate(events) if event not in EVENT_NAMES
    ]
    if unknown:
        raise BadRequest("The webhook asks for unknown events.", unknown)
    if not events:
        raise BadRequest("The webhook asks for no events.", [Finding("events", f"choose at least one of {', '.join(EVENT_NAMES)}, or leave it out for all")])
    return [event for event in EVENT_NAMES if event in events]


@transaction.atomic
def create_webhook(project: Project, url: str, events: list[str] | None, *, user=None) -> tuple[Webhook, str]:
    """Make a webhook; returns it and its signing secret (shown once: only its ciphertext is kept)."""
    events, url = validate_events(events), validate_url(url)
    refuse_duplicate(project, url)
    secret = f"{SECRET_PREFIX}_{secrets.token_urlsafe(32)}"
    webhook = Webhook.objects.create(project=project, url=url, events=events, secret_ciphertext=crypto.encrypt(secret), created_by=user)
    audit.record(AuditEvent.Action.CREATED, webhook, name=url, details={"events": events})
    return webhook, secret


def refuse_duplicate(project: Project, url: str) -> None:
    """A 400 naming `url` when the project has a webhook to it already: two would send each event
    twice, and their cards would look the same. Call in create_webhook's transaction: the project's
    row lock makes two adds of one URL at once wait for each other."""
    Project.objects.select_for_update().filter(pk=project.pk).first()
    existing = Webhook.objects.filter(project=project, url=url).order_by("pk").first()
    if existing is not None:
        raise BadRequest(
            "The project already has a webhook to this URL.",
            [
                Finding(
                    "url",
                    f"webhook {existing.pk} is sent to this URL already: use that one (enable it if it is disabled), "
                    f"or delete webhook {existing.pk} first to add the URL with other events",
                )
            ],
        )


@transaction.atomic
def set_webhook_active(webhook: Webhook, active: bool) -> Webhook:
    """Pause or resume a webhook: a paused one is sent nothing (its pending tries are dropped)."""
    if webhook.active != active:
        webhook.active = active
        webhook.save(update_fields=["active"])
        audit.record(AuditEvent.Action.UPDATED, webhook, name=webhook.url, details={"active": active})
    return webhook


@transaction.atomic
def delete_webhook(webhook: Webhook) -> None:
    audit.record(AuditEvent.Action.DELETED, webhook, name=webhook.url)
    webhook.delete()


def find_webhook(project: Project, webhook_id: int) -> Webhook:
    """The project's webhook `webhook_id`; another project's is a 404, as one that does not exist."""
    webhook = Webhook.objects.filter(project=project, pk=webhook_id).first()
    if webhook is None:
        raise NotFound(f"No webhook {webhook_id} in project {project.slug}.")
    return webhook


def queue_event(project_id: int, event: str, run_id: int, data: Callable[[], dict[str, Any]]) -> None:
    """Queue `event` of run `run_id` to each active webhook of the project that wants it, with the
    payload's `data()` (asked only when one does). Call inside the transaction that made the event
    happen (the run's end, its model's publish): the deliveries are made with it and sent once it
    commits."""
    wanting = [webhook for webhook in Webhook.objects.filter(project_id=project_id, active=True) if event in webhook.events]
    payload = data() if wanting else {}
    for webhook in wanting:
        queue_delivery(webhook, event, run_id, payload)


@transaction.atomic
def send_test(webhook: Webhook) -> WebhookDelivery:
    """A "ping" delivery to `webhook`, paused or not: Send test checks the receiver."""
    return queue_delivery(webhook, WebhookEvent.PING, None, {"project": webhook.project.slug, "webhook": webhook.pk})


def queue_delivery(webhook: Webhook, event: str, run_id: int | None, data: dict[str, Any]) -> WebhookDelivery:
    from studio.tasks import deliver_webhook  # the task module imports this one

    delivery = WebhookDelivery.objects.create(webhook=webhook, event=event, run_id=run_id, payload={}, next_try_at=timezone.now())
    delivery.payload = {"type": str(event), "id": str(delivery.pk), "created_at": delivery.created_at.isoformat(), "data": data}
    delivery.save(update_fields=["payload"])
    keep_newest_deliveries(webhook)
    send_after_commit(deliver_webhook, delivery.pk, 0, on_unsent=lambda: record_unsent(delivery.pk))
    return delivery


def keep_newest_deliveries(webhook: Webhook) -> None:
    old = WebhookDelivery.objects.filter(webhook=webhook).order_by("-created_at", "-id").values_list("pk", flat=True)[DELIVERIES_KEPT:]
    WebhookDelivery.objects.filter(pk__in=list(old)).delete()


def record_unsent(delivery_id: int) -> None:
    """The broker was down when the delivery was to be queued: say so on it, rather than leave it
    looking as if it were on its way. It stays due: the reconciler's first pass once the queue is
    back sends it (deliveries_to_resend)."""
    WebhookDelivery.objects.filter(pk=delivery_id, delivered_at__isnull=True).update(
        next_try_at=timezone.now(), last_error="not sent yet: the Studio's task queue (Redis) could not be reached; it is sent once the queue is back"
    )


# A try this late past its time never reached a worker (the queue was down, or its countdown was lost
# with the broker's data): the reconciler queues it again. Longer than a busy worker's delay.
RESEND_AFTER_S = 120


def unclaimed(now: datetime) -> Q:
    """No try in flight: none was claimed, or its claim has run out (claim_try)."""
    return Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)


def late(now: datetime) -> Q:
    """Due over RESEND_AFTER_S ago, with tries left and no try in flight: its task never ran, or its
    worker died mid-try and its claim has run out."""
    return Q(delivered_at__isnull=True, attempts__lt=MAX_TRIES, next_try_at__lt=now - timedelta(seconds=RESEND_AFTER_S)) & unclaimed(now)


def deliveries_to_resend(now=None) -> list[int]:
    """The late deliveries (late()), the longest overdue first, 100 a pass."""
    return list(WebhookDelivery.objects.filter(late(now or timezone.now())).order_by("next_try_at").values_list("pk", flat=True)[:100])


def resend(delivery_id: int) -> None:
    """Queue a late delivery's try again, if it is late still: the reconciler lists the late ones before
    it polls the runs, and a slow task may have made its try since. It is due anew now, so the next
    pass leaves it alone until it is late again. The task names the try (the one after `attempts`), so
    it sends nothing if the slow task makes that try first."""
    from studio.tasks import deliver_webhook

    now = timezone.now()
    with transaction.atomic():
        tries_made = WebhookDelivery.objects.select_for_update().filter(late(now), pk=delivery_id).values_list("attempts", flat=True).first()
        if tries_made is None:
            return
        WebhookDelivery.objects.filter(pk=delivery_id).update(next_try_at=now)
    send(deliver_webhook, delivery_id, tries_made)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The Studio-Signature header: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def claim_try(delivery_id: int, now: datetime, tries_made: int | None = None) -> datetime | None:
    """Conditional UPDATE: make the delivery's next try this worker's for CLAIM_S, unless it is
    delivered, out of tries, past the try asked for (`tries_made` made before it; None: whichever is
    next), or another worker's claim has not run out. Returns the claim's end, which the worker
    records its try under, or None: nothing for this worker to send."""
    until = now + timedelta(seconds=CLAIM_S)
    asked = Q() if tries_made is None else Q(attempts=tries_made)
    claimed = (
        WebhookDelivery.objects.filter(asked, unclaimed(now), pk=delivery_id, delivered_at__isnull=True, attempts__lt=MAX_TRIES)
        .update(claimed_until=until)
    )
    return until if claimed else None


class NextTry(NamedTuple):
    """The try to queue after a failed one: after `delay_s`, with `tries_made` made by then."""

    delay_s: int
    tries_made: int


def attempt_delivery(delivery_id: int, tries_made: int | None = None) -> NextTry | None:
    """Make the delivery's try after `tries_made` (None: whichever is next) and record it. Returns the
    next try to queue, or None when there is none (delivered, given up, nothing left to send, another
    worker is sending it, or that try was made already). Safe to run twice, at once too: the try is
    claimed first, so one worker sends it, and a delivered or exhausted delivery is not sent again."""
    claim = claim_try(delivery_id, timezone.now(), tries_made)
    if claim is None:
        return None
    # Read under the claim: no other worker changes the row until this one records its try.
    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None:  # deleted with its webhook, or as an old one, since the claim
        return None
    claimed = WebhookDelivery.objects.filter(pk=delivery_id, claimed_until=claim)
    webhook = delivery.webhook
    if not webhook.active and delivery.event != WebhookEvent.PING:
        claimed.update(next_try_at=None, last_error="not sent: the webhook is disabled", claimed_until=None)
        return None
    status_code, error, retry = post(webhook, delivery)
    now = timezone.now()
    attempts = delivery.attempts + 1
    delay = RETRY_DELAYS_S[attempts - 1] if retry and attempts < MAX_TRIES else None
    if error and retry and delay is None:
        error = f"{error}; gave up after {attempts} tries"
    recorded = claimed.update(
        attempts=attempts,
        last_status_code=status_code,
        last_error=error[:500],
        tries=[*delivery.tries, {"at": now.isoformat(), "status_code": status_code, "error": error[:500]}],
        delivered_at=now if not error else None,
        next_try_at=now + timedelta(seconds=delay) if delay is not None else None,
        claimed_until=None,
    )
    if not recorded:
        # Only a try that outlived CLAIM_S (no time limit, as in a shell): another worker may have
        # taken the delivery since, and its tries are not overwritten.
        log.warning("webhook delivery %s: try %s outlived its claim (%s s) and is not recorded", delivery_id, attempts, CLAIM_S)
        return None
    return NextTry(delay, attempts) if delay is not None else None


def post(webhook: Webhook, delivery: WebhookDelivery) -> tuple[int | None, str, bool]:
    """POST the delivery: (status code, error sentence or "", whether to try again)."""
    try:
        secret = crypto.decrypt(webhook.secret_ciphertext)
    except crypto.UndecryptableSecret:
        return None, "not sent: its secret cannot be decrypted (STUDIO_ENCRYPTION_KEY changed): delete the webhook and add it again", False
    parts = urlsplit(webhook.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        # Again at send time: the name may resolve elsewhere now than when the webhook was saved.
        address = check_host(parts.hostname or "", port)
    except UnsafeAddress as exc:
        return None, f"not sent: {exc}", False
    # The POST goes to the address just checked, not to the name: looked up again as it connects, a
    # name could answer with an internal address by then. The name is still the Host header, and what
    # TLS sends (SNI) and checks the certificate against.
    pinned = urlunsplit(parts._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}"))
    tls = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    headers = {
        "Host": parts.netloc,  # no user name or password: validate_url refuses them
        "Content-Type": "application/json",
        "User-Agent": "Studio-Webhooks/1",
        "Studio-Signature": signature(secret, int(time.time()), body),
        "Studio-Event": delivery.event,
        "Studio-Delivery": str(delivery.pk),
    }
    try:
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as client:
            response = client.post(pinned, content=body, headers=headers, extensions=tls)
    except httpx.TimeoutException:
        return None, f"no answer within {TIMEOUT_S} s", True
    except httpx.HTTPError as exc:
        return None, f"could not connect: {exc}", True
    if 200 <= response.status_code < 300:
        return response.status_code, "", False
    moved = " (redirects are not followed: give the final URL)" if response.is_redirect else ""
    return response.status_code, f"the receiver answered {response.status_code}{moved}", True
