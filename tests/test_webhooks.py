"""Webhooks: a run that ends is POSTed, signed, to its project's webhooks; a failed try is tried again
and recorded; private addresses are refused; the secret is shown once; the roles hold.

The receiver is a real HTTP server on 127.0.0.1 (STUDIO_WEBHOOK_ALLOW_PRIVATE lets the Studio send
there), and the Celery task runs eagerly, in-process, once the transaction commits."""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.db.models import F
from django.test import Client
from django.utils import timezone

from studio import crypto, webhooks
from studio.models import AuditEvent, Webhook, WebhookDelivery
from tests.conftest import assert_error, sft_body, wait_for
from tests.datahub.test_models_page import final_checkpoint  # noqa: F401 - the fixture is used by name
from training.models import Status, TrainingRun

pytestmark = pytest.mark.django_db


@dataclass
class Receiver:
    """An HTTP server that records each POST and answers with the next of `statuses` (then 200); with
    `hold` given, only once it is set (a slow receiver)."""

    statuses: list[int] = field(default_factory=list)
    received: list[dict] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    hold: threading.Event | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append({"headers": dict(self.headers), "body": body, "path": self.path})
                if receiver.hold is not None:
                    receiver.hold.wait(webhooks.TIMEOUT_S)
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self


@pytest.fixture
def receiver(settings):
    settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = settings.STUDIO_WEBHOOK_ALLOW_HTTP = True
    receiver = Receiver().start()
    yield receiver
    assert receiver.server is not None
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture(autouse=True)
def eager_celery():
    from studio.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


@pytest.fixture
def sent(django_capture_on_commit_callbacks):
    """A context in which what is queued after commit is sent (and delivered) as the block ends."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def verify(secret: str, headers: dict, body: bytes) -> bool:
    """The receiver's check, as the README shows it."""
    parts = dict(item.split("=", 1) for item in headers["Studio-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


def add_hook(api, url: str, **body) -> dict:
    response = api.post("/api/webhooks", {"url": url, **body})
    assert response.status_code == 201, response.content
    return response.json()


@pytest.fixture
def live_run(api):
    """A provisioning run on attempt 1 with its engine's ingest token, as dispatch leaves it."""
    run_id = api.post("/api/training-runs", sft_body(name="nightly")).json()["id"]
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    return TrainingRun.objects.get(pk=run_id), token


def report(run, token: str, batch_id: str, status: str, **extra):
    """The engine's status report, through the ingest API."""
    body = {"batch_id": batch_id, "metrics": [], "logs": [], "rollouts": [], "status": status, **extra}
    response = Client().post(f"/api/ingest/runs/{run.pk}", data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content


def test_a_completed_run_is_posted_once_signed_to_its_webhook(api, project, receiver, live_run, sent, settings):
    hook = add_hook(api, receiver.url)
    run, token = live_run
    with sent():
        report(run, token, "b1", "running")
    assert receiver.received == []
    with sent():
        report(run, token, "b2", "completed")

    [post] = receiver.received
    assert verify(hook["secret"], post["headers"], post["body"])
    payload = json.loads(post["body"])
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert post["headers"]["Studio-Event"] == "run.completed" and post["headers"]["Studio-Delivery"] == str(delivery.pk)
    assert post["headers"]["Content-Type"] == "application/json"
    assert payload["type"] == "run.completed" and payload["id"] == str(delivery.pk) and payload["created_at"]
    assert payload["data"] == {
        "run_id": run.pk,
        "name": "nightly",
        "project": "acme",
        "method": "sft",
        "status": "completed",
        "error": None,
        "published_model": None,
        "url": f"{settings.STUDIO_PUBLIC_URL}/training/runs/{run.pk}/",
    }
    assert delivery.attempts == 1 and delivery.last_status_code == 200 and delivery.delivered_at and delivery.next_try_at is None
    # A signature made with another secret, or over another body, does not verify.
    assert not verify("whsec_other", post["headers"], post["body"])
    assert not verify(hook["secret"], post["headers"], post["body"].replace(b"nightly", b"daily"))


def test_a_failed_run_sends_its_error_code_and_message_but_not_its_log(api, receiver, live_run, sent):
    hook = add_hook(api, receiver.url)
    run, token = live_run
    with sent():
        report(run, token, "b1", "failed", error={"code": "oom", "message": "CUDA out of memory", "log_tail": ["SECRET_TOKEN=abc"]})
    [post] = receiver.received
    assert verify(hook["secret"], post["headers"], post["body"])
    data = json.loads(post["body"])["data"]
    assert post["headers"]["Studio-Event"] == "run.failed"
    assert data["status"] == "failed" and data["error"] == {"code": "oom", "message": "CUDA out of memory"}
    assert b"SECRET_TOKEN" not in post["body"]


def test_a_stopped_run_sends_run_cancelled(api, receiver, live_run, sent):
    hook = add_hook(api, receiver.url)
    run, token = live_run
    report(run, token, "b1", "running")
    with sent():
        assert api.post(f"/api/training-runs/{run.pk}/stop").status_code == 200
    [post] = receiver.received
    assert post["headers"]["Studio-Event"] == "run.cancelled" and verify(hook["secret"], post["headers"], post["body"])
    assert json.loads(post["body"])["data"]["status"] == "cancelled"


def test_an_event_the_webhook_does_not_want_is_not_sent(api, receiver, live_run, sent):
    failures_only = add_hook(api, receiver.url, events=["run.failed"])
    disabled = add_hook(api, receiver.url + "?disabled")
    assert api.patch(f"/api/webhooks/{disabled['id']}", {"active": False}).json()["active"] is False
    run, token = live_run
    with sent():
        report(run, token, "b1", "completed")
    assert receiver.received == []
    assert not WebhookDelivery.objects.filter(webhook_id__in=[failures_only["id"], disabled["id"]]).exists()


def test_a_500_is_tried_again_and_each_try_is_recorded(api, receiver, live_run, sent):
    hook = add_hook(api, receiver.url)
    receiver.statuses = [500, 503]
    run, token = live_run
    with sent():
        report(run, token, "b1", "completed")
    # Eagerly, the countdown is not waited for: the third try got the 200.
    assert len(receiver.received) == 3
    assert len({post["headers"]["Studio-Delivery"] for post in receiver.received}) == 1
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.attempts == 3 and delivery.delivered_at and delivery.last_status_code == 200 and delivery.last_error == ""
    assert [t["status_code"] for t in delivery.tries] == [500, 503, 200]
    assert delivery.tries[0]["error"] == "the receiver answered 500"


def test_a_receiver_that_keeps_failing_is_given_up_after_five_tries(api, receiver, live_run, sent):
    hook = add_hook(api, receiver.url)
    receiver.statuses = [500] * 10
    run, token = live_run
    with sent():
        report(run, token, "b1", "completed")
    assert len(receiver.received) == webhooks.MAX_TRIES == 5
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.attempts == 5 and delivery.delivered_at is None and delivery.next_try_at is None
    assert delivery.last_error == "the receiver answered 500; gave up after 5 tries"
    listed = api.get(f"/api/webhooks/{hook['id']}/deliveries").json()
    assert listed[0]["attempts"] == 5 and listed[0]["last_status_code"] == 500


def test_a_redirect_is_not_followed(api, receiver, sent):
    hook = add_hook(api, receiver.url)
    receiver.statuses = [302] * 5
    with sent():
        assert api.post(f"/api/webhooks/{hook['id']}/test").status_code == 202
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.last_status_code == 302 and "redirects are not followed" in delivery.last_error


def test_send_test_pings_the_receiver(api, receiver, sent):
    hook = add_hook(api, receiver.url)
    with sent():
        response = api.post(f"/api/webhooks/{hook['id']}/test")
    assert response.status_code == 202 and response.json()["event"] == "ping"
    [post] = receiver.received
    assert post["headers"]["Studio-Event"] == "ping" and verify(hook["secret"], post["headers"], post["body"])
    [listed] = api.get(f"/api/webhooks/{hook['id']}/deliveries").json()
    assert listed["event"] == "ping" and listed["delivered_at"] and listed["attempts"] == 1


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:9/hook",
        "https://localhost/hook",
        "https://10.0.0.5/",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://192.168.1.1/",
        "https://0.0.0.0/",
    ],
)
def test_a_private_address_is_refused_without_the_setting(api, project, url):
    body = assert_error(api.post("/api/webhooks", {"url": url}), 400, "url")
    assert "STUDIO_WEBHOOK_ALLOW_PRIVATE" in body["errors"][0]["message"]
    assert not Webhook.objects.filter(project=project).exists()


def test_an_address_that_became_private_is_not_sent_to(api, receiver, sent, settings):
    hook = add_hook(api, receiver.url)
    settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = False
    with sent():
        api.post(f"/api/webhooks/{hook['id']}/test")
    assert receiver.received == []
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.attempts == 1 and delivery.next_try_at is None and "resolves to 127.0.0.1" in delivery.last_error


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://hooks.example.com/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "https://user:pw@hooks.example.com/x"}, "url"),
        ({"url": "https://no-such-host.invalid/x"}, "url"),
        ({"url": ""}, "url"),
        ({}, "url"),
        ({"url": "https://hooks.example.com/x", "events": ["run.finished"]}, "events[0]"),
        ({"url": "https://hooks.example.com/x", "events": []}, "events"),
        ({"url": "https://hooks.example.com/x", "secret": "mine"}, "secret"),
    ],
)
def test_a_bad_webhook_is_400_naming_the_field(api, project, body, field):
    assert_error(api.post("/api/webhooks", body), 400, field)
    assert not Webhook.objects.filter(project=project).exists()


def test_http_is_refused_unless_allowed(api, settings, receiver):
    settings.DEBUG = settings.STUDIO_WEBHOOK_ALLOW_HTTP = False
    body = assert_error(api.post("/api/webhooks", {"url": receiver.url}), 400, "url")
    assert "STUDIO_WEBHOOK_ALLOW_HTTP" in body["errors"][0]["message"]
    settings.DEBUG = True
    assert api.post("/api/webhooks", {"url": receiver.url}).status_code == 201
    settings.DEBUG, settings.STUDIO_WEBHOOK_ALLOW_HTTP = False, True
    assert api.post("/api/webhooks", {"url": receiver.url + "?second"}).status_code == 201


def test_viewer_cannot_write_and_member_can(api, api_as, receiver):
    hook = add_hook(api, receiver.url)
    viewer = api_as("viewer")
    assert [h["id"] for h in viewer.get("/api/webhooks").json()] == [hook["id"]]
    assert viewer.get(f"/api/webhooks/{hook['id']}/deliveries").status_code == 200
    assert_error(viewer.post("/api/webhooks", {"url": receiver.url}), 403)
    assert_error(viewer.delete(f"/api/webhooks/{hook['id']}"), 403)
    assert_error(viewer.post(f"/api/webhooks/{hook['id']}/test"), 403)
    assert_error(viewer.patch(f"/api/webhooks/{hook['id']}", {"active": False}), 403)
    assert Webhook.objects.filter(pk=hook["id"], active=True).exists()
    assert api_as("member").delete(f"/api/webhooks/{hook['id']}").status_code == 204
    assert not Webhook.objects.filter(pk=hook["id"]).exists()


def test_another_projects_webhook_is_404(api, api_as, receiver):
    hook = add_hook(api, receiver.url)
    outsider = api_as("outsider")
    assert outsider.get("/api/webhooks").json() == []
    for response in (
        outsider.get(f"/api/webhooks/{hook['id']}/deliveries"),
        outsider.delete(f"/api/webhooks/{hook['id']}"),
        outsider.post(f"/api/webhooks/{hook['id']}/test"),
        outsider.patch(f"/api/webhooks/{hook['id']}", {"active": False}),
    ):
        assert_error(response, 404)
    assert Webhook.objects.filter(pk=hook["id"], active=True).exists()


def test_the_secret_is_shown_once_stored_encrypted_and_never_in_a_get(api, api_as, receiver, users):
    hook = add_hook(api, receiver.url)
    secret = hook["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT secret_ciphertext FROM {Webhook._meta.db_table} WHERE id = %s", [hook["id"]])
        raw = bytes(cursor.fetchone()[0])
    assert secret.encode() not in raw and crypto.decrypt(raw) == secret
    client = Client()
    client.force_login(users["owner"])
    reads = [
        api.get("/api/webhooks"),
        api.get(f"/api/webhooks/{hook['id']}/deliveries"),
        api_as("viewer").get("/api/webhooks"),
        client.get("/settings/webhooks/"),
        api.get("/api/openapi.json"),
    ]
    for response in reads:
        assert response.status_code == 200
        assert secret not in response.content.decode()
    assert "secret" not in api.get("/api/webhooks").json()[0]
    event = AuditEvent.objects.get(target_type="webhook", action="created")
    assert secret not in json.dumps(event.details) and event.target_name == receiver.url


def test_create_and_delete_are_audited(api, receiver):
    hook = add_hook(api, receiver.url)
    api.delete(f"/api/webhooks/{hook['id']}")
    assert list(AuditEvent.objects.filter(target_type="webhook").order_by("id").values_list("action", "actor_name")) == [
        ("created", "owner"),
        ("deleted", "owner"),
    ]


def test_only_the_newest_deliveries_are_kept(api, receiver, sent, monkeypatch):
    monkeypatch.setattr(webhooks, "DELIVERIES_KEPT", 3)
    hook = add_hook(api, receiver.url)
    with sent():
        for _ in range(5):
            api.post(f"/api/webhooks/{hook['id']}/test")
    kept = list(WebhookDelivery.objects.filter(webhook_id=hook["id"]).values_list("pk", flat=True))
    assert len(kept) == 3 and max(kept) == WebhookDelivery.objects.filter(webhook_id=hook["id"]).latest("created_at").pk


def test_the_page_lists_webhooks_and_their_deliveries(api, users, receiver, live_run, sent):
    hook = add_hook(api, receiver.url)
    receiver.statuses = [500] * 5
    run, token = live_run
    with sent():
        report(run, token, "b1", "failed")
    owner = Client()
    owner.force_login(users["owner"])
    page = owner.get("/settings/webhooks/").content.decode()
    assert receiver.url in page and "run.failed" in page and f"run {run.pk}" in page
    assert "the receiver answered 500; gave up after 5 tries" in page
    assert "Send test" in page and "Disable" in page
    assert 'href="/settings/webhooks/"' in owner.get("/settings/secrets/").content.decode()
    assert 'aria-current="page">Settings</a>' in page and 'aria-current="page">Webhooks</a>' in page  # the top bar's entry, the tab
    viewer = Client()
    viewer.force_login(users["viewer"])
    read_only = viewer.get("/settings/webhooks/").content.decode()
    assert receiver.url in read_only and "Send test" not in read_only and "Viewers cannot change webhooks" in read_only
    assert viewer.post(f"/settings/webhooks/{hook['id']}/delete").status_code == 403
    assert Webhook.objects.filter(pk=hook["id"]).exists()


def test_the_page_adds_a_webhook_and_shows_its_secret_once(users, project, receiver, sent):
    owner = Client()
    owner.force_login(users["owner"])
    response = owner.post("/settings/webhooks/new", {"url": receiver.url, "events": ["run.completed", "run.failed"]})
    assert response.status_code == 200 and response["Cache-Control"].startswith("max-age=0")
    hook = Webhook.objects.get()
    secret = crypto.decrypt(hook.secret_ciphertext)
    assert secret in response.content.decode() and hook.events == ["run.completed", "run.failed"]
    assert secret not in owner.get("/settings/webhooks/").content.decode()
    with sent():
        assert owner.post(f"/settings/webhooks/{hook.pk}/test").status_code == 302
    assert receiver.received[0]["headers"]["Studio-Event"] == "ping"
    assert owner.post(f"/settings/webhooks/{hook.pk}/active", {"active": "0"}).status_code == 302
    assert Webhook.objects.get().active is False
    assert owner.post(f"/settings/webhooks/{hook.pk}/delete").status_code == 302
    assert not Webhook.objects.exists()


def said(response) -> list[tuple[str, str]]:
    """The page's messages: (level, text), as a reader sees them (the URLs' bidi isolates left out)."""
    found = re.findall(r'<li class="msg-(\w+)"><bdi dir="ltr">(.*?)</bdi></li>', response.content.decode(), re.S)
    return [(level, html.unescape(text).replace("\u2068", "").replace("\u2069", "")) for level, text in found]


def test_the_pages_messages_say_what_each_change_means(users, project, receiver):
    owner = Client()
    owner.force_login(users["owner"])
    [(level, added)] = said(owner.post("/settings/webhooks/new", {"url": receiver.url, "events": ["run.completed", "run.failed"]}))
    hook = Webhook.objects.get()
    named = f"webhook {hook.pk} ({receiver.url})"
    assert level == "success" and added == (
        f"Added {named}: it is sent run.completed and run.failed (not run.cancelled or model.published) from now on; what happened "
        "before is not sent. Its signing secret is below, shown this once: copy it to the receiver now. Send test checks that the receiver answers."
    )

    def change(action: str, **data) -> list[tuple[str, str]]:
        return said(owner.post(f"/settings/webhooks/{hook.pk}/{action}", data, follow=True))

    disabled = ("nothing is sent to it until you enable it again: events meanwhile are not sent later, and retries that fall due "
                "meanwhile are dropped. Send test still pings it.")
    assert change("active", active="0") == [("success", f"Disabled {named}: {disabled}")]
    assert change("active", active="0") == [("info", f"W{named[1:]} was already disabled: {disabled}")]
    [(_, pinged)] = change("test")
    delivery = WebhookDelivery.objects.get()
    assert pinged == (f"Queued a ping to {named} as delivery {delivery.pk} (sent although the webhook is disabled): it is listed in the "
                      "webhook's deliveries below; reload the page to see how the receiver answered.")
    assert change("active", active="1") == [("success", f"Enabled {named}: it is sent run.completed and run.failed (not run.cancelled or "
                                                         "model.published) again from now on; events while it was disabled are not sent.")]
    assert change("delete") == [("success", f"Deleted {named} and its deliveries: nothing more is sent to it, retries included, and its signing "
                                            "secret signs nothing now. To send to the URL again, add it again: it gets a new secret.")]
    [(_, every)] = said(owner.post("/settings/webhooks/new", {"url": receiver.url, "events": webhooks.EVENT_NAMES}))
    assert "it is sent every event (run.completed, run.failed, run.cancelled and model.published) from now on" in every


def test_the_page_refuses_a_private_url_beside_its_field(users, project):
    from tests.conftest import refused_form_page

    owner = Client()
    owner.force_login(users["owner"])
    page = refused_form_page(owner, "/settings/webhooks/new", {"url": "https://127.0.0.1/x", "events": ["run.completed"]}, "/settings/webhooks/")
    assert "STUDIO_WEBHOOK_ALLOW_PRIVATE" in page and 'value="https://127.0.0.1/x"' in page
    assert not Webhook.objects.exists()


def test_the_readme_snippet_verifies_a_delivery(api, receiver, sent):
    from tests.conftest import REPO_ROOT

    section = (REPO_ROOT / "README.md").read_text().split("## Webhooks\n", 1)[1].split("\n## ", 1)[0]
    [snippet] = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(snippet.strip().splitlines()) <= 10
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102 - the README's own code, run as a receiver would
    hook = add_hook(api, receiver.url)
    with sent():
        api.post(f"/api/webhooks/{hook['id']}/test")
    [post] = receiver.received
    assert namespace["verify"](hook["secret"], post["headers"]["Studio-Signature"], post["body"])
    assert not namespace["verify"](hook["secret"], post["headers"]["Studio-Signature"], post["body"] + b" ")


def test_a_receiver_that_cannot_be_reached_is_tried_again(api, receiver, sent):
    from tests.conftest import free_port

    hook = add_hook(api, f"http://127.0.0.1:{free_port()}/hook")
    with sent():
        api.post(f"/api/webhooks/{hook['id']}/test")
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.attempts == webhooks.MAX_TRIES and delivery.delivered_at is None
    assert all(t["status_code"] is None and t["error"].startswith("could not connect") for t in delivery.tries)


def test_with_the_task_queue_down_the_delivery_says_it_was_not_sent(api, receiver, sent):
    from studio.celery import app
    from tests.test_queue_down import NOWHERE, point_broker_at

    hook = add_hook(api, receiver.url)
    kept, app.conf.task_always_eager = app.conf.broker_url, False
    point_broker_at(NOWHERE)
    try:
        with sent():
            response = api.post(f"/api/webhooks/{hook['id']}/test")
    finally:
        point_broker_at(kept)
    assert response.status_code == 202
    assert receiver.received == []
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.attempts == 0 and "not sent yet: the Studio's task queue (Redis) could not be reached" in delivery.last_error
    # It was left so ("use Send test"): the reconciler's first pass with the queue back sends it.
    assert webhooks.deliveries_to_resend() == []  # not late yet: a worker may still take it
    app.conf.task_always_eager = True  # the task run in this process, as the other tests here do
    webhooks.resend(delivery.pk)  # nor is it resent
    assert receiver.received == []
    made_late(delivery)
    assert webhooks.deliveries_to_resend() == [delivery.pk]
    webhooks.resend(delivery.pk)  # as training.tasks.reconcile_runs does
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.delivered_at is not None and delivery.last_error == ""
    assert webhooks.deliveries_to_resend(timezone.now() + timedelta(seconds=webhooks.RESEND_AFTER_S + 1)) == []


def test_the_page_reads_as_many_rows_in_as_many_queries_for_more_webhooks(api, users, receiver, sent):
    from django.test.utils import CaptureQueriesContext

    owner = Client()
    owner.force_login(users["owner"])

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner.get("/settings/webhooks/").status_code == 200
        return len(captured)

    with sent():
        api.post(f"/api/webhooks/{add_hook(api, receiver.url)['id']}/test")
    one = queries()
    with sent():
        for n in range(3):
            api.post(f"/api/webhooks/{add_hook(api, f'{receiver.url}?n={n}')['id']}/test")
    assert queries() == one


def test_a_try_goes_to_the_address_that_was_checked_not_to_a_second_lookup(api, receiver, sent, monkeypatch):
    """DNS rebinding: the name was checked, then looked up again as httpx connected, so a name answering
    with a public address and then an internal one reached the internal one. Only name resolution is
    replaced here (getaddrinfo, the narrowest boundary): the first lookup of hooks.example.test gives
    the receiver's address, any later one an address where nothing listens."""
    import socket

    port = receiver.server.server_address[1]
    real, lookups = socket.getaddrinfo, []

    def rebinding(host, *args, **kwargs):
        if host != "hooks.example.test":
            return real(host, *args, **kwargs)
        lookups.append(host)
        return real("127.0.0.1" if len(lookups) == 1 else "127.0.0.9", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    hook = add_hook(api, f"http://hooks.example.test:{port}/hook")  # saving checks the name: lookup 1
    lookups.clear()
    with sent():
        api.post(f"/api/webhooks/{hook['id']}/test")
    assert lookups == ["hooks.example.test"]  # once, by the check before the try
    (got,) = receiver.received
    assert got["path"] == "/hook" and got["headers"]["Host"] == f"hooks.example.test:{port}"
    assert WebhookDelivery.objects.get(webhook_id=hook["id"]).delivered_at is not None


# ---- model.published ---------------------------------------------------------------------------------


def test_a_published_model_is_posted_as_model_published_once(api, project, receiver, sent, settings, final_checkpoint):  # noqa: F811
    """run.completed is sent before the run's weights are published, so its published_model is mostly
    null: model.published, sent by the publish itself, names the model repo and its commit."""
    from datahub.models import Repo
    from datahub.repos import resolve
    from datahub.services import commit_checkpoint

    hook = add_hook(api, receiver.url)
    assert "model.published" in hook["events"]  # all events by default
    only_runs = add_hook(api, receiver.url + "?runs", events=["run.completed"])
    run = final_checkpoint.run
    with sent():
        commit_checkpoint(final_checkpoint.pk)
    [post] = receiver.received
    assert post["path"] == "/hook" and post["headers"]["Studio-Event"] == "model.published"
    assert verify(hook["secret"], post["headers"], post["body"])
    repo = Repo.objects.get(project=project, name=f"my-sft-run-run{run.pk}")
    assert json.loads(post["body"])["data"] == {
        "run_id": run.pk,
        "name": "My SFT Run",
        "project": project.slug,
        "method": "sft",
        "model": repo.full_name,
        "commit": resolve(repo, "main").pk,
        "url": f"{settings.STUDIO_PUBLIC_URL}/training/runs/{run.pk}/",
        "model_url": f"{settings.STUDIO_PUBLIC_URL}/hub/{project.slug}/{repo.name}",
    }
    assert not WebhookDelivery.objects.filter(webhook_id=only_runs["id"]).exists()
    with sent():
        commit_checkpoint(final_checkpoint.pk)  # a retry of the task: publishes nothing new
    assert len(receiver.received) == 1 and WebhookDelivery.objects.filter(event="model.published").count() == 1


# ---- one webhook per URL, told apart on the page ----------------------------------------------------


def test_a_url_the_project_has_a_webhook_to_is_refused_naming_that_webhook(api, project, receiver, users):
    first = add_hook(api, receiver.url)
    body = assert_error(api.post("/api/webhooks", {"url": f"  {receiver.url} ", "events": ["run.failed"]}), 400, "url")
    assert f"webhook {first['id']}" in body["errors"][0]["message"]
    assert Webhook.objects.filter(project=project).count() == 1
    second = add_hook(api, receiver.url + "?team=b")
    owner = Client()
    owner.force_login(users["owner"])
    page = owner.get("/settings/webhooks/").content.decode()
    for hook in (first, second):
        assert f"Webhook {hook['id']}</span>" in page
        assert f'aria-label="Delete webhook {hook["id"]} (' in page and f'aria-label="Send a test ping to webhook {hook["id"]} (' in page
    labels = re.findall(r'aria-label="([^"]*)"', page)
    assert len(labels) == len(set(labels)), labels


# ---- what the form says it accepts, and link-local addresses --------------------------------------------


def test_the_form_says_which_urls_this_studio_accepts(users, project, settings):
    owner = Client()
    owner.force_login(users["owner"])
    settings.DEBUG = settings.STUDIO_WEBHOOK_ALLOW_HTTP = settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = False
    assert "An https URL on the public internet;" in owner.get("/settings/webhooks/").content.decode()
    settings.STUDIO_WEBHOOK_ALLOW_HTTP = settings.STUDIO_WEBHOOK_ALLOW_PRIVATE = True
    page = owner.get("/settings/webhooks/").content.decode()
    assert "An https or http URL on the public internet or at a loopback or private address (never a link-local one);" in page


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "https://169.254.1.1/hook", "https://[fe80::1]/hook", "https://[::ffff:169.254.169.254]/hook"]
)
def test_a_link_local_address_is_refused_even_where_private_ones_are_allowed(api, project, receiver, url):
    body = assert_error(api.post("/api/webhooks", {"url": url}), 400, "url")
    assert "link-local" in body["errors"][0]["message"] and "STUDIO_WEBHOOK_ALLOW_PRIVATE" not in body["errors"][0]["message"]  # it would not help
    assert not Webhook.objects.filter(project=project).exists()


def test_a_name_that_became_link_local_is_not_sent_to(api, receiver, sent, monkeypatch):
    import socket

    port = receiver.server.server_address[1]
    real, answer = socket.getaddrinfo, ["127.0.0.1"]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: real(answer[0] if host == "hooks.example.test" else host, *a, **kw))
    hook = add_hook(api, f"http://hooks.example.test:{port}/hook")
    answer[0] = "169.254.169.254"
    with sent():
        api.post(f"/api/webhooks/{hook['id']}/test")
    assert receiver.received == []
    delivery = WebhookDelivery.objects.get(webhook_id=hook["id"])
    assert delivery.next_try_at is None and "169.254.169.254, a link-local address" in delivery.last_error


def ping_delivery(project, receiver, **fields) -> WebhookDelivery:
    """A ping queued to a webhook to the receiver, its task not run yet."""
    hook, _ = webhooks.create_webhook(project, receiver.url, None)
    return WebhookDelivery.objects.create(webhook=hook, event="ping", payload={"type": "ping"}, next_try_at=timezone.now(), **fields)


def made_late(delivery: WebhookDelivery) -> None:
    """Its try due RESEND_AFTER_S ago, and a claim on it that long older: the clock moved on, told
    through the row (the reconciler's `now` is the real one)."""
    older = timedelta(seconds=webhooks.RESEND_AFTER_S + 1)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_try_at=F("next_try_at") - older, claimed_until=F("claimed_until") - older)


def test_two_workers_on_one_try_post_it_once(transactional_db, project, receiver):
    """A second task for the delivery (the reconciler's resend of a slow try, the broker handing the
    task out again) runs while the first worker waits on the receiver: it finds the try claimed."""
    delivery = ping_delivery(project, receiver)
    receiver.hold = threading.Event()
    delays: dict[str, int | None] = {}

    def worker(name: str) -> None:
        try:
            delays[name] = webhooks.attempt_delivery(delivery.pk)
        finally:
            connection.close()

    first = threading.Thread(target=worker, args=("first",))
    first.start()
    wait_for(lambda: receiver.received, 10, 0.05, message="the first worker's POST")
    second = threading.Thread(target=worker, args=("second",))
    second.start()
    second.join(2)
    receiver.hold.set()
    first.join(10)
    second.join(10)
    assert len(receiver.received) == 1
    assert delays == {"first": None, "second": None}
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and len(delivery.tries) == 1 and delivery.delivered_at is not None and delivery.claimed_until is None


def test_a_try_whose_worker_died_is_sent_once_its_claim_runs_out(project, receiver):
    assert webhooks.CLAIM_S < webhooks.RESEND_AFTER_S
    delivery = ping_delivery(project, receiver)
    assert webhooks.claim_try(delivery.pk, timezone.now()) is not None  # a worker claims the try, and is killed mid-POST
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_try_at=timezone.now() - timedelta(seconds=webhooks.RESEND_AFTER_S + 1))
    assert webhooks.attempt_delivery(delivery.pk, 0) is None  # the task handed out again while the claim holds
    assert webhooks.deliveries_to_resend() == []  # late, but its try may still be in flight
    webhooks.resend(delivery.pk)
    assert receiver.received == []
    made_late(delivery)  # its claim has run out
    assert webhooks.deliveries_to_resend() == [delivery.pk]
    webhooks.resend(delivery.pk)  # as training.tasks.reconcile_runs does; the task runs in this process
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.delivered_at is not None and delivery.claimed_until is None
    assert webhooks.attempt_delivery(delivery.pk) is None and len(receiver.received) == 1  # a delivered one is not sent again


def test_the_admin_lists_webhooks_and_deliveries_and_never_shows_the_secret(project, receiver, sent):
    from django.contrib.auth import get_user_model

    hook, secret = webhooks.create_webhook(project, receiver.url, ["run.failed", "model.published"])
    receiver.statuses = [500]
    with sent():
        delivery = webhooks.send_test(hook)
    root = Client()
    root.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    pages = {}
    for url in ("/admin/studio/webhook/", f"/admin/studio/webhook/{hook.pk}/change/",
                "/admin/studio/webhookdelivery/", f"/admin/studio/webhookdelivery/{delivery.pk}/change/"):
        response = root.get(url)
        assert response.status_code == 200, url
        pages[url] = page = response.content.decode()
        assert secret not in page and "ciphertext" not in page.lower() and webhooks.SECRET_PREFIX not in page, url
    webhook_list, delivery_list = pages["/admin/studio/webhook/"], pages["/admin/studio/webhookdelivery/"]
    assert receiver.url in webhook_list and "acme" in webhook_list and '<td class="field-event_names">run.failed, model.published</td>' in webhook_list
    assert '<td class="field-event">Ping</td>' in delivery_list and '<td class="field-attempts">2</td>' in delivery_list
    assert '<td class="field-last_status_code">200</td>' in delivery_list
    assert 'name="_save"' not in pages[f"/admin/studio/webhookdelivery/{delivery.pk}/change/"]  # the worker's record, read-only
    for url in ("/admin/studio/webhook/add/", "/admin/studio/webhookdelivery/add/"):
        assert root.get(url).status_code == 403, url  # a webhook is added where its secret is shown once


def test_a_task_for_a_try_made_already_sends_nothing(project, receiver):
    """The broker hands a task out again after its try was made, or the reconciler's resend of a slow
    try runs after it: the next try waits for its own task and time."""
    from studio.tasks import deliver_webhook

    delivery = ping_delivery(project, receiver)
    made_late(delivery)
    assert webhooks.deliveries_to_resend() == [delivery.pk]  # the reconciler lists it, then polls the runs
    receiver.statuses = [500]
    assert webhooks.attempt_delivery(delivery.pk, 0) == (webhooks.RETRY_DELAYS_S[0], 1)  # the slow task's try
    webhooks.resend(delivery.pk)  # not late now: its next try is due in a minute
    assert webhooks.attempt_delivery(delivery.pk, 0) is None  # its task handed out again
    deliver_webhook.delay(delivery.pk, 0)
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.next_try_at > timezone.now()
    assert webhooks.attempt_delivery(delivery.pk, 1) is None and len(receiver.received) == 2  # the next try's own task
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.delivered_at is not None
