"""The per-project secret store: encrypted at rest, written and listed by name, never shown again."""
from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from studio.models import ProjectSecret
from studio.services import reveal_secret, set_secret
from tests.conftest import assert_error

VALUE = "sk-live-0123456789-very-secret"


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def stored_bytes(project, name: str) -> bytes:
    """The column as PostgreSQL holds it, read with raw SQL (no model decoding in between)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ciphertext FROM {ProjectSecret._meta.db_table} WHERE project_id = %s AND name = %s", [project.pk, name])
        row = cursor.fetchone()
    assert row is not None
    return bytes(row[0])


def test_put_stores_the_value_encrypted(api, project):
    response = api.put("/api/secrets/judge_key", {"value": VALUE})
    assert response.status_code == 204, response.content
    assert response.content == b""
    raw = stored_bytes(project, "judge_key")
    assert raw and VALUE.encode() not in raw
    assert b"very-secret" not in raw and b"sk-live" not in raw
    assert reveal_secret(project, "judge_key") == VALUE


def test_get_lists_names_only(api, project):
    api.put("/api/secrets/b_key", {"value": VALUE})
    api.put("/api/secrets/a.key-2", {"value": "other-" + VALUE})
    response = api.get("/api/secrets")
    assert response.status_code == 200
    assert response.json() == [{"name": "a.key-2"}, {"name": "b_key"}]
    assert VALUE.encode() not in response.content


def test_put_again_replaces_the_value(api, project):
    api.put("/api/secrets/judge_key", {"value": "first-value"})
    assert api.put("/api/secrets/judge_key", {"value": VALUE}).status_code == 204
    assert ProjectSecret.objects.filter(project=project, name="judge_key").count() == 1
    assert reveal_secret(project, "judge_key") == VALUE


def test_value_never_appears_in_any_api_response(api, project, caplog):
    caplog.set_level(logging.DEBUG)
    responses = [api.put("/api/secrets/judge_key", {"value": VALUE})]
    responses.append(api.get("/api/secrets"))
    body = {
        "name": "ruler", "method": "grpo", "base_model": "org/base",
        "config": {"rl_mode": "ruler", "ruler_task_args": {"dataset": "org/prompts", "system_prompt": "be good"},
                   "judge": {"mode": "external", "endpoint": "https://judge.example/v1", "model": "j", "api_key_secret": "judge_key"}},
        "compute": {"backend": "local", "accelerators": "CPU"},
    }
    created = api.post("/api/training-runs", body)
    responses.append(created)
    assert created.status_code == 201, created.content
    run_id = created.json()["id"]
    responses += [api.get(f"/api/training-runs/{run_id}"), api.get("/api/training-runs"), api.post(f"/api/training-runs/{run_id}/start")]
    responses.append(api.get("/api/openapi.json"))
    for response in responses:
        assert VALUE not in response.content.decode(), response.content[:300]
    assert VALUE not in caplog.text


def test_admin_pages_never_show_the_value(project, users):
    secret = set_secret(project, "judge_key", VALUE)
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    for url in ("/admin/studio/projectsecret/", f"/admin/studio/projectsecret/{secret.pk}/change/"):
        response = client.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        assert "judge_key" in page
        assert VALUE not in page
        assert "ciphertext" not in page.lower()
    # The admin cannot add a secret (no field could take the value without showing it back).
    assert client.get("/admin/studio/projectsecret/add/").status_code == 403


def test_delete_removes_the_secret(api, project):
    api.put("/api/secrets/judge_key", {"value": VALUE})
    assert api.delete("/api/secrets/judge_key").status_code == 204
    assert not ProjectSecret.objects.filter(project=project, name="judge_key").exists()
    assert api.get("/api/secrets").json() == []


def test_delete_of_a_missing_secret_is_404(api):
    assert_error(api.delete("/api/secrets/nothing_here"), 404)


def test_secrets_are_per_project(api, api_as, project, other_project):
    api.put("/api/secrets/judge_key", {"value": VALUE})
    outsider = api_as("outsider")
    assert outsider.get("/api/secrets").json() == []
    assert outsider.put("/api/secrets/judge_key", {"value": "globex-value"}).status_code == 204
    assert reveal_secret(project, "judge_key") == VALUE
    assert reveal_secret(other_project, "judge_key") == "globex-value"
    assert_error(outsider.delete("/api/secrets/nope"), 404)
    assert outsider.delete("/api/secrets/judge_key").status_code == 204
    assert reveal_secret(project, "judge_key") == VALUE


@pytest.mark.parametrize("name", ["1starts-with-digit", "has%20space", "bad$name", "semi;colon", "x" * 101, "_leading", "-dash", "ünïcode", "KEY%0A"])
def test_bad_secret_name_is_400_naming_the_field(api, project, name):
    assert_error(api.put(f"/api/secrets/{name}", {"value": VALUE}), 400, "name")
    assert not ProjectSecret.objects.filter(project=project).exists()


@pytest.mark.parametrize("body, field", [
    ({"value": ""}, "value"),
    ({}, "value"),
    ({"value": None}, "value"),
    ({"value": 12}, "value"),
    ({"value": ["a"]}, "value"),
    ({"value": VALUE, "extra": 1}, "extra"),
])
def test_bad_secret_body_is_400_naming_the_field(api, project, body, field):
    response = api.put("/api/secrets/judge_key", body)
    assert_error(response, 400, field)
    assert VALUE not in response.content.decode()
    assert not ProjectSecret.objects.filter(project=project).exists()


def test_non_json_secret_body_is_400(api, project):
    response = api.client.put("/api/secrets/judge_key", data=b"value=abc", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert_error(response, 400, "body")
    assert not ProjectSecret.objects.filter(project=project).exists()


@pytest.mark.parametrize("value", [VALUE, "ünïcødé 🔑 key", "x" * 10_000, " leading and trailing spaces "])
def test_reveal_secret_round_trips(project, value):
    set_secret(project, "k", value)
    assert reveal_secret(project, "k") == value


def test_reveal_of_a_missing_secret_raises_not_found(project):
    from studio.errors import NotFound

    with pytest.raises(NotFound):
        reveal_secret(project, "missing")


def test_same_value_encrypts_differently_each_time(project, other_project):
    set_secret(project, "k", VALUE)
    set_secret(other_project, "k", VALUE)
    assert stored_bytes(project, "k") != stored_bytes(other_project, "k")


def test_changed_encryption_key_makes_decrypt_raise_a_clear_error(project, settings):
    set_secret(project, "judge_key", VALUE)
    original = settings.STUDIO_ENCRYPTION_KEY
    settings.STUDIO_ENCRYPTION_KEY = original + "-rotated"
    with pytest.raises(ValueError, match="STUDIO_ENCRYPTION_KEY changed"):
        reveal_secret(project, "judge_key")
    # Putting the old key back makes it readable again: nothing was lost.
    settings.STUDIO_ENCRYPTION_KEY = original
    assert reveal_secret(project, "judge_key") == VALUE


def test_deleting_a_secret_is_audited_without_its_value(api, project):
    from studio.models import AuditEvent

    assert api.put("/api/secrets/judge-key", {"value": "sk-audit-value"}).status_code == 204
    assert api.delete("/api/secrets/judge-key").status_code == 204
    event = AuditEvent.objects.get(action="deleted", target_type="projectsecret")
    assert event.target_name == "judge-key" and event.project_slug == project.slug and event.actor_name == "owner"
    assert "sk-audit-value" not in str(event.details)
