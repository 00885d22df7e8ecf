"""The setup commands: createplan, createproject, setplan, createapitoken, bootstrapdemo."""
from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from studio.models import ApiToken, Membership, Plan, Project
from tests.conftest import Api


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


# ---- createplan ----------------------------------------------------------------------------------

def test_createplan_defaults_include_training(db):
    run("createplan", "pro")
    plan = Plan.objects.get(name="pro")
    assert (plan.includes_training, plan.max_concurrent_runs, plan.max_gpus_per_run) == (True, 2, 8)


def test_createplan_with_options(db):
    output = run("createplan", "starter", "--no-training", "--max-concurrent-runs", "0", "--max-gpus", "1")
    plan = Plan.objects.get(name="starter")
    assert (plan.includes_training, plan.max_concurrent_runs, plan.max_gpus_per_run) == (False, 0, 1)
    assert "starter" in output


def test_createplan_again_updates_the_plan(db):
    run("createplan", "pro", "--max-gpus", "2")
    run("createplan", "pro", "--max-gpus", "4", "--max-concurrent-runs", "5")
    assert Plan.objects.filter(name="pro").count() == 1
    plan = Plan.objects.get(name="pro")
    assert (plan.max_gpus_per_run, plan.max_concurrent_runs) == (4, 5)


@pytest.mark.parametrize("option", ["--max-gpus", "--max-concurrent-runs"])
@pytest.mark.parametrize("value", ["-1", "99999999999999999999"])  # the second was an OverflowError traceback
def test_createplan_with_a_limit_out_of_range_is_a_command_error(db, option, value):
    with pytest.raises(CommandError, match=option.lstrip("-").replace("-", "[-_ ]")):
        run("createplan", "pro", option, value)
    assert not Plan.objects.filter(name="pro").exists()


def test_createplan_on_an_existing_plan_changes_only_what_it_is_given(db):
    # `createplan team --no-training` reset the team's 4 concurrent runs to the default 2.
    run("createplan", "team", "--max-concurrent-runs", "4", "--max-gpus", "16")
    output = run("createplan", "team", "--no-training")
    plan = Plan.objects.get(name="team")
    assert (plan.includes_training, plan.max_concurrent_runs, plan.max_gpus_per_run) == (False, 4, 16)
    assert "plan team updated: training=no, 4 concurrent runs, 16 GPUs per run" in output
    run("createplan", "team", "--training")
    assert Plan.objects.get(name="team").includes_training is True
    with pytest.raises(CommandError):
        run("createplan", "team", "--training", "--no-training")


@pytest.mark.parametrize("name", ["", "bad name!!", "Team", "x" * 65])
def test_createplan_with_a_bad_name_is_a_command_error(db, name):
    with pytest.raises(CommandError, match="is not a plan name"):
        run("createplan", name)
    assert not Plan.objects.exists()


# ---- createuser ----------------------------------------------------------------------------------

def test_createuser_makes_a_user_who_can_log_in_and_the_readme_chain_works(db, monkeypatch):
    # The README's Administration commands began with `createproject acme --owner alice`, and no
    # command made alice: "No user named 'alice'", and every command after it failed too.
    monkeypatch.setenv("STUDIO_USER_PASSWORD", "a long enough password")
    assert "user alice created" in run("createuser", "alice", "--email", "alice@example.com")
    assert Client().login(username="alice", password="a long enough password")
    user = get_user_model().objects.get(username="alice")
    assert not user.is_staff and not user.is_superuser
    run("createplan", "team", "--max-concurrent-runs", "4", "--max-gpus", "8")
    run("createproject", "acme", "--owner", "alice", "--plan", "team")
    token = run("createapitoken", "alice", "--project", "acme").strip().splitlines()[-1]
    assert Api(Client(), token).get("/api/training-runs").status_code == 200
    with pytest.raises(CommandError, match="exists already"):
        run("createuser", "alice")
    monkeypatch.setenv("STUDIO_USER_PASSWORD", "short")
    with pytest.raises(CommandError, match="that password will not do"):
        run("createuser", "bob")
    with pytest.raises(CommandError, match="is not a username"):
        run("createuser", "no spaces!")


def test_a_command_naming_a_user_who_does_not_exist_says_how_to_make_one(db):
    with pytest.raises(CommandError, match=r"create it first \(manage.py createuser alice\)"):
        run("createproject", "acme", "--owner", "alice")


# ---- createproject -------------------------------------------------------------------------------

def test_createproject_makes_the_owner_an_owner(alice):
    run("createplan", "team")
    run("createproject", "acme", "--owner", "alice", "--plan", "team")
    project = Project.objects.get(slug="acme")
    assert project.plan.name == "team"
    assert Membership.objects.get(project=project, user=alice).role == "owner"


def test_createproject_without_plan_has_no_plan(alice):
    run("createproject", "acme", "--owner", "alice")
    assert Project.objects.get(slug="acme").plan is None


def test_createproject_with_unknown_owner_is_a_command_error(db):
    with pytest.raises(CommandError, match="bob"):
        run("createproject", "acme", "--owner", "bob")
    assert not Project.objects.exists()


def test_createproject_with_unknown_plan_is_a_command_error(alice):
    with pytest.raises(CommandError, match="no plan named gold"):
        run("createproject", "acme", "--owner", "alice", "--plan", "gold")
    assert not Project.objects.exists()


def test_createproject_twice_is_a_command_error(alice):
    run("createproject", "acme", "--owner", "alice")
    with pytest.raises(CommandError, match="already exists"):
        run("createproject", "acme", "--owner", "alice")
    assert Project.objects.count() == 1


@pytest.mark.parametrize("slug", ["Has Space", "semi;colon", "x" * 65, "ünï"])
def test_createproject_with_a_bad_slug_is_a_command_error(alice, slug):
    with pytest.raises(CommandError, match="slug"):
        run("createproject", slug, "--owner", "alice")
    assert not Project.objects.exists()


# ---- setplan -------------------------------------------------------------------------------------

def test_setplan_moves_the_project(alice):
    run("createplan", "free", "--no-training")
    run("createplan", "team")
    run("createproject", "acme", "--owner", "alice", "--plan", "free")
    run("setplan", "acme", "team")
    assert Project.objects.get(slug="acme").plan.name == "team"


def test_plan_commands_are_in_the_audit_trail_with_what_changed(alice):
    # The admin's plan edits were audited; the same changes from the commands were not.
    from studio.models import AuditEvent

    run("createplan", "free", "--no-training")
    run("createplan", "team", "--max-gpus", "4")
    run("createplan", "team", "--max-gpus", "4")  # nothing changes: nothing recorded
    run("createplan", "team", "--max-gpus", "16")
    run("createproject", "acme", "--owner", "alice", "--plan", "free")
    run("setplan", "acme", "team")
    run("setplan", "acme", "team")
    events = [(e.action, e.target_name, e.project_slug, e.via, e.details) for e in AuditEvent.objects.filter(action__in=["created", "updated"]).exclude(
        target_type="project", action="created").order_by("id")]
    assert events == [
        ("created", "free", "", "system", {"changes": {"includes_training": {"from": None, "to": False}, "max_concurrent_runs": {"from": None, "to": 2},
                                                       "max_gpus_per_run": {"from": None, "to": 8}}}),
        ("created", "team", "", "system", {"changes": {"includes_training": {"from": None, "to": True}, "max_concurrent_runs": {"from": None, "to": 2},
                                                       "max_gpus_per_run": {"from": None, "to": 4}}}),
        ("updated", "team", "", "system", {"changes": {"max_gpus_per_run": {"from": 4, "to": 16}}}),
        ("updated", "acme", "acme", "system", {"changes": {"plan": {"from": "free", "to": "team"}}}),
    ], events


def test_setplan_unknown_project_is_a_command_error(db):
    run("createplan", "team")
    with pytest.raises(CommandError, match="no project nowhere"):
        run("setplan", "nowhere", "team")


def test_setplan_unknown_plan_is_a_command_error(alice):
    run("createproject", "acme", "--owner", "alice")
    with pytest.raises(CommandError, match="no plan named gold"):
        run("setplan", "acme", "gold")
    assert Project.objects.get(slug="acme").plan is None


# ---- createapitoken ------------------------------------------------------------------------------

def test_createapitoken_last_line_authenticates(alice):
    run("createplan", "team")
    run("createproject", "acme", "--owner", "alice", "--plan", "team")
    output = run("createapitoken", "alice", "--project", "acme")
    token = output.strip().splitlines()[-1]
    response = Api(Client(), token).get("/api/training-runs")
    assert response.status_code == 200, response.content
    assert response.json()["count"] == 0
    stored = ApiToken.objects.get()
    assert stored.token_hash != token and token not in stored.token_hash  # only the hash is kept
    # The plaintext is printed once, on the last line only.
    assert output.count(token) == 1


def test_createapitoken_unknown_user_is_a_command_error(alice):
    run("createproject", "acme", "--owner", "alice")
    with pytest.raises(CommandError, match="bob"):
        run("createapitoken", "bob", "--project", "acme")
    assert not ApiToken.objects.exists()


def test_createapitoken_with_an_overlong_name_is_a_command_error(alice):
    run("createproject", "acme", "--owner", "alice")
    with pytest.raises(CommandError, match="at most 100 characters; this one has 500"):
        run("createapitoken", "alice", "--project", "acme", "--name", "n" * 500)
    assert not ApiToken.objects.exists()


def test_createapitoken_unknown_project_is_a_command_error(alice):
    with pytest.raises(CommandError, match="no project nowhere"):
        run("createapitoken", "alice", "--project", "nowhere")


def test_createapitoken_for_a_non_member_is_a_command_error(alice):
    get_user_model().objects.create_user("bob", "bob@example.com", "pw")
    run("createproject", "acme", "--owner", "alice")
    with pytest.raises(CommandError, match="not a member"):
        run("createapitoken", "bob", "--project", "acme")
    assert not ApiToken.objects.exists()


# ---- bootstrapdemo -------------------------------------------------------------------------------

@pytest.fixture
def demo_var(settings, tmp_path):
    """A private var/ for the demo; the tiny models are marked built so the test needs no torch."""
    settings.VAR_DIR = tmp_path
    settings.DEBUG = True  # as make studio runs it
    (tmp_path / "demo" / "student").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def operators_setup(db, demo_var, settings):
    """A production Studio an operator set up: their plans, and an admin with their own password."""
    settings.DEBUG = False
    run("createplan", "team", "--max-concurrent-runs", "4", "--max-gpus", "8")
    run("createplan", "free", "--max-concurrent-runs", "2", "--max-gpus", "1")
    get_user_model().objects.create_superuser("admin", "ops@example.com", "the operator's password")
    return demo_var


def demo_state() -> dict:
    User = get_user_model()
    return {
        "users": sorted(User.objects.values_list("username", "is_superuser")),
        "plans": sorted(Plan.objects.values_list("name", "includes_training", "max_concurrent_runs", "max_gpus_per_run")),
        "projects": sorted(Project.objects.values_list("slug", "plan__name")),
        "memberships": sorted(Membership.objects.values_list("project__slug", "user__username", "role")),
        "tokens": sorted(ApiToken.objects.filter(revoked_at__isnull=True).values_list("pk", "project__slug", "user__username")),
    }


def test_bootstrapdemo_is_idempotent(db, demo_var):
    first_output = run("bootstrapdemo")
    first = demo_state()
    token = (demo_var / "demo-token").read_text().strip()
    run("bootstrapdemo")
    assert demo_state() == first
    assert (demo_var / "demo-token").read_text().strip() == token
    assert first["projects"] == [("demo", "team")]
    assert ("admin", True) in first["users"]
    assert len(first["tokens"]) == 1
    assert "/admin/" in first_output
    response = Api(Client(), token).get("/api/training-runs")
    assert response.status_code == 200, response.content


def test_bootstrapdemo_commits_the_demo_models_and_datasets_to_the_data_hub_once(db, demo_var):
    from datahub.models import Branch
    from datahub.refs import dataset_findings
    from training.suggestions import demo_recorded

    output = run("bootstrapdemo")
    built = demo_recorded()
    api = Api(Client(), (demo_var / "demo-token").read_text().strip())
    repos = {r["name"]: r["type"] for r in api.get("/api/hub/repos").json()}
    assert repos == {"demo-student": "model", "demo-teacher": "model", "demo-sft": "dataset", "demo-sft-text": "dataset",
                     "demo-sft-prompt-completion": "dataset", "demo-dpo": "dataset", "demo-distill": "dataset", "demo-grpo": "dataset"}
    assert "Data Hub: demo/demo-dpo@main" in output
    # The committed bytes are the built files', and a run can name them as refs.
    download = api.get("/api/hub/repos/demo-dpo/download?path=dpo.jsonl&ref=main")
    assert download.status_code == 200 and b"".join(download.streaming_content) == Path(built["dpo"]).read_bytes()
    config = api.get("/api/hub/repos/demo-student/download?path=config.json")
    assert b"".join(config.streaming_content) == (Path(built["student"]) / "config.json").read_bytes()
    project = Project.objects.get(slug="demo")
    assert dataset_findings(project, "dpo", "demo-dpo@main") == []
    assert dataset_findings(project, "dpo", "demo-sft@main")  # chats are no preference pairs: the rows were read
    # Again: nothing new; a demo repo the user deleted stays deleted.
    heads = sorted(Branch.objects.values_list("repo__name", "head_id"))
    assert api.delete("/api/hub/repos/demo-grpo").status_code == 204
    assert "Data Hub:" not in run("bootstrapdemo")
    assert sorted(Branch.objects.values_list("repo__name", "head_id")) == [h for h in heads if h[0] != "demo-grpo"]


def test_bootstrapdemo_without_debug_refuses_and_changes_nothing(operators_setup):
    # It used to set team to 2 concurrent runs and free to none, and print a password.
    before = demo_state()
    with pytest.raises(CommandError, match="DEBUG=1, or pass --i-know-this-is-production"):
        run("bootstrapdemo")
    assert demo_state() == before
    assert get_user_model().objects.get(username="admin").check_password("the operator's password")


def test_bootstrapdemo_in_production_creates_only_what_is_missing(operators_setup):
    before = demo_state()
    output = run("bootstrapdemo", "--i-know-this-is-production")
    after = demo_state()
    assert after["plans"] == before["plans"] == [("free", True, 2, 1), ("team", True, 4, 8)]
    assert after["users"] == before["users"]
    assert get_user_model().objects.get(username="admin").check_password("the operator's password")
    assert after["projects"] == [("demo", "team")] and len(after["tokens"]) == 1
    assert "password" not in output and "admin / " not in output


def test_bootstrapdemo_in_production_makes_no_admin_password_of_its_own(db, demo_var, settings, monkeypatch):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="set STUDIO_ADMIN_PASSWORD"):
        run("bootstrapdemo", "--i-know-this-is-production")
    monkeypatch.setenv("STUDIO_ADMIN_PASSWORD", "")  # an empty one made admin / admin
    with pytest.raises(CommandError, match="set STUDIO_ADMIN_PASSWORD"):
        run("bootstrapdemo", "--i-know-this-is-production")
    assert not get_user_model().objects.exists() and not Plan.objects.exists()
    monkeypatch.setenv("STUDIO_ADMIN_PASSWORD", "a long chosen password")
    output = run("bootstrapdemo", "--i-know-this-is-production")
    assert get_user_model().objects.get(username="admin").check_password("a long chosen password")
    assert "a long chosen password" not in output


def test_bootstrapdemo_keeps_the_plans_createplan_set(db, demo_var):
    run("createplan", "team", "--max-concurrent-runs", "4", "--max-gpus", "8")
    run("bootstrapdemo")
    assert Plan.objects.get(name="team").max_concurrent_runs == 4
    assert Plan.objects.get(name="free").includes_training is False  # made, as it was missing


def test_createproject_refuses_a_slug_that_is_one_of_the_hubs_own_urls(alice):
    # /hub/api/<repo> is the Hub read API's, so project api's repo pages could not be reached.
    for slug in ("api", "datasets", "new"):
        with pytest.raises(CommandError, match=rf"slug: choose another slug, e.g. {slug}-team"):
            run("createproject", slug, "--owner", "alice")
    assert not Project.objects.exists()
    run("createproject", "api-team", "--owner", "alice")
    assert Project.objects.get().slug == "api-team"


def test_the_reserved_slugs_are_every_first_word_of_the_hubs_routes():
    """A route added to datahub.hf_urls under a word of its own must keep that word from projects."""
    import re

    from datahub import hf_urls
    from studio.services import RESERVED_PROJECT_SLUGS

    words = {m[1] for p in hf_urls.urlpatterns if (m := re.match(r"\^(?:\(\?P<\w+>)?([a-z]+)\b", p.pattern.regex.pattern))}
    assert words == {"api", "datasets", "new"}
    assert words <= RESERVED_PROJECT_SLUGS


def test_manage_py_with_a_bad_environment_says_what_to_set_without_a_traceback():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "SECRET_KEY_FILE")}
    done = subprocess.run([sys.executable, "manage.py", "createplan", "team"], cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == "Studio cannot start: SECRET_KEY is not set: set SECRET_KEY (or SECRET_KEY_FILE), or DEBUG=1 for development"


@pytest.mark.parametrize("old_place", ["copied", "moved"])
def test_bootstrapdemo_in_a_moved_var_lists_and_suggests_its_own_demo_files(db, demo_var, settings, old_place):
    # built.json keeps absolute paths: after `cp -r var` into another checkout it named the old
    # checkout's files (gone, or read from there) in its output and in NEW RUN's suggestions.

    from training.suggestions import demo_built, demo_marker

    old, new = demo_var / "old-checkout" / "var", demo_var / "new-checkout" / "var"
    settings.VAR_DIR = old
    old.mkdir(parents=True)
    run("bootstrapdemo")
    shutil.copytree(old, new)
    if old_place == "moved":
        shutil.rmtree(old)
    settings.VAR_DIR = new
    output = run("bootstrapdemo")
    built = json.loads(demo_marker().read_text())
    assert built and all(path.startswith(f"{new}/demo/") and Path(path).exists() for path in built.values()), built
    listed = [line.strip() for line in output.splitlines() if line.startswith("  ")]
    assert listed == [f"{name}: {path}" for name, path in built.items()] and f"student: {new}/demo/tiny-student" in listed
    assert "building the demo models and datasets here again" in output
    assert demo_built() == {name: Path(path) for name, path in built.items()}
