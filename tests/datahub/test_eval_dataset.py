"""Held-out evaluation, the Studio's side: config.eval_dataset is checked row by row and pinned at START
like `dataset`, and reaches the engine's spec at its commit; the eval keys are refused where the run
could not evaluate: at create (400) whatever the rows, at START (422) where the rows decide."""

from __future__ import annotations

import pytest

from datahub import commits, repos
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training import services
from training.engine.data import split_advice
from training.models import TrainingRun

CHAT = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]} for i in range(8)]
DPO = {"method": "dpo", "dataset": "prefs@main", "config": {"loss": {"type": "dpo"}, "lora_rank": 8}}


@pytest.fixture
def chat_data(project):
    repo = repos.create_repo(project, "chat-data", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(CHAT)}, "data")
    return repo


PAIR = {"prompt": "q", "chosen": "a", "rejected": "b"}


@pytest.fixture
def prefs(project):
    repo = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl([PAIR] * 4)}, "pairs")
    return repo


@pytest.fixture
def held(project):
    repo = repos.create_repo(project, "held", "dataset")
    commits.commit_files(repo, "main", {"rows.jsonl": jsonl(CHAT[:3])}, "eval rows")
    return repo


def create(api, **overrides) -> int:
    r = api.post("/api/training-runs", sft_body(**{"dataset": "chat-data@main", **overrides}))
    assert r.status_code == 201, r.content
    return r.json()["id"]


def start(api, run_id: int):
    return api.post(f"/api/training-runs/{run_id}/start")


def test_the_eval_dataset_is_pinned_at_start_and_reaches_the_engine_at_its_commit(api, chat_data, held):
    run_id = create(api, config={"eval_dataset": "held@main", "eval_steps": 5})
    assert start(api, run_id).status_code == 202
    run = TrainingRun.objects.get(pk=run_id)
    head = repos.resolve(held, "main").pk
    assert run.pinned["config.eval_dataset"] == {"ref": "held@main", "commit": head, "repo": "acme/held"}
    spec = services.job_spec(run, "ing_abc").as_engine_spec()
    assert spec["eval_dataset"] == [{"path": "acme/held", "type": None, "revision": head, "data_hub": True}]
    commits.commit_files(held, "main", {"more.jsonl": jsonl(CHAT)}, "moved on")  # the run keeps the rows it started with
    assert services.job_spec(TrainingRun.objects.get(pk=run_id), "ing_abc").as_engine_spec()["eval_dataset"][0]["revision"] == head


def test_a_list_of_eval_datasets_is_pinned_entry_by_entry(api, chat_data, held):
    run_id = create(api, config={"eval_dataset": ["held@main", {"ref": "chat-data@main", "type": "chat"}]})
    assert start(api, run_id).status_code == 202
    spec = services.job_spec(TrainingRun.objects.get(pk=run_id), "ing_abc").as_engine_spec()
    assert [(e["path"], e["type"]) for e in spec["eval_dataset"]] == [("acme/held", None), ("acme/chat-data", "chat")]


def test_an_eval_dataset_row_error_names_the_field_the_row_and_the_field_of_the_row(api, project, prefs):
    bad = repos.create_repo(project, "bad-held", "dataset")
    commits.commit_files(bad, "main", {"rows.jsonl": jsonl([PAIR, {**PAIR, "chosen": ""}])})
    run_id = create(api, **{**DPO, "config": {**DPO["config"], "eval_dataset": "bad-held@main"}})
    err = assert_error(start(api, run_id), 422, "config.eval_dataset")
    assert {"field": "config.eval_dataset", "message": 'rows.jsonl row 2: "chosen" is empty'} in err["errors"], err


def test_a_dpo_runs_eval_dataset_is_checked_as_preference_rows(api, chat_data, prefs):
    run_id = create(api, **{**DPO, "config": {**DPO["config"], "eval_dataset": "chat-data@main"}})
    err = assert_error(start(api, run_id), 422, "config.eval_dataset")
    assert any("prompt/chosen/rejected" in e["message"] for e in err["errors"] if e["field"] == "config.eval_dataset"), err


def test_an_unknown_eval_dataset_ref_is_422_naming_it(api, chat_data):
    run_id = create(api, config={"eval_dataset": "nope@main"})
    err = assert_error(start(api, run_id), 422, "config.eval_dataset")
    assert [e["field"] for e in err["errors"]] == ["config.eval_dataset"], err


def test_eval_split_and_eval_dataset_together_are_400_at_create_and_422_for_a_run_stored_so(api, chat_data, held):
    # They were a 201 at create, and refused only at START.
    both = {"eval_dataset": "held@main", "eval_split": 0.25}
    err = assert_error(api.post("/api/training-runs", sft_body(dataset="chat-data@main", config=both)), 400)
    assert {e["field"] for e in err["errors"]} == {"config.eval_split", "config.eval_dataset"}, err
    assert "not both" in err["errors"][0]["message"]
    run_id = create(api, config={"eval_split": 0.25})
    TrainingRun.objects.filter(pk=run_id).update(config={**TrainingRun.objects.get(pk=run_id).config, **both})  # stored before the rule
    err = assert_error(start(api, run_id), 422)
    assert {e["field"] for e in err["errors"]} == {"config.eval_split", "config.eval_dataset"}, err


@pytest.mark.parametrize("key, value", [("eval_steps", 2), ("per_device_eval_batch_size", 2)])
def test_an_eval_setting_without_eval_rows_is_refused_at_create(api, chat_data, key, value):
    # It was taken, and the run trained to its end evaluating nothing, without a word.
    err = assert_error(api.post("/api/training-runs", sft_body(dataset="chat-data@main", config={key: value})), 400, f"config.{key}")
    assert err["errors"][0]["message"] == (f"{key} sets how the run evaluates held-out rows, and it has none: add eval_split (e.g. 0.1) "
                                           "or an eval_dataset, or remove it")
    assert create(api, config={key: value, "eval_split": 0.25})


def test_the_smallest_eval_split_advised_holds_out_a_row():
    # 1/64 was said as 0.0156, which holds out no row of 64 either: the advice is rounded up now.
    assert split_advice(64) == "set eval_split to at least 0.0157, or give an eval_dataset"
    assert split_advice(1) == "1 row is too few to hold any out: give an eval_dataset"
    for rows in range(2, 20000):
        advised = float(split_advice(rows).split("at least ")[1].split(",")[0])
        assert int(rows * advised) >= 1 and advised <= 0.5, rows


def test_an_eval_split_that_holds_out_no_row_is_422_with_the_row_count(api, chat_data):
    run_id = create(api, config={"eval_split": 0.1})  # 8 rows: 0.8 of a row
    err = assert_error(start(api, run_id), 422, "config.eval_split")
    assert "0.1 of the dataset's 8 rows holds out no row: set eval_split to at least 0.125" in err["errors"][0]["message"], err
    fine = create(api, config={"eval_split": 0.125})
    assert start(api, fine).status_code == 202


@pytest.mark.parametrize(
    ("method", "extra", "says"),
    [
        ("grpo", {"dataset": None, "config": {"environment_id": "builtin/arith@main", "eval_split": 0.1}}, "GRPO learns from rewards on its own rollouts"),
        ("grpo", {"dataset": None, "config": {"environment_id": "builtin/arith@main", "eval_steps": 10}}, "GRPO learns from rewards on its own rollouts"),
        ("distill", {"config": {"distillation": {"teacher_model": "org/teacher"}, "eval_dataset": "chat-data@main"}}, "DISTILL has no held-out evaluation yet"),
    ],
)
def test_eval_keys_on_a_method_without_evaluation_are_400_at_create_saying_what_instead(api, chat_data, method, extra, says):
    # They were a 201 at create, and refused only at START.
    r = api.post("/api/training-runs", sft_body(**{"dataset": "chat-data@main", "method": method, **extra}))
    key = next(k for k in ("eval_split", "eval_steps", "eval_dataset") if k in extra["config"])
    err = assert_error(r, 400, f"config.{key}")
    assert any(says in e["message"] for e in err["errors"] if e["field"] == f"config.{key}"), err


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"eval_split": 0.6}, "config.eval_split", "must be at most 0.5"),
        ({"eval_split": 0}, "config.eval_split", "must be greater than 0"),
        ({"eval_split": -0.1}, "config.eval_split", "must be greater than 0"),
        ({"eval_split": "10%"}, "config.eval_split", "a fraction of the training rows"),
        ({"eval_steps": 0}, "config.eval_steps", "must be at least 1"),
        ({"per_device_eval_batch_size": 0}, "config.per_device_eval_batch_size", "must be at least 1"),
        ({"eval_dataset": "bad ref!"}, "config.eval_dataset", "is not an HF id"),
        ({"eval_dataset": []}, "config.eval_dataset", "give at least one dataset, or leave eval_dataset out"),
        ({"eval_dataset": [{"ref": "held@main", "split": "test"}]}, "config.eval_dataset[0].split", "unknown key"),
    ],
)
def test_bad_eval_values_are_refused_at_create_naming_the_field(api, config, field, says):
    err = assert_error(api.post("/api/training-runs", sft_body(config=config)), 400, field)
    assert any(says in e["message"] for e in err["errors"] if e["field"] == field), err


def test_a_dpo_eval_batch_counts_rows_and_must_be_even(api, prefs, held):
    # The config alone decides it: a 400 at create (it was taken, then refused by START).
    body = sft_body(**{"dataset": "chat-data@main", **DPO, "config": {**DPO["config"], "eval_split": 0.25, "per_device_eval_batch_size": 3}})
    err = assert_error(api.post("/api/training-runs", body), 400, "config.per_device_eval_batch_size")
    assert "the batch must be even: use 4 or 2" in err["errors"][0]["message"], err
