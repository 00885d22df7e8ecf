"""Environment pages (catalogue + Fork, an environment repo's CONFIG) and Settings → Secrets, through
Django's test client: labelled fields, viewers cannot write, outsiders see nothing, values never echo."""
from __future__ import annotations

import json
import re

import pytest
from django.contrib.sessions.models import Session
from django.test import Client

from environments import services as env_services
from studio.models import ProjectSecret
from tests.conftest import refused_form_page

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
    again = refused_form_page(client, "/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths"}, "/environments/")  # the name is taken
    assert 'role="alert"' in again
    assert again.count("already has a repo") == 1  # beside the name, not again in a general alert
    bad = refused_form_page(client, "/environments/fork", {"catalogue": "gsm-maths", "name": "no spaces"}, "/environments/")
    assert 'id="fork-gsm-maths-errors"' in bad and 'value="no spaces"' in bad  # what was typed is kept
    reloaded = client.get("/environments/").content.decode()  # once: a reload shows a clean form
    assert 'id="fork-gsm-maths-errors"' not in reloaded and 'value="no spaces"' not in reloaded
    assert env_services.repo_config(project, "my-maths")["config"]["answer_marker"] == "####"  # the refusals changed nothing


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
    broken = refused_form_page(client, "/environments/mc/config", {"config": "{not json"}, "/environments/mc/")
    assert 'id="f-config-errors"' in broken and "{not json</textarea>" in broken  # what was typed is kept
    reloaded = client.get("/environments/mc/").content.decode()  # once: a reload shows the saved CONFIG
    assert 'id="f-config-errors"' not in reloaded and "{not json" not in reloaded
    assert "CONFIG is a JSON object" in refused_form_page(client, "/environments/mc/config", {"config": "[1, 2]"}, "/environments/mc/")
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
    html = refused_form_page(client_for(users["owner"]), "/environments/mc/config", {"config": text}, "/environments/mc/")
    assert 'id="f-config-errors"' in html and says in html
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
    bad = refused_form_page(client, "/settings/secrets/set", {"name": "9 bad name", "value": value}, "/settings/secrets/")
    assert 'id="f-name-errors"' in bad and 'value="9 bad name"' in bad  # the name is kept, never the value
    empty = refused_form_page(client, "/settings/secrets/set", {"name": "OTHER", "value": ""}, "/settings/secrets/")
    assert 'id="f-value-errors"' in empty and 'value="OTHER"' in empty
    pages = [r.content.decode() for r in responses] + [bad, empty]
    pages += [client.get("/settings/secrets/").content.decode(), client_for(users["viewer"]).get("/settings/secrets/").content.decode()]
    assert 'id="f-value-errors"' not in pages[-2]  # once: a reload shows a clean form
    from studio.services import reveal_secret

    assert reveal_secret(project, "JUDGE_KEY") == value + "-2"
    for html in pages:
        assert value not in html and "VERY-secret" not in html
    assert "JUDGE_KEY" in pages[-1]  # viewers see names
    deleted = client.post("/settings/secrets/delete", {"name": "JUDGE_KEY"}, follow=True)
    assert deleted.status_code == 200 and not ProjectSecret.objects.filter(project=project).exists()
    assert client.post("/settings/secrets/delete", {"name": "JUDGE_KEY"}).status_code == 404


def test_a_refused_secret_keeps_its_name_for_the_form_page_never_its_value(project, users):
    """The refused form's page is drawn from the session (redirect-after-POST): the name goes there, the value never."""
    value = "sk-never-in-the-session-42"
    client = client_for(users["owner"])
    response = client.post("/settings/secrets/set", {"name": "9 bad", "value": value})
    assert response.status_code == 303
    stored = json.dumps([session.get_decoded() for session in Session.objects.all()])
    assert "9 bad" in stored and value not in stored
    html = client.get("/settings/secrets/").content.decode()
    assert 'value="9 bad"' in html and 'name="value" value=""' in html and value not in html
    assert not ProjectSecret.objects.filter(project=project).exists()
