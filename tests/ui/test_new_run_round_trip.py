"""New run like this, submitted unchanged, makes a run with exactly the original's settings: one run per
method, created through the API with a value other than the default in every field NEW RUN shows, and
datasets whose entries differ in type (the form's single Dataset type cannot show them)."""
from __future__ import annotations

import pytest

from tests.ui.test_new_run_like_this import posted_form, settings_of
from tests.ui.test_pages import client_for
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

COMPUTE = {"backend": "dstack", "accelerators": "H100:1", "spot": True, "region": "eu-west-1"}
EPOCHS = {"num_epochs": 2.5, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 3}
COMMON = {"max_steps": 7, "learning_rate": 3e-5, "precision": "bf16", "use_liger": True, "gradient_checkpointing": False}
RUNS = {
    "sft": {"dataset": [{"ref": "chats@main", "type": "chat"}, {"ref": "texts@v2", "type": "text"}, "more-chats@main"],
            "config": {**COMMON, **EPOCHS, "packing": False, "lora_rank": 8, "warmup_steps": 2}},
    "dpo": {"dataset": [{"ref": "prefs@main", "type": "preference"}, {"ref": "more-prefs@main"}],
            "config": {**COMMON, **EPOCHS, "lora_rank": 8, "loss": {"type": "dpo", "dpo_beta": 0.3, "reference_free": True, "target_margin": 0.5,
                                                                     "length_norm": True, "span_mask": False}}},
    "grpo": {"dataset": [{"ref": "prompts@main", "type": "prompts"}],
             "config": {**COMMON, "rl_mode": "environment", "environment_id": "builtin/arith@main", "inference_blocks": 1, "trainer_blocks": 1,
                        "rollouts_per_prompt": 4, "kl_coef": 0.05, "max_response_length": 64, "rollout_engine": "generate"}},
    "grpo-ruler": {"dataset": None,
                   "config": {**COMMON, "rl_mode": "ruler", "ruler_task_args": {"dataset": "questions@main", "system_prompt": "Score helpfulness."},
                              "judge": {"mode": "external", "endpoint": "https://judge.example.com/v1", "model": "judge-7b", "api_key_secret": "JUDGE_KEY"},
                              "judge_blocks": 1, "inference_blocks": 1, "trainer_blocks": 1, "rollouts_per_prompt": 4, "kl_coef": 0.05, "max_response_length": 64}},
    "distill": {"dataset": {"ref": "chats@main"},
                "config": {**COMMON, **EPOCHS, "packing": True, "lora_rank": 16,
                           "distillation": {"teacher_model": "org/teacher-8B", "top_k": 32, "temperature": 2.0, "kd_weight": 0.7, "ce_weight": 0.2}}},
}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_new_run_like_this_submitted_unchanged_copies_every_setting(api, project, users, kind):
    body = {"name": f"{kind} original", "method": kind.split("-")[0], "base_model": "org/base", "compute": COMPUTE, **RUNS[kind]}
    created = api.post("/api/training-runs", body)
    assert created.status_code == 201, created.content.decode()
    run = TrainingRun.objects.get(pk=created.json()["id"])
    client = client_for(users["owner"])
    response = client.post("/training/new/", posted_form(client.get(f"/training/runs/{run.pk}/like/").content.decode()))
    assert response.status_code == 302, response.content.decode()[:3000]
    copy = TrainingRun.objects.exclude(pk=run.pk).get(project=project)
    assert copy.name == f"{kind} original (2)"
    assert settings_of(copy) == settings_of(run)


def test_a_copy_shows_the_entries_its_dataset_fields_cannot_and_changed_fields_replace_them(api, project, users):
    body = {"name": "mixed", "method": "sft", "base_model": "org/base", **RUNS["sft"]}
    run = TrainingRun.objects.get(pk=api.post("/api/training-runs", body).json()["id"])
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/like/").content.decode()
    note = html.split('data-testid="dataset-kept">', 1)[1].split("</p>", 1)[0]
    assert "chats@main (chat), texts@v2 (text), more-chats@main (type not set)" in note
    form = posted_form(html)
    assert (form["dataset"], form["dataset_type"]) == ("chats@main, texts@v2, more-chats@main", "")
    # The type chosen for all of them: the fields say what the copy trains on.
    assert client.post("/training/new/", {**form, "name": "all chat", "dataset_type": "chat"}).status_code == 302
    assert TrainingRun.objects.get(name="all chat").dataset == [{"ref": ref, "type": "chat"} for ref in ("chats@main", "texts@v2", "more-chats@main")]
    # A kept value that is not a dataset (not one this page wrote): the fields, which the user sees, win.
    assert client.post("/training/new/", {**form, "name": "refs only", "dataset_kept": '[{"type": "chat"'}).status_code == 302
    assert TrainingRun.objects.get(name="refs only").dataset == ["chats@main", "texts@v2", "more-chats@main"]
