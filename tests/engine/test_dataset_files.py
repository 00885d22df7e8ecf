"""Which files of a dataset the engine trains on, and in what order: every data file START checks
(datahub.datasets), for a local folder and for a Data Hub repo read through the live Studio's /hub
as a remote job reads it. Not the Hub's split-by-file-name rule, which trained a repo's train.jsonl
alone and failed a repo of data.jsonl + test.jsonl ('Unknown split "train"')."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datahub import commits, datasets, repos
from training.engine.data import load_rows, row_format
from training.engine.spec import DatasetRef, SpecError


def text_rows(*texts: str) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def parquet_rows(*texts: str) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"text": list(texts)}), out)
    return out.getvalue()


# Data files at the top and in a folder, one whose name holds glob characters, one with "::" (which
# datasets reads as fsspec's URL chaining), two formats, and files START does not check (a
# dot-folder's, a README): the engine must read exactly the checked ones.
FILES = {
    "data.jsonl": text_rows("d1", "d2", "d3"),
    "test.jsonl": text_rows("t1", "t2"),
    "nested/part[1]*.jsonl": text_rows("n1"),
    "nested/v1::v2.jsonl": text_rows("c1"),
    "shards/extra.parquet": parquet_rows("p1", "p2"),
    ".notes/scratch.jsonl": text_rows("never"),
    "README.md": b"# rows\n",
}
# By path, folder by folder; the parquet part follows the JSON one.
TRAINED = ["d1", "d2", "d3", "n1", "c1", "t1", "t2", "p1", "p2"]


def engine_rows(entry: dict, endpoint: str, token: str, tmp_path: Path) -> list[str]:
    """The rows the engine loads for a spec's dataset `entry`, in a process of its own with the
    environment Studio gives a job (and an HF cache of the test's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN=token, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
    spec = {"method": "sft", "base_model": "unused", "output_dir": str(tmp_path / "out"), "dataset": [entry]}
    script = (
        "import json, sys\n"
        "from training.engine.data import load_rows\n"
        "from training.engine.spec import parse_spec\n"
        "print(json.dumps(list(load_rows(parse_spec(json.loads(sys.argv[1])).datasets)['text'])))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_data_hub_repo_trains_on_every_file_start_checks(transactional_db, live_server, project, tokens, tmp_path):
    repo = repos.create_repo(project, "ds4", "dataset")
    commit = commits.commit_files(repo, "main", FILES, "rows")
    checked = [e.path for e in datasets.data_entries(commit)]
    assert sorted(checked) == sorted(p for p in FILES if p.endswith((".jsonl", ".parquet")) and not p.startswith("."))

    entry = {"path": "acme/ds4", "revision": commit.pk, "data_hub": True}
    assert engine_rows(entry, f"{live_server.url}/hub", tokens["member"], tmp_path) == TRAINED


def test_a_data_hub_repo_without_a_train_file_loads(transactional_db, live_server, project, tokens, tmp_path):
    """The QA case: data.jsonl + test.jsonl. The Hub's rule finds no train split in it."""
    repo = repos.create_repo(project, "ds4", "dataset")
    commit = commits.commit_files(repo, "main", {"data.jsonl": text_rows(*[f"d{i}" for i in range(64)]), "test.jsonl": text_rows(*"abcde")}, "rows")
    entry = {"path": "acme/ds4", "revision": commit.pk, "data_hub": True}
    assert len(engine_rows(entry, f"{live_server.url}/hub", tokens["member"], tmp_path)) == 69


def test_a_local_folder_trains_on_the_same_files_as_a_data_hub_repo(tmp_path):
    folder = tmp_path / "rows"
    for path, data in FILES.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    assert list(load_rows([DatasetRef(str(folder))])["text"]) == TRAINED


def test_a_spec_s_data_hub_flag_must_be_true_or_false(tmp_path):
    from training.engine.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match=r"^dataset\[0\]\.data_hub: true for a Data Hub repo"):
        parse_spec({"method": "sft", "base_model": "unused", "output_dir": str(tmp_path), "dataset": [{"path": "acme/ds4", "data_hub": "yes"}]})


def test_a_file_whose_name_holds_a_double_colon_loads(tmp_path):
    """datasets reads "a::b" as fsspec's chaining of URLs and found no such file; the Data Hub and
    START take the name, so the engine loads it, alone or among other files."""
    for name in ("v1::v2.jsonl", "v1::v2.csv"):
        path = tmp_path / "one" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text_rows("x1", "x2") if name.endswith(".jsonl") else b"text\nx1\nx2\n")
        assert list(load_rows([DatasetRef(str(path))])["text"]) == ["x1", "x2"]
    folder = tmp_path / "in::folder"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(text_rows("a1"))
    (folder / "b.jsonl").write_bytes(text_rows("b1"))
    assert list(load_rows([DatasetRef(str(folder))])["text"]) == ["a1", "b1"]


CHAT = [[{"role": "user", "content": "Hi, \"you\"."}, {"role": "assistant", "content": "Hello,\nthere."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]]


def csv_bytes(header: list[str], rows: list[list[object]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows([[json.dumps(cell) if isinstance(cell, list) else cell for cell in row] for row in rows])
    return out.getvalue().encode()


@pytest.mark.parametrize(("header", "rows"), [
    (["messages"], [[CHAT[0]], [CHAT[1]]]),
    # a conversational prompt and completion (SFT needs both in one form)
    (["prompt", "completion"], [[CHAT[1][:2], CHAT[1][2:]], [CHAT[0][:1], CHAT[0][1:]]]),
    # cells that start with "[" but are no JSON: text to both readers
    (["prompt", "completion"], [["[1] 2+2?", "[1] four"], ["[2] hi", "[2] hello"]]),
], ids=["chat", "prompt-completion", "bracketed-text"])
def test_csv_cells_load_as_start_reads_them(tmp_path, header, rows):
    """START (datahub.datasets) reads the JSON list in a CSV's messages cell and checks its messages:
    the engine trains on those lists, not on the cell's text (SFT refused the rows as "not
    conversational"; a prompt trained as the JSON's characters)."""
    data = csv_bytes(header, rows)
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    checked = [row for _, row in datasets.iter_rows(datasets.Source("rows.csv", len(data), lambda: io.BytesIO(data)))]
    assert datasets.rows_findings([datasets.Source("rows.csv", len(data), lambda: io.BytesIO(data))], "sft", "dataset") == []
    loaded = load_rows([DatasetRef(str(path))])
    assert loaded.to_list() == checked
    assert row_format(loaded) == ("chat" if header == ["messages"] else "prompt_completion")


def test_csv_cells_of_one_column_as_lists_and_as_text_are_a_spec_error(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(csv_bytes(["prompt", "completion"], [[CHAT[0][:1], "hello"], ["What is 2+2?", "4"]]))
    with pytest.raises(SpecError, match=r"^dataset\[0\]\.path: the 'prompt' column of rows\.csv holds JSON lists of messages in some "
                                        r"cells and plain text in others \(e\.g\. 'What is 2\+2\?'\): write every prompt cell"):
        load_rows([DatasetRef(str(path))])


def test_csv_text_trains_beside_json_and_parquet_text(tmp_path):
    """pandas reads a CSV's text as large_string and the JSON reader as string: datasets refused to
    join them ("features can't be aligned"), so a dataset of a .csv and a .jsonl that START passed
    failed the run, in one folder or as two dataset entries."""
    import pandas as pd

    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"prompt": "q1", "completion": "a1"}) + "\n")
    (folder / "b.csv").write_text("prompt,completion\nq2,a2\n")
    pd.DataFrame({"prompt": ["q3"], "completion": ["a3"]}).to_parquet(folder / "c.parquet")
    expected = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in (1, 2, 3)]
    assert load_rows([DatasetRef(str(folder))]).to_list() == expected
    entries = [DatasetRef(str(folder / name)) for name in ("a.jsonl", "b.csv", "c.parquet")]
    assert load_rows(entries).to_list() == expected


def test_a_column_of_single_values_whose_type_differs_between_files_or_entries_loads_as_text(tmp_path):
    # START checks the fields a method trains on, not every column's type: an id of numbers in one
    # file and of text in another (or in a CSV, whose cells are text) failed the run after START.
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x", "id": 1}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "y", "id": "b-1"}) + "\n")
    (tmp_path / "c.csv").write_text("text,id\nz,3\n")
    expected = [{"text": "x", "id": "1"}, {"text": "y", "id": "b-1"}, {"text": "z", "id": "3"}]
    assert load_rows([DatasetRef(str(tmp_path))]).to_list() == expected
    assert load_rows([DatasetRef(str(tmp_path / name)) for name in ("a.jsonl", "b.jsonl", "c.csv")]).to_list() == expected


def test_dataset_entries_whose_columns_differ_in_type_are_a_spec_error(tmp_path):
    # A column of lists in one entry and of text in another cannot be one column (START refuses the
    # fields it checks; this is any other column).
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x", "tags": ["a"]}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "y", "tags": "b"}) + "\n")
    with pytest.raises(SpecError, match=r"^dataset: its entries give the same column different types, so they cannot train as one dataset"):
        load_rows([DatasetRef(str(tmp_path / "a.jsonl")), DatasetRef(str(tmp_path / "b.jsonl"))])
