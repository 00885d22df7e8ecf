"""/api/hub: repos, refs, files, downloads, diff, preview — and the tenant matrix."""
from __future__ import annotations

import pytest

from datahub import commits, repos
from datahub.models import Repo
from studio.errors import BadRequest
from tests.conftest import assert_error
from tests.datahub.conftest import jsonl


def get(api, url: str, **params):
    """GET with query parameters (Api.get's own `path` argument would clash with ?path=)."""
    return api.client.get(url, params, **api._headers())


def test_create_and_list_repos(api, project):
    r = api.post("/api/hub/repos", {"name": "prefs", "type": "dataset"})
    assert r.status_code == 201, r.content
    assert r.json()["full_name"] == "acme/prefs"
    assert Repo.objects.get(project=project, name="prefs").type == "dataset"
    assert "prefs" in [x["name"] for x in api.get("/api/hub/repos").json()]
    assert "prefs" not in [x["name"] for x in api.get("/api/hub/repos", type="model").json()]
    assert_error(api.post("/api/hub/repos", {"name": "prefs"}), 409, "name")
    assert_error(api.post("/api/hub/repos", {"name": "../x"}), 400, "name")
    assert_error(api.post("/api/hub/repos", {"name": "ok", "type": "space"}), 400, "type")


@pytest.mark.parametrize(("role", "read", "write"), [("owner", 200, 201), ("member", 200, 201), ("viewer", 200, 403), ("outsider", 404, 404), (None, 401, 401)])
def test_tenant_matrix(api_as, repo, role, read, write):
    client = api_as(role)
    assert client.get("/api/hub/repos/my-model").status_code == read
    assert client.get("/api/hub/repos/my-model/files").status_code == read
    assert get(client, "/api/hub/repos/my-model/download", path="x").status_code == (404 if read == 200 else read)
    r = client.post("/api/hub/repos/my-model/uploads", {"files": [{"path": "a.txt", "size": 1}]})
    assert r.status_code == write, r.content
    # a bad body from an outsider is still a 404 (precedence: 404 before 400)
    if role == "outsider":
        assert client.post("/api/hub/repos/my-model/uploads", {"files": "nope"}).status_code == 404


def test_files_commits_branches_download_and_diff(api, repo, users):
    first = commits.commit_files(repo, "main", {"config.json": b"{}", "w/model.bin": b"1" * 100}, "weights")
    repos.create_branch(repo, "dev", "main")
    second = commits.commit_files(repo, "dev", {"w/model.bin": b"2" * 100, "README.md": b"hi"}, "v2", delete=["config.json"])
    files = get(api, "/api/hub/repos/my-model/files", ref="dev").json()
    assert files["commit"] == second.pk and [f["path"] for f in files["files"]] == ["README.md", "w/model.bin"]
    assert [c["id"] for c in get(api, "/api/hub/repos/my-model/commits", ref="dev").json()][:2] == [second.pk, first.pk]
    assert {b["name"] for b in api.get("/api/hub/repos/my-model/branches").json()["items"]} == {"main", "dev"}
    r = get(api, "/api/hub/repos/my-model/download", ref=first.pk[:10], path="w/model.bin")
    assert r.status_code == 200 and b"".join(r.streaming_content) == b"1" * 100 and r["X-Repo-Commit"] == first.pk
    d = get(api, "/api/hub/repos/my-model/diff", base="main", head="dev").json()
    assert [f["path"] for f in d["added"]] == ["README.md"]
    assert [f["path"] for f in d["removed"]] == ["config.json"]
    assert [f["path"] for f in d["changed"]] == ["w/model.bin"]
    assert api.post("/api/hub/repos/my-model/tags", {"name": "v1", "ref": "dev"}).json()["commit"] == second.pk
    assert_error(get(api, "/api/hub/repos/my-model/files", ref="nope"), 404)


@pytest.mark.parametrize("path", ["../secret", "/etc/passwd", "a/../../b", "nul\x00", "back\\slash"])
def test_traversal_in_download_is_400(api, repo, path):
    assert_error(get(api, "/api/hub/repos/my-model/download", path=path), 400, "path")


@pytest.mark.parametrize("path", ["../secret", "/etc/passwd", "a/../../b", "nul\x00", "back\\slash"])
def test_traversal_in_upload_is_400(api, repo, path):
    assert_error(api.post("/api/hub/repos/my-model/uploads", {"files": [{"path": path, "size": 1}]}), 400, "files[0].path")


def test_another_projects_repo_is_404(api_as, other_project):
    repos.create_repo(other_project, "theirs", "model")
    assert_error(api_as("owner").get("/api/hub/repos/theirs"), 404)


def test_preview_detects_shapes(api, project):
    cases = {
        "chat.jsonl": (jsonl([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]), "chat"),
        "pc.csv": (b"prompt,completion\nq,a\nq2,a2\n", "prompt_completion"),
        "prefs.jsonl": (jsonl([{"prompt": "q", "chosen": "a", "rejected": "b"}]), "preference"),
        "prompts.jsonl": (jsonl([{"prompt": "what is 2+2?"}]), "prompts"),
    }
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["q1", "q2"], "chosen": ["a", "b"], "rejected": ["c", "d"]}), buf)
    cases["prefs.parquet"] = (buf.getvalue(), "preference")
    repo = repos.create_repo(project, "mixed", "dataset")
    commits.commit_files(repo, "main", {p: data for p, (data, _) in cases.items()})
    for path, (_, shape) in cases.items():
        r = get(api, "/api/hub/repos/mixed/preview", path=path)
        assert r.status_code == 200, r.content
        assert r.json()["shape"] == shape, (path, r.json())
    assert get(api, "/api/hub/repos/mixed/preview", path="pc.csv").json()["rows"] == [{"prompt": "q", "completion": "a"}, {"prompt": "q2", "completion": "a2"}]
    # Columns in the file's order (they were alphabetical: completion before prompt, chosen before prompt).
    assert get(api, "/api/hub/repos/mixed/preview", path="pc.csv").json()["columns"] == ["prompt", "completion"]
    assert get(api, "/api/hub/repos/mixed/preview", path="prefs.jsonl").json()["columns"] == ["prompt", "chosen", "rejected"]


def test_ref_findings_name_the_key_that_was_sent(api, repo):
    commits.commit_files(repo, "main", {"a.txt": b"a"}, "first")
    for body, key in (({"name": "dev", "from": "nope"}, "from"), ({"name": "bad name", "from": "main"}, "name")):
        body_ = assert_error(api.post("/api/hub/repos/my-model/branches", body), 404 if key == "from" else 400, key)
        assert {e["field"] for e in body_["errors"]} == {key}, body_
    assert_error(api.post("/api/hub/repos/my-model/tags", {"name": "bad name", "ref": "main"}), 400, "name")
    assert_error(api.post("/api/hub/repos/my-model/tags", {"name": "v1", "ref": "nope"}), 404, "ref")
    api.post("/api/hub/repos/my-model/tags", {"name": "v1", "ref": "main"})
    assert_error(api.post("/api/hub/repos/my-model/tags", {"name": "v1", "ref": "main"}), 409, "name")
    assert_error(get(api, "/api/hub/repos/my-model/diff", base="nope", head="main"), 404, "base")
    assert_error(get(api, "/api/hub/repos/my-model/diff", base="main", head="nope"), 404, "head")
    assert not repo.branches.filter(name="dev").exists()


@pytest.mark.parametrize(("name", "says"), [
    ("ok.lock", "cannot end in '.lock'"), ("ok.", "cannot end in '.'"), ("a..b", "cannot contain '..'"), ("-x", "starting with a letter or digit"),
])
def test_refused_repo_name_says_the_rule_it_breaks(api, name, says):
    body = assert_error(api.post("/api/hub/repos", {"name": name}), 400, "name")
    assert says in body["errors"][0]["message"], body
    assert not Repo.objects.filter(name=name).exists()


def test_a_trailing_newline_is_not_part_of_a_repo_branch_or_tag_name(api, repo):
    """`$` matches before a final newline: "nl\n" was stored as a repo (and "dev\n" as a branch, "v1\n"
    as a tag) that no ref (repo@ref ends at \\Z) or /hub URL could name."""
    assert_error(api.post("/api/hub/repos", {"name": "nl\n"}), 400, "name")
    assert_error(api.post("/api/hub/repos/my-model/branches", {"name": "dev\n"}), 400, "name")
    assert_error(api.post("/api/hub/repos/my-model/tags", {"name": "v1\n"}), 400, "name")
    assert_error(get(api, "/api/hub/repos/my-model/commits", ref="main\n"), 400, "ref")
    assert not Repo.objects.filter(name__startswith="nl").exists()
    assert not repo.branches.filter(name__startswith="dev").exists() and not repo.tags.exists()


def test_bad_jsonl_row_names_its_column_not_json_s_inner_line(api, dataset_repo):
    data = b'{"text": "a"}\n{"text": \n{"text": "c"} x\n'
    commits.commit_files(dataset_repo, "main", {"train.jsonl": data}, "data")
    problems = get(api, "/api/hub/repos/hub-data/preview", path="train.jsonl").json()["problems"]
    assert problems == [
        {"row": 2, "message": "not valid JSON: the line ends before the value is complete (Expecting value)"},
        {"row": 3, "message": "not valid JSON at column 15 (Extra data)"},
    ]


def test_blank_lines_before_the_first_row_count_in_its_line_number(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {"train.jsonl": b'\n\n{"text": "a"}\n{"text": \n', "rows.json": b'\n\n[{"text": "a"},\n  {"text": }]'}, "data")
    assert get(api, "/api/hub/repos/hub-data/preview", path="train.jsonl").json()["problems"] == [
        {"row": 4, "message": "not valid JSON: the line ends before the value is complete (Expecting value)"},
    ]
    problems = get(api, "/api/hub/repos/hub-data/preview", path="rows.json").json()["problems"]
    assert len(problems) == 1 and "line 4 column 12" in problems[0]["message"], problems


def test_download_without_path_says_give_path(api, repo):
    for query in ({}, {"path": ""}):
        body = assert_error(get(api, "/api/hub/repos/my-model/download", **query), 400, "path")
        assert "give path=" in body["errors"][0]["message"] and body["detail"] == "path is required."


@pytest.mark.parametrize("path", ["data/evil\u202egpj.exe", "a\u2066b.txt", "x\u202a.jsonl", "del\x7f.txt"])
def test_bidi_and_control_characters_in_a_path_are_refused_naming_it(api, repo, path):
    body = assert_error(api.post("/api/hub/repos/my-model/uploads", {"files": [{"path": "ok.txt", "size": 1}, {"path": path, "size": 1}]}), 400, "files[1].path")
    assert "control characters" in body["errors"][0]["message"]
    with pytest.raises(BadRequest, match="not an allowed path"):
        commits.commit_files(repo, "main", {path: b"x"})


@pytest.mark.parametrize("path", ["\u200b", "data/\ufeff/train.jsonl", "data/ \u200b"])
def test_a_file_name_of_only_invisible_characters_is_refused_naming_it(api, repo, path):
    body = assert_error(api.post("/api/hub/repos/my-model/uploads", {"files": [{"path": "ok.txt", "size": 1}, {"path": path, "size": 1}]}), 400, "files[1].path")
    assert "needs a visible character" in body["errors"][0]["message"]


HUB_QUERY_VALUES = {
    "/api/hub/repos": {"type"},
    "/api/hub/repos/{name}/commits": {"ref", "limit"},
    "/api/hub/repos/{name}/files": {"ref", "path"},
    "/api/hub/repos/{name}/download": {"ref", "path"},
    "/api/hub/repos/{name}/archive": {"ref", "path"},
    "/api/hub/repos/{name}/diff": {"base", "head"},
    "/api/hub/repos/{name}/preview": {"ref", "path", "limit", "after"},
}


def test_openapi_names_the_query_values_each_hub_read_takes(api, repo):
    """They are read by hand after the 404 check, so ninja cannot list them: /api/openapi.json must
    still do, with the bounds the endpoint enforces."""
    commits.commit_files(repo, "main", {"data.jsonl": jsonl([{"prompt": "a", "completion": "b"}])}, "data")
    spec = api.client.get("/api/openapi.json").json()
    for path, expected in HUB_QUERY_VALUES.items():
        params = {p["name"]: p for p in spec["paths"][path]["get"].get("parameters", []) if p["in"] == "query"}
        assert set(params) == expected, (path, sorted(params))
        for name, param in params.items():
            maximum = param["schema"].get("maximum")
            if maximum is None:
                continue
            url = path.replace("{name}", "my-model")
            assert get(api, url, **{name: maximum}).status_code == 200, (url, name)
            assert_error(get(api, url, **{name: maximum + 1}), 400, name)


def test_listing_the_files_of_a_path_that_is_a_file_is_a_400_saying_how_to_fetch_it(api, repo):
    """It was 200 with no files, which reads as an empty folder."""
    commits.commit_files(repo, "main", {"config.json": b"{}", "w/model.bin": b"1" * 10}, "weights")
    for path, listed in (("w/model.bin", "path=w"), ("config.json", "no path (the repo root)")):
        body = assert_error(get(api, "/api/hub/repos/my-model/files", path=path, ref="main"), 400, "path")
        message = body["errors"][0]["message"]
        assert f"{path} is a file" in message and f"/api/hub/repos/my-model/download?path={path.replace('/', '%2F')}&ref=main" in message, body
        assert f"list its folder with {listed}" in message, body
    # a folder still lists, with or without its trailing slash
    for path in ("w", "w/"):
        assert [f["path"] for f in get(api, "/api/hub/repos/my-model/files", path=path).json()["files"]] == ["w/model.bin"]


def test_preview_lists_the_rows_start_would_refuse(api, project):
    # A short CSV row and a non-object JSONL line previewed as "None" with no problem, then START refused them.
    repo = repos.create_repo(project, "rough", "dataset")
    commits.commit_files(repo, "main", {"pc.csv": b"prompt,completion\nq,a\nonly-prompt\nq3,a3\n",
                                        "pc.jsonl": b'{"prompt": "q", "completion": "a"}\n[1, 2]\n{"prompt": "q2", "completion": "a2"}\n'})
    csv_problems = get(api, "/api/hub/repos/rough/preview", path="pc.csv").json()["problems"]
    assert csv_problems == [{"row": 2, "message": '"completion" is empty'}], csv_problems
    jsonl_problems = get(api, "/api/hub/repos/rough/preview", path="pc.jsonl").json()["problems"]
    assert jsonl_problems == [{"row": 2, "message": "must be an object, not list"}], jsonl_problems


def test_preview_of_rows_no_method_trains_on_says_so_instead_of_failing(api, project):
    # question/answer rows (a common maths format) made the preview a 500 (KeyError 'unknown').
    repo = repos.create_repo(project, "maths", "dataset")
    commits.commit_files(repo, "main", {"qa.jsonl": b'{"question": "q1", "answer": "a1"}\n{"question": "q2", "answer": "a2"}\n'})
    answer = get(api, "/api/hub/repos/maths/preview", path="qa.jsonl")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["shape"] == "unknown" and body["columns"] == ["question", "answer"] and body["row_numbers"] == [1, 2]
    [problem] = body["problems"]
    assert problem["row"] == 1
    assert "(question, answer) match no shape" in problem["message"] and "SFT takes chat messages (messages)" in problem["message"]
    assert "rename the columns" in problem["message"]


def test_listing_a_folder_the_ref_does_not_have_is_a_404_naming_path(api, repo):
    """It was 200 with no files, while the tree page and /hub's tree answer 404."""
    assert get(api, "/api/hub/repos/my-model/files").json()["files"] == []  # an empty repo's root lists nothing
    assert_error(get(api, "/api/hub/repos/my-model/files", path="w"), 404, "path")
    commits.commit_files(repo, "main", {"w/model.bin": b"1", "config.json": b"{}"}, "weights")
    for path in ("nonexist", "w/nope", "W"):
        body = assert_error(get(api, "/api/hub/repos/my-model/files", path=path, ref="main"), 404, "path")
        assert f"has no folder {path!r} at main" in body["detail"], body
        assert "/api/hub/repos/my-model/files?ref=main (no path) lists every file" in body["errors"][0]["message"], body
    assert [f["path"] for f in get(api, "/api/hub/repos/my-model/files", path="w").json()["files"]] == ["w/model.bin"]


def test_downloading_a_folder_says_it_is_one_and_how_to_list_it(api, repo):
    commits.commit_files(repo, "main", {"d/a.jsonl": b"1", "d/sub/b.jsonl": b"2"}, "data")
    for path in ("d", "d/sub"):
        body = assert_error(get(api, "/api/hub/repos/my-model/download", path=path), 400, "path")
        assert body["detail"] == f"{path} is a folder at main, not a file.", body
        assert f"/api/hub/repos/my-model/files?path={path.replace('/', '%2F')}&ref=main" in body["errors"][0]["message"], body
    # what is neither stays a 404
    assert "has no file 'dd'" in assert_error(get(api, "/api/hub/repos/my-model/download", path="dd"), 404)["detail"]


def test_repo_names_that_differ_only_in_case_cannot_both_be_in_a_project(api, project, other_project):
    assert api.post("/api/hub/repos", {"name": "UPPER", "type": "dataset"}).status_code == 201
    body = assert_error(api.post("/api/hub/repos", {"name": "upper", "type": "dataset"}), 409, "name")
    assert body["detail"].startswith("Project acme already has a repo 'UPPER': 'upper' differs from it only in case"), body
    assert "already has a repo UPPER: choose another name" in body["errors"][0]["message"], body
    assert list(Repo.objects.filter(project=project).values_list("name", flat=True)) == ["UPPER"]
    # lookups stay exact, and another project may have either name
    assert api.get("/api/hub/repos/UPPER").status_code == 200
    assert_error(api.get("/api/hub/repos/upper"), 404)
    assert repos.create_repo(other_project, "upper", "dataset").name == "upper"
    # a name an experiment's repo has in another case is an experiment's too
    body = assert_error(api.post("/api/hub/repos", {"name": "Experiment-default"}), 400, "name")
    assert "kept for the experiments' own repos" in body["errors"][0]["message"], body
