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
