"""TRL's config fields as the web process knows them (training/methods/trl_fields.json, read without
importing TRL): the snapshot matches the installed TRL, and create checks a TRL field's value by its type."""
from __future__ import annotations

import json
import typing
from enum import Enum
from typing import Literal

import pytest

from tests.conftest import assert_error, sft_body
from training.methods import trl_snapshot


def test_the_snapshot_is_the_installed_trls():
    assert json.loads(trl_snapshot.FILE.read_text()) == trl_snapshot.snapshot(), "run: python -m training.methods.trl_snapshot"


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize("annotation, choices, expected", [
    (int, None, {"kind": "int", "nullable": False}),
    (float | None, None, {"kind": "number", "nullable": True}),
    (typing.Optional[bool], None, {"kind": "bool", "nullable": True}),  # noqa: UP045 - the spelling older TRL uses
    (Colour | str, None, {"kind": "choice", "nullable": False, "choices": ["red", "blue"]}),
    (Literal["a", "b"] | None, None, {"kind": "choice", "nullable": True, "choices": ["a", "b"]}),
    (str, ["keep_end", "keep_start"], {"kind": "choice", "nullable": False, "choices": ["keep_end", "keep_start"]}),
    (str, ["A", "b"], {"kind": "str", "nullable": False}),  # choices compare in lower case: mixed case stays a string
    (dict | str | None, None, {"kind": "any", "nullable": True}),
    (list[str], None, {"kind": "any", "nullable": False}),
])
def test_field_types(annotation, choices, expected):
    assert trl_snapshot.field_type(annotation, choices) == expected


@pytest.mark.parametrize("key, value, says", [
    ("lr_scheduler_type", 5, "must be one of linear, cosine,"),
    ("lr_scheduler_type", "bogus", "must be one of linear, cosine,"),
    ("optim", "nope", "must be one of adamw_torch, adamw_torch_fused,"),
    ("logging_first_step", "yes", "must be true or false"),
    ("save_total_limit", 2**63, "must be at most 2147483647"),
    ("weight_decay", "0.1", "must be a number"),
    ("dataset_text_field", 3, "must be a string"),
    ("optim", None, "must not be null"),
    # ranges the trainer refuses only after the job started
    ("warmup_steps", -1, "must be at least 0"),
    ("dataloader_num_workers", -1, "must be at least 0"),
    ("adam_beta1", 2, "must be at most 1"),
    # settings that need an evaluation split, which the Studio does not have
    ("eval_strategy", "steps", "needs an evaluation split"),
    ("lr_scheduler_type", "reduce_lr_on_plateau", "needs an evaluation split"),
    ("load_best_model_at_end", True, "needs an evaluation split"),
    # precision is the Studio's key (fp16 with the device's bf16 made the trainer refuse both)
    ("fp16", True, "use precision instead"),
    ("bf16", True, "use precision instead"),
])
def test_a_trl_field_of_the_wrong_type_is_a_400_naming_it_and_stores_nothing(api, key, value, says):
    from training.models import TrainingRun

    body = assert_error(api.post("/api/training-runs", sft_body(config={"max_steps": 2, key: value})), 400, f"config.{key}")
    assert says in next(e["message"] for e in body["errors"] if e["field"] == f"config.{key}")
    assert not TrainingRun.objects.exists()


def test_a_right_trl_field_is_kept_as_written_and_a_choice_in_lower_case(api):
    r = api.post("/api/training-runs", sft_body(config={"max_steps": 2, "lr_scheduler_type": "Cosine", "warmup_steps": 3, "weight_decay": 0, "packing_strategy": "bfd"}))
    assert r.status_code == 201, r.content
    config = r.json()["config"]
    assert (config["lr_scheduler_type"], config["warmup_steps"], config["weight_decay"], config["packing_strategy"]) == ("cosine", 3, 0, "bfd")


def test_the_patchable_templates_are_the_installed_trls():
    assert json.loads(trl_snapshot.TEMPLATES_FILE.read_text()) == trl_snapshot.patchable_templates(), "run: python -m training.methods.trl_snapshot"
