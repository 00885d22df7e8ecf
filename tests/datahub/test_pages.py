"""The repo browser pages: files at a ref, commits, compare, dataset preview; outsiders get 404."""
from __future__ import annotations

import re

import pytest

from datahub import commits, repos
from tests.datahub.conftest import jsonl


def test_repo_pages_show_files_commits_diff_and_preview(browser, project):
    repo = repos.create_repo(project, "prefs", "dataset")
    first = commits.commit_files(repo, "main", {"data/train.jsonl": jsonl([{"prompt": "q", "chosen": "a", "rejected": "b"}]), "README.md": b"hi"}, "data")
    second = commits.commit_files(repo, "main", {"README.md": b"hello"}, "readme")
    c = browser("viewer")
    assert "acme/prefs" in c.get("/hub/").content.decode()
    page = c.get("/hub/acme/prefs").content.decode()
    assert "data/" in page and "README.md" in page
    assert "train.jsonl" in c.get("/hub/acme/prefs/tree/main/data").content.decode()
    assert "readme" in c.get("/hub/acme/prefs/commits/main").content.decode()
    diff = c.get(f"/hub/acme/prefs/compare/{first.pk}...{second.pk}").content.decode()
    assert "README.md" in diff and "train.jsonl" not in diff
    preview = c.get("/hub/acme/prefs/preview/main/data/train.jsonl").content.decode()
    assert "prompt/chosen/rejected" in preview
    download = c.get("/hub/datasets/acme/prefs/resolve/main/README.md")  # a dataset's files, as the Hub serves them
    assert b"".join(download.streaming_content) == b"hello"
    assert 'href="/hub/datasets/acme/prefs/resolve/main/README.md" download' in page
    assert c.get("/hub/acme/prefs/resolve/main/README.md").status_code == 404  # the models path is for models


def test_outsider_gets_404_pages(browser, project):
    repos.create_repo(project, "prefs", "dataset")
    c = browser("outsider")
    assert c.get("/hub/acme/prefs").status_code == 404
    assert c.get("/hub/acme/prefs/commits/main").status_code == 404
    assert "acme/prefs" not in c.get("/hub/").content.decode()


@pytest.mark.parametrize("path", ["..%2Fx", "a/../b", "a//b", "nul%00"])
def test_tree_page_of_a_path_that_cannot_exist_is_404(browser, project, path):
    repo = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(repo, "main", {"x": b"x"}, "x")
    assert browser("viewer").get(f"/hub/acme/prefs/tree/main/{path}").status_code == 404


def test_tree_page_of_a_path_not_on_the_ref_is_404_saying_so(browser, project):
    repo = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(repo, "main", {"data/train.jsonl": b"{}\n", "README.md": b"hi"}, "data")
    c = browser("viewer")
    r = c.get("/hub/acme/prefs/tree/main/nonexistent")
    assert r.status_code == 404
    assert "nonexistent is not on main" in r.content.decode() and "No files" not in r.content.decode()
    r = c.get("/hub/acme/prefs/tree/main/README.md")
    assert r.status_code == 404 and "README.md is a file, not a folder" in r.content.decode()
    assert c.get("/hub/acme/prefs/tree/main/data").status_code == 200
    # an empty repo's root is still a page, with its empty listing
    repos.create_repo(project, "empty", "dataset")
    r = c.get("/hub/acme/empty/tree/main")
    assert r.status_code == 200 and "No files at this ref" in r.content.decode()


def test_compare_page_of_refs_with_dots(browser, project):
    repo = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(repo, "main", {"a.txt": b"a"}, "a")
    repos.create_tag(repo, "v1.0", "main")
    repos.create_branch(repo, "dev.2", "main")
    commits.commit_files(repo, "dev.2", {"b.txt": b"b"}, "b")
    r = browser("viewer").get("/hub/acme/prefs/compare/v1.0...dev.2")
    assert r.status_code == 200, r.status_code
    page = r.content.decode()
    assert "v1.0 → dev.2" in page and "b.txt" in page and "a.txt" not in page
    from django.urls import reverse

    assert reverse("datahub:compare", args=["acme", "prefs", "v1.0", "dev.2"]) == "/hub/acme/prefs/compare/v1.0...dev.2"


def test_the_preview_table_says_which_rows_it_shows_and_which_it_could_not_read(browser, project):
    # It said "First 4 rows" over rows 1 to 5, row 3 (not JSON) being said above it: a user counted a row missing.
    repo = repos.create_repo(project, "prefs", "dataset")
    good = jsonl([{"prompt": "q", "chosen": "a", "rejected": "b"}] * 2)
    commits.commit_files(repo, "main", {"t.jsonl": good + b"{not json\n" + good, "ok.jsonl": good}, "data")
    c = browser("viewer")
    caption = re.search(r'<caption data-testid="preview-caption">([^<]*)</caption>', c.get("/hub/acme/prefs/preview/main/t.jsonl").content.decode())
    assert caption.group(1) == "Rows 1 to 5, but for row 3, which could not be read (above)", caption.group(1)
    caption = re.search(r'<caption data-testid="preview-caption">([^<]*)</caption>', c.get("/hub/acme/prefs/preview/main/ok.jsonl").content.decode())
    assert caption.group(1) == "Rows 1 to 2"


def test_tree_page_offers_preview_only_where_the_preview_works(browser, project):
    """Dot-folders and dot-files are not dataset files (data_entries, and what the trainer reads)."""
    repo = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(repo, "main", {".hidden/x.jsonl": b'{"text": "a"}\n', "data/y.jsonl": b'{"text": "b"}\n'}, "data")
    c = browser("viewer")
    assert "Preview" not in c.get("/hub/acme/prefs/tree/main/.hidden").content.decode()
    assert c.get("/hub/acme/prefs/preview/main/.hidden/x.jsonl").status_code == 404
    assert "/hub/acme/prefs/preview/main/data/y.jsonl" in c.get("/hub/acme/prefs/tree/main/data").content.decode()
    # Each Preview link names its file for a screen reader's list of links, as Download does.
    assert re.search(r'preview/main/data/y\.jsonl">Preview<span class="visually-hidden"> data/y\.jsonl</span></a>',
                     c.get("/hub/acme/prefs/tree/main/data").content.decode())
    assert c.get("/hub/acme/prefs/preview/main/data/y.jsonl").status_code == 200


def test_repo_tabs_are_a_list_like_the_other_pages_tabs_with_the_current_one_marked(browser, project):
    """nav.tabs held bare links, which studio.css (`.tabs ul`, as on a run's page) does not lay out
    as a tab strip: they stacked as full-width blocks."""
    repo = repos.create_repo(project, "prefs", "dataset")
    first = repos.resolve(repo, "main")
    second = commits.commit_files(repo, "main", {"a.jsonl": jsonl([{"text": "a"}])}, "a")
    c = browser("viewer")
    for url, current in (("/hub/acme/prefs", "Files"), ("/hub/acme/prefs/commits/main", "Commits"),
                         ("/hub/acme/prefs/preview/main/a.jsonl", "Files"), (f"/hub/acme/prefs/compare/{first.pk}...{second.pk}", "Compare")):
        html = c.get(url).content.decode()
        nav = re.search(r'<nav class="tabs" aria-label="Repo">\s*<ul>(.*?)</ul>\s*</nav>', html, re.S)
        assert nav, (url, html[:2000])
        items = re.findall(r"<li><a href=\"([^\"]+)\"( aria-current=\"page\")?>([^<]+)</a></li>", nav.group(1))
        assert [label for _, _, label in items][:2] == ["Files", "Commits"], (url, nav.group(1))
        assert [label for _, marked, label in items if marked] == [current], (url, nav.group(1))
        assert all(href.startswith("/hub/acme/prefs") for href, _, _ in items), items


def test_folders_and_files_with_numbers_list_in_number_order(browser, project):
    # checkpoints/ listed step-120 … step-320, then step-40 and step-80 (text order).
    repo = repos.create_repo(project, "steps", "model")
    commits.commit_files(repo, "main", {f"checkpoints/step-{n}/w.bin": b"w" for n in (320, 40, 120, 80)} | {f"logs/part-{n}.txt": b"l" for n in (10, 9)}, "steps")
    c = browser("viewer")
    page = c.get("/hub/acme/steps/tree/main/checkpoints").content.decode()
    assert re.findall(r"step-(\d+)/</a>", page) == ["40", "80", "120", "320"]
    page = c.get("/hub/acme/steps/tree/main/logs").content.decode()
    assert page.index("part-9.txt") < page.index("part-10.txt")


def test_preview_rows_show_their_own_numbers_after_a_bad_line(browser, project):
    """Line 11 is not JSON: the problems said "Row 11", and the table's 11th row showed line 12."""
    repo = repos.create_repo(project, "prefs", "dataset")
    lines = [f'{{"text": "line {n}"}}' for n in range(1, 11)] + ['{"text": ', '{"text": "line 12"}']
    commits.commit_files(repo, "main", {"bad.jsonl": ("\n".join(lines) + "\n").encode()}, "data")
    html = browser("viewer").get("/hub/acme/prefs/preview/main/bad.jsonl").content.decode()
    assert "Row 11: not valid JSON" in html
    table = re.search(r"<tbody>(.*?)</tbody>", html, re.S).group(1)
    numbered = dict(re.findall(r"<tr><td>(\d+)</td><td[^>]*>([^<]*)</td></tr>", table))
    assert list(numbered) == [str(n) for n in (*range(1, 11), 12)], numbered
    assert numbered["12"] == "line 12" and numbered["10"] == "line 10"
    assert re.search(r'<th scope="col">Row</th>', html)


@pytest.mark.parametrize(("kind", "snippet"), [
    ("dataset", 'datasets.load_dataset("acme/things", revision="dev")'),
    ("model", 'from_pretrained("acme/things", revision="dev")'),
])
def test_the_repo_card_says_how_to_load_a_repo_of_its_type(browser, project, kind, snippet):
    repo = repos.create_repo(project, "things", kind)
    repos.create_branch(repo, "dev", "main")
    html = browser("viewer").get("/hub/acme/things/tree/dev").content.decode()
    assert "HF_ENDPOINT=http://testserver/hub" in html and f"<code>{snippet}</code>" in html, html[:3000]
    assert ("from_pretrained" in html) == (kind == "model") and ("load_dataset" in html) == (kind == "dataset")


def test_experiment_and_environment_repos_say_how_they_are_used(browser, project):
    # An experiment branch's model is in final/ (from_pretrained at the root failed), and an environment
    # is a package, not a model to load.
    from datahub.services import provision_experiment_repo
    from experiments.services import create_experiment

    repo = provision_experiment_repo(create_experiment(project, "sweep"))
    commits.commit_files(repo, repo.default_branch, {"README.md": b"sweep"}, "start")
    repos.create_branch(repo, "run-7", repo.default_branch)
    commits.commit_files(repo, "run-7", {"final/config.json": b"{}", "final/model.safetensors": b"x"}, "final")
    html = browser("viewer").get(f"/hub/acme/{repo.name}/tree/run-7").content.decode()
    card = html[html.index("HF_ENDPOINT") - 400:html.index("HF_ENDPOINT") + 600] if "HF_ENDPOINT" in html else html[-4000:]
    assert 'subfolder="final")' in html and "use it in a run as" not in html, card
    repos.create_repo(project, "my-env", "environment")
    html = browser("viewer").get("/hub/acme/my-env").content.decode()
    assert "from_pretrained" not in html and "config.environment_id" in html and "my-env@main" in html


def test_repo_pages_of_another_project_show_its_role_and_a_run_ref_that_works(browser, project, other_project, users):
    # member is a member of acme (the session's current project) and a viewer of globex: globex's repo
    # pages must say viewer, and tell how a run can use the repo (a run of acme refuses globex's repos).
    from studio.auth import SESSION_PROJECT_KEY
    from studio.services import add_member

    add_member(other_project, users["member"], "viewer")
    theirs = repos.create_repo(other_project, "prefs", "dataset")
    first = commits.commit_files(theirs, "main", {"data/train.jsonl": jsonl([{"prompt": "q", "completion": "a"}])}, "data")
    second = commits.commit_files(theirs, "main", {"README.md": b"hi"}, "readme")
    repos.create_repo(other_project, "env", "environment")
    ours = repos.create_repo(project, "prefs", "dataset")
    commits.commit_files(ours, "main", {"README.md": b"hi"}, "readme")
    c = browser("member")
    session = c.session
    session[SESSION_PROJECT_KEY] = "acme"
    session.save()

    for url in ("/hub/globex/prefs", "/hub/globex/prefs/tree/main/data", "/hub/globex/prefs/commits/main",
                f"/hub/globex/prefs/compare/{first.pk}...{second.pk}", "/hub/globex/prefs/preview/main/data/train.jsonl", "/hub/globex/env"):
        page = c.get(url)
        assert page.status_code == 200, url
        html = page.content.decode()
        assert '<span class="role">(viewer)</span>' in html and "(member)" not in html, url
        assert '<option value="globex" selected>' in html, url
    html = c.get("/hub/globex/prefs").content.decode()
    assert "use it in a run of project globex as <code>prefs@main</code> (not in a run of acme: a run uses only its own project's repos)." in html
    assert "and a Studio token of project globex:" in html
    html = c.get("/hub/globex/env").content.decode()
    assert "Use it in a GRPO run of project globex as <code>config.environment_id</code> <code>env@main</code> (not in a run of acme" in html

    # the current project's own repo is as it was: the member's role, the ref a run of acme takes
    html = c.get("/hub/acme/prefs").content.decode()
    assert '<span class="role">(member)</span>' in html and "use it in a run as <code>prefs@main</code>." in html
    assert "not in a run of" not in html and "a Studio token:" in html


def test_the_preview_pages_through_the_file(browser, api, project):
    # Only the first 50 rows (the API's first 20 to 200) could be seen: a problem on row 537 had no page to look at.
    repo = repos.create_repo(project, "prefs", "dataset")
    rows = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(1, 121)]
    rows[99] = {"prompt": "q100", "chosen": "same", "rejected": "same"}
    commits.commit_files(repo, "main", {"t.jsonl": jsonl(rows)}, "data")
    c = browser("viewer")
    first = c.get("/hub/acme/prefs/preview/main/t.jsonl").content.decode()
    assert 'href="?after=50" data-testid="preview-next"' in first and "Rows 1 to 50" in first
    second = c.get("/hub/acme/prefs/preview/main/t.jsonl?after=50").content.decode()
    assert "Rows 51 to 100" in second and 'href="?after=100"' in second and "Row 100: " in second
    last = c.get("/hub/acme/prefs/preview/main/t.jsonl?after=100").content.decode()
    assert "Rows 101 to 120" in last and "preview-next" not in last
    past = c.get("/hub/acme/prefs/preview/main/t.jsonl?after=500").content.decode()
    assert "No rows after row 500: the file ends before" in past and 'data-testid="no-rows"' not in past
    assert c.get("/hub/acme/prefs/preview/main/t.jsonl?after=x").status_code == 400
    page = api.client.get("/api/hub/repos/prefs/preview", {"path": "t.jsonl", "limit": 40, "after": 90}, **api._headers()).json()
    assert page["row_numbers"] == list(range(91, 121))
    assert page["next_after"] is None and [p["row"] for p in page["problems"]] == [100]
    page = api.client.get("/api/hub/repos/prefs/preview", {"path": "t.jsonl", "limit": 20}, **api._headers()).json()
    assert page["row_numbers"] == list(range(1, 21)) and page["next_after"] == 20
    bad = api.client.get("/api/hub/repos/prefs/preview", {"path": "t.jsonl", "after": -1}, **api._headers())
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "after"
