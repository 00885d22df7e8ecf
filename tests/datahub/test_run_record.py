"""What a run's branch and its published model hold beside the weights (datahub.run_record): each
checkpoint's commit carries metrics.jsonl, (GRPO) rollouts.jsonl and training_config.json as of its
step, so a run stopped after a step has them on its branch; the published model's card names every
input with its pinned commit and the settings, and writes `base_model:` only as a repo id."""

from __future__ import annotations

import itertools
import json

import pytest

from datahub import commits, refs, repos, run_record, storage
from datahub import services as hub
from datahub.models import Commit, Repo, blob_path
from studio import crypto
from tests.conftest import sft_body
from tests.datahub.conftest import jsonl
from training import services as training
from training.backends.local import run_dir
from training.methods import get_method
from training.models import Checkpoint, TrainingRun


def read(repo: Repo, ref: str, path: str) -> str:
    blob = repos.tree(repos.resolve(repo, ref))[path]
    with storage.open_blob(blob_path(blob.sha256)) as fh:
        return fh.read().decode()


def saved(run: TrainingRun, step: int, kind: str = "checkpoint") -> str:
    folder = run_dir(run.pk, 1) / "output" / (f"checkpoint-{step}" if kind == "checkpoint" else kind)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(f"weights {kind} {step}".encode())
    return str(folder)


@pytest.fixture
def ingest(api, run_token, django_capture_on_commit_callbacks, eager_celery):
    """POST one ingest batch as the engine does; its checkpoints' commit tasks run when it commits."""
    batch_ids = itertools.count(1)

    def send(run_id: int, **batch):
        with django_capture_on_commit_callbacks(execute=True):
            r = api.client.post(
                f"/api/ingest/runs/{run_id}",
                data={"batch_id": f"b{next(batch_ids)}", **batch},
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {run_token}",
            )
        assert r.status_code == 200, r.content

    return send


@pytest.fixture
def run_token(settings, tmp_path):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    return "ing_record"


def started(api, body: dict, token: str = "ing_record") -> TrainingRun:
    run_id = api.post("/api/training-runs", body).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(ingest_token_hash=crypto.hash_token(token), attempt=1, status="running")
    return TrainingRun.objects.get(pk=run_id)


def branch_head(run: TrainingRun) -> str:
    return f"run-{run.pk}"


def test_a_stopped_runs_step_commit_carries_its_metrics_up_to_that_step(api, project, ingest):
    # QA: a run stopped at step 6 had checkpoints/step-4 on its branch but no metrics.jsonl: it came
    # only with the final (or adapter) checkpoint, which a stopped or failed run never reports.
    run = started(api, sft_body(config={"max_steps": 10, "save_steps": 4, "learning_rate": 1e-4}))
    metrics = [{"step": s, "key": "loss", "value": 3.0 - s / 10} for s in range(1, 7)]
    ingest(run.pk, metrics=metrics, checkpoints=[{"step": 4, "path": saved(run, 4)}])
    TrainingRun.objects.filter(pk=run.pk).update(status="cancelled")  # STOP at step 6: no final checkpoint comes

    repo = hub.run_repo(run)
    files = repos.tree(repos.resolve(repo, branch_head(run)))
    assert {"checkpoints/step-4/model.safetensors", "metrics.jsonl", "training_config.json"} <= set(files)
    rows = [json.loads(line) for line in read(repo, branch_head(run), "metrics.jsonl").splitlines()]
    assert [(r["key"], r["step"]) for r in rows] == [("loss", s) for s in range(1, 5)]  # as of step 4, not step 6's
    config = json.loads(read(repo, branch_head(run), "training_config.json"))
    assert config["studio_run_id"] == run.pk and config["method"] == "sft" and config["step"] == 4
    assert config["config"]["learning_rate"] == 1e-4 and config["base_model"] == {"ref": "org/base", "kind": "hf"}
    assert "rollouts.jsonl" not in files  # an SFT run has none


def test_a_grpo_runs_rollouts_are_committed_with_each_checkpoint_up_to_a_size_cap(api, project, ingest, monkeypatch):
    # QA: GRPO rollouts were never on the branch and had no download.
    run = started(
        api,
        {
            "name": "grpo run",
            "method": "grpo",
            "base_model": "org/base",
            "config": {"environment_id": "builtin/arith@main", "max_steps": 6, "rollouts_per_prompt": 2, "max_response_length": 8},
        },
    )
    rollouts = [
        {"step": s, "prompt": f"{s}+{s}=", "completion": str(2 * s + i), "reward": float(i == 0), "advantage": 0.5 - i} for s in (1, 2, 3) for i in (0, 1)
    ]
    ingest(run.pk, rollouts=rollouts, checkpoints=[{"step": 2, "path": saved(run, 2)}])
    repo = hub.run_repo(run)
    rows = [json.loads(line) for line in read(repo, branch_head(run), "rollouts.jsonl").splitlines()]
    assert [(r["step"], r["completion"]) for r in rows] == [(1, "2"), (1, "3"), (2, "4"), (2, "5")]  # step 3's came after the checkpoint
    assert rows[0] == {"step": 1, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "components": {}}

    # Past the cap, the file holds the first rollouts that fit and the commit message says how many of how many.
    monkeypatch.setattr(run_record, "ROLLOUTS_FILE_BYTES", len(json.dumps(rows[0])) * 3)
    ingest(run.pk, checkpoints=[{"step": 3, "path": saved(run, 3)}])
    assert len(read(repo, branch_head(run), "rollouts.jsonl").splitlines()) == 2
    head = repos.resolve(repo, branch_head(run))
    assert "rollouts.jsonl holds the first 2 of the 6 rollouts up to step 3" in Commit.objects.get(pk=head.pk).message


def test_a_merge_of_an_earlier_step_leaves_the_heads_newer_metrics(api, project, ingest):
    run = started(api, sft_body(config={"max_steps": 4, "save_steps": 2, "lora_rank": 8}))
    ingest(
        run.pk,
        metrics=[{"step": s, "key": "loss", "value": 1.0} for s in (1, 2, 3, 4)],
        checkpoints=[{"step": 2, "path": saved(run, 2)}, {"step": 4, "path": saved(run, 4)}],
    )
    merged = Checkpoint.objects.create(run=run, attempt=1, step=2, kind="merged", path=saved(run, 2, "merged-step-2"), requested=True)
    hub.commit_checkpoint(merged.pk)
    repo = hub.run_repo(run)
    assert "checkpoints/step-2/merged/model.safetensors" in repos.tree(repos.resolve(repo, branch_head(run)))
    assert len(read(repo, branch_head(run), "metrics.jsonl").splitlines()) == 4


@pytest.fixture
def hub_inputs(project):
    student = repos.create_repo(project, "demo-student", "model")
    commits.commit_files(student, "main", {"config.json": b'{"model_type": "llama"}'}, "student weights")
    data = repos.create_repo(project, "chat-data", "dataset")
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    commits.commit_files(data, "main", {"train.jsonl": jsonl(rows)}, "data")
    return student, data


def trained(run: TrainingRun) -> TrainingRun:
    """The run claimed as START would (its refs pinned, its attempt recorded) and completed."""
    TrainingRun.objects.filter(pk=run.pk).update(pinned=refs.pin_refs(run), attempt=1, status="completed")
    run.refresh_from_db()
    training.record_attempt(run)
    return run


def published(run: TrainingRun, kind: str = "final", step: int = 3) -> tuple[Repo, str, dict]:
    """The run trained, its final weights reported at `step` and committed: the model repo it
    published, its card and its training_config.json."""
    run = trained(run)
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=step, kind=kind, path=saved(run, step, kind))
    hub.commit_checkpoint(checkpoint.pk)
    repo = Repo.objects.get(project=run.project, name=hub.model_repo_name(run))
    return repo, read(repo, "main", "README.md"), json.loads(read(repo, "main", "training_config.json"))


def hub_run(project, owner, name: str, method: str, config: dict) -> TrainingRun:
    """A run of `method` on hub_inputs' student and chat data."""
    return training.create_run(
        project, owner, name=name, method=method, base_model="demo-student@main", dataset=[{"ref": "chat-data@main", "type": "chat"}], config=config
    )


def test_the_model_card_names_pinned_inputs_teacher_and_settings(project, users, hub_inputs, settings, tmp_path):
    # QA: the card named base, method and datasets only, and its front matter said
    # `base_model: demo-student@main`, which no Hub reads as a repo id.
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    student, data = hub_inputs
    config = {"distillation": {"teacher_model": "org/teacher"}, "learning_rate": 3e-5, "max_steps": 3, "per_device_train_batch_size": 2, "lora_rank": 8}
    run = hub_run(project, users["owner"], "Distilled", "distill", config)
    repo, card, config = published(run, "merged")
    student_commit, data_commit = repos.resolve(student, "main").pk, repos.resolve(data, "main").pk
    front = card.split("---")[1]
    assert "base_model: acme/demo-student\n" in front and "/hub" in front and "demo-student@main" not in front
    assert f"demo-student@main (pinned acme/demo-student@{student_commit[:12]})" in card
    assert f"chat-data@main (pinned acme/chat-data@{data_commit[:12]})" in card
    assert "**Teacher:** org/teacher (Hugging Face id, not pinned)" in card
    for line in ("- learning_rate: 3e-05", "- max_steps: 3", "- per_device_train_batch_size: 2", "- LoRA: rank 8, alpha 8", "- steps trained: 3"):
        assert line in card
    assert config["base_model"] == {"ref": "demo-student@main", "kind": "data_hub", "repo": "acme/demo-student", "commit": student_commit}
    assert config["datasets"] == [{"ref": "chat-data@main", "kind": "data_hub", "repo": "acme/chat-data", "commit": data_commit, "type": "chat"}]
    assert config["teacher_model"] == {"ref": "org/teacher", "kind": "hf"} and config["config"]["learning_rate"] == 3e-5
    assert config["studio_run_url"].endswith(f"/training/runs/{run.pk}/") and config["weights"] == "merged"


def test_a_grpo_cards_names_its_environment_and_a_local_base_is_not_front_matter(project, users, settings, tmp_path):
    # QA: a GRPO card said "Datasets: none" and `base_model: /tmp/.../tiny-student`.
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    base = tmp_path / "models" / "tiny-student"
    base.mkdir(parents=True)
    settings.STUDIO_LOCAL_ROOTS = [tmp_path.resolve()]
    run = training.create_run(
        project,
        users["owner"],
        name="Arith",
        method="grpo",
        base_model=str(base),
        config={"environment_id": "builtin/arith@main", "max_steps": 3, "rollouts_per_prompt": 2, "max_response_length": 8},
    )
    _, card, config = published(run)
    front = card.split("---")[1]
    assert "base_model" not in front
    assert f"**Base model:** {base} (local path, not versioned)" in card
    assert "**Environment (rewards and prompts):** builtin/arith@main (built in, not versioned)" in card and "Datasets" not in card
    assert "- rollouts_per_prompt: 2" in card and "- LoRA: none (full fine-tune)" in card
    # QA: it listed `num_epochs: 1`, which create stores on every GRPO run, as if it had been set.
    shown = settings_of(card)
    for line in ("- num_epochs: 1 (default)", "- kl_coef: 0.0 (default)", "- max_response_length: 8", '- environment_id: "builtin/arith@main"'):
        assert line in shown, shown
    assert config["environment"] == {"ref": "builtin/arith@main", "kind": "builtin"} and config["base_model"] == {"ref": str(base), "kind": "local_path"}


def settings_of(card: str) -> list[str]:
    return card.split("## Training settings\n\n")[1].split("\n- LoRA:")[0].splitlines()


@pytest.mark.parametrize(
    ("method", "config", "listed"),
    [
        (
            "dpo",
            {"loss": {"type": "dpo", "dpo_beta": 0.2}, "lora_rank": 8, "save_steps": 2, "max_steps": 3},
            ["- loss.dpo_beta: 0.2", '- loss.type: "dpo"', "- max_steps: 3", "- per_device_train_batch_size: 2 (default)", "- save_steps: 2"],
        ),
        (
            "distill",
            {"distillation": {"teacher_model": "org/teacher", "top_k": 16, "kd_weight": 0.7, "temperature": 2.0}, "max_steps": 3},
            [
                "- distillation.ce_weight: 0.3 (default)",
                "- distillation.kd_weight: 0.7",
                '- distillation.teacher_model: "org/teacher"',
                "- distillation.temperature: 2.0",
                "- distillation.top_k: 16",
                "- max_steps: 3",
            ],
        ),
    ],
)
def test_the_model_card_lists_every_setting_the_run_stored_by_dotted_key(project, users, hub_inputs, settings, tmp_path, method, config, listed):
    # QA: the card listed a fixed few keys and said "Settings not listed were the engine's defaults", so
    # save_steps, DPO's loss block and DISTILL's top_k, kd_weight and temperature were missing.
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run = hub_run(project, users["owner"], f"All {method}", method, config)
    _, card, record = published(run)
    shown = settings_of(card)
    assert all(line in shown for line in listed), shown
    assert shown == sorted(shown) and len(shown) == len(get_method(method).settings(run.config)), shown  # every stored key, by key
    assert "Settings not listed were the engine's defaults" not in card and "a setting not listed was the trainer's own default" in card
    assert record["config"] == run.config


def test_a_resumed_runs_card_says_which_steps_it_trained_and_what_it_resumed(api, project, users, hub_inputs, settings, tmp_path):
    # QA: a run resumed from step 4 of another that trained steps 5-8 said "steps trained: 8".
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    parent = trained(hub_run(project, users["owner"], "Parent", "sft", {"max_steps": 4}))
    Checkpoint.objects.create(run=parent, attempt=1, step=4, kind="checkpoint", path=saved(parent, 4))
    child_id = api.post(f"/api/training-runs/{parent.pk}/checkpoints/4/resume", {}).json()["id"]
    _, card, record = published(TrainingRun.objects.get(pk=child_id), step=8)
    assert f"- trained to step 8 (steps 5–8 in this run, resumed from run #{parent.pk} step 4)" in card, card
    assert "steps trained" not in card
    assert record["resumed_from"] == {"run": parent.pk, "step": 4} and record["step"] == 8
