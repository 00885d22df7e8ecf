"""An environment's CONFIG against what its package declares (CONFIG_TYPES, REWARD_COMPONENTS in
__init__.py): PUT …/config, Fork, the package check and START refuse what would fail or silently
mis-weigh the run."""
from __future__ import annotations

import pytest

from datahub.commits import commit_files
from datahub.models import Repo, RepoType
from datahub.repos import create_repo
from environments import services
from environments.declarations import declared_config_findings, reward_components
from tests.conftest import assert_error
from tests.environments.conftest import CATALOGUE
from training.engine.packages import load_package

QA_CONFIG = {"weights": {"format": 0.2, "exact": 0.8}, "max_examples": "ten"}
QA_FIELDS = {"config.max_examples", "config.weights.exact", "config.weights.correct", "config.weights.close"}


def fields(body: dict) -> set[str]:
    return {e["field"] for e in body["errors"]}


def test_a_config_put_with_a_mistyped_optional_key_or_foreign_weights_is_400_and_changes_nothing(api, project):
    # It was a 200, /check said findings [], and the GRPO run then failed as it loaded the package
    # ("slice indices must be integers"); "exact" was weighed by nothing and "correct" and "close" by 0.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths"})
    before = api.get("/api/environments/gsm-maths/config").json()
    body = assert_error(api.put("/api/environments/gsm-maths/config", {"config": {**before["config"], **QA_CONFIG}}), 400)
    assert fields(body) == QA_FIELDS
    messages = {e["field"]: e["message"] for e in body["errors"]}
    assert messages["config.max_examples"] == "must be a whole number or null, as the environment declares (CONFIG_TYPES in __init__.py); got 'ten'"
    assert messages["config.weights.exact"].startswith("'exact' is not a reward component of this environment")
    assert "weigh only correct, close, format" in messages["config.weights.exact"]
    assert "give it one (0 leaves it out on purpose)" in messages["config.weights.correct"]
    after = api.get("/api/environments/gsm-maths/config").json()
    assert after["commit"] == before["commit"] and after["config"] == before["config"]


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"max_examples": 2.5}, "config.max_examples", "must be a whole number or null"),
    ({"max_examples": True}, "config.max_examples", "must be a whole number or null"),
    ({"weights": {"correct": 0.7, "close": 0.2, "format": None}}, "config.weights.format", "must be a number"),
    ({"answer_marker": None}, "config.answer_marker", "must be a string"),
])
def test_a_config_put_breaking_a_declared_type_is_400_naming_the_key(api, project, change, field, says):
    api.post("/api/environments/fork", {"catalogue": "gsm-maths"})
    config = api.get("/api/environments/gsm-maths/config").json()["config"]
    body = assert_error(api.put("/api/environments/gsm-maths/config", {"config": {**config, **change}}), 400, field)
    assert says in body["errors"][0]["message"], body


def test_the_check_and_start_report_a_committed_config_that_breaks_the_declarations(api, project):
    # config.py written by a Data Hub commit never passes the PUT's checks.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths"})
    config = api.get("/api/environments/gsm-maths/config").json()["config"]
    commit_files(Repo.objects.get(project=project, name="gsm-maths"), "main", {"config.py": services.render_config({**config, **QA_CONFIG}).encode()})
    check = api.get("/api/environments/gsm-maths/check").json()["findings"]
    assert {f["field"] for f in check} == QA_FIELDS
    body = {"name": "env", "method": "grpo", "base_model": "org/base", "config": {"environment_id": "gsm-maths@main"}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    refused = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    messages = [e["message"] for e in refused["errors"] if e["field"] == "config.environment_id"]
    assert "CONFIG.max_examples: must be a whole number or null, as the environment declares (CONFIG_TYPES in __init__.py); got 'ten'" in messages
    assert any(m.startswith("CONFIG.weights.exact: 'exact' is not a reward component") for m in messages), messages
    assert api.get(f"/api/training-runs/{run_id}").json()["status"] == "queued"


def test_a_fork_refuses_a_weight_for_no_component_and_a_mistyped_optional_key(api, project):
    error = assert_error(api.post("/api/environments/fork", {"catalogue": "calculator", "config": {"weights": {"exact": 1.0}}}), 400, "config.weights.exact")
    assert "weigh only correct, tool_use, format" in error["errors"][0]["message"]
    assert_error(api.post("/api/environments/fork", {"catalogue": "science-qa", "config": {"max_examples": "ten"}}), 400, "config.max_examples")
    assert_error(api.post("/api/environments/fork", {"catalogue": "calculator", "config": {"max_tool_calls": 2.5}}), 400, "config.max_tool_calls")
    assert not Repo.objects.filter(project=project).exists()
    # Merged member by member, one weight changed keeps the others: fine.
    assert api.post("/api/environments/fork", {"catalogue": "calculator", "config": {"weights": {"correct": 0.5}, "max_examples": 4}}).status_code == 201


@pytest.mark.parametrize("name", ["calculator", "gsm_maths", "multiple_choice", "science_qa"])
def test_each_catalogue_package_declares_the_components_its_score_returns(name):
    files = services.package_files_from_dir(CATALOGUE / name)
    init = services.parsed_init(files)
    env = load_package(CATALOGUE / name, f"builtin/{name}@main", {})
    row = env.prompts(1, seed=0)[0]
    assert set(env.score(row, "Answer: 4\n#### 4")) - {"total"} == set(reward_components(init))
    assert set(services.read_config(files)["weights"]) == set(reward_components(init))
    assert declared_config_findings(init, services.read_config(files)) == []


def test_what_the_check_refuses_is_what_failed_the_run_as_it_loaded():
    with pytest.raises(TypeError, match="slice indices must be integers"):
        load_package(CATALOGUE / "gsm_maths", "builtin/gsm_maths@main", {"max_examples": "ten"})


def test_a_package_without_declarations_is_checked_as_before_and_a_malformed_one_is_a_finding(api, project):
    repo = create_repo(project, "plain-env", RepoType.ENVIRONMENT)
    init = b"from .config import CONFIG\n\n\ndef load_environment(**kwargs):\n    cfg = {**CONFIG, **kwargs}\n    return cfg['weights'], cfg.get('limit')\n"
    commit_files(repo, "main", {"__init__.py": init, "config.py": b"CONFIG = {'weights': {'a': 1.0}, 'limit': None}\n"})
    # A None default takes any value, and weights any names: the package says nothing about them.
    assert api.put("/api/environments/plain-env/config", {"config": {"weights": {"b": 1.0}, "limit": "ten"}}).status_code == 200
    commit_files(repo, "main", {"__init__.py": init + b"CONFIG_TYPES = {'limit': 'int'}\nREWARD_COMPONENTS = 'a'\n"})
    check = api.get("/api/environments/plain-env/check").json()["findings"]
    messages = [f["message"] for f in check]
    assert any(m.startswith("__init__.py:7: CONFIG_TYPES must be a literal dict") for m in messages), messages
    assert any(m.startswith("__init__.py:8: REWARD_COMPONENTS must be a literal tuple") for m in messages), messages
    assert {f["field"] for f in check} == {"config.environment_id"}


# ---- ranges (CONFIG_RANGES) --------------------------------------------------------------------

@pytest.mark.parametrize(("catalogue", "change", "field", "says"), [
    # max_examples 0 trained on every row and -5 on all but the last five, without a word.
    ("gsm-maths", {"max_examples": 0}, "config.max_examples", "must be at least 1, as the environment declares (CONFIG_RANGES in __init__.py); got 0"),
    ("gsm-maths", {"max_examples": -5}, "config.max_examples", "must be at least 1, as the environment declares (CONFIG_RANGES in __init__.py); got -5"),
    ("gsm-maths", {"weights": {"correct": -0.7, "close": 0.2, "format": 0.1}}, "config.weights.correct", "must be at least 0"),
    ("multiple-choice", {"max_examples": 0}, "config.max_examples", "must be at least 1"),
    ("science-qa", {"max_words": 0}, "config.max_words", "must be at least 1"),
    ("calculator", {"max_tool_calls": 0}, "config.max_tool_calls", "must be at least 1"),
])
def test_a_config_put_out_of_a_declared_range_is_400_naming_the_key_and_its_range(api, project, catalogue, change, field, says):
    api.post("/api/environments/fork", {"catalogue": catalogue})
    before = api.get(f"/api/environments/{catalogue}/config").json()
    body = assert_error(api.put(f"/api/environments/{catalogue}/config", {"config": {**before["config"], **change}}), 400, field)
    assert fields(body) == {field}
    assert says in body["errors"][0]["message"], body
    assert api.get(f"/api/environments/{catalogue}/config").json()["commit"] == before["commit"]


def test_a_fork_out_of_range_is_400_and_makes_no_repo(api, project):
    body = assert_error(api.post("/api/environments/fork", {"catalogue": "gsm-maths", "config": {"max_examples": 0, "weights": {"format": -1}}}), 400)
    assert fields(body) == {"config.max_examples", "config.weights.format"}
    assert not Repo.objects.filter(project=project).exists()
    assert api.post("/api/environments/fork", {"catalogue": "gsm-maths", "config": {"max_examples": 1, "weights": {"format": 0}}}).status_code == 201


RANGED_INIT = b"""from .config import CONFIG

CONFIG_TYPES = {"keep_prob": "number", "weights": "object"}
CONFIG_RANGES = {"keep_prob": (0, 1), "temperature": (None, 2), "weights": (0, None)}


def load_environment(**kwargs):
    cfg = {**CONFIG, **kwargs}
    return cfg["keep_prob"], cfg["temperature"], cfg["weights"]
"""
RANGED_CONFIG = {"keep_prob": 0.5, "temperature": 1.0, "weights": {"a": 1.0}}


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"keep_prob": 1.5}, "config.keep_prob", "must be from 0 to 1, as the environment declares (CONFIG_RANGES in __init__.py); got 1.5"),
    ({"keep_prob": -0.1}, "config.keep_prob", "must be from 0 to 1"),
    ({"temperature": 2.5}, "config.temperature", "must be at most 2"),
    ({"weights": {"a": 1.0, "b": -2}}, "config.weights.b", "must be at least 0"),
])
def test_a_packages_own_ranges_bound_both_ends_and_each_weight(api, project, change, field, says):
    repo = create_repo(project, "ranged", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": RANGED_INIT, "config.py": services.render_config(RANGED_CONFIG).encode()})
    body = assert_error(api.put("/api/environments/ranged/config", {"config": {**RANGED_CONFIG, **change}}), 400, field)
    assert says in body["errors"][0]["message"], body
    # The bounds themselves are in range; a type error is said once, not again as a range.
    assert api.put("/api/environments/ranged/config", {"config": {**RANGED_CONFIG, "keep_prob": 1, "temperature": 2}}).status_code == 200
    wrong = assert_error(api.put("/api/environments/ranged/config", {"config": {**RANGED_CONFIG, "keep_prob": True}}), 400, "config.keep_prob")
    assert len(wrong["errors"]) == 1 and wrong["errors"][0]["message"].startswith("must be a number"), wrong


def test_the_check_and_start_report_a_committed_config_out_of_range(api, project):
    api.post("/api/environments/fork", {"catalogue": "gsm-maths"})
    config = api.get("/api/environments/gsm-maths/config").json()["config"]
    commit_files(Repo.objects.get(project=project, name="gsm-maths"), "main", {"config.py": services.render_config({**config, "max_examples": 0}).encode()})
    assert {f["field"] for f in api.get("/api/environments/gsm-maths/check").json()["findings"]} == {"config.max_examples"}
    body = {"name": "env", "method": "grpo", "base_model": "org/base", "config": {"environment_id": "gsm-maths@main"}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    refused = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    assert "CONFIG.max_examples: must be at least 1, as the environment declares (CONFIG_RANGES in __init__.py); got 0" in [e["message"] for e in refused["errors"]]
    assert api.get(f"/api/training-runs/{run_id}").json()["status"] == "queued"


def test_a_malformed_range_declaration_is_a_finding(api, project):
    repo = create_repo(project, "ranged", RepoType.ENVIRONMENT)
    init = RANGED_INIT.replace(b'"keep_prob": (0, 1)', b'"keep_prob": (1, 0)')
    commit_files(repo, "main", {"__init__.py": init, "config.py": services.render_config(RANGED_CONFIG).encode()})
    check = api.get("/api/environments/ranged/check").json()["findings"]
    assert [(f["field"], f["message"].split(" must ")[0]) for f in check] == [("config.environment_id", "__init__.py:4: CONFIG_RANGES")], check


# ---- forks made before the catalogue declared anything -----------------------------------------

DECLARED = ("CONFIG_TYPES", "REWARD_COMPONENTS", "CONFIG_RANGES")


def old_style_fork(project, name: str = "old-maths", edit: bytes = b"", lacks: tuple[str, ...] = DECLARED) -> Repo:
    """A gsm-maths fork as Fork made it before the catalogue declared `lacks`: the same code without
    them (and `edit` appended, for one whose code was changed)."""
    files = services.catalogue_entry("gsm-maths").files()
    lines = files["__init__.py"].decode().splitlines(keepends=True)
    files["__init__.py"] = "".join(line for line in lines if not line.startswith(lacks)).encode() + edit
    assert services.parsed_init(files) is not None and not any(name.encode() in files["__init__.py"] for name in lacks)
    repo = create_repo(project, name, RepoType.ENVIRONMENT, description="Forked from builtin/gsm-maths@main")
    commit_files(repo, "main", files, message="Fork builtin/gsm-maths@main from the Studio catalogue")
    return repo


def test_a_fork_made_before_the_declarations_is_checked_against_its_catalogue_packages(api, project):
    # Its CONFIG was checked only against the one it replaced: "ten" for max_examples (default None),
    # a weight for no component, and max_examples 0 were all a 200, and the run then failed or misbehaved.
    old_style_fork(project)
    config = api.get("/api/environments/old-maths/config").json()["config"]
    body = assert_error(api.put("/api/environments/old-maths/config", {"config": {**config, **QA_CONFIG}}), 400)
    assert fields(body) == QA_FIELDS
    assert_error(api.put("/api/environments/old-maths/config", {"config": {**config, "max_examples": 0}}), 400, "config.max_examples")
    assert api.put("/api/environments/old-maths/config", {"config": {**config, "max_examples": 3}}).status_code == 200
    # A CONFIG committed straight to the repo: /check and START say the same.
    commit_files(Repo.objects.get(project=project, name="old-maths"), "main", {"config.py": services.render_config({**config, "max_examples": -5}).encode()})
    assert {f["field"] for f in api.get("/api/environments/old-maths/check").json()["findings"]} == {"config.max_examples"}
    run_id = api.post("/api/training-runs", {"name": "env", "method": "grpo", "base_model": "org/base", "config": {"environment_id": "old-maths@main"}}).json()["id"]
    refused = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    assert any(e["message"].startswith("CONFIG.max_examples: must be at least 1") for e in refused["errors"]), refused


def test_a_fork_made_before_the_ranges_takes_the_catalogues_ranges_and_keeps_its_own_types(api, project):
    old_style_fork(project, lacks=("CONFIG_RANGES",))
    config = api.get("/api/environments/old-maths/config").json()["config"]
    assert_error(api.put("/api/environments/old-maths/config", {"config": {**config, "max_examples": 0}}), 400, "config.max_examples")
    assert_error(api.put("/api/environments/old-maths/config", {"config": {**config, "max_examples": "ten"}}), 400, "config.max_examples")


def test_a_fork_whose_code_was_edited_keeps_the_checks_against_its_config(api, project):
    # Its score() may weigh other components now: the catalogue's REWARD_COMPONENTS would refuse them.
    edit = b"\n\ndef speed(completion):\n    return 1.0 if len(completion) < 40 else 0.0\n"
    old_style_fork(project, edit=edit)
    config = api.get("/api/environments/old-maths/config").json()["config"]
    weights = {**config["weights"], "speed": 0.1}
    assert api.put("/api/environments/old-maths/config", {"config": {**config, "weights": weights}}).status_code == 200
    # What the CONFIG it replaces says still holds: a weight is a number.
    assert_error(api.put("/api/environments/old-maths/config", {"config": {**config, "weights": {**weights, "correct": "high"}}}), 400, "config.weights.correct")
