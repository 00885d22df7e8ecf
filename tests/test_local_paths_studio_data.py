"""A local path into the Studio's own data (another project's run output, the Data Hub's storage) is
refused at create, PATCH and START, naming the field, however it is written; the demo's paths in var/
still train; and the local backend never hands such a path to an engine (training.refs.studio_data)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_error, sft_body
from training import services
from training.backends.base import BackendError, JobSpec
from training.models import Status, TrainingRun

SAYS = "is inside the Studio's own data (run outputs, STUDIO_RUNS_DIR): a run's model is in the Data Hub as <project>/<model repo>@<commit>; use that"


@pytest.fixture
def var(settings, tmp_path) -> Path:
    """A Studio's var/ of its own: runs, the Data Hub and the demo's files below it, as `make studio` has them."""
    var = tmp_path / "var"
    settings.VAR_DIR = var
    settings.STUDIO_RUNS_DIR = var / "runs"
    settings.DATAHUB_ROOT = var / "hub"
    settings.DATAHUB_CHECKOUT_DIR = var / "checkouts"
    return var


def write_model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"beta's weights")
    return path


@pytest.fixture
def beta_output(var, other_project, users) -> Path:
    """The final model of a run of another project (globex), in its folder under STUDIO_RUNS_DIR."""
    run = services.create_run(other_project, users["outsider"], name="beta's run", method="sft", base_model="org/base", dataset="org/data")
    return write_model(var / "runs" / str(run.pk) / "attempt-1" / "output" / "final")


def stored_run(project, users, **fields) -> TrainingRun:
    """A run as one stored before create refused these paths: its fields written past the validator."""
    run = services.create_run(project, users["owner"], name="stored before", method="sft", base_model="org/base", dataset="org/data")
    TrainingRun.objects.filter(pk=run.pk).update(**fields)
    return run


def test_another_projects_run_output_as_base_model_is_refused_at_create(api, beta_output):
    body = assert_error(api.post("/api/training-runs", sft_body(base_model=str(beta_output))), 400, "base_model")
    assert [e["message"] for e in body["errors"] if e["field"] == "base_model"] == [f"{beta_output} {SAYS}"], body
    assert not TrainingRun.objects.filter(name="sft run").exists()


def test_another_projects_run_output_is_refused_through_a_link_and_a_dotdot_path(api, beta_output, tmp_path):
    (tmp_path / "innocent").symlink_to(beta_output.parent)
    (tmp_path / "elsewhere").mkdir()
    for path in (str(tmp_path / "innocent" / "final"), str(tmp_path / "elsewhere" / ".." / beta_output.relative_to(tmp_path))):
        body = assert_error(api.post("/api/training-runs", sft_body(base_model=path)), 400, "base_model")
        assert [e["message"] for e in body["errors"] if e["field"] == "base_model"] == [f"{path} {SAYS}"], body


def test_a_folder_of_links_to_another_runs_weights_is_refused_at_create(api, beta_output, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").symlink_to(beta_output / "model.safetensors")
    body = assert_error(api.post("/api/training-runs", sft_body(base_model=str(folder))), 400, "base_model")
    message = [e["message"] for e in body["errors"] if e["field"] == "base_model"][0]
    assert message.startswith(f"{folder} holds a link ({folder / 'model.safetensors'}) into the Studio's own data (run outputs, STUDIO_RUNS_DIR)"), message


def test_every_local_path_field_is_refused_at_create_and_patch(api, beta_output, var):
    data = beta_output / "rows.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    cases = [
        (sft_body(dataset=str(data)), "dataset"),
        (sft_body(dataset=["org/data", {"ref": str(data), "type": "chat"}]), "dataset[1]"),
        (sft_body(method="distill", config={"distillation": {"teacher_model": str(beta_output)}}), "config.distillation.teacher_model"),
        (sft_body(method="grpo", dataset=None, config={"rl_mode": "ruler", "ruler_task_args": {"dataset": str(data), "system_prompt": "Be kind"},
                                                       "judge": {"mode": "external", "endpoint": "http://judge", "api_key_secret": "k"}}),
         "config.ruler_task_args.dataset"),
        (sft_body(config={"eval_dataset": str(data)}), "config.eval_dataset"),
        (sft_body(config={"eval_dataset": ["org/held", {"ref": str(data), "type": "chat"}]}), "config.eval_dataset[1]"),
        (sft_body(dataset=str(var / "hub")), "dataset"),  # the Data Hub's blobs
        (sft_body(dataset=str(var)), "dataset"),  # a folder above them all
    ]
    for body, field in cases:
        refused = assert_error(api.post("/api/training-runs", body), 400, field)
        assert any("the Studio's own data" in e["message"] for e in refused["errors"] if e["field"] == field), refused
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    assert_error(api.patch(f"/api/training-runs/{run_id}", {"base_model": str(beta_output)}), 400, "base_model")
    assert TrainingRun.objects.get(pk=run_id).base_model == "org/base"


def test_a_stored_run_naming_another_projects_output_is_refused_at_start_however_written(api, project, users, beta_output, tmp_path):
    (tmp_path / "innocent").symlink_to(beta_output.parent)
    (tmp_path / "elsewhere").mkdir()
    for path in (str(beta_output), str(tmp_path / "innocent" / "final"), str(tmp_path / "elsewhere" / ".." / beta_output.relative_to(tmp_path))):
        run = stored_run(project, users, base_model=path)
        body = assert_error(api.post(f"/api/training-runs/{run.pk}/start"), 422, "base_model")
        assert f"{path} {SAYS}" in [e["message"] for e in body["errors"] if e["field"] == "base_model"], body
        run.refresh_from_db()
        assert (run.status, run.start_requested_at, run.attempt) == (Status.QUEUED, None, 0)


def test_the_projects_own_run_output_is_refused_too(api, project, users, var):
    # The Data Hub ref is the way: its model repo is checked against the project, a folder is not.
    own = services.create_run(project, users["owner"], name="ours", method="sft", base_model="org/base", dataset="org/data")
    output = write_model(var / "runs" / str(own.pk) / "attempt-1" / "output" / "final")
    assert_error(api.post("/api/training-runs", sft_body(base_model=str(output))), 400, "base_model")
    run = stored_run(project, users, base_model=str(output))
    assert_error(api.post(f"/api/training-runs/{run.pk}/start"), 422, "base_model")


def test_the_demos_paths_in_var_still_train(api, var):
    student = write_model(var / "demo" / "tiny-student")
    data = var / "demo" / "datasets" / "sft_chat.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    created = api.post("/api/training-runs", sft_body(base_model=str(student), dataset=str(data)))
    assert created.status_code == 201, created.content
    started = api.post(f"/api/training-runs/{created.json()['id']}/start")
    assert started.status_code == 202, started.content
    assert TrainingRun.objects.get(pk=created.json()["id"]).start_requested_at is not None


def test_the_local_backend_never_hands_an_engine_the_studios_own_data(settings, beta_output, tmp_path):
    # Defence in depth: were the validators skipped, submit refuses and the sandbox binds nothing of it.
    from training.backends.local import LocalBackend, sandbox_plan

    settings.STUDIO_LOCAL_SANDBOX = "auto"
    link = tmp_path / "innocent"
    link.symlink_to(beta_output)
    spec = JobSpec(run_id=8, attempt=1, method="sft", base_model=str(link), dataset=[{"path": str(beta_output / "model.safetensors")}],
                   config={}, compute={}, ingest_url="http://127.0.0.1:9/none", ingest_token="ing_x")
    plan = sandbox_plan(spec, Path(settings.STUDIO_RUNS_DIR) / "8" / "attempt-1")
    assert not [path for path in plan["read_only"] if Path(path).is_relative_to(beta_output.parents[2])], plan
    with pytest.raises(BackendError, match=r"base_model: .* is inside the Studio's own data .*; dataset\[0\]: "):
        LocalBackend().submit(spec)
    assert not (Path(settings.STUDIO_RUNS_DIR) / "8").exists()


def test_the_local_backend_reads_an_eval_dataset_path_as_it_reads_the_dataset(settings, beta_output, tmp_path):
    # config.eval_dataset is one of the run's local reads (training.refs.local_reads): refused into the
    # Studio's own data at submit, and shown to the sandboxed engine read-only elsewhere.
    from training.backends.local import LocalBackend, sandbox_plan

    settings.STUDIO_LOCAL_SANDBOX = "auto"
    held = tmp_path / "held.jsonl"
    held.write_text("{}\n")
    fine = JobSpec(run_id=9, attempt=1, method="sft", base_model="org/base", dataset=[{"path": "org/data"}],
                   config={"eval_dataset": [str(held)]}, compute={}, ingest_url="http://127.0.0.1:9/none", ingest_token="ing_x",
                   eval_dataset=[{"path": str(held)}])
    assert str(held.resolve()) in sandbox_plan(fine, Path(settings.STUDIO_RUNS_DIR) / "9" / "attempt-1")["read_only"]
    inside = str(beta_output / "model.safetensors")
    spec = JobSpec(run_id=8, attempt=1, method="sft", base_model="org/base", dataset=[{"path": "org/data"}],
                   config={"eval_dataset": inside}, compute={}, ingest_url="http://127.0.0.1:9/none", ingest_token="ing_x",
                   eval_dataset=[{"path": inside}])
    with pytest.raises(BackendError, match=r"config\.eval_dataset: .* is inside the Studio's own data"):
        LocalBackend().submit(spec)
