"""The audit trail: each change a person makes (through the API, the pages or the admin) is one
AuditEvent naming who made it, in which project, to what; a secret's value or a token's plaintext
is never in it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from datahub import commits, repos
from studio.models import ApiToken, AuditEvent, Membership
from studio.services import add_member
from tests.conftest import Api

SECRET_VALUE = "sk-audit-do-not-log-9f3a"


@pytest.fixture(autouse=True)
def hub_root(tmp_path, settings):
    settings.DATAHUB_ROOT = tmp_path / "hub"


@dataclass
class World:
    api: Api
    browser: Client  # the owner's logged-in pages
    root: Client  # a superuser's admin
    project: Any
    users: dict


def hub_repo(w: World, name: str = "audit-data"):
    return repos.find_repo(w.project, name) or repos.create_repo(w.project, name, "dataset", w.users["owner"])


def ok(response, *statuses: int):
    assert response.status_code in (statuses or (200, 201, 204, 302)), response.content.decode()[:2000]
    return response


def upload(w: World) -> None:
    hub_repo(w)
    upload_id = ok(w.api.post("/api/hub/repos/audit-data/uploads", {"files": [{"path": "train.jsonl", "size": 4}]})).json()["id"]
    ok(w.api.client.put(f"/api/hub/uploads/{upload_id}/files/0?offset=0", data=b'{}\n\n', content_type="application/octet-stream",
                        HTTP_AUTHORIZATION=f"Bearer {w.api.token}"))
    ok(w.api.post(f"/api/hub/uploads/{upload_id}/commit"))


def admin_members(w: World, change: Callable[[list[dict]], list[dict]]) -> None:
    """The project's admin change form with its Membership inline rows changed by `change`."""
    rows = change([{"id": m.pk, "user": m.user_id, "role": m.role} for m in w.project.memberships.order_by("pk")])
    data: dict[str, Any] = {"slug": w.project.slug, "name": w.project.name, "plan": w.project.plan_id or "",
                            "memberships-TOTAL_FORMS": len(rows), "memberships-INITIAL_FORMS": sum(1 for r in rows if r.get("id")),
                            "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000}
    for i, row in enumerate(rows):
        data.update({f"memberships-{i}-{key}": value for key, value in row.items()})
        data[f"memberships-{i}-project"] = w.project.pk
    ok(w.root.post(f"/admin/studio/project/{w.project.pk}/change/", data), 302)


def role_of(w: World, name: str, role: str) -> Callable[[list[dict]], list[dict]]:
    pk = w.users[name].pk
    return lambda rows: [{**r, "role": role} if r["user"] == pk else r for r in rows]


def without(w: World, name: str) -> Callable[[list[dict]], list[dict]]:
    pk = w.users[name].pk
    return lambda rows: [{**r, "DELETE": "on"} if r["user"] == pk else r for r in rows]


def env_config(w: World) -> None:
    config = ok(w.api.get("/api/environments/gsm-maths/config")).json()["config"]
    ok(w.api.put("/api/environments/gsm-maths/config", {"config": config}))


def new_token(w: World) -> ApiToken:
    return ApiToken.objects.create(project=w.project, user=w.users["member"], name="ci", prefix="stu_abcdef", token_hash="0" * 64)


@dataclass
class Case:
    setup: Callable[[World], Any]
    change: Callable[[World], Any]
    action: str
    target_type: str
    target_name: str
    actor: str  # "" is the system (a management command)
    via: str


def nothing(w: World) -> None:
    return None


WEBHOOK_URL = "https://127.0.0.1/hook"


def webhook(w: World):
    from django.test import override_settings

    from studio.webhooks import create_webhook

    with override_settings(STUDIO_WEBHOOK_ALLOW_PRIVATE=True):
        return create_webhook(w.project, WEBHOOK_URL, None)[0]


CASES = {
    "secret set (API)": Case(nothing, lambda w: ok(w.api.put("/api/secrets/judge-key", {"value": SECRET_VALUE})),
                             "created", "projectsecret", "judge-key", "owner", "token"),
    "secret overwritten (API)": Case(lambda w: w.api.put("/api/secrets/judge-key", {"value": "first"}),
                                     lambda w: ok(w.api.put("/api/secrets/judge-key", {"value": SECRET_VALUE})),
                                     "updated", "projectsecret", "judge-key", "owner", "token"),
    "secret set (page)": Case(nothing, lambda w: ok(w.browser.post(reverse("secret_set"), {"name": "judge-key", "value": SECRET_VALUE}), 302),
                              "created", "projectsecret", "judge-key", "owner", "session"),
    "secret deleted (API)": Case(lambda w: w.api.put("/api/secrets/judge-key", {"value": SECRET_VALUE}),
                                 lambda w: ok(w.api.delete("/api/secrets/judge-key")), "deleted", "projectsecret", "judge-key", "owner", "token"),
    "secret deleted (admin)": Case(lambda w: w.api.put("/api/secrets/judge-key", {"value": SECRET_VALUE}),
                                   lambda w: ok(w.root.post(f"/admin/studio/projectsecret/{w.project.secrets.get().pk}/delete/", {"post": "yes"}), 302),
                                   "deleted", "projectsecret", "judge-key", "root", "session"),
    "repo created (API)": Case(nothing, lambda w: ok(w.api.post("/api/hub/repos", {"name": "audit-data", "type": "dataset"})),
                               "created", "repo", "audit-data", "owner", "token"),
    "repo created (page)": Case(nothing, lambda w: ok(w.browser.post(reverse("datahub:create"), {"name": "audit-data", "type": "dataset"}), 302),
                                "created", "repo", "audit-data", "owner", "session"),
    "repo deleted (API)": Case(hub_repo, lambda w: ok(w.api.delete("/api/hub/repos/audit-data")), "deleted", "repo", "audit-data", "owner", "token"),
    "branch created (API)": Case(hub_repo, lambda w: ok(w.api.post("/api/hub/repos/audit-data/branches", {"name": "dev", "from": "main"})),
                                 "created", "branch", "dev", "owner", "token"),
    "branch deleted (API)": Case(lambda w: repos.create_branch(hub_repo(w), "dev", "main"),
                                 lambda w: ok(w.api.delete("/api/hub/repos/audit-data/branches/dev")), "deleted", "branch", "dev", "owner", "token"),
    "tag created (API)": Case(hub_repo, lambda w: ok(w.api.post("/api/hub/repos/audit-data/tags", {"name": "v1", "ref": "main"})),
                              "created", "tag", "v1", "owner", "token"),
    "tag deleted (API)": Case(lambda w: repos.create_tag(hub_repo(w), "v1", "main"),
                              lambda w: ok(w.api.delete("/api/hub/repos/audit-data/tags/v1")), "deleted", "tag", "v1", "owner", "token"),
    "files uploaded (API)": Case(nothing, upload, "uploaded", "repo", "audit-data", "owner", "token"),
    "files uploaded (page)": Case(hub_repo, lambda w: ok(w.browser.post("/hub/acme/audit-data/upload", {
        "files": [SimpleUploadedFile("a.txt", b"a"), SimpleUploadedFile("b.txt", b"b")], "branch": "main", "message": ""}), 302),
        "uploaded", "repo", "audit-data", "owner", "session"),
    "file deleted (page)": Case(lambda w: commits.commit_files(hub_repo(w), "main", {"train.jsonl": b"{}\n"}),
                                lambda w: ok(w.browser.post("/hub/acme/audit-data/delete/main/train.jsonl"), 302),
                                "files_deleted", "repo", "audit-data", "owner", "session"),
    "branch deleted (page)": Case(lambda w: repos.create_branch(hub_repo(w), "dev", "main"),
                                  lambda w: ok(w.browser.post("/hub/acme/audit-data/branches/dev/delete"), 302),
                                  "deleted", "branch", "dev", "owner", "session"),
    "repo deleted (page)": Case(hub_repo, lambda w: ok(w.browser.post("/hub/acme/audit-data/delete", {"confirm": "audit-data"}), 302),
                                "deleted", "repo", "audit-data", "owner", "session"),
    "file deleted (API)": Case(lambda w: commits.commit_files(hub_repo(w), "main", {"train.jsonl": b"{}\n"}),
                               lambda w: ok(w.api.delete("/api/hub/repos/audit-data/files", {"branch": "main", "paths": ["train.jsonl"]})),
                               "files_deleted", "repo", "audit-data", "owner", "token"),
    "experiment created (API)": Case(nothing, lambda w: ok(w.api.post("/api/experiments", {"name": "tone-sweep"})),
                                     "created", "experiment", "tone-sweep", "owner", "token"),
    "environment forked (API)": Case(nothing, lambda w: ok(w.api.post("/api/environments/fork", {"catalogue": "gsm-maths"})),
                                     "created", "repo", "gsm-maths", "owner", "token"),
    "environment CONFIG saved (API)": Case(lambda w: w.api.post("/api/environments/fork", {"catalogue": "gsm-maths"}), env_config,
                                           "patched", "repo", "gsm-maths", "owner", "token"),
    "member added (admin)": Case(nothing, lambda w: admin_members(w, lambda rows: [*rows, {"user": w.users["outsider"].pk, "role": "viewer"}]),
                                 "added", "membership", "outsider", "root", "session"),
    "member's role changed (admin)": Case(nothing, lambda w: admin_members(w, role_of(w, "viewer", "member")),
                                          "role_changed", "membership", "viewer", "root", "session"),
    "member removed (admin)": Case(nothing, lambda w: admin_members(w, without(w, "viewer")), "removed", "membership", "viewer", "root", "session"),
    "webhook disabled (admin)": Case(webhook, lambda w: ok(w.root.post(f"/admin/studio/webhook/{w.project.webhooks.get().pk}/change/", {}), 302),
                                     "updated", "webhook", WEBHOOK_URL, "root", "session"),
    "webhook deleted (admin)": Case(webhook, lambda w: ok(w.root.post(f"/admin/studio/webhook/{w.project.webhooks.get().pk}/delete/", {"post": "yes"}), 302),
                                    "deleted", "webhook", WEBHOOK_URL, "root", "session"),
    "token created (createapitoken)": Case(nothing, lambda w: call_command("createapitoken", "member", project="acme", name="ci", stdout=open("/dev/null", "w")),
                                           "created", "apitoken", "ci", "", "system"),
    "token created (page)": Case(nothing, lambda w: ok(w.browser.post(reverse("api_token_create"), {"name": "ci"}), 200),
                                 "created", "apitoken", "ci", "owner", "session"),
    "token revoked (page)": Case(new_token, lambda w: ok(w.browser.post(reverse("api_token_revoke", args=[ApiToken.objects.get(name="ci").pk])), 302),
                                 "revoked", "apitoken", "ci", "owner", "session"),
    "token revoked (admin)": Case(new_token, lambda w: ok(w.root.post("/admin/studio/apitoken/", {
        "action": "revoke", "_selected_action": [ApiToken.objects.get(name="ci").pk]}), 302), "revoked", "apitoken", "ci", "root", "session"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_change_is_one_audit_event_naming_actor_project_and_object(case: Case, api, project, users, root):
    browser = Client()
    browser.force_login(users["owner"])
    w = World(api, browser, root, project, users)
    case.setup(w)
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

    case.change(w)

    events = list(AuditEvent.objects.filter(id__gt=last))
    assert [(e.action, e.target_type, e.target_name) for e in events] == [(case.action, case.target_type, case.target_name)]
    event = events[0]
    assert (event.actor_name, event.project_id, event.project_slug) == (case.actor, project.pk, "acme")
    assert event.via.startswith(case.via)
    assert (event.actor_id is None) == (case.actor == "")
    assert SECRET_VALUE not in str(event.details)


def test_a_secrets_value_and_a_tokens_plaintext_are_in_no_audit_event(api, project, users, capsys):
    browser = Client()
    browser.force_login(users["owner"])
    ok(api.put("/api/secrets/judge-key", {"value": SECRET_VALUE}))
    ok(api.put("/api/secrets/judge-key", {"value": SECRET_VALUE + "-2"}))
    ok(browser.post(reverse("secret_set"), {"name": "other-key", "value": SECRET_VALUE}), 302)
    ok(api.delete("/api/secrets/judge-key"))
    call_command("createapitoken", "member", project="acme")
    plaintext = capsys.readouterr().out.strip().splitlines()[-1]

    rows = [str(list(row)) for row in AuditEvent.objects.values_list()]
    assert len(rows) >= 5
    assert not [row for row in rows if SECRET_VALUE in row or plaintext in row]


def test_a_role_given_again_and_a_revoked_token_revoked_again_record_nothing(project, users, tokens):
    from studio.services import revoke_api_token

    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    add_member(project, users["member"], "member")
    token = ApiToken.objects.filter(project=project, user=users["member"]).get()
    assert revoke_api_token(token) is True
    assert revoke_api_token(token) is False
    assert list(AuditEvent.objects.filter(id__gt=last).values_list("action", flat=True)) == ["revoked"]
    assert Membership.objects.get(project=project, user=users["member"]).role == "member"


def test_the_details_say_what_changed(api, project, users):
    add_member(project, users["viewer"], "member")
    upload(World(api, Client(), Client(), project, users))
    role = AuditEvent.objects.get(action="role_changed")
    assert role.details == {"role": "member", "previous_role": "viewer"} and role.target_id == str(project.memberships.get(user=users["viewer"]).pk)
    uploaded = AuditEvent.objects.get(action="uploaded")
    head = repos.resolve(repos.find_repo(project, "audit-data"), "main")
    assert uploaded.details == {"branch": "main", "commit": head.pk, "paths": ["train.jsonl"], "path_count": 1}
