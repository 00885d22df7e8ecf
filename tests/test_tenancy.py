"""The tenant matrix: every REST endpoint × owner / member / viewer / outsider / anonymous / bad token,
with the contract's precedence 401 → 404 → 403 → 402 → 409 → 400/422, and the database unchanged
after every refused call. Plus the browser session: reads work, unsafe calls need the CSRF token."""
from __future__ import annotations

import json
import secrets
import string
from typing import Any

import pytest
from django.test import Client

from experiments.models import Experiment
from studio.auth import BAD_TOKEN, MALFORMED_TOKEN
from studio.crypto import hash_token
from studio.models import ApiToken, ProjectSecret
from studio.services import add_member, authenticate_token, create_api_token, create_plan, remove_member, revoke_api_token, set_plan, set_secret
from tests.conftest import Api, assert_error, sft_body
from training import status as status_service
from training.models import Checkpoint, LogLine, MetricPoint, Rollout, Status, TrainingRun

PERSONAS = ("owner", "member", "viewer", "outsider", "anonymous", "bad_token")


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """conftest's users get passwords; PBKDF2's million rounds would dominate this matrix's runtime."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client_as(tokens):
    def make(persona: str) -> Api:
        if persona == "anonymous":
            return Api(Client(), None)
        if persona == "bad_token":
            return Api(Client(), "stu_" + secrets.token_urlsafe(32))
        return Api(Client(), tokens[persona])

    return make


def make_run(api: Api, **overrides: Any) -> TrainingRun:
    response = api.post("/api/training-runs", sft_body(**overrides))
    assert response.status_code == 201, response.content
    return TrainingRun.objects.get(pk=response.json()["id"])


def move(run: TrainingRun, *statuses: str) -> TrainingRun:
    for target in statuses:
        status_service.transition(run.pk, target)
    run.refresh_from_db()
    return run


@pytest.fixture
def world(api, project):
    """acme's runs in each state the endpoints care about, with something to read on each, and a secret."""
    queued = make_run(api, name="queued run", dataset="org/hf-dataset", compute={"backend": "local", "accelerators": "CPU"})
    running = move(make_run(api, name="running run"), Status.PROVISIONING, Status.RUNNING)
    completed = move(make_run(api, name="completed run"), Status.PROVISIONING, Status.RUNNING, Status.COMPLETED)
    for run in (queued, running, completed):
        MetricPoint.objects.create(run=run, key="loss", step=1, value=2.0)
        LogLine.objects.create(run=run, line="hello")
        Rollout.objects.create(run=run, step=1, prompt="p", completion="c", reward=1.0)
        Checkpoint.objects.create(run=run, attempt=1, step=1, path="/ckpt/1")
    set_secret(project, "judge_key", "sk-acme-value")
    return {"queued": queued.pk, "running": running.pk, "completed": completed.pk}


def snapshot(project=None) -> dict:
    """Everything a refused call must leave alone (in `project`, or everywhere)."""
    scope = {"project": project} if project is not None else {}
    run_scope = {"run__project": project} if project is not None else {}
    return {
        "runs": sorted(TrainingRun.objects.filter(**scope).values_list("pk", "project_id", "name", "status", "config", "compute", "base_model", "attempt", "start_requested_at")),
        "experiments": sorted(Experiment.objects.filter(**scope).values_list("pk", "project_id", "name")),
        "secrets": sorted((p, n, bytes(c)) for p, n, c in ProjectSecret.objects.filter(**scope).values_list("project_id", "name", "ciphertext")),
        "metrics": MetricPoint.objects.filter(**run_scope).count(),
        "logs": LogLine.objects.filter(**run_scope).count(),
    }


# (method, path, body, {persona: status}) — {q}/{r}/{c}: a queued / running / completed run of acme.
READ = dict(owner=200, member=200, viewer=200, outsider=404, anonymous=401, bad_token=401)
COLLECTION_READ = dict(owner=200, member=200, viewer=200, outsider=200, anonymous=401, bad_token=401)
MATRIX: list[tuple[str, str, Any, dict[str, int]]] = [
    ("get", "/api/experiments", None, COLLECTION_READ),
    ("post", "/api/experiments", {"name": "new experiment"}, dict(owner=201, member=201, viewer=403, outsider=201, anonymous=401, bad_token=401)),
    ("get", "/api/training-runs", None, COLLECTION_READ),
    ("post", "/api/training-runs", sft_body(name="new run"), dict(owner=201, member=201, viewer=403, outsider=201, anonymous=401, bad_token=401)),
    ("get", "/api/training-runs/{q}", None, READ),
    ("patch", "/api/training-runs/{q}", {"name": "renamed"}, dict(owner=200, member=200, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("post", "/api/training-runs/{q}/start", None, dict(owner=202, member=202, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("post", "/api/training-runs/{r}/stop", None, dict(owner=200, member=200, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("get", "/api/training-runs/{q}/metrics", None, READ),
    ("get", "/api/training-runs/{q}/rollouts", None, READ),
    ("get", "/api/training-runs/{q}/logs", None, READ),
    ("get", "/api/training-runs/{q}/checkpoints", None, READ),
    ("get", "/api/training-runs/{q}/attempts", None, READ),
    ("get", "/api/secrets", None, COLLECTION_READ),
    ("put", "/api/secrets/new_key", {"value": "sk-new"}, dict(owner=204, member=204, viewer=403, outsider=204, anonymous=401, bad_token=401)),
    # The outsider's own project has no judge_key: 404, and acme's secret stays.
    ("delete", "/api/secrets/judge_key", None, dict(owner=204, member=204, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    # The state conflicts (409) come after who-you-are (401/404/403).
    ("post", "/api/training-runs/{r}/start", None, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("post", "/api/training-runs/{c}/start", None, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("patch", "/api/training-runs/{r}", {"name": "renamed"}, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("patch", "/api/training-runs/{c}", {"name": "renamed"}, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("post", "/api/training-runs/{q}/stop", None, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    # Body errors (400) come last: a viewer or an outsider never learns the body was wrong.
    ("patch", "/api/training-runs/{q}", {"name": 5}, dict(owner=400, member=400, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("patch", "/api/training-runs/{c}", {"name": 5}, dict(owner=409, member=409, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("post", "/api/training-runs", {"method": "sft"}, dict(owner=400, member=400, viewer=403, outsider=400, anonymous=401, bad_token=401)),
    ("post", "/api/experiments", {"nom": "x"}, dict(owner=400, member=400, viewer=403, outsider=400, anonymous=401, bad_token=401)),
    ("put", "/api/secrets/new_key", {"value": 5}, dict(owner=400, member=400, viewer=403, outsider=400, anonymous=401, bad_token=401)),
    # Pre-start validation (422) after the state: a queued run without a dataset cannot start.
    ("post", "/api/training-runs/{q_nodata}/start", None, dict(owner=422, member=422, viewer=403, outsider=404, anonymous=401, bad_token=401)),
    ("get", "/api/training-runs/999999", None, dict(owner=404, member=404, viewer=404, outsider=404, anonymous=401, bad_token=401)),
]


def case_id(case: tuple) -> str:
    method, path, body, expected = case
    return f"{method.upper()} {path} {body if body is not None and method != 'post' or path.endswith('s') else ''} owner={expected['owner']}"


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("case", MATRIX, ids=[case_id(c) for c in MATRIX])
def test_endpoint_status_per_persona_and_refused_calls_change_nothing(case, persona, world, api, client_as, project, other_project):
    method, path, body, expected = case
    world = dict(world)
    if "{q_nodata}" in path:
        world["q_nodata"] = make_run(api, name="no data", dataset=None).pk
    url = path.format(q=world["queued"], r=world["running"], c=world["completed"], q_nodata=world.get("q_nodata"))
    before, before_acme = snapshot(), snapshot(project)

    response = client_as(persona).call(method, url, body)

    assert response.status_code == expected[persona], (persona, method, url, response.status_code, response.content[:400])
    if response.status_code >= 400:
        body_out = assert_error(response, expected[persona])
        if response.status_code in (400, 422):
            assert body_out["errors"], "a body or pre-start error names its fields"
        assert snapshot() == before, "a refused call changed the database"
    elif persona == "outsider" and method == "get":
        # A collection read by an outsider's token lists its own project's rows, none of acme's.
        data = response.json()
        rows = data["items"] if isinstance(data, dict) else data
        text = response.content.decode()
        assert "queued run" not in text and "judge_key" not in text and "default" not in text, rows
    elif persona == "outsider":
        # An outsider's write lands in its own project, never in acme.
        assert snapshot(project) == before_acme


def test_successful_writes_change_what_they_say(world, client_as, project):
    member = client_as("member")
    assert member.patch(f"/api/training-runs/{world['queued']}", {"name": "renamed"}).status_code == 200
    assert TrainingRun.objects.get(pk=world["queued"]).name == "renamed"
    assert member.post(f"/api/training-runs/{world['queued']}/start").status_code == 202
    assert TrainingRun.objects.get(pk=world["queued"]).start_requested_at is not None
    assert member.post(f"/api/training-runs/{world['running']}/stop").status_code == 200
    assert TrainingRun.objects.get(pk=world["running"]).status == Status.CANCELLED
    assert member.delete("/api/secrets/judge_key").status_code == 204
    assert not ProjectSecret.objects.filter(project=project, name="judge_key").exists()


# ---- 402 sits between 403 and 409/400 ------------------------------------------------------------

@pytest.fixture
def free_world(world, project):
    set_plan(project, create_plan("free", includes_training=False, max_concurrent_runs=0, max_gpus_per_run=0))
    return world


PLAN_MATRIX: list[tuple[str, str, Any, dict[str, int]]] = [
    ("post", "/api/training-runs", sft_body(), dict(owner=402, member=402, viewer=403)),
    # A bad body on a plan without training is still 402: the plan is the first thing to fix.
    ("post", "/api/training-runs", {"name": 5}, dict(owner=402, member=402, viewer=403)),
    ("post", "/api/training-runs/{q}/start", None, dict(owner=402, member=402, viewer=403)),
    # 402 before 409: a running run on a plan without training.
    ("post", "/api/training-runs/{r}/start", None, dict(owner=402, member=402, viewer=403)),
    ("get", "/api/training-runs/{q}", None, dict(owner=200, member=200, viewer=200)),
]


@pytest.mark.parametrize("persona", ("owner", "member", "viewer"))
@pytest.mark.parametrize("case", PLAN_MATRIX, ids=[f"{c[0].upper()} {c[1]} {c[2]}" for c in PLAN_MATRIX])
def test_plan_without_training_is_402_after_403(case, persona, free_world, client_as):
    method, path, body, expected = case
    url = path.format(q=free_world["queued"], r=free_world["running"])
    before = snapshot()
    response = client_as(persona).call(method, url, body)
    assert response.status_code == expected[persona], (persona, url, response.content[:400])
    if response.status_code >= 400:
        body_out = assert_error(response, expected[persona])
        if response.status_code == 402:
            assert "Settings → Billing" in body_out["detail"]
        assert snapshot() == before


# ---- tokens --------------------------------------------------------------------------------------

@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Basic dXNlcjpwdw==", "Token abc", "bearer"])
def test_malformed_authorization_header_is_401(header, world):
    response = Client().get("/api/training-runs", HTTP_AUTHORIZATION=header)
    assert_error(response, 401)
    assert response.json()["detail"] in (MALFORMED_TOKEN, BAD_TOKEN)


def test_revoked_token_is_401(world, tokens):
    token = ApiToken.objects.get(token_hash=hash_token(tokens["member"]))
    revoke_api_token(token)
    assert assert_error(Api(Client(), tokens["member"]).get("/api/training-runs"), 401)["detail"] == BAD_TOKEN


def test_a_bad_token_is_told_where_to_make_a_new_one(world):
    # It said "Ask a project owner for a new one": owners could not make tokens. Now every member can,
    # on Settings → API tokens, and a Studio administrator still can.
    detail = assert_error(Api(Client(), "st_not-a-token").get("/api/training-runs"), 401)["detail"]
    assert detail == ("This API token is not valid: it is mistyped, was revoked, or its user is no longer a member of its project. "
                      "Make a new one in Settings → API tokens (/settings/api-tokens/), or ask a Studio administrator for one "
                      "(they make it with manage.py createapitoken).")


def test_a_missing_or_malformed_token_is_told_where_to_make_one(world):
    missing = assert_error(Client().get("/api/training-runs"), 401)["detail"]
    malformed = assert_error(Client().get("/api/training-runs", HTTP_AUTHORIZATION="Token abc"), 401)["detail"]
    for detail in (missing, malformed):
        assert "Settings → API tokens (/settings/api-tokens/)" in detail, detail


def test_token_of_removed_member_is_401(world, tokens, project, users):
    remove_member(project, users["member"])
    # A token was sent: the answer says what is wrong with it, not "send a token".
    assert assert_error(Api(Client(), tokens["member"]).get(f"/api/training-runs/{world['queued']}"), 401)["detail"] == BAD_TOKEN


def test_removing_a_member_revokes_their_tokens_so_a_reinvite_does_not_revive_them(tokens, project, other_project, users):
    # authenticate_token refused a removed member's token only while they stayed out: adding them
    # back made every token they had before answer 200 again.
    add_member(other_project, users["viewer"], "viewer")
    _, elsewhere = create_api_token(users["viewer"], other_project)
    remove_member(project, users["viewer"])
    assert not project.memberships.filter(user=users["viewer"]).exists()
    mine = ApiToken.objects.get(token_hash=hash_token(tokens["viewer"]))
    assert mine.revoked_at is not None
    assert ApiToken.objects.get(token_hash=hash_token(elsewhere)).revoked_at is None  # their token for another project stays
    assert ApiToken.objects.get(token_hash=hash_token(tokens["member"])).revoked_at is None  # and other members' tokens
    add_member(project, users["viewer"], "viewer")
    assert assert_error(Api(Client(), tokens["viewer"]).get("/api/training-runs"), 401)["detail"] == BAD_TOKEN
    assert Api(Client(), elsewhere).get("/api/training-runs").status_code == 200
    assert Api(Client(), create_api_token(users["viewer"], project)[1]).get("/api/training-runs").status_code == 200  # a new token works


def test_a_membership_deleted_outside_the_service_does_not_revive_its_tokens_on_a_reinvite(tokens, project, users):
    # A shell or SQL delete skips remove_member's revocation: the token stayed live, and came back
    # with the next invite. A token belongs to the membership it was made in.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM studio_membership WHERE project_id = %s AND user_id = %s", [project.pk, users["viewer"].pk])
    assert ApiToken.objects.get(token_hash=hash_token(tokens["viewer"])).revoked_at is None
    add_member(project, users["viewer"], "viewer")
    assert assert_error(Api(Client(), tokens["viewer"]).get("/api/training-runs"), 401)["detail"] == BAD_TOKEN
    assert ApiToken.objects.get(token_hash=hash_token(tokens["viewer"])).revoked_at is not None  # and its page says so
    assert Api(Client(), create_api_token(users["viewer"], project)[1]).get("/api/training-runs").status_code == 200


def test_a_membership_from_before_joined_at_was_recorded_keeps_its_tokens(tokens, project, users):
    project.memberships.filter(user=users["member"]).update(joined_at=None)
    assert Api(Client(), tokens["member"]).get("/api/training-runs").status_code == 200
    add_member(project, users["member"], "viewer")  # a role change is the same membership
    assert Api(Client(), tokens["member"]).get("/api/training-runs").status_code == 200


def admin_client() -> Client:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def admin_memberships_post(project, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The project's admin change form as the browser posts it, with `rows` as its Membership inline."""
    data: dict[str, Any] = {"slug": project.slug, "name": project.name, "plan": project.plan_id or "",
                            "memberships-TOTAL_FORMS": len(rows), "memberships-INITIAL_FORMS": sum(1 for r in rows if r.get("id")),
                            "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000}
    for i, row in enumerate(rows):
        data.update({f"memberships-{i}-{key}": value for key, value in row.items()})
        data[f"memberships-{i}-project"] = project.pk
    return data


def test_removing_a_member_in_the_admin_revokes_their_tokens(tokens, project, users):
    # The admin's Membership inline is where an owner's staff remove someone.
    rows = [{"id": m.pk, "user": m.user_id, "role": m.role, **({"DELETE": "on"} if m.user_id == users["viewer"].pk else {})}
            for m in project.memberships.order_by("pk")]
    r = admin_client().post(f"/admin/studio/project/{project.pk}/change/", admin_memberships_post(project, rows))
    assert r.status_code == 302, r.content.decode()[:3000]
    assert not project.memberships.filter(user=users["viewer"]).exists()
    assert ApiToken.objects.get(token_hash=hash_token(tokens["viewer"])).revoked_at is not None
    assert ApiToken.objects.get(token_hash=hash_token(tokens["member"])).revoked_at is None
    add_member(project, users["viewer"], "viewer")
    assert Api(Client(), tokens["viewer"]).get("/api/training-runs").status_code == 401


def test_a_membership_row_given_to_another_user_in_the_admin_revokes_the_first_users_tokens(tokens, project, users):
    rows = [{"id": m.pk, "user": users["outsider"].pk if m.user_id == users["viewer"].pk else m.user_id, "role": m.role}
            for m in project.memberships.order_by("pk")]
    assert admin_client().post(f"/admin/studio/project/{project.pk}/change/", admin_memberships_post(project, rows)).status_code == 302
    assert project.memberships.filter(user=users["outsider"], role="viewer").exists() and not project.memberships.filter(user=users["viewer"]).exists()
    assert ApiToken.objects.get(token_hash=hash_token(tokens["viewer"])).revoked_at is not None
    add_member(project, users["viewer"], "viewer")
    assert Api(Client(), tokens["viewer"]).get("/api/training-runs").status_code == 401


def test_the_admin_cannot_move_a_token_to_another_user_or_project(tokens, project, other_project, users):
    # Its change form saved a new User and Project: the member's plaintext then acted in globex as the
    # outsider, and the audit log credited the outsider with what it did.
    token = ApiToken.objects.get(token_hash=hash_token(tokens["member"]))
    client = admin_client()
    url = f"/admin/studio/apitoken/{token.pk}/change/"
    r = client.post(url, {"user": users["outsider"].pk, "project": other_project.pk, "name": "renamed", "revoked_at_0": "", "revoked_at_1": ""})
    assert r.status_code == 302, r.content.decode()[:3000]
    token.refresh_from_db()
    # The whole form is read-only (revoking is the list's action, audited): nothing posted changes the token.
    assert (token.user_id, token.project_id, token.name) == (users["member"].pk, project.pk, "")
    acting = authenticate_token(tokens["member"])
    assert acting is not None and (acting.user, acting.project) == (users["member"], project)
    form = client.get(url).content.decode()  # shown, not offered
    assert 'name="user"' not in form and 'name="project"' not in form and 'name="name"' not in form and "acme" in form


def test_token_sees_only_its_own_project_even_when_user_is_in_both(world, project, other_project, users):
    """A token implies its project: the outsider, made a member of acme too, still sees only globex
    through a globex token."""
    add_member(project, users["outsider"], "owner")
    _, globex_token = create_api_token(users["outsider"], other_project)
    api = Api(Client(), globex_token)
    assert_error(api.get(f"/api/training-runs/{world['queued']}"), 404)
    assert api.get("/api/training-runs").json()["count"] == 0
    before = snapshot()
    assert_error(api.patch(f"/api/training-runs/{world['queued']}", {"name": "x"}), 404)
    assert snapshot() == before


# ---- browser sessions ----------------------------------------------------------------------------

def csrf_pair() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))


def session_client(user, *, csrf: bool = True) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_logged_in_member_reads_through_the_session(world, users):
    client = session_client(users["viewer"])
    response = client.get("/api/training-runs")
    assert response.status_code == 200, response.content
    assert {r["id"] for r in response.json()["items"]} >= {world["queued"], world["running"]}
    assert client.get(f"/api/training-runs/{world['queued']}").status_code == 200


def test_session_outsider_gets_404_for_another_projects_run(world, users):
    client = session_client(users["outsider"])
    assert_error(client.get(f"/api/training-runs/{world['queued']}"), 404)


def test_session_write_without_csrf_token_is_refused(world, users):
    client = session_client(users["owner"])
    before = snapshot()
    response = client.patch(f"/api/training-runs/{world['queued']}", data='{"name": "csrf"}', content_type="application/json")
    assert_error(response, 403)
    response = client.post("/api/training-runs", data=json.dumps(sft_body()), content_type="application/json")
    assert_error(response, 403)
    assert snapshot() == before


def test_session_write_with_csrf_token_succeeds(world, users):
    client = session_client(users["owner"])
    token = csrf_pair()
    client.cookies["csrftoken"] = token
    response = client.patch(f"/api/training-runs/{world['queued']}", data='{"name": "with csrf"}', content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200, response.content
    assert TrainingRun.objects.get(pk=world["queued"]).name == "with csrf"


def test_session_viewer_cannot_write_even_with_csrf_token(world, users):
    client = session_client(users["viewer"])
    token = csrf_pair()
    client.cookies["csrftoken"] = token
    before = snapshot()
    response = client.patch(f"/api/training-runs/{world['queued']}", data='{"name": "nope"}', content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert_error(response, 403)
    assert snapshot() == before


def test_session_user_in_no_project_gets_404_on_collections(db):
    from django.contrib.auth import get_user_model

    loner = get_user_model().objects.create_user("loner", "l@example.com", "pw")
    assert_error(session_client(loner).get("/api/training-runs"), 404)


# ---- ingest: only the attempt's own token --------------------------------------------------------

def test_ingest_accepts_only_the_runs_current_attempt_token(world, tokens):
    from studio.crypto import new_token

    running, other = world["running"], world["queued"]
    token = new_token("ing")
    TrainingRun.objects.filter(pk=running).update(ingest_token_hash=hash_token(token))
    batch = {"batch_id": "b1", "logs": ["hi"]}
    before = snapshot()
    assert_error(Api(Client(), None).post(f"/api/ingest/runs/{running}", batch), 401)
    assert_error(Api(Client(), tokens["owner"]).post(f"/api/ingest/runs/{running}", batch), 403)  # a user token is no ingest token
    assert_error(Api(Client(), token).post(f"/api/ingest/runs/{other}", batch), 403)  # another run's token
    assert_error(Api(Client(), token).post("/api/ingest/runs/999999", batch), 403)
    assert snapshot() == before
    assert Api(Client(), token).post(f"/api/ingest/runs/{running}", batch).status_code == 200
    assert LogLine.objects.filter(run_id=running, line="hi").exists()


@pytest.mark.parametrize("slug", ["api", "datasets", "new"])
def test_the_admin_refuses_a_reserved_project_slug_on_add_and_on_rename(project, slug):
    # createproject refused these; the admin took them, making a project whose Data Hub pages no URL reaches.
    from studio.models import Project

    client = admin_client()
    added = client.post("/admin/studio/project/add/", {"slug": slug, "name": "x", "plan": "", "memberships-TOTAL_FORMS": 0,
                                                       "memberships-INITIAL_FORMS": 0, "memberships-MIN_NUM_FORMS": 0,
                                                       "memberships-MAX_NUM_FORMS": 1000})
    assert added.status_code == 200 and "kept for the Studio&#x27;s URLs" in added.content.decode()
    renamed = client.post(f"/admin/studio/project/{project.pk}/change/", {**admin_memberships_post(project, []), "slug": slug})
    assert renamed.status_code == 200 and "kept for the Studio&#x27;s URLs" in renamed.content.decode()
    assert not Project.objects.filter(slug=slug).exists()
    project.refresh_from_db()
    assert project.slug != slug
