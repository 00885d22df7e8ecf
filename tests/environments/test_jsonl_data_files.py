"""An environment's data file is read as its loader reads it (JSON Lines, one object a line) before a
run can start: QA forked gsm-maths with data_file /etc/passwd, the check found nothing, START took it,
and the run failed as the package loaded with a JSONDecodeError naming neither the key nor the line."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from datahub.commits import commit_files
from datahub.repos import find_repo
from environments.services import catalogue_entry, jsonl_file_findings, parsed_init
from tests.conftest import assert_error
from training.engine.packages import EnvironmentLoadError, jsonl_problem, load_package

NOT_JSONL = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"


def grpo_run(api, environment_id: str) -> int:
    r = api.post("/api/training-runs", {"name": "env", "method": "grpo", "base_model": "org/base", "config": {"environment_id": environment_id}})
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_a_fork_naming_a_file_that_is_not_json_lines_is_refused_naming_the_key_and_line(api, project, tmp_path, settings):
    passwd = tmp_path / "passwd"
    passwd.write_text(NOT_JSONL)
    settings.STUDIO_LOCAL_ROOTS = [tmp_path]
    body = assert_error(api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "qa-gsm2", "config": {"data_file": str(passwd)}}),
                        400, "config.data_file")
    message = next(e["message"] for e in body["errors"] if e["field"] == "config.data_file")
    assert message.startswith(f"{passwd} line 1 is not JSON (Expecting value, column 1)") and "JSON Lines" in message, message
    assert find_repo(project, "qa-gsm2") is None  # nothing stored
    # A PUT of the same CONFIG is refused too, and a JSON Lines file of objects is taken.
    assert api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "qa-gsm2"}).status_code == 201
    config = api.get("/api/environments/qa-gsm2/config").json()["config"]
    assert_error(api.put("/api/environments/qa-gsm2/config", {"config": {**config, "data_file": str(passwd)}}), 400, "config.data_file")
    good = tmp_path / "maths.jsonl"
    good.write_text('{"question": "1+1?", "answer": "2"}\n\n{"question": "2+2?", "answer": "4"}\n')
    assert api.put("/api/environments/qa-gsm2/config", {"config": {**config, "data_file": str(good)}}).status_code == 200


def test_the_check_and_start_read_the_data_file_as_the_loader_does(api, project, tmp_path, settings):
    # The file changed after it was saved (or the repo's own data.jsonl was pushed broken): the check and START say so.
    assert api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "qa-gsm2"}).status_code == 201
    commit_files(find_repo(project, "qa-gsm2"), "main", {"data.jsonl": b'{"question": "1+1?", "answer": "2"}\n[1, 2]\n'})
    findings = api.get("/api/environments/qa-gsm2/check").json()["findings"]
    assert [f["field"] for f in findings] == ["config.data_file"], findings
    assert findings[0]["message"].startswith("data.jsonl line 2 is a list, not a row object"), findings
    run_id = grpo_run(api, "qa-gsm2@main")
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "config.environment_id")
    assert any(e["message"].startswith("CONFIG.data_file: data.jsonl line 2 is a list") for e in body["errors"]), body
    assert api.get(f"/api/training-runs/{run_id}").json()["status"] == "queued"
    commit_files(find_repo(project, "qa-gsm2"), "main", {"data.jsonl": b'{"question": "1+1?", "answer": "2"}\n'})
    assert api.get("/api/environments/qa-gsm2/check").json()["findings"] == []


def test_a_fork_made_before_the_declaration_is_checked_as_its_catalogue_code_is():
    # Forks copied __init__.py before JSONL_FILES existed; they run the catalogue's code, so its declaration holds.
    files = catalogue_entry("gsm-maths").files()
    files["__init__.py"] = b"\n".join(line for line in files["__init__.py"].splitlines() if not line.startswith(b"JSONL_FILES")) + b"\n"
    files["data.jsonl"] = b"not json\n"
    found = jsonl_file_findings(parsed_init(files), {"data_file": "data.jsonl"}, files, "config")
    assert [(f.field, f.message.split(",")[0]) for f in found] == [("config.data_file", "data.jsonl line 1 is not JSON (Expecting value")]


@pytest.mark.parametrize(("content", "expected"), [
    (b'{"a": 1}\n\n{"a": 2}\n', None),
    (b'\xef\xbb\xbf{"a": 1}\n', None),  # a byte order mark, which the check and the engine skip
    (b'{"a": 1}\n"text"\n', (2, "a string, not a row object ({...})")),
    (b'{"a": 1}\n{"a": \xff}\n', (2, "not UTF-8 text (byte 0xff at column 7)")),
])
def test_jsonl_problem_names_the_first_bad_line(tmp_path: Path, content: bytes, expected):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with path.open("rb") as fh:
        assert jsonl_problem(fh) == expected


def test_jsonl_problem_stops_at_the_studios_limits(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 3 + b"not json\n")
    with path.open("rb") as fh:
        assert jsonl_problem(fh, max_rows=3) is None  # the rows past the limit are not read
    path.write_bytes(b'{"a": "' + b"x" * 100 + b'"}\n')
    with path.open("rb") as fh:
        assert jsonl_problem(fh, max_row_bytes=50) == (1, "over the 50 bytes a row may have")


def test_the_engine_refuses_a_data_file_that_is_not_json_lines_naming_the_key_file_and_line(tmp_path: Path):
    package = tmp_path / "gsm"
    shutil.copytree(catalogue_entry("gsm-maths").directory, package, ignore=shutil.ignore_patterns("__pycache__"))
    passwd = tmp_path / "passwd"
    passwd.write_text(NOT_JSONL)
    with pytest.raises(EnvironmentLoadError) as caught:
        load_package(package, "qa-gsm2@main", overrides={"data_file": str(passwd)})
    assert str(caught.value).startswith(f"environment qa-gsm2@main: CONFIG.data_file: {passwd} line 1 is not JSON (Expecting value, column 1)")
    assert load_package(package, "qa-gsm2@main").prompts(2, seed=0)  # its own data.jsonl loads
