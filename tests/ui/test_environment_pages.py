"""Environment pages (catalogue + Fork, an environment repo's CONFIG) and Settings → Secrets, through
Django's test client: labelled fields, viewers cannot write, outsiders see nothing, values never echo."""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from environments import services as env_services
from studio.models import ProjectSecret

pytestmark = pytest.mark.django_db

CATALOGUE = ("calculator", "gsm-maths", "multiple-choice", "science-qa")


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def labelled(html: str) -> None:
    """Every visible input, select and textarea has a <label for=its id>."""
    for tag in re.findall(r"<(?:input|select|textarea)\b[^>]*>", html):
        if 'type="hidden"' in tag:
            continue
        found = re.search(r'\bid="([^"]+)"', tag)
        assert found and f'<label for="{found.group(1)}"' in html, tag


def test_catalogue_lists_the_four_entries_with_fork(project, users):
    response = client_for(users["owner"]).get("/environments/")
    html = response.content.decode()
    assert response.status_code == 200
    assert sorted(e.name for e in env_services.catalogue()) == list(CATALOGUE)
    for name in CATALOGUE:
        assert f"builtin/{name}@main" in html and f'name="catalogue" value="{name}"' in html
    assert html.count(">Fork</button>") == 4
    labelled(html)
    viewer = client_for(users["viewer"]).get("/environments/").content.decode()
    assert "gsm-maths" in viewer and ">Fork</button>" not in viewer


def test_fork_creates_the_repo_and_its_page_shows_config(project, users):
    client = client_for(users["member"])
    response = client.post("/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths"})
    assert response.status_code == 302 and response["Location"] == "/environments/my-maths/"
    assert env_services.repo_config(project, "my-maths")["config"]["answer_marker"] == "####"
    html = client.get(response["Location"]).content.decode()
    assert "CONFIG" in html and "my-maths@main" in html and "answer_marker" in html and "config.py" in html
    labelled(html)
    listing = client.get("/environments/").content.decode()
    assert 'href="/environments/my-maths/"' in listing
    again = client.post("/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths"})  # the name is taken
    assert again.status_code == 409 and 'role="alert"' in again.content.decode()
    assert again.content.decode().count("already has a repo") == 1  # beside the name, not again in a general alert
    bad = client.post("/environments/fork", {"catalogue": "gsm-maths", "name": "no spaces"})
    assert bad.status_code == 400 and 'id="fork-gsm-maths-errors"' in bad.content.decode()


def test_editing_config_saves_a_commit(project, users):
    env_services.fork(project, "multiple-choice", "mc", user=users["owner"])
    client = client_for(users["owner"])
    before = env_services.repo_config(project, "mc")
    config = {**before["config"], "max_examples": 5}
    response = client.post("/environments/mc/config", {"config": json.dumps(config)})
    assert response.status_code == 302
    after = env_services.repo_config(project, "mc")
    assert after["config"]["max_examples"] == 5 and after["commit"] != before["commit"]
    partial = client.post("/environments/mc/config", {"config": json.dumps({**config, "max_examples": 7})}, HTTP_HX_REQUEST="true")
    assert partial.status_code == 200 and partial.content.decode().lstrip().startswith('<section class="card" id="config-card"')
    head = env_services.repo_config(project, "mc")
    assert head["config"]["max_examples"] == 7
    # The Head commit row above the card follows the save (it showed the old commit until a reload).
    assert f'<code id="env-head" hx-swap-oob="true">{head["commit"][:10]}</code>' in partial.content.decode()
    broken = client.post("/environments/mc/config", {"config": "{not json"})
    assert broken.status_code == 400 and 'id="f-config-errors"' in broken.content.decode()
    assert client.post("/environments/mc/config", {"config": "[1, 2]"}).status_code == 400
    head = env_services.repo_config(project, "mc")
    assert head["config"]["max_examples"] == 7
    # The Head commit row above the card follows the save (it showed the old commit until a reload).
    assert f'<code id="env-head" hx-swap-oob="true">{head["commit"][:10]}</code>' in partial.content.decode()


@pytest.mark.parametrize(
    ("key", "raw", "says"),
    [
        ("max_examples", "NaN", "NaN is not a JSON number"),
        ("max_examples", "1e999", "too large for a number"),
        ("max_examples", "-Infinity", "-Infinity is not a JSON number"),
        ("max_examples", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("max_examples", "[" * 40 + "]" * 40, "nested more than 32 levels deep"),
        ("description", '"a\\u0000b"', "NUL character"),
    ],
)
def test_config_box_refuses_what_the_api_refuses_and_commits_nothing(project, users, key, raw, says):
    # Python's json reads NaN, Infinity and 1e999; written into config.py they become `nan`/`inf`,
    # which neither the Studio (CONFIG shown as null) nor the engine (NameError on import) can read.
    env_services.fork(project, "multiple-choice", "mc", user=users["owner"])
    before = env_services.repo_config(project, "mc")
    text = json.dumps({k: v for k, v in before["config"].items() if k != key})[:-1] + f', "{key}": {raw}}}'
    response = client_for(users["owner"]).post("/environments/mc/config", {"config": text})
    html = response.content.decode()
    assert response.status_code == 400 and 'id="f-config-errors"' in html and says in html
    assert env_services.repo_config(project, "mc") == before


def test_config_box_and_package_check_name_the_config_key_the_environment_declares_otherwise(project, users):
    # max_examples "ten" and a weight for a component the package does not have were saved, and the
    # check said the package was fine; the run then failed as it loaded.
    from datahub.commits import commit_files
    from datahub.models import Repo

    env_services.fork(project, "gsm-maths", "gsm", user=users["owner"])
    client = client_for(users["owner"])
    before = env_services.repo_config(project, "gsm")
    bad = {**before["config"], "max_examples": "ten", "weights": {"correct": 0.5, "close": 0.2, "format": 0.1, "exact": 0.2}}
    html = client.post("/environments/gsm/config", {"config": json.dumps(bad)}, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="f-config-errors"' in html and "config.max_examples: must be a whole number or null" in html
    assert "config.weights.exact: &#x27;exact&#x27; is not a reward component" in html
    assert env_services.repo_config(project, "gsm")["commit"] == before["commit"]
    commit_files(Repo.objects.get(project=project, name="gsm"), "main", {"config.py": env_services.render_config(bad).encode()})
    page = client.get("/environments/gsm/").content.decode()
    assert "would refuse this package" in page and "<code>config.max_examples</code>: must be a whole number or null" in page


def test_viewer_cannot_write_and_outsider_sees_nothing(project, other_project, users):
    env_services.fork(project, "science-qa", "sci", user=users["owner"])
    viewer = client_for(users["viewer"])
    assert viewer.get("/environments/sci/").status_code == 200
    assert viewer.post("/environments/fork", {"catalogue": "calculator"}).status_code == 403
    assert viewer.post("/environments/sci/config", {"config": "{}"}).status_code == 403
    assert viewer.post("/settings/secrets/set", {"name": "K", "value": "v-123"}).status_code == 403
    assert viewer.post("/settings/secrets/delete", {"name": "K"}).status_code == 403
    assert not ProjectSecret.objects.filter(project=project).exists()
    assert env_services.repo_config(project, "sci")["config"] == env_services.catalogue_entry("science-qa").config()
    outsider = client_for(users["outsider"])
    assert outsider.get("/environments/sci/").status_code == 404
    assert outsider.post("/environments/sci/config", {"config": "{}"}).status_code == 404
    assert Client().get("/environments/").status_code == 302  # to login


def test_secrets_page_lists_names_and_never_echoes_values(project, users):
    value = "sk-test-VERY-secret-value-9f8e7d"
    client = client_for(users["owner"])
    page = client.get("/settings/secrets/")
    assert page.status_code == 200 and "No secrets yet" in page.content.decode()
    labelled(page.content.decode())
    responses = [client.post("/settings/secrets/set", {"name": "JUDGE_KEY", "value": value}, follow=True)]
    assert responses[0].status_code == 200 and "JUDGE_KEY" in responses[0].content.decode()
    assert ProjectSecret.objects.filter(project=project, name="JUDGE_KEY").exists()
    responses.append(client.post("/settings/secrets/set", {"name": "JUDGE_KEY", "value": value + "-2"}, follow=True))  # replace
    bad = client.post("/settings/secrets/set", {"name": "9 bad name", "value": value})
    assert bad.status_code == 400 and 'id="f-name-errors"' in bad.content.decode()
    empty = client.post("/settings/secrets/set", {"name": "OTHER", "value": ""})
    assert empty.status_code == 400 and 'id="f-value-errors"' in empty.content.decode()
    responses += [bad, empty, client.get("/settings/secrets/"), client_for(users["viewer"]).get("/settings/secrets/")]
    from studio.services import reveal_secret

    assert reveal_secret(project, "JUDGE_KEY") == value + "-2"
    for response in responses:
        html = response.content.decode()
        assert value not in html and "VERY-secret" not in html
    assert "JUDGE_KEY" in responses[-1].content.decode()  # viewers see names
    deleted = client.post("/settings/secrets/delete", {"name": "JUDGE_KEY"}, follow=True)
    assert deleted.status_code == 200 and not ProjectSecret.objects.filter(project=project).exists()
    assert client.post("/settings/secrets/delete", {"name": "JUDGE_KEY"}).status_code == 404
