"""The Data Hub's forms in a real browser: create a repo, upload a .jsonl into a folder, see it in
the tree, and delete the repo by typing its name. Screenshots land in var/test-artifacts/ui/."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from datahub import repos
from datahub.models import Repo
from tests.ui.test_browser import check_page

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def hub_root(tmp_path, settings):
    settings.DATAHUB_ROOT = tmp_path / "hub"


def test_create_a_repo_upload_a_jsonl_and_delete_the_repo(owner_page, project, tmp_path):
    page = owner_page
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}?", "completion": str(2 * i)}) + "\n" for i in range(5)))

    page.goto("/hub/")
    page.get_by_label("Repo name").fill("support chats")
    page.get_by_label("Repo type").select_option("dataset")
    page.get_by_role("button", name="Create repo").click()
    expect(page.locator("#f-name-errors")).to_contain_text("letters, digits")  # refused beside its field
    page.get_by_label("Repo name").fill("support-chats")
    page.get_by_role("button", name="Create repo").click()
    expect(page).to_have_url(re.compile(r"/hub/acme/support-chats$"))
    expect(page.locator("#main > ul.messages")).to_contain_text("Created dataset repo \u2068acme/support-chats\u2069")
    check_page(page)
    page.shot("created")

    page.locator("input[type=file]#f-files").set_input_files(str(data))  # not by label: the Files table is a region named "Files" too
    page.get_by_label("Folder (optional)").fill("data")
    page.get_by_label("Commit message").fill("Add training data")
    page.get_by_role("button", name="Commit files").click()
    expect(page).to_have_url(re.compile(r"/hub/acme/support-chats/tree/main/data$"))
    expect(page.locator("#main > ul.messages")).to_contain_text("Committed 1 file to \u2068main\u2069")
    expect(page.get_by_role("cell", name="train.jsonl", exact=True)).to_be_visible()
    page.get_by_role("link", name="Preview").click()
    expect(page.get_by_role("table")).to_contain_text("3+3?")
    page.go_back()
    repo = Repo.objects.get(project=project, name="support-chats")
    assert repos.entry(repos.resolve(repo, "main"), "data/train.jsonl").blob.size == data.stat().st_size
    check_page(page)
    page.shot("uploaded")

    confirm = page.get_by_label("Type the repo name to confirm")
    confirm.fill("support")
    page.get_by_role("button", name="Delete this repo").click()
    expect(page.locator("#f-confirm-errors")).to_contain_text("type support-chats to confirm")
    # The top says what happened, and focus goes to the field with its finding, far below it.
    expect(page.locator("#main > ul.messages")).to_contain_text("\u2068acme/support-chats\u2069 was not deleted")
    expect(confirm).to_be_focused()
    expect(page.locator("#f-confirm-errors")).to_be_in_viewport()
    assert Repo.objects.filter(pk=repo.pk).exists()
    page.get_by_label("Type the repo name to confirm").fill("support-chats")
    page.get_by_role("button", name="Delete this repo").click()
    expect(page).to_have_url(re.compile(r"/hub/$"))
    expect(page.locator("#main > ul.messages")).to_contain_text("Deleted \u2068acme/support-chats\u2069")
    expect(page.locator('tr[data-repo="support-chats"]')).to_have_count(0)
    assert not Repo.objects.filter(pk=repo.pk).exists()
    page.shot("deleted")


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("R&amp;D.txt", None),  # Django's form parser read it as R&D.txt
        ("a\\b.txt", "use forward slashes"),  # and as b.txt
        ('say "hi".txt', "browsers send a quote or a line break in a file name as %22"),  # Chromium sends say %22hi%22.txt
    ],
)
def test_upload_files_commits_the_chosen_name_or_refuses_it(owner_page, project, tmp_path, name, refused):
    page = owner_page
    repo = repos.create_repo(project, "names", "dataset")
    head = repos.resolve(repo, "main")
    chosen = tmp_path / name
    chosen.write_text("x\n")
    page.goto("/hub/acme/names")
    page.locator("input[type=file]#f-files").set_input_files(str(chosen))
    page.get_by_role("button", name="Commit files").click()
    if refused is None:
        expect(page.locator("#main > ul.messages")).to_contain_text("Committed 1 file")
        assert set(repos.tree(repos.resolve(repo, "main"))) == {name}
    else:
        expect(page.locator("#f-files-errors")).to_contain_text(refused)
        assert repos.resolve(repo, "main") == head
