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
