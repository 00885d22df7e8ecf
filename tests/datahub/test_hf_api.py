"""The HF Hub-compatible read API: huggingface_hub and transformers against the live test server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datahub import commits, repos


@pytest.fixture
def model_repo(project, tiny_model_dir):
    repo = repos.create_repo(project, "tiny-llama", "model")
    files = {p.name: p for p in tiny_model_dir.iterdir() if p.is_file()}
    commit = commits.commit_files(repo, "main", files, "tiny llama")
    repos.create_branch(repo, "stable", "main")
    commits.commit_files(repo, "main", {"README.md": b"# newer"}, "readme on main only")
    return repo, commit


def hf_env(tmp_path: Path, endpoint: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN=token, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_XET="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    return env


def test_snapshot_download_and_from_pretrained_from_the_live_server(transactional_db, live_server, model_repo, tokens, tmp_path, tiny_model_dir):
    from huggingface_hub import hf_hub_download, snapshot_download

    repo, commit = model_repo
    endpoint = f"{live_server.url}/hub"
    folder = snapshot_download("acme/tiny-llama", revision="stable", endpoint=endpoint, token=tokens["owner"], cache_dir=tmp_path / "cache")
    got = sorted(p.name for p in Path(folder).iterdir())
    assert got == sorted(p.name for p in tiny_model_dir.iterdir() if p.is_file())
    assert Path(folder).name == commit.pk  # the snapshot is keyed by the commit the branch resolved to
    assert (Path(folder) / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()

    readme = hf_hub_download("acme/tiny-llama", "README.md", revision="main", endpoint=endpoint, token=tokens["member"], cache_dir=tmp_path / "c2")
    assert Path(readme).read_bytes() == b"# newer"

    # transformers, in its own process, with HF_ENDPOINT pointed at Studio and a Studio token
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained('acme/tiny-llama', revision=sys.argv[1])\n"
        "t = AutoTokenizer.from_pretrained('acme/tiny-llama', revision=sys.argv[1])\n"
        "ids = t('hello world', return_tensors='pt').input_ids\n"
        "print(json.dumps({'hidden': m.config.hidden_size, 'layers': m.config.num_hidden_layers, 'logits': list(m(ids).logits.shape)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, "stable"], env=hf_env(tmp_path, endpoint, tokens["viewer"]),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hidden"] == 32 and out["layers"] == 2


def test_another_projects_token_gets_404(transactional_db, live_server, model_repo, tokens, tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("acme/tiny-llama", endpoint=f"{live_server.url}/hub", token=tokens["outsider"], cache_dir=tmp_path / "c")


def test_resolve_headers_head_and_range(client, model_repo, tokens):
    repo, commit = model_repo
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    blob = repos.tree(commit)["config.json"]
    head = client.head("/hub/acme/tiny-llama/resolve/stable/config.json", **auth)
    assert head.status_code == 200
    assert head["X-Repo-Commit"] == commit.pk
    assert head["ETag"] == f'"{blob.sha256}"' and head["X-Linked-Etag"] == f'"{blob.sha256}"'
    assert head["Content-Length"] == str(blob.size)
    part = client.get(f"/hub/acme/tiny-llama/resolve/{commit.pk}/config.json", HTTP_RANGE="bytes=2-5", **auth)
    assert part.status_code == 206
    full = b"".join(client.get(f"/hub/acme/tiny-llama/resolve/{commit.pk}/config.json", **auth).streaming_content)
    assert b"".join(part.streaming_content) == full[2:6]
    missing = client.head("/hub/acme/tiny-llama/resolve/main/nope.json", **auth)
    assert missing.status_code == 404 and missing["X-Error-Code"] == "EntryNotFound" and missing["X-Repo-Commit"]
    assert client.get("/hub/api/models/acme/tiny-llama/revision/nope", **auth)["X-Error-Code"] == "RevisionNotFound"
    assert client.get("/hub/api/models/acme/tiny-llama").status_code == 401


@pytest.mark.parametrize("path", ["..%2F..%2Fetc%2Fpasswd", "a/%2E%2E/config.json", "nul%00byte", "back%5Cslash"])
def test_traversal_in_downloads_is_400(client, model_repo, tokens, path):
    r = client.get(f"/hub/acme/tiny-llama/resolve/main/{path}", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}")
    assert r.status_code == 400, (r.status_code, r.content)
    assert r.json()["errors"][0]["field"] == "path"


def test_outsider_gets_404_on_every_hub_endpoint(client, model_repo, tokens):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['outsider']}"}
    for url in ("/hub/api/models/acme/tiny-llama", "/hub/api/models/acme/tiny-llama/revision/main",
                "/hub/api/models/acme/tiny-llama/tree/main", "/hub/acme/tiny-llama/resolve/main/config.json",
                "/hub/api/models/acme/tiny-llama/refs", "/hub/api/models/acme/tiny-llama/commits/main"):
        r = client.get(url, **auth)
        assert r.status_code == 404 and r["X-Error-Code"] == "RepoNotFound", url


def test_load_dataset_from_the_live_server(transactional_db, live_server, project, tokens, tmp_path):
    """How the engine on a remote backend reads a Data Hub dataset: datasets.load_dataset with
    HF_ENDPOINT pointed at Studio and the pinned commit as the revision."""
    repo = repos.create_repo(project, "chat", "dataset")
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(5)]
    commit = commits.commit_files(repo, "main", {"data/train.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()})
    script = (
        "import json, sys, datasets\n"
        "ds = datasets.load_dataset('acme/chat', revision=sys.argv[1], split='train')\n"
        "print(json.dumps({'n': len(ds), 'cols': ds.column_names}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, commit.pk], env=hf_env(tmp_path, f"{live_server.url}/hub", tokens["owner"]),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"n": 5, "cols": ["messages"]}


def test_a_dataset_repo_page_s_load_snippet_loads_it_from_the_live_server(transactional_db, live_server, project, browser, tokens, tmp_path):
    """The page said from_pretrained("acme/qa-data") for a dataset repo too: its snippet, run as
    shown with the page's HF_ENDPOINT pointed at this server, loads the dataset's rows."""
    import html
    import re

    repo = repos.create_repo(project, "qa-data", "dataset")
    rows = [{"prompt": f"{i}+{i}?", "completion": str(2 * i)} for i in range(4)]
    commits.commit_files(repo, "main", {"train.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()})
    page = browser("viewer").get("/hub/acme/qa-data").content.decode()
    endpoint, snippet = re.search(r"<code>HF_ENDPOINT=(.*?)</code> and a Studio token: <code>(.*?)</code>", page).groups()
    assert endpoint == "http://testserver/hub" and snippet.startswith("datasets.load_dataset("), snippet
    script = f"import json, datasets\nds = {html.unescape(snippet)}\nprint(json.dumps({{name: split.to_list() for name, split in ds.items()}}))\n"
    proc = subprocess.run([sys.executable, "-c", script], env=hf_env(tmp_path, f"{live_server.url}/hub", tokens["viewer"]),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"train": rows}


# ---- tree listing: the Hub's cursor pagination -------------------------------------------------

@pytest.fixture
def wide_repo(project, settings):
    """More files than one page: pages of 10 entries (the Hub's, and our default, is 1000; a commit of
    1000+ files takes ~20 s here) over 23 files, at the top and in nested folders."""
    settings.DATAHUB_TREE_PAGE_SIZE = 10
    repo = repos.create_repo(project, "wide", "dataset")
    files = {f"shards/part-{i:04d}.jsonl": f"{i}\n".encode() for i in range(20)}
    files.update({"README.md": b"# wide", "nested/a/b.txt": b"b", "nested/c.txt": b"c"})
    return repo, commits.commit_files(repo, "main", files, "wide"), files


def test_list_repo_tree_follows_every_page_with_huggingface_hub(transactional_db, live_server, wide_repo, tokens, settings):
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    repo, commit, files = wide_repo
    api = HfApi(endpoint=f"{live_server.url}/hub", token=tokens["viewer"])
    listed = list(api.list_repo_tree("acme/wide", repo_type="dataset", revision="main", recursive=True))
    assert sorted(f.path for f in listed if isinstance(f, RepoFile)) == sorted(files)  # 23 files + 3 folders: 3 pages
    assert sorted(f.path for f in listed if isinstance(f, RepoFolder)) == ["nested", "nested/a", "shards"]
    assert len(listed) == len({f.path for f in listed})  # no entry served twice across a page boundary
    pages = list(api._iter_repo_tree_pages("acme/wide", repo_type="dataset", revision="main", recursive=True))
    assert [len(page) for page, _ in pages] == [10, 10, 6] and [finished for _, finished in pages] == [False, False, True]

    # A folder listed without recursion, in pages of 7: every shard once, in path order.
    settings.DATAHUB_TREE_PAGE_SIZE = 7
    shards = [f.path for f in api.list_repo_tree("acme/wide", "shards", repo_type="dataset", revision=commit.pk)]
    assert shards == sorted(p for p in files if p.startswith("shards/"))
    top = [f.path for f in api.list_repo_tree("acme/wide", repo_type="dataset")]
    assert top == ["README.md", "nested", "shards"]


def test_tree_link_header_pins_the_commit_and_keeps_the_query(client, wide_repo, tokens, settings):
    repo, commit, files = wide_repo
    settings.DATAHUB_TREE_PAGE_SIZE = 8
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    first = client.get("/hub/api/datasets/acme/wide/tree/main?recursive=true&expand=false", **auth)
    assert first.status_code == 200 and len(first.json()) == 8 and first["X-Repo-Commit"] == commit.pk
    link = first["Link"]
    assert link.startswith("<http://testserver/hub/api/datasets/acme/wide/tree/main?") and link.endswith('>; rel="next"')
    assert "recursive=true" in link and "expand=false" in link and "cursor=" in link
    # A commit lands on main between two pages: the listing goes on from the commit it began with.
    commits.commit_files(repo, "main", {"AAA-new.txt": b"new"}, "between pages")
    seen, url = [e["path"] for e in first.json()], link[1:link.index(">")]
    while url:
        page = client.get(url.removeprefix("http://testserver"), **auth)
        assert page.status_code == 200 and page["X-Repo-Commit"] == commit.pk
        seen += [e["path"] for e in page.json()]
        url = page["Link"][1:page["Link"].index(">")] if page.has_header("Link") else None
    assert seen == sorted(set(files) | {"nested", "nested/a", "shards"})
    assert "AAA-new.txt" not in seen
    last = client.get("/hub/api/datasets/acme/wide/tree/main/nested?recursive=1", **auth)
    assert not last.has_header("Link") and [e["path"] for e in last.json()] == ["nested/a", "nested/a/b.txt", "nested/c.txt"]


def test_bad_tree_cursor_is_400_naming_cursor(client, wide_repo, model_repo, tokens):
    import base64

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    other_commit = model_repo[1]  # a real commit, of another repo
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    for cursor in ("", "not base64!", b64(b"\xff\xfe"), b64(b"{}"), b64(b'["x", "a", "file"]'), b64(b'[1, 2, 3]'),
                   b64(json.dumps([wide_repo[1].pk, "a", "symlink"]).encode()), b64(json.dumps([other_commit.pk, "a", "file"]).encode())):
        r = client.get(f"/hub/api/datasets/acme/wide/tree/main?cursor={cursor}", **auth)
        assert r.status_code == 400, (cursor, r.status_code, r.content)
        assert [e["field"] for e in r.json()["errors"]] == ["cursor"]
    # an outsider learns nothing from a cursor: the repo is not found first
    r = client.get(f"/hub/api/datasets/acme/wide/tree/main?cursor={b64(b'{}')}", HTTP_AUTHORIZATION=f"Bearer {tokens['outsider']}")
    assert r.status_code == 404 and r["X-Error-Code"] == "RepoNotFound"


def test_ingest_token_lookup_uses_the_ingest_token_index(project, users):
    """A remote engine reads /hub with its attempt's ingest token; reader_for finds the run by the
    token's hash. With 20,000 runs PostgreSQL's own planner must pick the ingest_token_hash index."""
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from datahub.hf_api import reader_for
    from studio import crypto
    from training import services as training
    from training.models import TrainingRun

    run = training.create_run(project, users["owner"], name="remote", method="sft", base_model="org/base", dataset="d@main")
    TrainingRun.objects.filter(pk=run.pk).update(status="running", attempt=1, ingest_token_hash=crypto.hash_token("ing_remote"))
    table = TrainingRun._meta.db_table
    columns = [f.column for f in TrainingRun._meta.concrete_fields if f.column not in ("id", "ingest_token_hash")]
    with connection.cursor() as cursor:
        # Copies of the run, each with its own token hash, then fresh statistics for the planner.
        cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}, ingest_token_hash) "
                       f"SELECT {', '.join(columns)}, md5(n::text) || md5(n::text) FROM {table}, generate_series(1, 20000) AS n WHERE id = %s", [run.pk])
        cursor.execute(f"ANALYZE {table}")
    with CaptureQueriesContext(connection) as queries:
        reader = reader_for(RequestFactory().get("/hub/api/models/acme/base", HTTP_AUTHORIZATION="Bearer ing_remote"))
    assert reader.project_ids == {project.pk}
    lookup = [q["sql"] for q in queries if "ingest_token_hash" in q["sql"]]
    assert len(lookup) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + lookup[0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan" not in plan and "ingest_token_hash" in plan, plan


# ---- paths-info --------------------------------------------------------------------------------

def test_paths_info_with_huggingface_hub_form_body(transactional_db, live_server, model_repo, tokens):
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=f"{live_server.url}/hub", token=tokens["viewer"])
    infos = api.get_paths_info("acme/tiny-llama", ["config.json", "nope.txt"], revision="main")
    assert [(type(i), i.path) for i in infos] == [(RepoFile, "config.json")]


@pytest.mark.parametrize("body", [{"paths": 5}, [1], {"paths": [1]}, {"paths": {"a": 1}}, "config.json"])
def test_paths_info_json_body_that_is_not_a_list_of_paths_is_400_naming_paths(client, model_repo, tokens, body):
    r = client.post("/hub/api/models/acme/tiny-llama/paths-info/main", json.dumps(body), content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}")
    assert r.status_code == 400, r.content
    assert [e["field"] for e in r.json()["errors"]] == ["paths"]
    assert "list of file paths (strings)" in r.json()["errors"][0]["message"]


def test_paths_info_json_body(client, model_repo, tokens):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    r = client.post("/hub/api/models/acme/tiny-llama/paths-info/main", {"paths": ["config.json"]}, content_type="application/json", **auth)
    assert r.status_code == 200 and [e["path"] for e in r.json()] == ["config.json"]
    r = client.post("/hub/api/models/acme/tiny-llama/paths-info/main", "{nope", content_type="application/json", **auth)
    assert r.status_code == 400 and r.json()["detail"] == "The body is not valid JSON."


def test_resolve_content_disposition_escapes_the_file_name(client, project, tokens):
    repo = repos.create_repo(project, "names", "dataset")
    commits.commit_files(repo, "main", {'say "hi".txt': b"q", "ü.txt": b"u"}, "names")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    r = client.get("/hub/datasets/acme/names/resolve/main/say%20%22hi%22.txt", **auth)
    assert r.status_code == 200 and r["Content-Disposition"] == 'inline; filename="say \\"hi\\".txt"'
    r = client.get("/hub/datasets/acme/names/resolve/main/%C3%BC.txt", **auth)
    assert r["Content-Disposition"] == "inline; filename*=utf-8''%C3%BC.txt"
    r = client.get("/api/hub/repos/names/download", {"path": 'say "hi".txt'}, **auth)
    assert r["Content-Disposition"] == 'attachment; filename="say \\"hi\\".txt"'


def test_ingest_token_reads_the_hub_without_counting_as_a_bad_api_token(client, project, users, settings):
    """An engine downloads every file of its base model with its run's ingest token: each request
    must be a read, not a failed API-token check that the rate limit then answers with 429."""
    from django.core.cache import cache

    from studio import crypto
    from training import services as training
    from training.models import TrainingRun

    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 3
    cache.clear()
    repo = repos.create_repo(project, "base", "model")
    commits.commit_files(repo, "main", {"config.json": b"{}"}, "base")
    run = training.create_run(project, users["owner"], name="remote", method="sft", base_model="base@main", dataset="d@main")
    pinned = {"base_model": {"ref": "base@main", "commit": repos.resolve(repo, "main").pk, "repo": "acme/base"}}
    TrainingRun.objects.filter(pk=run.pk).update(status="running", attempt=1, ingest_token_hash=crypto.hash_token("ing_remote"), pinned=pinned)
    for _ in range(5):
        r = client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer ing_remote")
        assert r.status_code == 200, r.content
    r = client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer not-a-token")
    assert r.status_code == 401 and r["X-Error-Message"] == "Invalid credentials in Authorization header"
    for _ in range(2):
        client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer ing_stale")
    assert client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer ing_stale").status_code == 429
    # Local engines all download over 127.0.0.1: a stale engine's bad tokens must not lock out a running one.
    assert client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer ing_remote").status_code == 200
    cache.clear()
    TrainingRun.objects.filter(pk=run.pk).update(status="completed")
    assert client.get("/hub/acme/base/resolve/main/config.json", HTTP_AUTHORIZATION="Bearer ing_remote").status_code == 401


def test_ingest_token_reads_only_the_commits_its_run_pinned(client, project, users, tokens):
    """The ingest token lives in the compute job's environment, beside the environment's own code:
    it reads the repos and commits its run pinned at START, not the rest of the project."""
    from studio import crypto
    from training import services as training
    from training.models import TrainingRun

    base = repos.create_repo(project, "base", "model")
    pinned_commit = commits.commit_files(base, "main", {"config.json": b"{}"}, "base")
    secret = repos.create_repo(project, "private-data", "dataset")
    commits.commit_files(secret, "main", {"train.jsonl": b'{"text": "not for this run"}'}, "data")
    run = training.create_run(project, users["owner"], name="remote", method="sft", base_model="base@main", dataset="org/data")
    pinned = {"base_model": {"ref": "base@main", "commit": pinned_commit.pk, "repo": "acme/base"}}
    TrainingRun.objects.filter(pk=run.pk).update(status="running", attempt=1, ingest_token_hash=crypto.hash_token("ing_pinned"), pinned=pinned)
    auth = {"HTTP_AUTHORIZATION": "Bearer ing_pinned"}
    assert client.get(f"/hub/acme/base/resolve/{pinned_commit.pk}/config.json", **auth).status_code == 200
    assert client.get(f"/hub/api/models/acme/base/revision/{pinned_commit.pk}", **auth).status_code == 200
    assert client.get(f"/hub/api/models/acme/base/tree/{pinned_commit.pk}", **auth).status_code == 200
    # another repo of the project: not found, as for an outsider
    for url in ("/hub/datasets/acme/private-data/resolve/main/train.jsonl", "/hub/api/datasets/acme/private-data",
                "/hub/api/datasets/acme/private-data/tree/main", "/hub/api/datasets/acme/private-data/refs"):
        r = client.get(url, **auth)
        assert r.status_code == 404 and r["X-Error-Code"] == "RepoNotFound", (url, r.status_code)
    # the pinned repo at a commit made after START, or its refs: not found either
    later = commits.commit_files(base, "main", {"config.json": b'{"later": 1}'}, "after start")
    for url in (f"/hub/acme/base/resolve/{later.pk}/config.json", "/hub/acme/base/resolve/main/config.json", "/hub/api/models/acme/base/tree/main"):
        r = client.get(url, **auth)
        assert r.status_code == 404 and r["X-Error-Code"] == "RevisionNotFound", (url, r.status_code)
    assert client.get("/hub/api/models/acme/base/refs", **auth).status_code == 404
    # a member's token still reads the whole project
    assert client.get("/hub/datasets/acme/private-data/resolve/main/train.jsonl", HTTP_AUTHORIZATION=f"Bearer {tokens['viewer']}").status_code == 200


# ---- refs and commits --------------------------------------------------------------------------

def test_list_repo_refs_and_commits_with_huggingface_hub(transactional_db, live_server, model_repo, tokens):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    repo, first = model_repo
    repos.create_tag(repo, "v1", "stable")
    api = HfApi(endpoint=f"{live_server.url}/hub", token=tokens["viewer"])
    refs = api.list_repo_refs("acme/tiny-llama")
    main = repos.resolve(repo, "main")
    assert {(b.name, b.ref, b.target_commit) for b in refs.branches} == {("main", "refs/heads/main", main.pk), ("stable", "refs/heads/stable", first.pk)}
    assert [(t.name, t.ref, t.target_commit) for t in refs.tags] == [("v1", "refs/tags/v1", first.pk)]
    history = api.list_repo_commits("acme/tiny-llama", revision="main")
    assert [c.commit_id for c in history] == [c.pk for c in repos.history(repo, "main")]
    assert history[0].title == "readme on main only" and history[0].created_at is not None
    assert [c.commit_id for c in api.list_repo_commits("acme/tiny-llama", revision="v1")][0] == first.pk
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_commits("acme/tiny-llama", revision="no-such-branch")


def test_a_hub_write_through_huggingface_hub_says_where_writes_go(transactional_db, live_server, model_repo, tokens, tmp_path):
    # create_branch, upload_file, create_repo were a bare 404 ("repository not found"), whoami a JSON error.
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=f"{live_server.url}/hub", token=tokens["owner"])
    (tmp_path / "x.txt").write_text("x")
    for call in (lambda: api.create_branch("acme/tiny-llama", branch="dev"),
                 lambda: api.upload_file(path_or_fileobj=str(tmp_path / "x.txt"), path_in_repo="x.txt", repo_id="acme/tiny-llama"),
                 lambda: api.create_repo("acme/new-one"), api.whoami):
        with pytest.raises(HfHubHTTPError) as caught:
            call()
        assert "read API only" in str(caught.value) and "/api/hub/repos/<name>/uploads" in str(caught.value), caught.value
    assert list(api.list_repo_files("acme/tiny-llama"))  # reads still work


def test_an_api_path_this_hub_does_not_have_is_json_not_the_login_page(client, model_repo, tokens):
    # huggingface_hub calls endpoints this Hub lacks (e.g. /api/agent-harnesses): it got a redirect to the login page.
    response = client.get("/hub/api/agent-harnesses", HTTP_AUTHORIZATION=f"Bearer {tokens['owner']}")
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
    assert "read API only" in response.json()["error"]


def test_a_repo_is_served_under_its_own_kind_only_and_other_methods_get_a_json_405(client, project, model_repo, tokens):
    repos.create_repo(project, "qa-data", "dataset")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['owner']}"}
    # As on the Hub: a dataset repo is not a model, and a model repo is not a dataset.
    for url, found in (("/hub/api/datasets/acme/qa-data", 200), ("/hub/api/models/acme/qa-data", 404),
                       ("/hub/api/models/acme/tiny-llama", 200), ("/hub/api/datasets/acme/tiny-llama", 404)):
        r = client.get(url, **auth)
        assert r.status_code == found, (url, r.content)
        if found == 404:
            assert r["X-Error-Code"] == "RepoNotFound"
    for method, url in (("post", "/hub/api/models/acme/tiny-llama"), ("put", "/hub/api/datasets/acme/qa-data/refs"), ("delete", "/hub/api/models/acme/tiny-llama/tree/main")):
        r = getattr(client, method)(url, **auth)
        assert r.status_code == 405 and r["Content-Type"] == "application/json" and r["Allow"], (method, url)
        assert "read API only" in r.json()["detail"]
    # HEAD is a read: it answers as GET does.
    for url in ("/hub/api/models/acme/tiny-llama", "/hub/api/datasets/acme/qa-data/refs"):
        assert client.head(url, **auth).status_code == client.get(url, **auth).status_code == 200, url
