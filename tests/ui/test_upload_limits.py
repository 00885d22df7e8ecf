"""An upload of more files than one form may carry (DATA_UPLOAD_MAX_NUMBER_FILES): the browser
says so beside the Files field before sending anything, and the server answers its 400 sentence,
under DEBUG too (which skips handler400 and would show Django's technical page)."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from datahub import repos
from datahub.models import Commit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def repo(tmp_path, settings, project, users):
    settings.DATAHUB_ROOT = tmp_path / "hub"
    return repos.create_repo(project, "many", type="dataset", user=users["owner"])


def too_many() -> int:
    return settings.DATA_UPLOAD_MAX_NUMBER_FILES + 1


@pytest.mark.parametrize("debug", [True, False])
def test_too_many_files_is_the_400_sentence_also_under_debug(settings, repo, users, debug):
    settings.DEBUG = debug
    client = Client()
    client.force_login(users["owner"])
    files = [SimpleUploadedFile(f"f{i}.txt", b"x") for i in range(too_many())]
    response = client.post("/hub/acme/many/upload", {"files": files, "branch": "main", "message": "many"})
    assert response.status_code == 400
    html = response.content.decode()
    assert f"Too many files in one form: choose at most {settings.DATA_UPLOAD_MAX_NUMBER_FILES} in Files" in html
    assert "Traceback" not in html and "TooManyFilesSent" not in html
    assert not Commit.objects.filter(repo=repo, message="many").exists()


def test_the_browser_refuses_too_many_files_before_sending(owner_page, repo):
    page = owner_page
    page.goto("/hub/acme/many")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if request.url.endswith("/upload") else None)
    files = page.locator("input[type=file]#f-files")  # not by label: the Files table is a region named "Files" too
    files.set_input_files([{"name": f"f{i}.txt", "mimeType": "text/plain", "buffer": b"x"} for i in range(too_many())])
    assert files.evaluate("el => el.validationMessage") == (
        f"Choose at most {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files (these are {too_many()}): commit the rest in another upload.")
    page.get_by_role("button", name="Commit files").click()
    assert sent == []
    files.set_input_files([{"name": "one.txt", "mimeType": "text/plain", "buffer": b"x"}])
    assert files.evaluate("el => el.validationMessage") == ""
