"""The Data Hub seams the rest of Studio calls: experiment repos, run branches, pinned refs at
START, dataset row checks (the 422), and checkpoints committed to run-<id> on ingest."""
from __future__ import annotations

import pytest

from datahub import commits, refs, repos, services
from datahub.models import Branch, Repo
from studio import crypto
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training.backends.local import run_dir
from training.models import TrainingRun


def body(**overrides):
    """sft_body with its dataset pointed at this module's chat-data repo unless a test says otherwise."""
    return sft_body(**{"dataset": "chat-data@main", **overrides})


GOOD_CHAT = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3


@pytest.fixture
def base_repo(project):
    repo = repos.create_repo(project, "base", "model")
    commits.commit_files(repo, "main", {"config.json": b'{"model_type": "llama"}'}, "base weights")
    return repo


@pytest.fixture
def chat_data(project):
    repo = repos.create_repo(project, "chat-data", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(GOOD_CHAT)}, "data")
    return repo


def test_creating_an_experiment_provisions_its_repo(api, project):
    r = api.post("/api/experiments", {"name": "Exp One"})
    assert r.status_code == 201, r.content
    repo = Repo.objects.get(project=project, name="experiment-exp-one")
    assert repo.type == "experiment"
    from experiments.models import Experiment

    assert Experiment.objects.get(pk=r.json()["id"]).hub_repo == "acme/experiment-exp-one"
    assert repos.resolve(repo, "main").message == "Initial commit"


def test_creating_a_run_makes_its_branch_from_main(api, project, chat_data):
    r = api.post("/api/training-runs", body())
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    repo = Repo.objects.get(project=project, name="experiment-default")
    branch = Branch.objects.get(repo=repo, name=f"run-{run_id}")
    assert branch.head == repos.resolve(repo, "main")


def test_base_model_given_as_repo_at_branch_is_pinned_to_a_commit_on_start(api, base_repo, chat_data):
    head = repos.resolve(base_repo, "main")
    run_id = api.post("/api/training-runs", body(base_model="base@main")).json()["id"]
    r = api.post(f"/api/training-runs/{run_id}/start")
    assert r.status_code == 202, r.content
    pinned = TrainingRun.objects.get(pk=run_id).pinned
    assert pinned["base_model"] == {"ref": "base@main", "commit": head.pk, "repo": "acme/base"}
    assert pinned["dataset"]["commit"] == repos.resolve(chat_data, "main").pk
    # main moves on; the run keeps the bytes it started with
    commits.commit_files(base_repo, "main", {"config.json": b'{"model_type": "llama", "x": 1}'})
    assert TrainingRun.objects.get(pk=run_id).pinned["base_model"]["commit"] == head.pk
    assert refs.resolve_ref(base_repo.project, "base@main").commit != head.pk


def test_unknown_dataset_ref_returns_422_on_start(api):
    run_id = api.post("/api/training-runs", body(dataset="nope@main")).json()["id"]
    err = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert "nope" in err["errors"][0]["message"]
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None


def not_a_dataset_repo(value: str, kind: str) -> str:
    return (f'{value} names acme/chats, a {kind} repo, and a run trains only on a dataset repo\'s files: push the data files to a '
            'dataset repo (type "dataset" in POST /api/hub/repos, or the Data Hub\'s New repo) and use its repo@ref')


@pytest.mark.parametrize("kind", ["model", "experiment", "environment"])
def test_a_dataset_ref_to_a_repo_of_another_type_returns_422_on_start(api, project, chat_data, kind):
    """/hub serves only dataset repos as datasets (another type there is a 404, as on the Hub): the
    engine found no such dataset and the run failed once its job had started, though START had
    checked the repo's rows and passed them."""
    repo = repos.create_repo(project, "chats", kind)
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(GOOD_CHAT)}, "rows")
    run_id = api.post("/api/training-runs", body(dataset=["chat-data@main", {"ref": "chats@main"}])).json()["id"]
    err = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset[1].ref")
    assert err["errors"] == [{"field": "dataset[1].ref", "message": not_a_dataset_repo("chats@main", kind)}]
    run = TrainingRun.objects.get(pk=run_id)
    assert run.start_requested_at is None and not run.pinned


def test_a_ruler_dataset_ref_to_a_model_repo_returns_422_on_start(api, project):
    """A RULER run's prompts load as a dataset too, from /hub on a remote backend."""
    repo = repos.create_repo(project, "chats", "model")
    commits.commit_files(repo, "main", {"prompts.jsonl": jsonl([{"prompt": "Greet a friend."}])}, "prompts")
    config = {"rl_mode": "ruler", "ruler_task_args": {"dataset": "chats@main", "system_prompt": "Be warm."},
              "judge": {"mode": "external", "endpoint": "http://judge.example/v1", "api_key_secret": "judge-key"}}
    run_id = api.post("/api/training-runs", body(method="grpo", dataset=None, config=config)).json()["id"]
    err = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.ruler_task_args.dataset")
    assert {"field": "config.ruler_task_args.dataset", "message": not_a_dataset_repo("chats@main", "model")} in err["errors"]
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None


def test_unknown_base_model_branch_returns_422_on_start(api, base_repo, chat_data):
    run_id = api.post("/api/training-runs", body(base_model="base@no-such-branch")).json()["id"]
    assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "base_model")


def test_dataset_row_errors_name_the_row(api, project):
    repo = repos.create_repo(project, "prefs", "dataset")
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 56 + [{"prompt": "q", "chosen": "", "rejected": "b"}]
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(rows)})
    run_id = api.post("/api/training-runs", body(method="dpo", dataset="prefs@main", config={"loss": {"type": "dpo"}, "lora_rank": 8})).json()["id"]
    err = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert {"field": "dataset", "message": 'train.jsonl row 57: "chosen" is empty'} in err["errors"]


def test_chat_rows_for_dpo_are_the_wrong_shape(api, chat_data):
    run_id = api.post("/api/training-runs", body(method="dpo", config={"loss": {"type": "dpo"}, "lora_rank": 8})).json()["id"]
    err = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert any("prompt/chosen/rejected" in e["message"] for e in err["errors"])


def test_checkpoints_are_committed_to_the_run_branch(api, project, chat_data, eager_celery, tmp_path, settings, django_capture_on_commit_callbacks):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(ingest_token_hash=crypto.hash_token("ing_test"), attempt=1)
    out = run_dir(run_id, 1) / "output"
    step = out / "checkpoint-10"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"w" * 1000)
    (step / "sub").mkdir()
    (step / "sub" / "state.json").write_text("{}")
    (step / "link").symlink_to("/etc/hostname")
    final = out / "final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"f" * 1000)

    def ingest(batch_id, checkpoints):
        with django_capture_on_commit_callbacks(execute=True):
            r = api.client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": batch_id, "checkpoints": checkpoints},
                                content_type="application/json", HTTP_AUTHORIZATION="Bearer ing_test")
        assert r.status_code == 200, r.content

    ingest("b1", [{"step": 10, "path": str(step)}])
    repo = Repo.objects.get(project=project, name="experiment-default")
    head = repos.resolve(repo, f"run-{run_id}")
    assert set(repos.tree(head)) == {"checkpoints/step-10/model.safetensors", "checkpoints/step-10/sub/state.json", "metrics.jsonl", "training_config.json"}
    ingest("b2", [{"step": 20, "path": str(final), "kind": "final"}])
    head2 = repos.resolve(repo, f"run-{run_id}")
    assert head2.parents == [head.pk]
    assert {"checkpoints/step-10/model.safetensors", "final/model.safetensors", "metrics.jsonl"} <= set(repos.tree(head2))
    # main is untouched: the run's artifacts live on its branch
    assert repos.tree(repos.resolve(repo, "main")) == {}
    # running the task again for the same checkpoint makes no new commit
    from training.models import Checkpoint

    assert services.commit_checkpoint(Checkpoint.objects.get(run_id=run_id, step=20).pk) == head2


def test_builtin_environment_refs_are_not_hub_refs(project):
    assert refs.run_refs(None, None, {"environment_id": "builtin/arith@main"}) == []


def test_engine_inputs_point_at_pinned_commits_and_ingest_token_reads_the_hub(api, client, base_repo, chat_data):
    run_id = api.post("/api/training-runs", body(base_model="base@main", dataset=[{"ref": "chat-data@main", "type": "chat"}])).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    TrainingRun.objects.filter(pk=run_id).update(status="running", ingest_token_hash=crypto.hash_token("ing_abc"))
    run = TrainingRun.objects.get(pk=run_id)
    inputs = refs.engine_inputs(run, "ing_abc")
    assert inputs["base_model"] == "acme/base" and inputs["base_model_revision"] == repos.resolve(base_repo, "main").pk
    assert inputs["dataset"] == [{"path": "acme/chat-data", "type": "chat", "revision": repos.resolve(chat_data, "main").pk, "data_hub": True}]
    assert inputs["env"]["HF_ENDPOINT"].endswith("/hub") and inputs["env"]["HF_TOKEN"] == "ing_abc"
    # the attempt's ingest token reads its project's repos through /hub while the run is active
    r = client.get(f"/hub/acme/base/resolve/{inputs['base_model_revision']}/config.json", HTTP_AUTHORIZATION="Bearer ing_abc")
    assert r.status_code == 200
    TrainingRun.objects.filter(pk=run_id).update(status="completed")
    assert client.get("/hub/api/models/acme/base", HTTP_AUTHORIZATION="Bearer ing_abc").status_code == 401


def test_a_merge_token_reads_only_its_attempts_base_commit_while_the_merge_runs(api, client, base_repo, chat_data):
    from django.utils import timezone

    from training.models import Checkpoint

    run_id = api.post("/api/training-runs", body(base_model="base@main", config={"lora_rank": 4})).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    TrainingRun.objects.filter(pk=run_id).update(status="completed")
    trained_on = TrainingRun.objects.get(pk=run_id).pinned["base_model"]["commit"]
    commits.commit_files(base_repo, "main", {"README.md": b"moved on"}, "after the run")
    saved = Checkpoint.objects.create(run_id=run_id, attempt=1, step=2, path="/x/checkpoint-2", merge_requested_at=timezone.now(),
                                      merge_token_hash=crypto.hash_token("mrg_abc"))
    auth = {"HTTP_AUTHORIZATION": "Bearer mrg_abc"}
    assert client.get(f"/hub/acme/base/resolve/{trained_on}/config.json", **auth).status_code == 200
    # Not the branch where it is now, nor the run's other repos.
    assert client.get("/hub/acme/base/resolve/main/config.json", **auth).status_code == 404
    assert client.get("/hub/api/datasets/acme/chat-data", **auth).status_code == 404
    Checkpoint.objects.filter(pk=saved.pk).update(merge_requested_at=None)  # the merge ended
    assert client.get(f"/hub/acme/base/resolve/{trained_on}/config.json", **auth).status_code == 401


def test_refs_at_pins_write_each_pinned_ref_at_its_commit():
    fields = {"base_model": "base@main", "dataset": [{"ref": "acme/rows@b1", "type": "chat"}, "other@main", "org/hf-data"],
              "config": {"distillation": {"teacher_model": "teacher@v1"}, "environment_id": "builtin/arith@main", "lora_rank": 4}, "compute": {}}
    pinned = {"base_model": {"ref": "base@main", "commit": "a" * 40, "repo": "acme/base"},
              "dataset[0]": {"ref": "acme/rows@b1", "commit": "b" * 40, "repo": "acme/rows"},
              "dataset[1]": {"ref": "other@old", "commit": "c" * 40, "repo": "acme/other"},  # pinned from another value: left as it is
              "config.distillation.teacher_model": {"ref": "teacher@v1", "commit": "d" * 40, "repo": "acme/teacher"}}
    assert refs.refs_at_pins(fields, pinned) == {
        "base_model": f"base@{'a' * 40}", "dataset": [{"ref": f"acme/rows@{'b' * 40}", "type": "chat"}, "other@main", "org/hf-data"],
        "config": {"distillation": {"teacher_model": f"teacher@{'d' * 40}"}, "environment_id": "builtin/arith@main", "lora_rank": 4}, "compute": {},
    }
    assert fields["base_model"] == "base@main"  # a copy: the attempt's own record stays as it trained
