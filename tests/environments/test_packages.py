"""Static package checks (no import in the web process), the catalogue/fork/CONFIG API, and the
pre-start 422 for a package importing something outside the trainer image's set."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from datahub.commits import commit_files
from datahub.models import Repo, RepoType
from datahub.repos import create_repo
from environments import services
from tests.conftest import assert_error

GOOD = b"import json\nimport re\nfrom .config import CONFIG\nfrom . import helpers\nimport helpers\n\ndef load_environment(**kwargs):\n    return None\n"


def image(*names):
    return lambda module: module in names


def findings(files, *names):
    return [f.message for f in services.static_findings(files, image(*names))]


def test_a_valid_package_has_no_findings():
    files = {"__init__.py": GOOD, "config.py": b"CONFIG = {'a': 1}\n", "helpers.py": b"import torch\n", "data.jsonl": b"{}\n"}
    assert findings(files, "torch") == []
    assert services.read_config(files) == {"a": 1}


def test_an_import_outside_the_image_is_named():
    files = {"__init__.py": GOOD + b"import numpy_but_not_really\nfrom sklearn.metrics import f1_score\n", "helpers.py": b""}
    messages = findings(files, "torch")
    assert len(messages) == 2
    assert "'numpy_but_not_really'" in messages[0] and "__init__.py:9" in messages[0]
    assert "'sklearn'" in messages[1]


def test_missing_entry_point_syntax_errors_and_layout():
    assert any("no module-level load_environment" in m for m in findings({"__init__.py": b"def other():\n    pass\n"}))
    assert any("syntax error" in m for m in findings({"__init__.py": b"def load_environment(:\n"}))
    assert any("no __init__.py" in m for m in findings({"env.py": b"def load_environment(): pass\n"}))
    # one sub-package is fine; so are entry points imported from a module or bound by assignment
    assert findings({"pkg/__init__.py": b"from .impl import load_environment\n", "pkg/impl.py": b"def load_environment(**k): pass\n"}) == []
    assert findings({"__init__.py": b"def _make(**k): pass\nload_environment = _make\n"}) == []


def test_a_verifiers_taskset_package_passes():
    source = b"import verifiers.v1 as vf\n\nclass MyTaskset(vf.Taskset[vf.Task]):\n    def load(self):\n        return []\n"
    assert findings({"__init__.py": source}, "verifiers") == []
    assert any("'verifiers'" in m for m in findings({"__init__.py": source}))


def test_the_local_image_check_uses_the_engine_environment():
    from training.validation import local_image_has

    assert local_image_has("trl") and not local_image_has("definitely_not_installed_mod")
    assert "json" in sys.stdlib_module_names


def test_every_catalogue_package_passes_the_static_checks_for_both_image_kinds(settings):
    from training.validation import local_image_has, remote_image_has

    for entry in services.catalogue():
        assert services.static_findings(entry.files(), local_image_has) == [], entry.name
        assert services.static_findings(entry.files(), remote_image_has) == [], entry.name


def test_catalogue_api_lists_the_four_and_arith(api):
    r = api.get("/api/environments/catalogue")
    assert r.status_code == 200, r.content
    by_name = {e["name"]: e for e in r.json()}
    assert set(by_name) == {"gsm-maths", "multiple-choice", "science-qa", "calculator", "arith"}
    assert by_name["gsm-maths"]["environment_id"] == "builtin/gsm-maths@main" and by_name["gsm-maths"]["config"]["weights"]
    assert "data.jsonl" in by_name["calculator"]["files"] and by_name["calculator"]["config"]["max_tool_calls"] == 3
    assert {n: e["row_keys"] for n, e in by_name.items()} == {
        "gsm-maths": ["prompt", "answer"], "multiple-choice": ["prompt", "answer"], "science-qa": ["prompt", "aliases"],
        "calculator": ["prompt", "answer"], "arith": ["prompt"]}


def test_fork_copies_the_package_with_an_editable_config(api, api_as, project):
    r = api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths", "config": {"max_examples": 5}})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["environment_id"] == "my-maths@main" and body["forked_from"] == "builtin/gsm-maths@main"
    repo = Repo.objects.get(project=project, name="my-maths")
    assert repo.type == RepoType.ENVIRONMENT
    got = api.get("/api/environments/my-maths/config").json()
    assert got["config"]["max_examples"] == 5 and got["config"]["answer_marker"] == "####"
    assert {"__init__.py", "config.py", "data.jsonl"} <= set(got["files"])
    edited = {**got["config"], "weights": {"correct": 1.0, "close": 0.0, "format": 0}}
    r = api.put("/api/environments/my-maths/config", {"config": edited})
    assert r.status_code == 200, r.content
    assert api.get("/api/environments/my-maths/config").json()["config"]["weights"] == {"correct": 1.0, "close": 0.0, "format": 0}
    assert [e["repo"] for e in api.get("/api/environments").json()] == ["my-maths"]
    # the same name twice is a 409; an unknown catalogue entry a 404; viewers cannot fork (403)
    assert_error(api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths"}), 409)
    assert_error(api.post("/api/environments/fork", {"catalogue": "chess"}), 404, "catalogue")
    assert_error(api_as("viewer").post("/api/environments/fork", {"catalogue": "calculator"}), 403)
    assert_error(api_as("outsider").get("/api/environments/my-maths/config"), 404)


def test_a_nul_in_an_environment_name_or_ref_is_a_4xx_not_500(api, project, users):
    # PostgreSQL cannot compare text with a NUL: each lookup was a 500.
    services.fork(project, "gsm-maths", "gsm", user=users["owner"])
    assert_error(api.get("/api/environments/a%00b/config"), 404, "name")
    # A ref with a NUL is no ref at all: a 400, as on the /api/hub reads.
    assert_error(api.get("/api/environments/gsm/config", ref="main\x00"), 400, "ref")
    assert_error(api.get("/api/environments/gsm/check", ref="\x00"), 400, "ref")
    assert_error(api.get("/api/hub/repos/a%00b"), 404)
    assert api.get("/api/environments/gsm/config", ref="main").status_code == 200


def grpo_run(api, environment_id: str, **compute) -> int:
    body = {"name": "env", "method": "grpo", "base_model": "org/base", "config": {"environment_id": environment_id}, "compute": compute}
    r = api.post("/api/training-runs", body)
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_start_refuses_a_package_importing_a_module_outside_the_image(api, project):
    repo = create_repo(project, "bad-env", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": b"import definitely_not_installed_mod\n\ndef load_environment(**kwargs):\n    return None\n"})
    run_id = grpo_run(api, "bad-env@main")
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    messages = [e["message"] for e in body["errors"] if e["field"] == "config.environment_id"]
    assert any("'definitely_not_installed_mod'" in m and "__init__.py:1" in m for m in messages), messages
    assert api.get(f"/api/training-runs/{run_id}").json()["status"] == "queued"


def test_start_checks_remote_images_against_the_configured_package_list(api, project, settings):
    repo = create_repo(project, "np-env", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": b"import numpy\n\ndef load_environment(**kwargs):\n    return None\n"})
    run_id = grpo_run(api, "np-env@main", backend="dstack", accelerators="H100:2")
    body = api.post(f"/api/training-runs/{run_id}/start").json()
    assert any(e["field"] == "config.environment_id" and "'numpy'" in e["message"] and "dstack" in e["message"] for e in body["errors"]), body


def test_start_refuses_unknown_builtins_and_non_refs(api):
    for env_id, text in (("builtin/chess@main", "not a built-in"), ("my-env", "not an environment ref")):
        body = assert_error(api.post(f"/api/training-runs/{grpo_run(api, env_id)}/start"), 422, "config.environment_id")
        assert any(text in e["message"] for e in body["errors"]), body


@pytest.mark.parametrize("env_id", ["builtin/gsm-maths@main", "builtin/arith@main"])
def test_builtins_pass_the_environment_checks(api, env_id):
    from training.methods.base import Draft
    from training.validation import local_image_has

    draft = Draft(method="grpo", base_model="x", dataset=None, config={"environment_id": env_id}, compute={}, project=None)
    assert services.environment_findings(draft, local_image_has) == []


@pytest.mark.parametrize("body, field", [
    ({}, "catalogue"),
    ({"catalogue": 5}, "catalogue"),
    ({"catalogue": "gsm-maths", "name": "../etc"}, "name"),
    ({"catalogue": "gsm-maths", "nme": "x"}, "nme"),
    ({"catalogue": "gsm-maths", "config": [1]}, "config"),
])
def test_bad_fork_bodies_are_400s_naming_the_field(api, body, field):
    assert_error(api.post("/api/environments/fork", body), 400, field)


def test_config_edits_need_an_environment_repo_and_an_object(api, project):
    create_repo(project, "weights", RepoType.MODEL)
    assert_error(api.get("/api/environments/weights/config"), 404, "name")
    assert_error(api.put("/api/environments/nope/config", {"config": {}}), 404, "name")
    api.post("/api/environments/fork", {"catalogue": "science-qa"})
    assert_error(api.put("/api/environments/science-qa/config", {"config": "x"}), 400, "config")
    assert_error(api.put("/api/environments/science-qa/config", {}), 400, "config")


def test_a_staging_failure_leaves_repo_and_commit_for_the_engine(api, project, monkeypatch, settings, tmp_path):
    from training.models import TrainingRun

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"

    fork = api.post("/api/environments/fork", {"catalogue": "gsm-maths"}).json()
    run = TrainingRun.objects.get(pk=grpo_run(api, "gsm-maths@main"))
    run.pinned = {"config.environment_id": {"ref": "gsm-maths@main", "commit": fork["commit"], "repo": "acme/gsm-maths"}}
    staged = Path(services.job_environment(run)["path"])
    assert staged == tmp_path / "runs" / str(run.pk) / "attempt-0" / "environment" and (staged / "config.py").is_file()
    monkeypatch.setattr(services, "checkout", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    block = services.job_environment(run)
    assert "path" not in block and block["commit"] == fork["commit"]


def test_ruler_judge_endpoint_must_be_an_http_url():
    from training.methods.base import Draft
    from training.validation import local_image_has

    def draft(endpoint):
        config = {"rl_mode": "ruler", "judge": {"mode": "external", "endpoint": endpoint, "api_key_secret": "k"}}
        return Draft(method="grpo", base_model="x", dataset=None, config=config, compute={}, project=None)

    assert [f.field for f in services.environment_findings(draft("judge.local:8000/v1"), local_image_has)] == ["config.judge.endpoint"]
    assert services.environment_findings(draft("https://judge.example/v1"), local_image_has) == []


def test_the_check_endpoint_reports_what_start_would(api, project):
    repo = create_repo(project, "np-env2", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": b"import numpy\nimport trl\n\ndef load_environment(**kwargs):\n    return None\n"})
    assert api.get("/api/environments/np-env2/check").json()["findings"] == []  # numpy and trl are in this venv
    remote = api.get("/api/environments/np-env2/check", backend="dstack").json()
    assert [f["field"] for f in remote["findings"]] == ["config.environment_id"] and "'numpy'" in remote["findings"][0]["message"]
    assert_error(api.get("/api/environments/np-env2/check", backend="mainframe"), 400, "backend")
    assert_error(api.get("/api/environments/np-env2/check", ref="nope"), 404)


def test_a_config_put_that_drops_keys_load_environment_reads_is_400_and_changes_nothing(api, project):
    fork = api.post("/api/environments/fork", {"catalogue": "calculator"}).json()
    before = api.get("/api/environments/calculator/config").json()
    body = assert_error(api.put("/api/environments/calculator/config", {"config": {"max_tool_calls": 5}}), 400)
    assert {e["field"] for e in body["errors"]} == {"config.data_file", "config.system_prompt", "config.weights"}
    assert all("which load_environment reads (__init__.py:" in e["message"] for e in body["errors"]), body
    after = api.get("/api/environments/calculator/config").json()
    assert after["commit"] == before["commit"] == fork["commit"] and after["config"] == before["config"]
    # Optional keys (read with .get) may go; the keys it needs stay.
    slim = {k: v for k, v in before["config"].items() if k != "max_examples"}
    assert api.put("/api/environments/calculator/config", {"config": slim}).status_code == 200


def test_start_and_the_check_refuse_a_package_whose_config_lacks_a_key_it_reads(api, project):
    repo = create_repo(project, "thin-env", RepoType.ENVIRONMENT)
    init = (b"from .config import CONFIG\n\n\ndef load_environment(**kwargs):\n    cfg = {**CONFIG, **kwargs}\n"
            b"    rows = [r['question'] for r in []]\n    return cfg['data_file'], cfg.get('limit'), rows\n")
    commit_files(repo, "main", {"__init__.py": init, "config.py": b"CONFIG = {'name': 'thin'}\n"})
    expected = "CONFIG has no 'data_file', which load_environment reads (__init__.py:7): put it back in CONFIG"
    assert [f["message"] for f in api.get("/api/environments/thin-env/check").json()["findings"]] == [expected]
    body = assert_error(api.post(f"/api/training-runs/{grpo_run(api, 'thin-env@main')}/start"), 422, "config.environment_id")
    assert expected in [e["message"] for e in body["errors"]]


@pytest.mark.parametrize("entry", ["gsm-maths", "multiple-choice", "science-qa", "calculator"])
def test_every_catalogue_fork_passes_the_config_check(api, project, entry):
    fork = api.post("/api/environments/fork", {"catalogue": entry}).json()
    assert api.get(f"/api/environments/{fork['repo']}/check").json()["findings"] == []


def test_a_fork_merges_nested_config_and_refuses_what_does_not_fit_the_package(api, project):
    # It replaced `weights` whole (tool_use and format went), took {"correct": "x"}, and the run then
    # failed with a bare TypeError; a misspelt key was silently unused; a missing data file failed it.
    body = api.post("/api/environments/fork", {"catalogue": "calculator", "name": "calc4", "config": {"weights": {"correct": 0.5}}}).json()
    assert body["config"]["weights"] == {"correct": 0.5, "tool_use": 0.2, "format": 0.1}
    cases = [
        ({"weights": {"correct": "x"}}, "config.weights.correct", "must be a number, as it is now (0.7); got 'x'"),
        ({"max_tool_calls": "many"}, "config.max_tool_calls", "must be a number"),
        ({"max_tool_call": 5}, "config.max_tool_call", "load_environment does not read 'max_tool_call'"),
        ({"data_file": "nope.jsonl"}, "config.data_file", "the package has no file 'nope.jsonl' (it has '__init__.py', 'config.py', 'data.jsonl'"),
    ]
    for config, field, says in cases:
        error = assert_error(api.post("/api/environments/fork", {"catalogue": "calculator", "name": "calc5", "config": config}), 400, field)
        assert says in error["errors"][0]["message"], error
    assert not Repo.objects.filter(project=project, name="calc5").exists()


def test_a_config_put_of_the_wrong_type_or_an_unread_key_is_400_and_changes_nothing(api, project):
    api.post("/api/environments/fork", {"catalogue": "calculator", "name": "calc2"})
    before = api.get("/api/environments/calc2/config").json()
    for change, field in (({"max_tool_calls": "many"}, "config.max_tool_calls"), ({"data_file": "nope.jsonl"}, "config.data_file"),
                          ({"temperature": 0.3}, "config.temperature")):
        assert_error(api.put("/api/environments/calc2/config", {"config": {**before["config"], **change}}), 400, field)
    assert api.get("/api/environments/calc2/config").json()["commit"] == before["commit"]
    # A value of the same type, and null for an optional key (max_examples: None reads as "no limit"), save.
    assert api.put("/api/environments/calc2/config", {"config": {**before["config"], "max_tool_calls": 1, "max_examples": 4}}).status_code == 200


def test_config_keys_a_package_takes_as_parameters_or_hands_on_are_not_called_unread(api, project):
    # Only cfg["key"] reads counted as known: a named parameter, or **kwargs handed to a Taskset, was refused.
    repo = create_repo(project, "param-env", RepoType.ENVIRONMENT)
    init = b"from .config import CONFIG\n\n\ndef load_environment(limit=3, **kwargs):\n    return limit, kwargs\n"
    commit_files(repo, "main", {"__init__.py": init, "config.py": b"CONFIG = {'limit': 3}\n"})
    assert api.put("/api/environments/param-env/config", {"config": {"limit": 5}}).status_code == 200
    assert_error(api.put("/api/environments/param-env/config", {"config": {"limit": 5, "limt": 1}}), 400, "config.limt")
    handed = create_repo(project, "handing-env", RepoType.ENVIRONMENT)
    init = b"from .config import CONFIG\n\n\ndef load_environment(**kwargs):\n    return dict(**kwargs)\n"
    commit_files(handed, "main", {"__init__.py": init, "config.py": b"CONFIG = {'a': 1}\n"})
    assert api.put("/api/environments/handing-env/config", {"config": {"a": 2, "anything": True}}).status_code == 200


def test_start_checks_a_runs_own_dataset_has_the_columns_its_environment_scores_against(api, project, tmp_path):
    rows = tmp_path / "questions.jsonl"
    rows.write_text('{"prompt": "2+2?", "answer": "4"}\n{"prompt": "3+3?"}\n{"prompt": "1+1?", "answer": " "}\n')

    def dataset_messages(env_id: str, dataset: str) -> list[str]:
        body = {"name": "own data", "method": "grpo", "base_model": "org/base", "dataset": dataset, "config": {"environment_id": env_id}}
        r = api.post("/api/training-runs", body)
        assert r.status_code == 201, r.content
        answer = api.post(f"/api/training-runs/{r.json()['id']}/start")
        return [e["message"] for e in answer.json().get("errors", []) if e["field"] == "dataset"]

    advice = "add it to every row, or leave dataset empty to use the environment's own prompts"
    assert dataset_messages("builtin/gsm-maths@main", str(rows)) == [
        f'questions.jsonl row 2: "answer" is missing: builtin/gsm-maths scores each completion against the row\'s prompt, answer; {advice}',
        f'questions.jsonl row 3: "answer" is empty: builtin/gsm-maths scores each completion against the row\'s prompt, answer; {advice}',
    ]
    assert dataset_messages("builtin/arith@main", str(rows)) == []  # arith reads the sum from the prompt
    # A project's own package declares its columns the same way, and a Data Hub dataset is checked alike.
    env_repo = create_repo(project, "needs-label", RepoType.ENVIRONMENT)
    commit_files(env_repo, "main", {"__init__.py": b'ROW_KEYS = ("prompt", "label")\n\ndef load_environment(**kwargs):\n    return None\n'})
    data = create_repo(project, "labelled", RepoType.DATASET)
    commit_files(data, "main", {"train.jsonl": b'{"prompt": "a", "label": "x"}\n{"prompt": "b", "answer": "y"}\n'})
    assert dataset_messages("needs-label@main", "labelled@main") == [
        f'train.jsonl row 2: "label" is missing: needs-label scores each completion against the row\'s prompt, label; {advice}']
    commit_files(data, "main", {"train.jsonl": b'{"prompt": "a", "label": "x"}\n'})
    assert dataset_messages("needs-label@main", "labelled@main") == []


def test_start_says_once_that_a_dataset_lacks_a_column_its_environment_reads(api, tmp_path):
    rows = tmp_path / "no-answer.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{n}+{n}?", "solution": str(2 * n)} if n != 3 else {"prompt": " ", "solution": "6"}) + "\n"
                            for n in range(1, 31)))
    body = {"name": "own data", "method": "grpo", "base_model": "org/base", "dataset": str(rows), "config": {"environment_id": "builtin/gsm-maths@main"}}
    r = api.post("/api/training-runs", body)
    assert r.status_code == 201, r.content
    messages = [e["message"] for e in api.post(f"/api/training-runs/{r.json()['id']}/start").json().get("errors", []) if e["field"] == "dataset"]
    assert messages[0] == ('no-answer.jsonl has no "answer" column, which builtin/gsm-maths reads from every row (its ROW_KEYS: prompt, answer): '
                           "add the column, or leave dataset empty to use the environment's own prompts")
    # A row that is bad on its own still gets its own finding; no 20 copies of the same one, no "stopped after".
    assert len(messages) == 2 and messages[1].startswith("no-answer.jsonl row 3: "), messages


def test_row_keys_are_read_without_importing_the_package():
    assert services.row_keys({"__init__.py": b"ROW_KEYS = ['prompt', 'answer']\n"}) == ("prompt", "answer")
    assert services.row_keys({"__init__.py": b"ROW_KEYS: tuple = ('prompt',)\n"}) == ("prompt",)
    for init in (b"ROW_KEYS = compute()\n", b"ROW_KEYS = 'prompt'\n", b"ROW_KEYS = (1, 2)\n", b"def load_environment(): ...\n", b"def (:\n"):
        assert services.row_keys({"__init__.py": init}) == (), init
    # One that is there but cannot be read is a finding at START and on the package check, not silence.
    init = b"ROW_KEYS = tuple(['prompt', 'level'])\n\ndef load_environment(**kwargs):\n    return None\n"
    assert any("ROW_KEYS must be a literal tuple of column names" in m for m in findings({"__init__.py": init}))
    assert not any("ROW_KEYS" in m for m in findings({"__init__.py": b"ROW_KEYS = ('prompt',)\n" + GOOD}))


def test_a_configs_description_can_be_removed_and_put_back(api, project):
    # name and description describe the package (load_environment never gets them): dropping one made
    # the original CONFIG a 400 ("load_environment does not read 'description'") from then on.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "ratchet"})
    original = api.get("/api/environments/ratchet/config").json()["config"]
    assert "description" in original
    slim = {k: v for k, v in original.items() if k != "description"}
    assert api.put("/api/environments/ratchet/config", {"config": slim}).status_code == 200
    r = api.put("/api/environments/ratchet/config", {"config": original})
    assert r.status_code == 200, r.content
    assert api.get("/api/environments/ratchet/config").json()["config"] == original


def test_an_optional_config_key_set_once_can_go_back_to_none_and_a_wrong_type_can_be_corrected(api, project):
    # Type checks compared with the current CONFIG: max_examples set from None to 10 could never be None
    # ("all examples") again, and a string that got in while it was None could never be replaced.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "gsm2"})
    config = api.get("/api/environments/gsm2/config").json()["config"]
    assert config["max_examples"] is None
    for value in (10, None, 10, None):
        r = api.put("/api/environments/gsm2/config", {"config": {**config, "max_examples": value}})
        assert r.status_code == 200, (value, r.content)
        assert api.get("/api/environments/gsm2/config").json()["config"]["max_examples"] == value
    # The package declares max_examples a whole number or null (CONFIG_TYPES): a string is refused, and
    # one that got in by a commit of config.py is reported by the check and can be corrected.
    assert_error(api.put("/api/environments/gsm2/config", {"config": {**config, "max_examples": "lots"}}), 400, "config.max_examples")
    commit_files(Repo.objects.get(project=project, name="gsm2"), "main", {"config.py": services.render_config({**config, "max_examples": "lots"}).encode()})
    assert [f["field"] for f in api.get("/api/environments/gsm2/check").json()["findings"]] == ["config.max_examples"]
    assert api.put("/api/environments/gsm2/config", {"config": {**config, "max_examples": 10}}).status_code == 200
    # A key that had a type from the start keeps it.
    assert_error(api.put("/api/environments/gsm2/config", {"config": {**config, "answer_marker": 4}}), 400, "config.answer_marker")


def test_an_empty_or_malformed_ref_on_an_environment_read_is_the_hubs_answer(api, project):
    # ?ref= answered environment_id "gsm3@" (not an id to copy into a config); ?ref=../x was a 404
    # here and a 400 on the /api/hub reads.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "gsm3"})
    assert api.get("/api/environments/gsm3/config?ref=").json()["environment_id"] == "gsm3@main"
    assert api.get("/api/environments/gsm3/check?ref=").status_code == 200
    for path in ("config", "check"):
        assert_error(api.get(f"/api/environments/gsm3/{path}?ref=../x"), 400, "ref")


def test_config_is_read_where_the_package_defines_it_as_the_engine_takes_it():
    # The engine takes the module's own CONFIG (training.engine.packages.package_config): one that
    # __init__.py defines wins over a config.py it never imports, which was what the Studio showed.
    assert services.read_config({"__init__.py": b"CONFIG = {'n': 8}\n", "config.py": b"CONFIG = {'n': 1}\n"}) == {"n": 8}
    assert services.read_config({"__init__.py": b"from .settings import CONFIG\n", "settings.py": b"CONFIG = {'n': 3}\n"}) == {"n": 3}
    assert services.read_config({"__init__.py": b"from .config import CONFIG\nCONFIG = {'n': 4}\n", "config.py": b"CONFIG = {'n': 1}\n"}) == {"n": 4}
    assert services.read_config({"__init__.py": b"def load_environment(**k): pass\n", "config.py": b"CONFIG = {'n': 5}\n"}) == {"n": 5}


def test_a_config_put_edits_config_where_the_package_defines_it(api, project):
    repo = create_repo(project, "init-env", RepoType.ENVIRONMENT)
    init = b'"""Counts."""\nCONFIG: dict = {\n    "n": 8,  # how many\n}\nN = 2\n\n\ndef load_environment(**kwargs):\n    return CONFIG["n"] * N\n'
    commit_files(repo, "main", {"__init__.py": init})
    assert api.put("/api/environments/init-env/config", {"config": {"n": 1}}).status_code == 200
    from datahub.repos import resolve

    files = services.hub_package_files(resolve(repo, "main"))
    assert set(files) == {"__init__.py"}  # no config.py beside it that the run would never read
    assert files["__init__.py"] == b'"""Counts."""\nCONFIG: dict = {\'n\': 1}\nN = 2\n\n\ndef load_environment(**kwargs):\n    return CONFIG["n"] * N\n'
    assert api.get("/api/environments/init-env/config").json()["config"] == {"n": 1}


def test_a_config_that_is_not_a_literal_dict_is_a_finding_on_the_check_and_start_naming_its_line(api, project):
    # GET config answered null, the check found nothing, START took it and the run failed as it loaded.
    repo = create_repo(project, "expr-env", RepoType.ENVIRONMENT)
    init = b"from .config import CONFIG\n\n\ndef load_environment(**kwargs):\n    return kwargs['n']\n"
    commit_files(repo, "main", {"__init__.py": init, "config.py": b'"""Arguments."""\nCONFIG = dict(n=8)\n'})
    says = 'config.py:2: CONFIG must be a literal dict, e.g. CONFIG = {"max_examples": 10}, not an expression'
    findings = api.get("/api/environments/expr-env/check").json()["findings"]
    assert [f["field"] for f in findings] == ["config.environment_id"] and says in findings[0]["message"], findings
    body = assert_error(api.post(f"/api/training-runs/{grpo_run(api, 'expr-env@main')}/start"), 422, "config.environment_id")
    assert any(says in e["message"] for e in body["errors"]), body
    # A PUT writes a literal in its place, which clears the finding.
    assert api.put("/api/environments/expr-env/config", {"config": {"n": 2}}).status_code == 200
    assert api.get("/api/environments/expr-env/config").json()["config"] == {"n": 2}
    assert api.get("/api/environments/expr-env/check").json()["findings"] == []


def test_a_config_put_naming_an_absolute_data_file_needs_a_file_runs_may_read(api, project, settings, tmp_path):
    # "/nonexistent/file.jsonl" was saved (only a relative path was checked), and the run failed with FileNotFoundError.
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "abs-maths"})
    before = api.get("/api/environments/abs-maths/config").json()
    error = assert_error(api.put("/api/environments/abs-maths/config", {"config": {**before["config"], "data_file": "/nonexistent/file.jsonl"}}),
                         400, "config.data_file")
    assert "/nonexistent/file.jsonl is not a file on the Studio's machine that runs may read" in error["errors"][0]["message"]
    own = tmp_path / "maths.jsonl"
    own.write_text('{"question": "1+1?", "answer": "2"}\n')
    settings.STUDIO_LOCAL_ROOTS = [tmp_path / "elsewhere"]
    assert_error(api.put("/api/environments/abs-maths/config", {"config": {**before["config"], "data_file": str(own)}}), 400, "config.data_file")
    assert api.get("/api/environments/abs-maths/config").json()["commit"] == before["commit"]
    settings.STUDIO_LOCAL_ROOTS = [tmp_path]
    assert api.put("/api/environments/abs-maths/config", {"config": {**before["config"], "data_file": str(own)}}).status_code == 200


def test_a_config_put_naming_a_file_in_another_runs_folder_is_refused(api, project, settings, tmp_path):
    # The engine would read another project's run output past every project check.
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    theirs = tmp_path / "runs" / "1" / "attempt-1" / "output" / "rows.jsonl"
    theirs.parent.mkdir(parents=True)
    theirs.write_text('{"question": "1+1?", "answer": "2"}\n')
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "runs-maths"})
    before = api.get("/api/environments/runs-maths/config").json()
    error = assert_error(api.put("/api/environments/runs-maths/config", {"config": {**before["config"], "data_file": str(theirs)}}), 400, "config.data_file")
    assert error["errors"][0]["message"] == (f"{theirs} is inside the Studio's own data (run outputs, STUDIO_RUNS_DIR): "
                                             "push the file to the environment's repo and name it by its path there"), error
    assert api.get("/api/environments/runs-maths/config").json()["commit"] == before["commit"]


@pytest.mark.parametrize("init", [
    b"try:\n    from .local import CONFIG\nexcept ImportError:\n    CONFIG = {'n': 8}\n\n\ndef load_environment(**kwargs):\n    return kwargs['n']\n",
    b"import os\n\nif os.environ.get('FAST'):\n    CONFIG = {'n': 8}\n\n\ndef load_environment(**kwargs):\n    return kwargs['n']\n",
])
def test_a_config_bound_in_a_block_is_a_finding_on_the_check_and_start_and_a_put_saves_nothing(api, project, init):
    # The Studio read, showed and saved config.py's CONFIG, while the run loaded the one __init__.py bound in its if/try.
    repo = create_repo(project, "block-env", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": init, "config.py": b"CONFIG = {'n': 1}\n"})
    line = 2 if init.startswith(b"try") else 4
    says = f"__init__.py:{line}: CONFIG is bound inside an if/try/with/for block"
    findings = api.get("/api/environments/block-env/check").json()["findings"]
    assert [f["field"] for f in findings] == ["config.environment_id"] and says in findings[0]["message"], findings
    assert "move CONFIG to a top-level assignment" in findings[0]["message"]
    body = assert_error(api.post(f"/api/training-runs/{grpo_run(api, 'block-env@main')}/start"), 422, "config.environment_id")
    assert any(says in e["message"] for e in body["errors"]), body
    before = api.get("/api/environments/block-env/config").json()["commit"]
    error = assert_error(api.put("/api/environments/block-env/config", {"config": {"n": 2}}), 400, "config")
    assert says in error["errors"][0]["message"]
    assert api.get("/api/environments/block-env/config").json()["commit"] == before
    # Moved to the top level, CONFIG is the one the Studio edits; one bound in a function is no module binding.
    commit_files(repo, "main", {"__init__.py": b"CONFIG = {'n': 8}\n\n\ndef load_environment(**kwargs):\n    if kwargs:\n        CONFIG = {}\n    return kwargs['n']\n"})
    assert api.get("/api/environments/block-env/check").json()["findings"] == []
    assert api.put("/api/environments/block-env/config", {"config": {"n": 2}}).status_code == 200


def test_start_checks_an_absolute_data_file_again_as_it_may_be_gone_since_it_was_saved(api, project, settings, tmp_path):
    # A data file saved in CONFIG, then deleted or made unreadable, started the run, which failed in the engine as the package loaded.
    own = tmp_path / "maths.jsonl"
    own.write_text('{"question": "1+1?", "answer": "2"}\n')
    settings.STUDIO_LOCAL_ROOTS = [tmp_path]
    api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "abs-maths"})
    config = api.get("/api/environments/abs-maths/config").json()["config"]
    assert api.put("/api/environments/abs-maths/config", {"config": {**config, "data_file": str(own)}}).status_code == 200
    started = api.post(f"/api/training-runs/{grpo_run(api, 'abs-maths@main')}/start")
    assert started.status_code < 300, started.content  # the file is there
    says = f"CONFIG.data_file: {own} is not a file on the Studio's machine that runs may read"
    for gone in (lambda: setattr(settings, "STUDIO_LOCAL_ROOTS", [tmp_path / "elsewhere"]), own.unlink):  # moved out of the roots, deleted
        gone()
        run_id = grpo_run(api, "abs-maths@main")
        body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
        assert any(e["message"].startswith(says) for e in body["errors"]), body
        assert api.get(f"/api/training-runs/{run_id}").json()["status"] == "queued"
        check = api.get("/api/environments/abs-maths/check").json()["findings"]
        assert [f["field"] for f in check] == ["config.data_file"], check
        settings.STUDIO_LOCAL_ROOTS = [tmp_path]


def test_start_takes_an_absolute_path_without_an_extension_for_no_file(api, project):
    # START's second look at absolute data files must not refuse a package's own non-file values.
    repo = create_repo(project, "url-env", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": b"CONFIG = {'n': 8, 'endpoint_path': '/v1/completions', 'data_file': '/nowhere/rows.jsonl'}\n\n\n"
                                                b"def load_environment(**kwargs):\n    return kwargs['n']\n"})
    findings = api.get("/api/environments/url-env/check").json()["findings"]
    assert [f["field"] for f in findings] == ["config.data_file"], findings  # endpoint_path is no file



@pytest.mark.parametrize("name", ["arith", "builtin/arith", "builtin/arith@main"])
def test_forking_the_engines_builtin_is_a_400_saying_what_to_use_instead(api, project, name):
    """builtin/arith is in the catalogue's list (forkable: false) but has no package: a fork of it said
    the catalogue had no such environment (404). It says it ships with the engine, and makes no repo."""
    listed = {e["environment_id"]: e["forkable"] for e in api.get("/api/environments/catalogue").json()}
    assert listed["builtin/arith@main"] is False
    body = assert_error(api.post("/api/environments/fork", {"catalogue": name}), 400, "catalogue")
    assert body["detail"] == "builtin/arith ships with the engine and cannot be forked."
    assert 'config.environment_id "builtin/arith@main"' in body["errors"][0]["message"]
    assert not Repo.objects.filter(project=project).exists()
