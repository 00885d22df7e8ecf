"""The Django admin is no back door around the services: a superuser's edit there either goes through
the service the API calls (STOP, DELETE: their checks, their side effects, their audit event), or is
refused with the row intact; and what the admin alone edits (plans, a project's plan, backend
connections, GPU prices) is in the audit trail."""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.messages import get_messages

from datahub import commits, repos
from datahub.models import Blob, Commit, Repo, Tag, UploadSession
from datahub.uploads import create_upload
from experiments.models import Experiment
from studio.models import AuditEvent, Plan
from tests.conftest import sft_body
from training.backends.local import run_dir
from training.models import BackendConnection, GpuPrice, Status, TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def folders(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.DATAHUB_ROOT = tmp_path / "hub"


def said(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def events_after(last: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(id__gt=last).order_by("id"))


def last_event() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def new_run(api, status: str = Status.QUEUED, **fields: Any) -> TrainingRun:
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=status, **fields)
    return TrainingRun.objects.get(pk=run_id)


# ---- training runs -------------------------------------------------------------------------------

def test_a_running_runs_settings_cannot_be_edited_in_the_admin(api, root):
    run = new_run(api, Status.RUNNING, attempt=1, backend_job_id="local-1")
    before = TrainingRun.objects.filter(pk=run.pk).values("name", "method", "base_model", "dataset", "config", "compute", "project", "experiment").get()
    root.post(f"/admin/training/trainingrun/{run.pk}/change/", {
        "project": run.project_id, "experiment": run.experiment_id, "created_by": run.created_by_id, "name": "renamed", "method": "dpo", "base_model": "org/other",
        "dataset": json.dumps("org/other-data"), "config": json.dumps({"learning_rate": 1}), "compute": json.dumps({"backend": "modal"}),
        "stage": "", "progress": "{}", "pinned": "{}", "poll_failures": 0,
    })
    assert TrainingRun.objects.filter(pk=run.pk).values(*before).get() == before
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING


def test_deleting_a_running_run_in_the_admin_is_refused_saying_to_stop_it_first(api, root):
    run = new_run(api, Status.RUNNING, attempt=1, backend_job_id="local-1")
    last = last_event()
    response = root.post(f"/admin/training/trainingrun/{run.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert TrainingRun.objects.filter(pk=run.pk, status=Status.RUNNING).exists()
    assert "STOP it first" in said(response)
    assert events_after(last) == []


def test_deleting_an_ended_run_in_the_admin_goes_through_delete_run(api, root, django_capture_on_commit_callbacks):
    run = new_run(api, Status.FAILED, attempt=1)
    folder = run_dir(run.pk, 1)
    folder.mkdir(parents=True)
    (folder / "engine.log").write_text("step 1")
    last = last_event()
    with django_capture_on_commit_callbacks(execute=True):
        response = root.post(f"/admin/training/trainingrun/{run.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not TrainingRun.objects.filter(pk=run.pk).exists()
    assert not folder.parent.exists()  # the run's folder, as the API's DELETE removes it
    assert [(e.action, e.target_type, e.target_id, e.actor_name) for e in events_after(last)] == [("deleted", "trainingrun", str(run.pk), "root")]


def test_delete_selected_runs_deletes_the_ended_and_keeps_the_live_one_naming_why(api, root):
    ended, live = new_run(api, Status.CANCELLED, attempt=1), new_run(api, Status.PROVISIONING, attempt=1)
    page = root.post("/admin/training/trainingrun/", {"action": "delete_selected", "_selected_action": [ended.pk, live.pk]})
    assert page.status_code == 200 and "Are you sure" in page.content.decode()  # Django's confirmation page first
    response = root.post("/admin/training/trainingrun/", {"action": "delete_selected", "_selected_action": [ended.pk, live.pk], "post": "yes"})
    assert response.status_code == 302
    assert not TrainingRun.objects.filter(pk=ended.pk).exists()
    assert TrainingRun.objects.filter(pk=live.pk, status=Status.PROVISIONING).exists()
    assert "STOP it first" in said(response) and "Deleted 1 training run." in said(response)
    assert AuditEvent.objects.filter(action="deleted", target_type="trainingrun", target_id=str(ended.pk), actor_name="root").exists()


def test_the_admins_stop_action_stops_the_run_through_stop_run(api, root):
    run = new_run(api, Status.RUNNING, attempt=1, backend_job_id="local-1")
    last = last_event()
    response = root.post("/admin/training/trainingrun/", {"action": "stop", "_selected_action": [run.pk]})
    assert response.status_code == 302
    assert TrainingRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert [(e.action, e.target_id, e.actor_name) for e in events_after(last)] == [("stopped", str(run.pk), "root")]


def test_a_run_cannot_be_added_in_the_admin(root):
    assert root.get("/admin/training/trainingrun/add/").status_code == 403


# ---- Data Hub --------------------------------------------------------------------------------------

def test_a_tag_cannot_be_pointed_at_another_repos_commit_in_the_admin(project, other_project, users, root):
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    theirs = repos.create_repo(other_project, "secret", "dataset", users["outsider"])
    tag = repos.create_tag(repo, "v1", "main")
    other_commit = repos.resolve(theirs, "main")
    root.post(f"/admin/datahub/tag/{tag.pk}/change/", {"repo": theirs.pk, "name": "v1", "commit": other_commit.pk})
    tag.refresh_from_db()
    assert (tag.repo_id, tag.commit_id) == (repo.pk, repos.resolve(repo, "main").pk)


def test_history_cannot_be_deleted_in_the_admin(project, users, root):
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    first = repos.resolve(repo, "main")
    commits.commit_files(repo, "main", {"train.jsonl": b"{}\n"})
    blob = Blob.objects.get(entries__commit=repos.resolve(repo, "main"))
    Blob.objects.create(sha256="f" * 64, size=1)  # bytes no tree names yet (an upload's, within hub_gc's grace)
    root.post(f"/admin/datahub/commit/{first.pk}/delete/", {"post": "yes"})  # the head's parent: no ref protects it
    root.post(f"/admin/datahub/blob/{'f' * 64}/delete/", {"post": "yes"})
    root.post(f"/admin/datahub/blob/{blob.pk}/change/", {"sha256": blob.pk, "size": 999, "used_at_0": "2000-01-01", "used_at_1": "00:00:00"})
    assert Commit.objects.filter(pk=first.pk).exists()
    assert Blob.objects.filter(pk="f" * 64).exists()
    blob.refresh_from_db()
    assert blob.size == 3
    assert root.get("/admin/datahub/blob/add/").status_code == 403


def test_deleting_a_repo_in_the_admin_goes_through_delete_repo(project, users, root):
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    last = last_event()
    response = root.post(f"/admin/datahub/repo/{repo.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Repo.objects.filter(pk=repo.pk).exists()
    assert [(e.action, e.target_type, e.target_name, e.actor_name) for e in events_after(last)] == [("deleted", "repo", "data", "root")]


def test_deleting_a_repo_a_live_run_uses_is_refused_in_the_admin(api, root):
    run = new_run(api, Status.QUEUED)
    repo = Repo.objects.get(project=run.project, name=f"experiment-{run.experiment.slug}")
    response = root.post(f"/admin/datahub/repo/{repo.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert Repo.objects.filter(pk=repo.pk).exists()
    assert f"run #{run.pk}" in said(response)


def test_deleting_a_tag_in_the_admin_is_audited(project, users, root):
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    tag = repos.create_tag(repo, "v1", "main")
    last = last_event()
    assert root.post(f"/admin/datahub/tag/{tag.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Tag.objects.filter(pk=tag.pk).exists()
    assert [(e.action, e.target_type, e.target_name, e.actor_name) for e in events_after(last)] == [("deleted", "tag", "v1", "root")]


def test_an_upload_session_is_aborted_not_edited_in_the_admin(project, users, root):
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    session = create_upload(repo, users["owner"], "main", [{"path": "a.txt", "size": 1}])
    root.post(f"/admin/datahub/uploadsession/{session.pk}/change/", {
        "project": project.pk, "repo": repo.pk, "repo_name": "data", "branch": "main", "state": "committed", "message": "", "parent": "", "abort_reason": ""})
    assert UploadSession.objects.get(pk=session.pk).state == UploadSession.State.OPEN
    root.post("/admin/datahub/uploadsession/", {"action": "abort", "_selected_action": [session.pk]})
    assert UploadSession.objects.get(pk=session.pk).state == UploadSession.State.ABORTED


def test_an_experiments_slug_cannot_be_changed_in_the_admin(api, root):
    run = new_run(api)
    experiment = run.experiment
    root.post(f"/admin/experiments/experiment/{experiment.pk}/change/", {"project": experiment.project_id, "name": "x", "slug": "moved", "hub_repo": ""})
    assert Experiment.objects.get(pk=experiment.pk).slug == experiment.slug


# ---- what only the admin edits, in the audit trail --------------------------------------------------

def test_a_plans_limits_changed_in_the_admin_are_audited(team_plan, root):
    last = last_event()
    response = root.post(f"/admin/studio/plan/{team_plan.pk}/change/", {"name": "team", "includes_training": "on", "max_concurrent_runs": 5, "max_gpus_per_run": 8})
    assert response.status_code == 302
    assert Plan.objects.get(pk=team_plan.pk).max_concurrent_runs == 5
    [event] = events_after(last)
    assert (event.action, event.target_type, event.target_name, event.actor_name, event.via) == ("updated", "plan", "team", "root", "session")
    assert event.details == {"changes": {"max_concurrent_runs": {"from": 2, "to": 5}}}


def test_a_projects_plan_changed_in_the_admin_is_audited(project, free_plan, root):
    last = last_event()
    response = root.post(f"/admin/studio/project/{project.pk}/change/", {
        "slug": "acme", "name": project.name, "plan": free_plan.pk,
        "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0, "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000})
    assert response.status_code == 302, response.content.decode()[:2000]
    [event] = events_after(last)
    assert (event.action, event.target_type, event.project_slug, event.actor_name) == ("updated", "project", "acme", "root")
    assert event.details == {"changes": {"plan": {"from": "team", "to": "free"}}}


def connection_form(project, **changes: Any) -> dict[str, Any]:
    """The admin's backend connection form as the browser posts it: a dstack connection, enabled."""
    return {"project": project.pk, "backend": "dstack", "enabled": "on", "server_url": "http://127.0.0.1:3000", "dstack_project": "main",
            "backends": "[]", "modal_app": "studio-engine", "setup_commands": "[]", "regions": "[]", "retry_window_seconds": 0,
            "interruption_retries": 2, "request_timeout_seconds": 30, **changes}


def test_a_connection_a_running_job_goes_through_is_not_deleted_or_disabled_in_the_admin(api, project, root):
    connection = BackendConnection.objects.create(project=project, backend="dstack", server_url="http://127.0.0.1:3000", dstack_project="main")
    run = new_run(api, Status.RUNNING, attempt=1, backend_job_id="studio-run-1", compute={"backend": "dstack"})
    response = root.post(f"/admin/training/backendconnection/{connection.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and f"run #{run.pk}" in said(response) and "STOP it first" in said(response)
    disabled = {key: value for key, value in connection_form(project).items() if key != "enabled"}
    response = root.post(f"/admin/training/backendconnection/{connection.pk}/change/", disabled)
    assert response.status_code == 200 and f"run #{run.pk}" in response.content.decode()
    assert BackendConnection.objects.filter(pk=connection.pk, enabled=True).exists()
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    last = last_event()
    assert root.post(f"/admin/training/backendconnection/{connection.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not BackendConnection.objects.filter(pk=connection.pk).exists()
    assert [(e.action, e.target_type, e.project_slug, e.actor_name) for e in events_after(last)] == [("deleted", "backendconnection", "acme", "root")]


def test_a_backend_connection_and_a_gpu_price_changed_in_the_admin_are_audited(project, root):
    last = last_event()
    response = root.post("/admin/training/backendconnection/add/", connection_form(project))
    assert response.status_code == 302, response.content.decode()[:3000]
    connection = BackendConnection.objects.get(project=project)
    price = GpuPrice.objects.create(gpu_type="H100", backend="", spot=False, price_per_hour="2.5000")
    response = root.post("/admin/training/gpuprice/", {
        "form-TOTAL_FORMS": 1, "form-INITIAL_FORMS": 1, "form-MIN_NUM_FORMS": 0, "form-MAX_NUM_FORMS": 1000,
        "form-0-id": price.pk, "form-0-price_per_hour": "3.1000", "_save": "Save"})
    assert response.status_code == 302
    events = events_after(last)
    assert [(e.action, e.target_type, e.target_id, e.project_slug, e.actor_name) for e in events] == [
        ("created", "backendconnection", str(connection.pk), "acme", "root"), ("updated", "gpuprice", str(price.pk), "", "root")]
    assert events[0].details["changes"]["server_url"] == {"from": None, "to": "http://127.0.0.1:3000"}
    assert events[1].details == {"changes": {"price_per_hour": {"from": "2.5000", "to": "3.1000"}}}
    assert events[1].target_name == "H100 on any backend"


def test_each_admin_list_and_page_still_opens(api, project, users, root):
    run = new_run(api, Status.FAILED, attempt=1)
    repo = repos.create_repo(project, "data", "dataset", users["owner"])
    commits.commit_files(repo, "main", {"train.jsonl": b"{}\n"})
    tag = repos.create_tag(repo, "v1", "main")
    session = create_upload(repo, users["owner"], "main", [{"path": "a.txt", "size": 1}])
    price = GpuPrice.objects.create(gpu_type="H100", backend="", spot=False, price_per_hour="2.5000")
    pages = {
        "training/trainingrun": run.pk, "datahub/repo": repo.pk, "datahub/commit": repos.resolve(repo, "main").pk,
        "datahub/blob": Blob.objects.first().pk, "datahub/tag": tag.pk, "datahub/uploadsession": session.pk,
        "experiments/experiment": run.experiment_id, "studio/plan": project.plan_id, "studio/project": project.pk, "training/gpuprice": price.pk,
    }
    for model, pk in pages.items():
        for url in (f"/admin/{model}/", f"/admin/{model}/{pk}/change/"):
            assert root.get(url).status_code == 200, url
    assert "Delete" in root.get(f"/admin/training/trainingrun/{run.pk}/change/").content.decode()
