"""Settings → API tokens, through Django's test client against the real database: a member lists,
makes and revokes their own tokens (an owner, everyone's in the project); the plaintext is shown
once and works against the API; a revoked token is a 401; other projects' tokens are 404."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from studio.auth import BAD_TOKEN
from studio.crypto import hash_token
from studio.models import ApiToken, AuditEvent
from studio.services import create_api_token
from tests.conftest import Api, refused_form_page

pytestmark = pytest.mark.django_db

PAGE = "/settings/api-tokens/"


def client_for(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def make_token(client: Client, name: str = "") -> tuple[str, str]:
    """POST the page's form; (the answer's HTML, the plaintext it shows)."""
    response = client.post("/settings/api-tokens/new", {"name": name})
    assert response.status_code == 200, response.content[:2000]
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    return html, re.search(r'id="new-token" value="(stu_[^"]+)"', html).group(1)


def row(user, name: str = "") -> ApiToken:
    return ApiToken.objects.get(user=user, name=name)


def test_the_list_shows_the_members_own_tokens_never_a_hash(project, users, tokens):
    mine = row(users["member"])
    html = client_for(users["member"]).get(PAGE).content.decode()
    assert f">{mine.prefix}…</code>" in html and "active" in html and "never" in html
    for other in ApiToken.objects.exclude(pk=mine.pk):
        assert other.prefix not in html
    assert not [t for t in ApiToken.objects.values_list("token_hash", flat=True) if t in html]
    assert 'aria-current="page">Settings</a>' in html and 'aria-current="page">API tokens</a>' in html  # the nav's entry, the settings tab


def test_an_owner_lists_every_token_of_the_project_with_its_user_and_no_other_projects(project, users, tokens, django_assert_max_num_queries):
    owner = client_for(users["owner"])
    html = owner.get(PAGE).content.decode()
    for name in ("owner", "member", "viewer"):
        assert row(users[name]).prefix in html and f"<td>{name}</td>" in html
    assert row(users["outsider"]).prefix not in html
    with django_assert_max_num_queries(20) as few:
        owner.get(PAGE)
    for _ in range(5):
        create_api_token(users["member"], project)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert owner.get(PAGE).content.decode().count(">Revoke</button>") == 8


def test_a_new_token_is_shown_once_and_authenticates_an_api_call(project, users):
    client = client_for(users["member"])
    html, plaintext = make_token(client, "laptop")
    assert "it will not be shown again" in html and "Copy it now" in html
    assert f'curl -H "Authorization: Bearer {plaintext}" http://testserver/api/training-runs' in html
    token = ApiToken.objects.get(token_hash=hash_token(plaintext))
    assert (token.user, token.project, token.name, token.prefix, token.revoked_at) == (users["member"], project, "laptop", plaintext[:10], None)
    assert plaintext not in client.get(PAGE).content.decode()  # once
    assert Api(Client(), plaintext).get("/api/training-runs").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_revoking_makes_the_api_answer_401_and_a_second_revoke_is_harmless(project, users):
    client = client_for(users["member"])
    _, plaintext = make_token(client, "ci")
    token = row(users["member"], "ci")
    response = client.post(f"/settings/api-tokens/{token.pk}/revoke")
    assert response.status_code == 302 and response["Location"] == PAGE
    token.refresh_from_db()
    revoked_at = token.revoked_at
    assert revoked_at is not None
    detail = Api(Client(), plaintext).get("/api/training-runs").json()["detail"]
    assert detail == BAD_TOKEN and "Settings → API tokens" in detail
    again = client.post(f"/settings/api-tokens/{token.pk}/revoke", follow=True)
    assert again.status_code == 200 and "was already revoked" in again.content.decode()
    token.refresh_from_db()
    assert token.revoked_at == revoked_at
    page = client.get(PAGE).content.decode()
    assert "revoked at" in page and ">Revoke</button>" not in page


def test_another_projects_or_another_members_token_is_404_and_stays_active(project, other_project, users, tokens):
    member = client_for(users["member"])
    for holder in ("outsider", "owner", "viewer"):
        token = row(users[holder])
        assert member.post(f"/settings/api-tokens/{token.pk}/revoke").status_code == 404
        token.refresh_from_db()
        assert token.revoked_at is None
    # An owner of globex, not of acme: acme's tokens are another project's.
    assert client_for(users["outsider"]).post(f"/settings/api-tokens/{row(users['owner']).pk}/revoke").status_code == 404
    assert row(users["owner"]).revoked_at is None


def test_an_owner_may_revoke_a_members_token(project, users, tokens):
    response = client_for(users["owner"]).post(f"/settings/api-tokens/{row(users['member']).pk}/revoke")
    assert response.status_code == 302
    assert row(users["member"]).revoked_at is not None
    assert Api(Client(), tokens["member"]).get("/api/training-runs").status_code == 401


def test_a_viewers_token_reads_and_the_page_says_it_cannot_write(project, users):
    client = client_for(users["viewer"])
    assert 'data-testid="viewer-note"' in client.get(PAGE).content.decode()
    assert 'data-testid="viewer-note"' not in client_for(users["member"]).get(PAGE).content.decode()
    _, plaintext = make_token(client)
    api = Api(Client(), plaintext)
    assert api.get("/api/training-runs").status_code == 200
    assert api.post("/api/experiments", {"name": "not allowed"}).status_code == 403


def test_an_overlong_name_is_refused_beside_the_name_field(project, users):
    client = client_for(users["member"])
    html = refused_form_page(client, "/settings/api-tokens/new", {"name": "n" * 101}, PAGE)
    assert 'id="f-name-errors"' in html and "a token&#x27;s name has at most 100 characters; this one has 101" in html
    assert 'aria-invalid="true"' in html and 'value="' + "n" * 101 + '"' in html
    nul = refused_form_page(client, "/settings/api-tokens/new", {"name": "ci\x00"}, PAGE)
    assert 'id="f-name-errors"' in nul and "a token&#x27;s name cannot contain a NUL character" in nul
    assert not ApiToken.objects.filter(user=users["member"]).exists()


def test_the_forms_need_the_csrf_token(project, users, tokens):
    client = client_for(users["owner"], enforce_csrf_checks=True)
    before = ApiToken.objects.count()
    assert client.post("/settings/api-tokens/new", {"name": "forged"}).status_code == 403
    assert client.post(f"/settings/api-tokens/{row(users['member']).pk}/revoke").status_code == 403
    assert ApiToken.objects.count() == before and row(users["member"]).revoked_at is None
    page = client.get(PAGE)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    assert client.post("/settings/api-tokens/new", {"name": "real", "csrfmiddlewaretoken": csrf}).status_code == 200


def test_anonymous_is_sent_to_log_in_and_nothing_is_made(project, users, tokens):
    anonymous = Client()
    response = anonymous.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=/settings/api-tokens/")
    before = ApiToken.objects.count()
    assert anonymous.post("/settings/api-tokens/new", {"name": "x"}).status_code == 302
    assert anonymous.post(f"/settings/api-tokens/{row(users['member']).pk}/revoke").status_code == 302
    assert ApiToken.objects.count() == before and row(users["member"]).revoked_at is None


def test_a_get_of_a_form_action_goes_to_the_page(project, users, tokens):
    client = client_for(users["member"])
    assert client.get("/settings/api-tokens/new")["Location"] == PAGE
    assert client.get(f"/settings/api-tokens/{row(users['member']).pk}/revoke")["Location"] == PAGE
    assert row(users["member"]).revoked_at is None


def test_making_and_revoking_on_the_page_is_audited_without_the_plaintext(project, users):
    client = client_for(users["member"])
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    _, plaintext = make_token(client, "ci")
    token = row(users["member"], "ci")
    client.post(f"/settings/api-tokens/{token.pk}/revoke")
    client.post(f"/settings/api-tokens/{token.pk}/revoke")
    events = list(AuditEvent.objects.filter(id__gt=last).order_by("id"))
    assert [(e.action, e.target_type, e.target_id, e.actor_name, e.via, e.project_slug) for e in events] == [
        ("created", "apitoken", str(token.pk), "member", "session", "acme"),
        ("revoked", "apitoken", str(token.pk), "member", "session", "acme"),
    ]
    assert all(plaintext not in str(e.details) and e.details["prefix"] == token.prefix for e in events)


def test_reloading_the_answer_that_showed_a_token_makes_no_second_one(project, users):
    # A reload sent the form again: a second token of the same name, and nothing said so.
    client = client_for(users["member"])
    key = re.search(r'name="once" value="([^"]+)"', client.get(PAGE).content.decode()).group(1)
    first = client.post("/settings/api-tokens/new", {"name": "laptop", "once": key})
    assert first.status_code == 200 and 'id="new-token"' in first.content.decode()
    again = client.post("/settings/api-tokens/new", {"name": "laptop", "once": key}, follow=True)
    page = again.content.decode()
    assert again.redirect_chain == [(PAGE, 302)] and 'id="new-token"' not in page
    assert "That form was sent before" in page and "revoke it below and make another" in page
    assert ApiToken.objects.filter(user=users["member"], name="laptop").count() == 1
    other = re.search(r'name="once" value="([^"]+)"', page).group(1)  # the page's next form has a key of its own
    assert other != key and client.post("/settings/api-tokens/new", {"name": "laptop", "once": other}).status_code == 200
    assert ApiToken.objects.filter(user=users["member"], name="laptop").count() == 2
