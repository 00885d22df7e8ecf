"""The Data Hub pages' forms: New repo (the list), Upload files and Delete (the repo page). Each is
the API's own path; a refusal answers 303 to the form's page, which shows the finding beside its
field once, and stores nothing; viewers see no form and get 403, outsiders 404."""
from __future__ import annotations

import re
from html import unescape

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from datahub import commits, repos, uploads
from datahub.models import Blob, Commit, Repo, UploadSession
from tests.conftest import refused_form_page, sft_body
from tests.datahub.conftest import jsonl
from training import services as training
from training.models import Status, TrainingRun

ROWS = [{"prompt": "2+2?", "completion": "4"}, {"prompt": "3+3?", "completion": "6"}]


@pytest.fixture
def ds(project):
    repo = repos.create_repo(project, "ds", "dataset")
    commits.commit_files(repo, "main", {"notes/readme.txt": b"hi", "config": b"{}"}, "seed")
    return repo


def field_errors(html: str, field: str) -> str:
    """The text of the findings list shown beside `field` (the {% field %} tag's f-<field>-errors)."""
    found = re.search(rf'<ul class="field-errors" id="f-{field}-errors" role="alert">(.*?)</ul>', html, re.S)
    assert found, f"no findings beside {field}:\n{html[:3000]}"
    return re.sub(r"<[^>]+>", " ", found.group(1))


def page_message(html: str) -> str:
    """The message at the top of the page (base.html's messages), which a refused form at the
    bottom of a long page needs: the re-rendered page opens scrolled to the top."""
    found = re.search(r'<ul class="messages" role="status">(.*?)</ul>', html, re.S)
    assert found, html[:3000]
    return re.sub(r"<[^>]+>", " ", found.group(1))


def general_errors(html: str) -> str:
    found = re.search(r'<div class="alert alert-error" role="alert"[^>]*>(.*?)</div>', html, re.S)
    assert found, html[:3000]
    return re.sub(r"<[^>]+>", " ", found.group(1))


def files(*items: tuple[str, bytes]) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(name, data) for name, data in items]


# ---- New repo ----------------------------------------------------------------------------------

def test_new_repo_form_creates_the_repo_and_opens_its_page(browser, project, users):
    c = browser("member")
    assert 'action="/hub/new"' in c.get("/hub/").content.decode()
    r = c.post("/hub/new", {"name": " support-chats ", "type": "dataset"})
    assert r.status_code == 302 and r["Location"] == "/hub/acme/support-chats"
    repo = Repo.objects.get(project=project, name="support-chats")
    assert (repo.type, repo.created_by) == ("dataset", users["member"])
    page = c.get(r["Location"]).content.decode()
    assert "Created dataset repo \u2068acme/support-chats\u2069" in page and "Upload files" in page


@pytest.mark.parametrize(("values", "field", "said"), [
    ({"name": "", "type": "model"}, "name", "at least 1 character"),
    ({"name": "has space", "type": "model"}, "name", "letters, digits"),
    ({"name": "a..b", "type": "model"}, "name", "cannot contain &#x27;..&#x27;"),
    ({"name": "x" * 129, "type": "model"}, "name", "at most 128 characters"),
    ({"name": "fine", "type": "spreadsheet"}, "type", "model"),
    ({"name": "ds", "type": "dataset"}, "name", "acme already has a repo ds: choose another name"),  # says why, beside the field
])
def test_new_repo_form_refusals_name_the_field_and_store_nothing(browser, project, ds, values, field, said):
    before = set(Repo.objects.values_list("pk", flat=True))
    c = browser("owner")
    html = refused_form_page(c, "/hub/new", values, "/hub/")
    assert said in field_errors(html, field)
    assert f'value="{values["name"]}"' in html  # what was typed is kept
    assert set(Repo.objects.values_list("pk", flat=True)) == before
    again = c.get("/hub/").content.decode()  # a reload: a clean form, and nothing sent again
    assert 'class="field-errors"' not in again and (values["name"] == "" or f'value="{values["name"]}"' not in again)
    assert set(Repo.objects.values_list("pk", flat=True)) == before


def test_viewers_get_no_new_repo_form_and_403_on_post(browser, project):
    c = browser("viewer")
    assert 'action="/hub/new"' not in c.get("/hub/").content.decode()
    assert c.post("/hub/new", {"name": "mine", "type": "model"}).status_code == 403
    assert not Repo.objects.filter(name="mine").exists()


# ---- Upload files ------------------------------------------------------------------------------

def test_upload_commits_the_files_under_the_folder_on_the_branch(browser, project, users, ds, hub_root):
    repos.create_branch(ds, "dev", "main")
    c = browser("member")
    r = c.post("/hub/acme/ds/upload", {"files": files(("train.jsonl", jsonl(ROWS)), ("eval.jsonl", b"")), "folder": "data/",
                                       "branch": "dev", "message": "add data"})
    assert r.status_code == 302 and r["Location"] == "/hub/acme/ds/tree/dev/data", r.content[:2000]
    head = repos.resolve(ds, "dev")
    assert (head.message, head.author, head.parents) == ("add data", users["member"], [repos.resolve(ds, "main").pk])
    tree = repos.tree(head)
    assert set(tree) == {"notes/readme.txt", "config", "data/train.jsonl", "data/eval.jsonl"}
    assert tree["data/train.jsonl"].size == len(jsonl(ROWS)) and tree["data/eval.jsonl"].size == 0
    assert repos.resolve(ds, "main").message == "seed"  # only the chosen branch moved
    session = UploadSession.objects.get(repo=ds)
    assert session.state == UploadSession.State.COMMITTED and session.commit == head
    assert not uploads.staged_path(session.pk).exists()
    page = c.get(r["Location"]).content.decode()
    assert "train.jsonl" in page and "Committed 2 files to \u2068dev\u2069" in page


def test_upload_without_a_message_gets_the_default_one(browser, ds):
    r = browser("owner").post("/hub/acme/ds/upload", {"files": files(("a.txt", b"a")), "branch": "main", "message": ""})
    assert r.status_code == 302 and r["Location"] == "/hub/acme/ds/tree/main"
    assert repos.resolve(ds, "main").message == "Upload 1 file"


@pytest.mark.parametrize(("form", "field", "said"), [
    ({"branch": "main"}, "files", "choose one or more files"),
    ({"files": [("a.txt", b"a")], "folder": "../up", "branch": "main"}, "folder", "cannot contain &#x27;..&#x27;"),
    ({"files": [("a.txt", b"a")], "folder": "/abs", "branch": "main"}, "folder", "relative to the repo root"),
    ({"files": [("a.txt", b"a")], "branch": "nope"}, "branch", "upload to an existing branch"),
    ({"files": [("a.txt", b"a")], "folder": "config", "branch": "main"}, "files", "config/a.txt: config is a file on branch main"),
    ({"files": [("notes", b"a")], "branch": "main"}, "files", "notes: notes is a folder on branch main"),
    ({"files": [("a.txt", b"a"), ("a.txt", b"b")], "branch": "main"}, "files", "a.txt: list each path once"),
    ({"files": [("a.txt", b"a")], "branch": "main", "message": "m" * 5001}, "message", "at most 5000 characters"),
    ({"files": [("a.txt", b"a")], "branch": "main", "message": "nul \x00 here"}, "message", "NUL"),
])
def test_upload_refusals_name_the_field_and_commit_nothing(browser, ds, hub_root, form, field, said):
    head, blobs = repos.resolve(ds, "main").pk, Blob.objects.count()
    body = {**form, "files": files(*form.get("files", []))}
    html = refused_form_page(browser("owner"), "/hub/acme/ds/upload", body, "/hub/acme/ds/tree/main")
    assert said in field_errors(html, field)
    assert "Nothing was committed: see Upload files below" in page_message(html)
    assert repos.resolve(ds, "main").pk == head and Commit.objects.filter(repo=ds).count() == 2
    assert Blob.objects.count() == blobs
    assert not UploadSession.objects.filter(repo=ds).exclude(state=UploadSession.State.ABORTED).exists()
    staging = hub_root / "staging" / "uploads"
    assert not staging.exists() or not any(staging.iterdir()), "nothing is left staged"


def test_viewers_get_no_upload_or_delete_form_and_403_on_post(browser, ds):
    c = browser("viewer")
    page = c.get("/hub/acme/ds").content.decode()
    assert "Upload files" not in page and "Delete this repo" not in page and "/hub/acme/ds/upload" not in page
    assert c.post("/hub/acme/ds/upload", {"files": files(("a.txt", b"a")), "branch": "main"}).status_code == 403
    assert c.post("/hub/acme/ds/delete", {"confirm": "ds"}).status_code == 403
    assert Repo.objects.filter(pk=ds.pk).exists() and repos.resolve(ds, "main").message == "seed"
    outsider = browser("outsider")
    assert outsider.post("/hub/acme/ds/upload", {"files": files(("a.txt", b"a")), "branch": "main"}).status_code == 404
    assert outsider.post("/hub/acme/ds/delete", {"confirm": "ds"}).status_code == 404


# ---- Delete ------------------------------------------------------------------------------------

def test_delete_form_deletes_once_the_name_is_typed(browser, project, ds):
    c = browser("member")
    r = c.post("/hub/acme/ds/delete", {"confirm": "ds"})
    assert r.status_code == 302 and r["Location"] == "/hub/"
    assert not Repo.objects.filter(pk=ds.pk).exists()
    page = c.get("/hub/").content.decode()
    assert "Deleted \u2068acme/ds\u2069" in page and 'data-repo="ds"' not in page
    assert c.get("/hub/acme/ds").status_code == 404


@pytest.mark.parametrize("typed", ["", "DS", "acme/ds", "d"])
def test_delete_form_with_the_wrong_name_typed_is_refused_and_keeps_the_repo(browser, ds, typed):
    c = browser("owner")
    html = refused_form_page(c, "/hub/acme/ds/delete", {"confirm": typed}, "/hub/acme/ds")
    assert "type ds to confirm" in field_errors(html, "confirm")
    assert f'name="confirm" value="{typed}"' in html or not typed  # what was typed is kept
    assert "\u2068acme/ds\u2069 was not deleted: see Delete this repo below" in page_message(html)
    assert Repo.objects.filter(pk=ds.pk).exists()
    assert 'id="f-confirm-errors"' not in c.get("/hub/acme/ds").content.decode()  # a reload: a clean form


def test_delete_form_while_a_live_run_uses_the_repo_is_409_saying_what_to_do(browser, project, users, ds):
    body = sft_body(dataset="ds@main")
    run = training.create_run(project, users["owner"], name=body["name"], method="sft", base_model=body["base_model"], dataset=body["dataset"])
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    html = refused_form_page(browser("owner"), "/hub/acme/ds/delete", {"confirm": "ds"}, "/hub/acme/ds")
    said = general_errors(html)
    assert "acme/ds is used by 1 live run" in said and f"run #{run.pk}" in said and "stop the run" in said
    assert "\u2068acme/ds\u2069 was not deleted" in page_message(html)
    assert Repo.objects.filter(pk=ds.pk).exists()
    # Focused without JavaScript too: the error summary, which says what to do, not a field.
    assert re.search(r'<div class="alert alert-error" role="alert" tabindex="-1" data-error-summary autofocus>', html) and html.count("autofocus") == 1


def test_more_files_than_a_form_takes_is_a_400_page_saying_the_limit(users, ds, settings):
    """Django refuses such a form while the CSRF check reads it, before the view: the 400 page
    (studio.views.bad_request) says which field and what limit."""
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    c = Client(enforce_csrf_checks=True)
    c.force_login(users["owner"])
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', c.get("/hub/acme/ds").content.decode()).group(1)
    r = c.post("/hub/acme/ds/upload", {"csrfmiddlewaretoken": token, "branch": "main", "files": files(*[(f"f{i}.txt", b"x") for i in range(4)])})
    assert r.status_code == 400
    assert "choose at most 3 in Files" in r.content.decode()
    assert repos.resolve(ds, "main").message == "seed" and not UploadSession.objects.filter(repo=ds).exists()


# ---- Delete branch -----------------------------------------------------------------------------

def branches_table(html: str) -> str:
    found = re.search(r'<section class="card" id="branches".*?</section>', html, re.S)
    assert found, html[:3000]
    return found.group(0)


def test_writers_get_a_delete_form_for_each_branch_but_the_default_that_asks_first(browser, ds):
    repos.create_branch(ds, "dev", "main")
    repos.create_tag(ds, "v1", "main")
    table = branches_table(browser("member").get("/hub/acme/ds").content.decode())
    assert 'action="/hub/acme/ds/branches/dev/delete"' in table and 'hx-post="/hub/acme/ds/branches/dev/delete"' in table
    assert 'hx-confirm="Delete branch \u2068dev\u2069 of \u2068acme/ds\u2069?' in table
    assert "/branches/main/delete" not in table and "default branch" in table
    # a viewer reads the table (the page's head names the first branches only) but deletes nothing
    viewers = branches_table(browser("viewer").get("/hub/acme/ds").content.decode())
    assert 'data-branch="dev"' in viewers and "/delete" not in viewers and "Actions" not in viewers


@pytest.mark.parametrize("htmx", [False, True])
def test_delete_branch_form_deletes_it_and_keeps_its_commits(browser, ds, htmx):
    repos.create_branch(ds, "dev", "main")
    dev = commits.commit_files(ds, "dev", {"dev.txt": b"dev"}, "on dev")
    c = browser("member")
    r = c.post("/hub/acme/ds/branches/dev/delete", **({"HTTP_HX_REQUEST": "true"} if htmx else {}))
    if htmx:
        assert r.status_code == 204 and r["HX-Redirect"] == "/hub/acme/ds"
    else:
        assert r.status_code == 302 and r["Location"] == "/hub/acme/ds"
    assert not ds.branches.filter(name="dev").exists()
    assert repos.resolve(ds, dev.pk) == dev  # its commits stay
    page = c.get("/hub/acme/ds").content.decode()
    assert "Deleted branch \u2068dev\u2069 of \u2068acme/ds\u2069" in page_message(page) and 'data-branch="dev"' not in page


@pytest.mark.parametrize("htmx", [False, True])
def test_delete_branch_form_refusals_say_why_and_keep_the_branch(browser, project, users, ds, htmx):
    """The same refusals as the API's DELETE: the default branch, a run's branch, a branch a live run names."""
    repos.create_branch(ds, "from-sha", "main")
    body = sft_body(dataset="ds@from-sha")
    run = training.create_run(project, users["owner"], name=body["name"], method="sft", base_model=body["base_model"], dataset=body["dataset"])
    experiment_repo = f"experiment-{run.experiment.slug}"
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    c = browser("owner")
    for url, said in (("/hub/acme/ds/branches/from-sha/delete", f"run #{run.pk}"),
                      ("/hub/acme/ds/branches/main/delete", "default branch"),
                      (f"/hub/acme/{experiment_repo}/branches/run-{run.pk}/delete", f"delete run #{run.pk} first")):
        if htmx:  # the Branches table alone, swapped in place
            r = c.post(url, **headers)
            assert r.status_code == 409, (url, r.status_code)
            html = r.content.decode()
            assert html.lstrip().startswith('<section class="card" id="branches"'), html[:300]
        else:
            html = refused_form_page(c, url, {}, url.partition("/branches/")[0])
            assert "was not deleted: see Branches below" in page_message(html)
        assert said in general_errors(branches_table(html)), (url, html[:3000])
    assert set(ds.branches.values_list("name", flat=True)) == {"main", "from-sha"}
    assert Repo.objects.get(name=experiment_repo).branches.filter(name=f"run-{run.pk}").exists()
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    assert c.post("/hub/acme/ds/branches/from-sha/delete").status_code == 302
    assert set(ds.branches.values_list("name", flat=True)) == {"main"}


def test_viewers_and_outsiders_cannot_delete_a_branch(browser, ds):
    repos.create_branch(ds, "dev", "main")
    assert browser("viewer").post("/hub/acme/ds/branches/dev/delete").status_code == 403
    assert browser("outsider").post("/hub/acme/ds/branches/dev/delete").status_code == 404
    assert browser("owner").post("/hub/acme/ds/branches/nope/delete").status_code == 404
    assert ds.branches.filter(name="dev").exists()


# ---- Delete a file -----------------------------------------------------------------------------

def files_table(html: str) -> str:
    found = re.search(r'<div id="files">.*?</table></div>\s*</div>', html, re.S)
    assert found, html[:3000]
    return found.group(0)


def test_writers_get_a_delete_form_for_each_file_on_a_branch_that_asks_first(browser, ds):
    head = repos.resolve(ds, "main")
    repos.create_tag(ds, "v1", "main")
    table = files_table(browser("member").get("/hub/acme/ds").content.decode())
    assert 'action="/hub/acme/ds/delete/main/config"' in table and 'hx-post="/hub/acme/ds/delete/main/config"' in table
    assert 'hx-confirm="Delete \u2068config\u2069 from branch \u2068main\u2069 of \u2068acme/ds\u2069? It goes in a new commit; earlier commits keep it."' in table
    assert f'name="parent" value="{head.pk}"' in table
    notes = files_table(browser("member").get("/hub/acme/ds/tree/main/notes").content.decode())
    assert 'action="/hub/acme/ds/delete/main/notes/readme.txt"' in notes
    # a tag or a commit never changes: no Delete there; nor for a viewer
    for url, role in (("/hub/acme/ds/tree/v1", "owner"), (f"/hub/acme/ds/tree/{head.pk}", "owner"), ("/hub/acme/ds", "viewer")):
        table = files_table(browser(role).get(url).content.decode())
        assert "config" in table and "/delete/" not in table and "Delete" not in table, url


@pytest.mark.parametrize("htmx", [False, True])
def test_delete_file_form_deletes_it_and_shows_the_new_head(browser, users, ds, htmx):
    commits.commit_files(ds, "main", {"notes/todo.txt": b"todo"}, "todo")
    c = browser("member")
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    for path, folder_url in (("notes/readme.txt", "/hub/acme/ds/tree/main/notes"), ("notes/todo.txt", "/hub/acme/ds/tree/main")):
        before = repos.resolve(ds, "main")
        r = c.post(f"/hub/acme/ds/delete/main/{path}", {"parent": before.pk}, **headers)
        if htmx:
            assert r.status_code == 204 and r["HX-Redirect"] == folder_url
        else:
            assert r.status_code == 302 and r["Location"] == folder_url  # the folder, or the one above once it is empty
        after = repos.resolve(ds, "main")
        assert (after.parents, after.message, after.author) == ([before.pk], f"Delete {path}", users["member"])
        assert path not in repos.tree(after) and path in repos.tree(before)
        page = c.get(folder_url).content.decode()
        assert f"Deleted \u2068{path}\u2069 from branch \u2068main\u2069 as commit {after.pk[:10]}" in page_message(page)
        assert f"at commit <code>{after.pk[:10]}</code>" in page and f'data-file="{path}"' not in page
    assert set(repos.tree(repos.resolve(ds, "main"))) == {"config"}


@pytest.mark.parametrize("htmx", [False, True])
def test_delete_file_form_refusals_say_why_and_keep_the_file(browser, project, users, ds, htmx):
    """A branch that moved since the page was read, and a run's branch while the run exists."""
    seen = repos.resolve(ds, "main")
    moved = commits.commit_files(ds, "main", {"later.txt": b"later"}, "later")
    run = training.create_run(project, users["owner"], name="r", method="sft", base_model="org/base", dataset="org/data")
    experiment_repo = Repo.objects.get(name=f"experiment-{run.experiment.slug}")
    commits.commit_files(experiment_repo, f"run-{run.pk}", {"final/w.bin": b"w"}, "final")
    run_head = repos.resolve(experiment_repo, f"run-{run.pk}")
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    c = browser("owner")
    for url, parent, said, page in (("/hub/acme/ds/delete/main/config", seen.pk, f"moved since {seen.pk[:10]}", "/hub/acme/ds/tree/main"),
                                    (f"/hub/acme/{experiment_repo.name}/delete/run-{run.pk}/final/w.bin", run_head.pk, f"delete run #{run.pk} first",
                                     f"/hub/acme/{experiment_repo.name}/tree/run-{run.pk}/final")):
        if htmx:  # the Files table alone, swapped in place
            r = c.post(url, {"parent": parent}, **headers)
            assert r.status_code == 409, (url, r.status_code)
            html = r.content.decode()
            assert html.lstrip().startswith('<div id="files">'), html[:300]
        else:  # the Files page of the file's folder
            html = refused_form_page(c, url, {"parent": parent}, page)
            assert "was not deleted: see Files below" in page_message(html)
        assert said in general_errors(files_table(html)), (url, html[:3000])
    assert repos.resolve(ds, "main") == moved and "config" in repos.tree(moved)
    assert repos.resolve(experiment_repo, f"run-{run.pk}") == run_head


def head_line(html: str) -> str:
    found = re.search(r'<p id="repo-head"[^>]*>(.*?)</p>', html, re.S)
    assert found, html[:3000]
    return found.group(0)


def test_a_refused_htmx_delete_moves_the_pages_head_and_branches_to_the_branchs_real_head(browser, ds):
    """htmx swaps the Files table alone: the head line above it and the Branches table, which showed
    the head the page was read at, come back out of band at the branch's real head."""
    seen = repos.resolve(ds, "main")
    moved = commits.commit_files(ds, "main", {"later.txt": b"later"}, "someone else")
    r = browser("owner").post("/hub/acme/ds/delete/main/config", {"parent": seen.pk}, HTTP_HX_REQUEST="true")
    assert r.status_code == 409
    html = r.content.decode()
    head = head_line(html)
    assert 'hx-swap-oob="true"' in head and f"at commit <code>{moved.pk[:10]}</code>" in head and seen.pk[:10] not in head
    branches = re.search(r'<section class="card" id="branches"[^>]*hx-swap-oob="true">.*?</section>', html, re.S)
    assert branches and f'<tr data-branch="main"><td><a href="/hub/acme/ds/tree/main"><code>main</code></a></td><td><code>{moved.pk[:10]}</code>' in branches.group(0)
    assert repos.resolve(ds, "main") == moved and "config" in repos.tree(moved)


@pytest.mark.parametrize("htmx", [False, True])
def test_a_delete_on_a_branch_deleted_since_shows_the_default_branch_at_its_head(browser, ds, htmx):
    """A 404 (the branch went since the page was read): htmx swaps no 404, so it is sent to the
    page, which names the branch that is gone and shows main at its real head; so is a plain form (303)."""
    repos.create_branch(ds, "dev", "main")
    seen = repos.resolve(ds, "dev")
    head = commits.commit_files(ds, "main", {"later.txt": b"later"}, "someone else")
    repos.delete_branch(ds, "dev")
    c = browser("owner")
    if htmx:
        r = c.post("/hub/acme/ds/delete/dev/config", {"parent": seen.pk}, HTTP_HX_REQUEST="true")
        assert r.status_code == 404 and r["HX-Redirect"] == "/hub/acme/ds/tree/main"
        page = c.get(r["HX-Redirect"]).content.decode()
        said = unescape(page_message(page))
    else:
        page = refused_form_page(c, "/hub/acme/ds/delete/dev/config", {"parent": seen.pk}, "/hub/acme/ds/tree/main")
        said = unescape(general_errors(files_table(page)))
    assert "\u2068config\u2069 was not deleted: \u2068acme/ds\u2069 has no branch \u2068'dev'\u2069" in said and "pick a branch above" in said
    assert f"Ref <code>main</code> at commit <code>{head.pk[:10]}</code>" in head_line(page)
    assert repos.resolve(ds, "main") == head and "config" in repos.tree(head)


def test_a_delete_of_a_file_gone_since_shows_the_branch_at_its_head(browser, ds):
    """Without `parent` (a form from before it was sent), a file another commit removed is refused
    on the page of the branch at the head that removed it."""
    gone = commits.commit_files(ds, "main", {}, "someone else", delete=["config"])
    html = refused_form_page(browser("owner"), "/hub/acme/ds/delete/main/config", {}, "/hub/acme/ds/tree/main")
    assert "has no file or folder 'config'" in unescape(general_errors(files_table(html)))
    assert f"at commit <code>{gone.pk[:10]}</code>" in head_line(html)
    assert repos.resolve(ds, "main") == gone


def test_viewers_and_outsiders_cannot_delete_a_file(browser, ds):
    head = repos.resolve(ds, "main")
    repos.create_tag(ds, "v1", "main")
    assert browser("viewer").post("/hub/acme/ds/delete/main/config", {"parent": head.pk}).status_code == 403
    assert browser("outsider").post("/hub/acme/ds/delete/main/config", {"parent": head.pk}).status_code == 404
    assert "no file or folder" in refused_form_page(browser("owner"), "/hub/acme/ds/delete/main/nope.txt", {"parent": head.pk}, "/hub/acme/ds/tree/main")
    assert "has no branch" in refused_form_page(browser("owner"), "/hub/acme/ds/delete/v1/config", {}, "/hub/acme/ds/tree/main")  # a tag never changes
    assert browser("owner").post("/hub/acme/ds/delete/main/a/../config").status_code == 404
    assert repos.resolve(ds, "main") == head
