"""CONFIG naming a package file: a name typed with é as one character finds the file that macOS
uploaded with e + U+0301 (equal under NFC), and CONFIG keeps the stored name, which the run opens."""

from __future__ import annotations

from datahub.commits import commit_files
from datahub.models import RepoType
from datahub.repos import create_repo
from environments import services
from tests.conftest import assert_error

INIT = b"from .config import CONFIG\n\n\ndef load_environment(**kwargs):\n    cfg = {**CONFIG, **kwargs}\n    return open(cfg['data_file']).read()\n"
TYPED, STORED = "donn\u00e9es.jsonl", "donne\u0301es.jsonl"


def package(project, name: str = "fr-env"):
    repo = create_repo(project, name, RepoType.ENVIRONMENT)
    files = {"__init__.py": INIT, "config.py": b"CONFIG = {'data_file': 'data.jsonl'}\n", "data.jsonl": b"{}\n", STORED: b"{}\n"}
    commit_files(repo, "main", files)
    return repo


def test_a_config_naming_a_file_in_another_unicode_form_saves_the_stored_name(api, project):
    package(project)
    saved = api.put("/api/environments/fr-env/config", {"config": {"data_file": TYPED}})
    assert saved.status_code == 200, saved.content
    assert saved.json()["config"] == {"data_file": STORED}
    assert api.get("/api/environments/fr-env/config").json()["config"] == {"data_file": STORED}


def test_a_config_naming_no_file_lists_every_file_of_the_package(api, project):
    repo = package(project)
    before = repo.branches.get(name="main").head_id
    body = assert_error(api.put("/api/environments/fr-env/config", {"config": {"data_file": "nope.jsonl"}}), 400, "config.data_file")
    assert f"the package has no file 'nope.jsonl' (it has '__init__.py', 'config.py', 'data.jsonl', {STORED!r})" in body["errors"][0]["message"], body
    assert repo.branches.get(name="main").head_id == before


def test_stored_file_names_leaves_exact_and_unknown_names_as_given():
    files = {"__init__.py": INIT, STORED: b"{}\n", "data.jsonl": b""}
    config = {"data_file": TYPED, "other": "data.jsonl", "name": "nope", "n": 3}
    assert services.stored_file_names(config, files) == {"data_file": STORED, "other": "data.jsonl", "name": "nope", "n": 3}
