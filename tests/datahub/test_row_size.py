"""Oversized rows: START refuses a row over DATAHUB_MAX_ROW_BYTES naming its file, row, size and the
limit (a 30 MB row passed, and the trainer tokenizes a row whole before cutting it to max_length),
and the dataset preview stays small whatever the rows (it returned them whole), while the stored
file keeps every row whole."""
from __future__ import annotations

import json

from datahub import commits, datasets, repos
from tests.conftest import sft_body
from tests.datahub.conftest import jsonl
from tests.datahub.test_start_rows import source, start_accepted, start_refused
from training.models import TrainingRun

MB = 1024**2


def too_large(size: int, limit: str = "4.0 MiB (4,194,304 bytes)") -> str:
    return (f"the row is {size / MB:.1f} MiB ({size:,} bytes), over the {limit} one row may have (DATAHUB_MAX_ROW_BYTES): "
            "split it into shorter rows or shorten it (the trainer keeps only the first max_length tokens of a row)")


def test_start_refuses_a_row_over_the_limit_naming_its_file_row_and_size(api, project):
    line = json.dumps({"prompt": "q", "completion": "a" * (30 * MB)}).encode() + b"\n"
    ok = jsonl([{"prompt": "q", "completion": "a"}] * 2)
    messages = start_refused(api, project, {"data/train.jsonl": ok + line + ok})
    # The file is named even in a dataset of one file: it is the one to split.
    assert messages == [f"data/train.jsonl row 3: {too_large(len(line))}"], messages
    # The preview says the same of the row, and does not show it.
    r = api.client.get("/api/hub/repos/rows/preview", {"path": "data/train.jsonl"}, **api._headers())
    assert r.status_code == 200 and len(r.content) < 10_000, len(r.content)
    assert r.json()["problems"] == [{"row": 3, "message": too_large(len(line))}]
    assert r.json()["row_numbers"] == [1, 2, 4, 5]


def test_a_row_within_the_limit_starts_and_csv_fields_past_csvs_own_limit_are_read(api, project):
    # A long row the trainer handles (it cuts it to max_length) is no problem; csv's default field
    # limit (131,072 characters) refused such a CSV row as "not valid CSV", which pandas reads.
    long = "a" * 200_000
    csv = f"prompt,completion\nq,{long}\nq,a\n".encode()
    run = start_accepted(api, project, {"train.jsonl": jsonl([{"prompt": "q", "completion": "b" * (3 * MB)}]), "train.csv": csv})
    assert run.start_requested_at is not None


def test_the_limit_is_a_setting_and_holds_for_every_format_and_local_files(api, project, settings, tmp_path):
    settings.DATAHUB_MAX_ROW_BYTES = 1000
    limit = "1000 B (1,000 bytes)"
    big = "é" * 600  # 1,200 bytes in UTF-8, though 600 characters
    row = {"prompt": "q", "completion": big}
    small = {"prompt": "q", "completion": "a"}
    local = tmp_path / "local.csv"
    local.write_text(f"prompt,completion\nq,a\nq,{big}\n", encoding="utf-8")
    run_id = api.post("/api/training-runs", sft_body(dataset=str(local))).json()["id"]
    r = api.post(f"/api/training-runs/{run_id}/start")
    assert r.status_code == 422, r.content
    assert [e["message"] for e in r.json()["errors"] if e["field"] == "dataset"] == [
        f"local.csv row 2: the row is 1.2 KiB (1,201 bytes), over the {limit} one row may have (DATAHUB_MAX_ROW_BYTES): "
        "split it into shorter rows or shorten it (the trainer keeps only the first max_length tokens of a row)"]
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    as_json = len(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode())
    for name, data in (("t.json", json.dumps([small, row]).encode()), ("t.jsonl", jsonl([small, row]))):
        messages = [f.message for f in datasets.rows_findings([source(name, data)], "sft", "dataset")]
        size = as_json if name == "t.json" else len(json.dumps(row).encode()) + 1  # a line counts its newline
        assert messages[0].startswith(f"{name} row 2: the row is "), messages
        assert f"({size:,} bytes), over the {limit}" in messages[0], messages
    # A line over the limit in characters too is counted, not read whole, and the next rows are read on.
    data = jsonl([{"prompt": "q", "completion": "a" * 5000}, {"prompt": "q", "completion": ""}])
    assert [f.message for f in datasets.rows_findings([source("t.jsonl", data)], "sft", "dataset")] == [
        f"t.jsonl row 1: the row is 4.9 KiB ({len(data) - 34:,} bytes), over the {limit} one row may have (DATAHUB_MAX_ROW_BYTES): "
        "split it into shorter rows or shorten it (the trainer keeps only the first max_length tokens of a row)",
        't.jsonl row 2: "completion" is empty']


def test_the_preview_of_multi_megabyte_rows_stays_small_and_says_what_it_cut(api, project):
    chat = {"messages": [{"role": "user", "content": "hi " * 50}, {"role": "assistant", "content": "yo " * 50}] * 10_000}
    rows = [{"prompt": "q", "completion": "a"},
            {"prompt": "p" * (3 * MB // 2), "completion": "c" * (3 * MB // 2)},  # 3 MiB: within the limit
            {"prompt": "q", "completion": "a", "k" * 50_000: "v"}]
    data = jsonl(rows)
    repo = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": data, "chat.jsonl": jsonl([chat] * 3)}, "data")
    r = api.client.get("/api/hub/repos/rows/preview", {"path": "train.jsonl", "limit": 200}, **api._headers())
    assert r.status_code == 200, r.content[:300]
    assert len(r.content) < 20_000, len(r.content)  # it was over 3 MB
    body = r.json()
    assert body["rows"][0] == {"prompt": "q", "completion": "a"}
    cut = body["rows"][1]
    assert cut["prompt"] == "p" * 1000 + f"… [cut: {3 * MB // 2:,} characters in all]"
    assert cut["completion"] == "c" * 1000 + f"… [cut: {3 * MB // 2:,} characters in all]"
    assert {"row": 2, "field": "prompt", "characters": 3 * MB // 2, "items": None} in body["cut"]
    assert {"row": 3, "field": "<key>", "characters": 50_000, "items": None} in body["cut"]
    assert body["shape"] == "prompt_completion" and body["problems"] == []
    # A row of twenty thousand messages shows the first few.
    r = api.client.get("/api/hub/repos/rows/preview", {"path": "chat.jsonl", "limit": 200}, **api._headers())
    assert r.status_code == 200 and len(r.content) < 20_000, len(r.content)
    body = r.json()
    messages = body["rows"][0]["messages"]
    assert 1 < len(messages) < 20 and messages[0] == chat["messages"][0]
    assert {"row": 1, "field": "messages", "characters": None, "items": 20_000} in body["cut"]
    assert body["shape"] == "chat" and body["problems"] == []
    # The file itself is unchanged.
    stored = {s.path: s for s in datasets.commit_sources(repos.resolve(repo, "main"))}["train.jsonl"]
    with stored.open() as fh:
        assert fh.read() == data


def test_the_preview_page_marks_what_it_cut(api, project, browser):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}] * 5000}
    repo = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl([{"prompt": "q", "completion": "c" * (3 * MB)}]),
                                        "chat.jsonl": jsonl([chat])}, "data")
    page = browser("viewer").get("/hub/acme/rows/preview/main/train.jsonl").content.decode()
    assert len(page) < 50_000, len(page)
    assert f'<span class="note" data-testid="cut">✂ cut for the preview, {3 * MB:,} characters in all</span>' in page, page
    page = browser("viewer").get("/hub/acme/rows/preview/main/chat.jsonl").content.decode()
    assert '<span class="note" data-testid="cut">✂ cut for the preview, 10,000 items in all</span>' in page, page
