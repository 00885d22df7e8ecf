"""The Data Hub repo page in a real browser: its tabs are a tab strip, and a writer deletes a branch
from the Branches table, or a file from the Files table, once the confirm dialog is accepted; Download repo
(.tar) and Download folder (.tar) save the shown ref's files.
Screenshots land in var/test-artifacts/ui/."""
from __future__ import annotations

import re
import tarfile

import pytest
from playwright.sync_api import expect

from datahub import commits, repos
from tests.conftest import sft_body
from training import services as training
from training.models import Status, TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ds(project):
    repo = repos.create_repo(project, "ds", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": b'{"text": "hi"}\n'}, "seed")
    return repo


def test_repo_tabs_are_a_strip_with_the_current_tab_marked(owner_page, ds):
    page = owner_page
    for url, current in (("/hub/acme/ds", "Files"), ("/hub/acme/ds/commits/main", "Commits")):
        page.goto(url)
        tabs = page.get_by_role("navigation", name="Repo")
        files, history = tabs.get_by_role("link", name="Files"), tabs.get_by_role("link", name="Commits")
        expect(tabs.get_by_role("link", name=current)).to_have_attribute("aria-current", "page")
        a, b = files.bounding_box(), history.bounding_box()
        assert a["y"] == b["y"] and b["x"] >= a["x"] + a["width"], (a, b)  # side by side, not stacked
        assert a["width"] < 200 and b["width"] < 200, (a, b)  # each as wide as its label, not the page
        page.shot(current.lower())


def test_delete_a_branch_asks_first_then_deletes_it(owner_page, project, users, ds):
    page = owner_page
    repos.create_branch(ds, "dev", "main")
    repos.create_branch(ds, "from-sha", "main")
    body = sft_body(dataset="ds@from-sha")
    run = training.create_run(project, users["owner"], name=body["name"], method="sft", base_model=body["base_model"], dataset=body["dataset"])
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    page.goto("/hub/acme/ds")
    branches = page.locator("#branches")
    expect(branches.get_by_role("row", name=re.compile(r"^main"))).to_contain_text("default branch")

    page.once("dialog", lambda dialog: dialog.dismiss())
    branches.get_by_role("button", name="Delete branch dev").click()
    page.wait_for_timeout(300)
    assert ds.branches.filter(name="dev").exists(), "dismissing the dialog deletes nothing"

    said: list[str] = []
    page.once("dialog", lambda dialog: (said.append(dialog.message), dialog.accept()))
    branches.get_by_role("button", name="Delete branch dev").click()
    expect(page.locator("#main > ul.messages")).to_contain_text("Deleted branch \u2068dev\u2069 of \u2068acme/ds\u2069")
    assert said and said[0].startswith("Delete branch \u2068dev\u2069 of \u2068acme/ds\u2069?"), said
    assert not ds.branches.filter(name="dev").exists()
    expect(page.locator("#branches")).not_to_contain_text("dev")

    # a branch a live run names: refused, with the run and what to do, above the table
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#branches").get_by_role("button", name="Delete branch from-sha").click()
    expect(page.locator("#branches").get_by_role("alert")).to_contain_text(f"run #{run.pk}")
    expect(page.locator("#branches").get_by_role("alert")).to_contain_text("then delete the branch")
    assert ds.branches.filter(name="from-sha").exists()
    page.shot("refused")


def test_delete_a_file_asks_first_then_shows_the_new_head(owner_page, ds):
    page = owner_page
    commits.commit_files(ds, "main", {"prefs.csv": b"prompt,chosen,rejected\nq,a,b\n"}, "prefs")
    before = repos.resolve(ds, "main")
    page.goto("/hub/acme/ds")
    files = page.locator("#files")
    expect(files.get_by_role("cell", name="prefs.csv", exact=True)).to_be_visible()

    page.once("dialog", lambda dialog: dialog.dismiss())
    files.get_by_role("button", name="Delete prefs.csv").click()
    page.wait_for_timeout(300)
    assert repos.resolve(ds, "main") == before, "dismissing the dialog deletes nothing"

    said: list[str] = []
    page.once("dialog", lambda dialog: (said.append(dialog.message), dialog.accept()))
    files.get_by_role("button", name="Delete prefs.csv").click()
    expect(page.locator("#main > ul.messages")).to_contain_text("Deleted \u2068prefs.csv\u2069 from branch \u2068main\u2069")
    assert said and said[0].startswith("Delete \u2068prefs.csv\u2069 from branch \u2068main\u2069 of \u2068acme/ds\u2069?"), said
    after = repos.resolve(ds, "main")
    assert after.parents == [before.pk] and set(repos.tree(after)) == {"train.jsonl"}
    expect(page.get_by_text(f"at commit {after.pk[:10]}")).to_be_visible()  # the page shows the new head
    expect(page.locator("#files")).not_to_contain_text("prefs.csv")
    expect(page.locator("#files").get_by_role("cell", name="train.jsonl", exact=True)).to_be_visible()
    page.shot("file-deleted")

    # another commit lands after the page was read: refused above the table, nothing deleted
    moved = commits.commit_files(ds, "main", {"later.txt": b"later"}, "someone else")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#files").get_by_role("button", name="Delete train.jsonl").click()
    expect(page.locator("#files").get_by_role("alert")).to_contain_text("moved since")
    expect(page.locator("#files").get_by_role("alert")).to_contain_text("delete the file again if it should still go")
    expect(page.locator("#files").get_by_role("cell", name="later.txt", exact=True)).to_be_visible()  # the table is the branch's head now
    expect(page.locator("#repo-head")).to_contain_text(f"at commit {moved.pk[:10]}")  # and so is the head line above it
    expect(page.locator("#branches").locator('tr[data-branch="main"]')).to_contain_text(moved.pk[:10])
    assert repos.resolve(ds, "main") == moved
    page.shot("file-refused")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#files").get_by_role("button", name="Delete train.jsonl").click()  # again, at the head it shows
    expect(page.locator("#main > ul.messages")).to_contain_text("Deleted \u2068train.jsonl\u2069 from branch \u2068main\u2069")
    assert set(repos.tree(repos.resolve(ds, "main"))) == {"later.txt"}
    expect(page.locator("#repo-head")).to_contain_text(f"at commit {repos.resolve(ds, 'main').pk[:10]}")


def test_a_file_delete_on_a_branch_deleted_since_lands_on_the_default_branch_saying_so(owner_page, ds):
    repos.create_branch(ds, "dev", "main")
    page = owner_page
    page.goto("/hub/acme/ds/tree/dev")
    head = commits.commit_files(ds, "main", {"later.txt": b"later"}, "someone else")
    repos.delete_branch(ds, "dev")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#files").get_by_role("button", name="Delete train.jsonl").click()
    expect(page.locator("#main > ul.messages")).to_contain_text("\u2068train.jsonl\u2069 was not deleted: \u2068acme/ds\u2069 has no branch \u2068'dev'\u2069")
    expect(page.locator("#repo-head")).to_contain_text(f"Ref main at commit {head.pk[:10]}")
    assert page.url.endswith("/hub/acme/ds/tree/main") and repos.resolve(ds, "main") == head


def test_download_repo_and_download_folder_save_the_tar_of_the_shown_ref(owner_page, ds, tmp_path):
    v1 = commits.commit_files(ds, "main", {"data/more/extra.jsonl": b'{"text": "more"}\n'}, "more")
    commits.commit_files(ds, "main", {"data/more/extra.jsonl": b'{"text": "changed"}\n'}, "changed later")
    page = owner_page
    for url, link, name, files in (
        (f"/hub/acme/ds/tree/{v1.pk}", "Download repo (.tar)", f"ds-{v1.pk[:10]}.tar",
         {"train.jsonl": b'{"text": "hi"}\n', "data/more/extra.jsonl": b'{"text": "more"}\n'}),
        ("/hub/acme/ds/tree/main/data", "Download folder (.tar)", "ds-main-data.tar", {"data/more/extra.jsonl": b'{"text": "changed"}\n'}),
    ):
        page.goto(url)
        with page.expect_download() as download:
            page.get_by_role("link", name=link).click()
        assert download.value.suggested_filename == name
        saved = tmp_path / name
        download.value.save_as(saved)
        with tarfile.open(saved) as tar:
            assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == files
