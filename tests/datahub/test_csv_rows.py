"""CSV rows as the engine reads them: a row with more fields than the header is a problem naming
its line (the preview lists it, START refuses it); a shorter one is read with empty fields, as
pandas (through datasets.load_dataset, the engine's reader) reads it."""
from __future__ import annotations

import io

import pytest

from datahub import commits, datasets, repos
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training.models import TrainingRun

# line 1 is the header; the bad row is data row 5, on line 6
LONG_ROW = b'prompt,completion\nq1,a1\nq2,a2\n"q3, with a comma",a3\nq4,a4\n"oops, extra",col,"here",4\nq6,a6\n'
LONG_ROW_PROBLEM = 'line 6 has 4 fields, the header has 2: put a field that holds a comma in double quotes ("a, b"), or remove the extra fields'


def preview(api, repo: str, path: str) -> dict:
    r = api.client.get(f"/api/hub/repos/{repo}/preview", {"path": path}, **api._headers())
    assert r.status_code == 200, r.content
    return r.json()


def test_a_row_with_more_fields_than_the_header_is_a_preview_problem_naming_its_line(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {"qa.csv": LONG_ROW, "first.csv": b"prompt,completion\nq1,a1,x\nq2,a2\n"}, "data")
    out = preview(api, "hub-data", "qa.csv")
    assert out["problems"] == [{"row": 5, "message": LONG_ROW_PROBLEM}]
    assert [row["prompt"] for row in out["rows"]] == ["q1", "q2", "q3, with a comma", "q4", "q6"]  # not shown cut short
    assert out["row_numbers"] == [1, 2, 3, 4, 6]
    # on the first row too, where pandas would not fail but shift every column under an index
    assert preview(api, "hub-data", "first.csv")["problems"] == [
        {"row": 1, "message": 'line 2 has 3 fields, the header has 2: put a field that holds a comma in double quotes ("a, b"), or remove the extra fields'}]


def test_a_row_with_more_fields_than_the_header_is_refused_at_start_naming_file_and_row(api, project):
    repo = repos.create_repo(project, "qa-data", "dataset")
    pairs = [{"prompt": "q0", "completion": "a0"}]  # the CSV's shape: files of two shapes are refused as such
    commits.commit_files(repo, "main", {"pairs.jsonl": jsonl(pairs), "qa.csv": LONG_ROW}, "data")
    run_id = api.post("/api/training-runs", sft_body(dataset="qa-data@main")).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert {"field": "dataset", "message": f"qa.csv row 5: {LONG_ROW_PROBLEM}"} in body["errors"], body
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None


def test_a_shorter_row_reads_its_missing_fields_as_empty(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {"short.csv": b"prompt,completion,source\nq1,a1,web\nq2,a2\nq3\n"}, "data")
    out = preview(api, "hub-data", "short.csv")
    # Read, not refused by the reader; the preview says what START says of row 3 (the same rule as below).
    assert out["problems"] == [{"row": 3, "message": '"completion" is empty'}] and out["row_numbers"] == [1, 2, 3]
    assert out["rows"][1:] == [{"prompt": "q2", "completion": "a2", "source": None}, {"prompt": "q3", "completion": None, "source": None}]
    findings = datasets.rows_findings([source("short.csv")], "sft", "dataset")
    assert [f.message for f in findings] == ['short.csv row 3: "completion" is empty']


def source(name: str) -> datasets.Source:
    data = {"short.csv": b"prompt,completion,source\nq1,a1,web\nq2,a2\nq3\n", "long.csv": LONG_ROW}[name]
    return datasets.Source(name, len(data), lambda: io.BytesIO(data))


@pytest.mark.parametrize("name", ["long.csv", "short.csv"])
def test_the_rule_is_the_engines_csv_reader_s(tmp_path, monkeypatch, name):
    """datasets.load_dataset("csv") (pandas) fails on a longer row and fills a shorter one with
    nulls: what the Studio's reader calls a problem must be what the engine cannot read."""
    import datasets as hf_datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    src = source(name)
    path = tmp_path / name
    path.write_bytes(src.open().read())
    studio_problems = [row for _, row in datasets.iter_rows(src) if isinstance(row, datasets.RowError)]
    if name == "long.csv":
        with pytest.raises(hf_datasets.exceptions.DatasetGenerationError) as failed:
            hf_datasets.load_dataset("csv", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
        assert "Expected 2 fields in line 6, saw 4" in str(failed.value.__cause__)
        assert [str(p) for p in studio_problems] == [LONG_ROW_PROBLEM]
    else:
        rows = hf_datasets.load_dataset("csv", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")).to_list()
        assert rows == [row for _, row in datasets.iter_rows(src)] and not studio_problems


# A quote opened on line 3 (data row 2) and never closed: csv read the rest of the file into that one
# field, and the finding was '"completion" is empty' (the row short of its second field); with the
# quote in the row's last field there was no finding at all, and the engine failed the run on it.
UNCLOSED = b'prompt,completion\nq1,a1\n"hello,world\nq3,a3\nq4,a4\n'
UNCLOSED_LAST = b'prompt,completion\nq1,a1\nq2,"hello\nq3,a3\n'


def unclosed(line: int, start: str, rest: str) -> str:
    return (f'line {line} opens a quoted field ("{start}) that is never closed, so the rest of the file ({rest}) reads as that one '
            'field: close the quote where the field ends, or, if the " is part of the text, write it as "" inside a quoted field '
            '("a ""quoted"" word")')


def test_a_quote_never_closed_is_refused_at_start_naming_the_file_and_the_line_it_opens_on(api, project):
    repo = repos.create_repo(project, "qa-data", "dataset")
    commits.commit_files(repo, "main", {"qa.csv": UNCLOSED}, "data")
    run_id = api.post("/api/training-runs", sft_body(dataset="qa-data@main")).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert [e["message"] for e in body["errors"] if e["field"] == "dataset"] == [f"qa.csv row 2: {unclosed(3, 'hello,world', 'lines 3 to 5')}"], body
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    # In a row's last field, where it passed START.
    commits.commit_files(repo, "main", {"qa.csv": UNCLOSED_LAST}, "quote in the last field")
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
    assert [e["message"] for e in body["errors"] if e["field"] == "dataset"] == [f"qa.csv row 2: {unclosed(3, 'hello', 'lines 3 to 4')}"], body


def test_a_quote_never_closed_is_a_preview_problem_naming_the_line_it_opens_on(api, dataset_repo):
    commits.commit_files(dataset_repo, "main", {"qa.csv": UNCLOSED, "header.csv": b'"prompt,completion\nq1,a1\n'}, "data")
    out = preview(api, "hub-data", "qa.csv")
    assert out["problems"] == [{"row": 2, "message": unclosed(3, "hello,world", "lines 3 to 5")}]
    assert out["rows"] == [{"prompt": "q1", "completion": "a1"}] and out["row_numbers"] == [1]
    # In the header too, where the preview said only that the file has no rows.
    assert preview(api, "hub-data", "header.csv")["problems"] == [{"row": 1, "message": unclosed(1, "prompt,completion", "lines 1 to 2")}]


def test_quotes_that_close_are_read_as_before():
    # A quoted field may span lines, and end the file: only a quote still open at its end is refused.
    data = b'prompt,completion\nq1,"a ""quoted"" word"\r\nq2,"two\nlines"'
    rows = list(datasets.iter_rows(datasets.Source("ok.csv", len(data), lambda: io.BytesIO(data))))
    assert rows == [(1, {"prompt": "q1", "completion": 'a "quoted" word'}), (2, {"prompt": "q2", "completion": "two\nlines"})]
    # The line named is the one its quote opens on, after a row of several lines, a file without a
    # last line break, or one with blank lines at its end.
    for data, line, start, rest in ((b'prompt,completion\n"q\n1",a1\nq2,"a\n\n', 4, "a", "lines 4 to 5"),
                                    (b'prompt,completion\nq1,a1\n"q2', 3, "q2", "line 3"),
                                    (b'prompt,completion\r\nq1,"\r\n', 2, "", "line 2")):
        rows = list(datasets.iter_rows(datasets.Source("bad.csv", len(data), lambda data=data: io.BytesIO(data))))
        assert [(n, str(row)) for n, row in rows if isinstance(row, datasets.RowError)] == [(len(rows), unclosed(line, start, rest))], rows


@pytest.mark.parametrize("data", [UNCLOSED, UNCLOSED_LAST])
def test_a_quote_never_closed_fails_the_engines_csv_reader(tmp_path, monkeypatch, data):
    import datasets as hf_datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    path = tmp_path / "qa.csv"
    path.write_bytes(data)
    with pytest.raises(hf_datasets.exceptions.DatasetGenerationError) as failed:
        hf_datasets.load_dataset("csv", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert "EOF inside string starting at row 2" in str(failed.value.__cause__)
    problems = [(n, row) for n, row in datasets.iter_rows(datasets.Source("qa.csv", len(data), lambda: io.BytesIO(data))) if isinstance(row, datasets.RowError)]
    assert [n for n, _ in problems] == [2] and str(problems[0][1]).startswith("line 3 opens a quoted field"), problems
