"""The repo page's Upload files commits each file under the exact name the browser sent, or refuses
it as the API would: Django's `UploadedFile.name` is a sanitised name (HTML entities unescaped,
what precedes a backslash dropped, cut to 255 characters), which the form committed silently."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from datahub import commits, repos
from datahub.models import UploadSession

BOUNDARY = "studio-test-boundary"


@pytest.fixture
def ds(project):
    repo = repos.create_repo(project, "ds", "dataset")
    commits.commit_files(repo, "main", {"seed.txt": b"hi"}, "seed")
    return repo


def post_form(client: Client, names: list[str], branch: str = "main"):
    """POST the form as a browser does: each file's name in its part's filename, as given (the test
    client's own encoding goes through UploadedFile.name, which would cut a long name first)."""
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="branch"\r\n\r\n{branch}\r\n'.encode()]
    for name in names:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\nContent-Type: text/plain\r\n\r\n'.encode() + b"bytes\r\n"
        )
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return client.post("/hub/acme/ds/upload", body, content_type=f"multipart/form-data; boundary={BOUNDARY}")


def upload_errors(client: Client) -> str:
    html = client.get("/hub/acme/ds/tree/main").content.decode()
    found = re.search(r'<ul class="field-errors" id="f-files-errors" role="alert">(.*?)</ul>', html, re.S)
    assert found, html[:3000]
    return unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


@pytest.mark.parametrize("name", ["R&amp;D.txt", "caf\u00e9 & co.txt", "a&lt;b&gt;.jsonl"])
def test_a_name_with_what_reads_as_an_entity_is_committed_as_sent(browser, ds, name):
    response = post_form(browser("owner"), [name])
    assert response.status_code == 302, response.content[:2000]
    assert set(repos.tree(repos.resolve(ds, "main"))) == {"seed.txt", name}


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a\\b.txt", "a\\b.txt: use forward slashes"),
        ("x" * 300 + ".txt", "at most 246 bytes"),
        ("100%22 sure.txt", "browsers send a quote or a line break in a file name as %22"),
    ],
)
def test_a_name_the_api_would_refuse_is_refused_not_renamed(browser, ds, name, says):
    head = repos.resolve(ds, "main")
    client = browser("owner")
    response = post_form(client, ["ok.txt", name])
    assert response.status_code == 303, response.content[:2000]
    assert says in upload_errors(client)
    assert repos.resolve(ds, "main") == head  # nothing committed: not b.txt, not a name cut to 255
    assert not UploadSession.objects.filter(state=UploadSession.State.COMMITTED).exists()
