"""START's row checks of a dataset (the 422, the Start button) against what the engine's reader and
trainer do with the same file: a dataset they cannot train on is refused naming the row and field,
one they can is not, and rows left unchecked are said, not refused."""
from __future__ import annotations

import io
import json

import pytest
from django.urls import reverse
from django.utils.html import escape

from datahub import commits, datasets, repos
from studio.services import set_secret
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from training.models import TrainingRun

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
DPO = {"method": "dpo", "config": {"loss": {"type": "dpo"}, "lora_rank": 8}}


def start_refused(api, project, files: dict[str, bytes], field: str = "dataset", **overrides) -> list[str]:
    """START a run on a new dataset repo holding `files`: it is a 422, the run stays unstarted; the messages on `field`."""
    repo = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repo, "main", files, "data")
    run_id = api.post("/api/training-runs", sft_body(**{"dataset": "rows@main", **overrides})).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, field)
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    return [e["message"] for e in body["errors"] if e["field"] == field]


def start_accepted(api, project, files: dict[str, bytes], **overrides) -> TrainingRun:
    repo = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repo, "main", files, "data")
    run_id = api.post("/api/training-runs", sft_body(**{"dataset": "rows@main", **overrides})).json()["id"]
    r = api.post(f"/api/training-runs/{run_id}/start")
    assert r.status_code == 202, r.content
    return TrainingRun.objects.get(pk=run_id)


def preview_problems(api, path: str) -> list[dict]:
    r = api.client.get("/api/hub/repos/rows/preview", {"path": path}, **api._headers())
    assert r.status_code == 200, r.content
    return r.json()["problems"]


@pytest.mark.parametrize(("first", "kind"), [(b"null", "null"), (b"5", "number")])
def test_a_first_line_that_is_not_an_object_is_refused_naming_row_1(api, project, first, kind):
    # The shape came from the first object row and the lines before it were never checked: START
    # took the file, and the engine's reader died on it (signal 11, or DatasetGenerationError).
    messages = start_refused(api, project, {"train.jsonl": first + b"\n" + jsonl([CHAT, CHAT])})
    assert messages == [f"train.jsonl row 1: must be an object, not {kind}"], messages
    assert preview_problems(api, "train.jsonl") == [{"row": 1, "message": f"must be an object, not {kind}"}]


def test_bytes_that_are_not_utf8_are_refused_naming_the_row(api, project):
    # Read with errors="replace" they passed as "caf\ufffd", and the engine failed on a UnicodeDecodeError.
    good = jsonl([{"prompt": "q", "completion": "a"}] * 4)
    data = {"train.jsonl": good + b'{"prompt": "caf\xe9", "completion": "a"}\n' + good,
            "train.csv": b"prompt,completion\nq,a\n\"caf\xe9, au lait\",a\n",
            "train.json": b'[{"prompt": "q", "completion": "a"},\n {"prompt": "caf\xe9", "completion": "a"}]'}
    messages = start_refused(api, project, data)
    assert "train.jsonl row 5: not valid UTF-8 (the byte 0xE9 at column 16): save the file as UTF-8" in messages, messages
    assert 'train.csv row 2: not valid UTF-8 (the byte 0xE9 in "prompt", on line 3): save the file as UTF-8' in messages, messages
    assert "train.json row 1: the file is not valid UTF-8 (the byte 0xE9 on line 2): save it as UTF-8" in messages, messages
    assert preview_problems(api, "train.jsonl") == [{"row": 5, "message": "not valid UTF-8 (the byte 0xE9 at column 16): save the file as UTF-8"}]
    # A file of no other row previews too (no shape to check the rows against).
    commits.commit_files(repos.find_repo(project, "rows"), "main", {"only.jsonl": b'{"text": "caf\xe9"}\n'}, "one bad row")
    assert preview_problems(api, "only.jsonl") == [{"row": 1, "message": "not valid UTF-8 (the byte 0xE9 at column 14): save the file as UTF-8"}]
    # The character written in UTF-8 is no problem.
    assert not datasets.rows_findings([source("ok.jsonl", '{"prompt": "café", "completion": "a"}\n'.encode())], "sft", "dataset")


def test_a_header_that_is_not_utf8_is_refused():
    findings = datasets.rows_findings([source("t.csv", b"pr\xf6mpt,completion\nq,a\n")], "sft", "dataset")
    assert [f.message for f in findings] == ["t.csv row 1: the header line is not valid UTF-8 (the byte 0xF6): save the file as UTF-8"]


def test_a_later_row_whose_fields_are_messages_where_the_first_rows_are_text_is_refused_naming_both(api, project):
    # It passed, and the trainer, which reads every row as it reads the first, failed on
    # AttributeError: 'list' object has no attribute 'endswith'.
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(3000)]
    rows[2499] = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}
    messages = start_refused(api, project, {"train.jsonl": jsonl(rows)})
    assert messages == ['train.jsonl row 2500: "prompt" is a list of messages, and in row 1 it is text: '
                        "write it as text here too, as the trainer reads every row the way it reads the file's first"], messages
    # The other way round too, on the field that differs; the preview says it of the rows it shows.
    pairs = [{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]},
             {"prompt": [{"role": "user", "content": "q"}], "completion": "a"}]
    findings = datasets.rows_findings([source("pairs.jsonl", jsonl(pairs))], "sft", "dataset")
    assert [f.message for f in findings] == ['pairs.jsonl row 2: "completion" is text, and in row 1 it is a list of messages: '
                                             "write it as a list of messages here too, as the trainer reads every row the way it reads the file's first"]
    commits.commit_files(repos.find_repo(project, "rows"), "main", {"pairs.jsonl": jsonl(pairs)}, "pairs")
    assert [p["row"] for p in preview_problems(api, "pairs.jsonl")] == [2]


def test_a_dataset_of_one_file_names_the_file_in_its_findings_as_a_folder_does(api, project, browser, tmp_path):
    # A folder's findings said "train.jsonl row 2: ...", one file's only "row 2: ...": in the 422, the
    # Start button's reasons and the Edit form alike, the file to fix was left to guess.
    rows = jsonl([{"prompt": "q", "completion": "a"}, {"prompt": "q", "completion": ""}])
    said = 'train.jsonl row 2: "completion" is empty'
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(rows)
    (folder / "more.jsonl").write_bytes(jsonl([{"prompt": "q", "completion": "a"}]))
    (tmp_path / "train.jsonl").write_bytes(rows)
    for dataset in (str(folder), str(tmp_path / "train.jsonl")):
        run_id = api.post("/api/training-runs", sft_body(dataset=dataset)).json()["id"]
        body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, "dataset")
        assert [e["message"] for e in body["errors"] if e["field"] == "dataset"] == [said], (dataset, body)
        assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    assert start_refused(api, project, {"train.jsonl": rows}) == [said]
    run_id = TrainingRun.objects.latest("pk").pk
    for url in (reverse("training:run", args=[run_id]), reverse("training:edit", args=[run_id])):
        assert escape(said) in browser("owner").get(url).content.decode(), url
    # A file's findings that are not a row's name it too.
    assert [f.message for f in datasets.rows_findings([source("empty.jsonl", b"")], "sft", "dataset")] == [
        "empty.jsonl has no rows: add rows to it, or train on a dataset that has some"]


def test_rows_past_the_limit_are_said_beside_start_and_do_not_refuse_it(api, project, browser, settings, tmp_path):
    # They were skipped silently: a bad row there passed START and failed the run in the engine.
    settings.DATAHUB_VALIDATE_MAX_ROWS = 3
    rows = [{"prompt": "q", "completion": "a"}] * 4 + [{"prompt": "q", "completion": ""}]
    check = datasets.check_rows([source("train.jsonl", jsonl(rows))], "sft", "dataset")
    assert check.findings == []
    assert [n.message for n in check.notices] == [
        "only the first 3 rows of train.jsonl were checked before START (DATAHUB_VALIDATE_MAX_ROWS): a problem in a later row "
        "fails the run when the trainer reaches it; check the rest of the file, or ask the Studio's administrator to raise the limit"]
    repo = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repo, "main", {"train.jsonl": jsonl(rows)}, "data")
    run_id = api.post("/api/training-runs", sft_body(dataset="rows@main")).json()["id"]
    page = browser("owner").get(reverse("training:run", args=[run_id])).content.decode()
    assert 'id="start-notices"' in page and "only the first 3 rows of train.jsonl were checked" in page, page
    assert 'id="start-blockers"' not in page
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    # A dataset on the Studio's machine is said the same way.
    local = tmp_path / "local.jsonl"
    local.write_bytes(jsonl(rows))
    run_id = api.post("/api/training-runs", sft_body(dataset=str(local))).json()["id"]
    page = browser("owner").get(reverse("training:run", args=[run_id])).content.decode()
    assert "only the first 3 rows of local.jsonl were checked" in page and 'id="start-blockers"' not in page, page
    # Within the limit, there is nothing to say.
    assert not datasets.check_rows([source("train.jsonl", jsonl(rows[:3]))], "sft", "dataset").notices


def test_a_ruler_prompts_dataset_given_as_a_data_hub_ref_is_checked_row_by_row(api, project):
    # Only a local path's rows were checked: a Data Hub ref of chat rows, or of an empty prompt, passed START.
    set_secret(project, "judge-key", "sk")
    config = {"rl_mode": "ruler", "ruler_task_args": {"dataset": "rows@main", "system_prompt": "Score it"},
              "judge": {"mode": "external", "endpoint": "http://judge.example/v1", "api_key_secret": "judge-key"}}
    grpo = {"method": "grpo", "dataset": None, "config": config}
    field = "config.ruler_task_args.dataset"
    messages = start_refused(api, project, {"prompts.jsonl": jsonl([{"prompt": "p1"}, {"prompt": " "}])}, field, **grpo)
    assert messages == ['prompts.jsonl row 2: "prompt" is empty'], messages
    commits.commit_files(repos.find_repo(project, "rows"), "main", {"prompts.jsonl": jsonl([CHAT])}, "chat rows")
    run_id = api.post("/api/training-runs", sft_body(**grpo)).json()["id"]
    body = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422, field)
    assert any(e["field"] == field and e["message"].startswith("prompts.jsonl rows have no prompt, question or text column (columns: messages)")
               for e in body["errors"]), body


def test_a_jsonl_file_with_a_byte_order_mark_is_accepted(api, project):
    # "Unexpected UTF-8 BOM" refused it, though the engine's reader reads it (and a CSV with one was accepted).
    run = start_accepted(api, project, {"train.jsonl": b"\xef\xbb\xbf" + jsonl([CHAT, CHAT])})
    assert run.start_requested_at is not None
    assert preview_problems(api, "train.jsonl") == []
    assert not datasets.rows_findings([source("rows.json", b"\xef\xbb\xbf" + json.dumps([CHAT]).encode())], "sft", "dataset")


def test_a_dpo_row_missing_rejected_is_named_with_its_row_and_field(api, project):
    # START said only "rows look like prompts (prompt) ... train on these rows with GRPO", where the
    # preview said row 1: "rejected" is missing.
    rows = [{"prompt": "q", "chosen": "a"}] + [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 2
    messages = start_refused(api, project, {"train.jsonl": jsonl(rows)}, **DPO)
    assert messages == ['train.jsonl row 1: "rejected" is missing'], messages
    findings = datasets.rows_findings([source("t.jsonl", jsonl([{"chosen": "a", "rejected": "b"}]))], "dpo", "dataset")
    assert [f.message for f in findings] == ['t.jsonl row 1: "prompt" is missing']
    # Rows that are another shape whole still say which method trains on them.
    findings = datasets.rows_findings([source("t.jsonl", jsonl([{"prompt": "q", "completion": "a"}]))], "dpo", "dataset")
    assert [f.message for f in findings] == ["t.jsonl rows look like prompt/completion (columns: completion, prompt); DPO trains on "
                                             "prompt/chosen/rejected rows: give a dataset of such rows, or train on these rows with SFT or DISTILL or GRPO"]


@pytest.mark.parametrize(("name", "data"), [
    ("bom.jsonl", b"\xef\xbb\xbf" + jsonl([{"prompt": "q", "completion": "a"}] * 2)),
    ("latin.jsonl", jsonl([{"prompt": "q", "completion": "a"}]) + b'{"prompt": "caf\xe9", "completion": "a"}\n'),
    ("latin.csv", b"prompt,completion\nq,a\ncaf\xe9,a\n"),
])
def test_the_rule_is_the_engines_reader_s(tmp_path, monkeypatch, name, data):
    """What the engine's reader (datasets.load_dataset) reads, START takes; what it fails on, START refuses."""
    import datasets as hf_datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    path = tmp_path / name
    path.write_bytes(data)
    findings = datasets.rows_findings([source(name, data)], "sft", "dataset")
    builder = "csv" if name.endswith(".csv") else "json"
    if name.startswith("latin"):
        # CSV fails as it loads; JSON Lines loads (pyarrow keeps the bytes) and fails on the first read of the row.
        with pytest.raises((UnicodeDecodeError, hf_datasets.exceptions.DatasetGenerationError)):
            hf_datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")).to_list()
        assert ["row 2: not valid UTF-8" in f.message for f in findings] == [True], findings
    else:
        rows = hf_datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")).to_list()
        assert rows == [{"prompt": "q", "completion": "a"}] * 2 and not findings


def source(name: str, data: bytes) -> datasets.Source:
    return datasets.Source(name, len(data), lambda: io.BytesIO(data))


def test_files_named_like_an_evaluation_split_are_said_beside_start():
    # test.jsonl in a dataset repo was trained on silently; the run's log says so too (training/engine/data.py).
    rows = jsonl([{"text": "a"}])
    check = datasets.check_rows([source("train.jsonl", rows), source("data/validation-00000-of-00001.jsonl", rows)], "sft", "dataset")
    assert check.findings == []
    assert [n.message for n in check.notices] == [
        "data/validation-00000-of-00001.jsonl is named like an evaluation split, and a run trains on every data file of its dataset: "
        "move evaluation files to another branch or repo if they are not for training"]


def nested(depth: int) -> str:
    """A row whose meta nests `depth` lists inside each other (the row itself is one more level)."""
    return '{"prompt": "q", "completion": "a", "meta": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(("name", "line", "says"), [
    ("deep62.jsonl", nested(62), None),
    ("deep63.jsonl", nested(63), "the row nests lists and objects more than 63 levels deep (itself counted)"),
    ("surrogate.jsonl", '{"prompt": "\\ud800x", "completion": "a"}', "a string holds a lone surrogate escape (\\ud800), which is no character"),
    ("pair.jsonl", '{"prompt": "\\ud83d\\ude00", "completion": "a"}', None),
])
def test_a_row_the_engines_reader_fails_the_file_on_is_refused_naming_it(tmp_path, monkeypatch, name, line, says):
    """Both passed START and failed the run with "DatasetGenerationError: An error occurred while generating
    the dataset" (pyarrow: "Recursion level in ArrowSchema struct exceeded", "The surrogate pair in string is invalid")."""
    import datasets as hf_datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    data = (json.dumps({"prompt": "q", "completion": "a"}) + "\n" + line + "\n").encode()
    (tmp_path / name).write_bytes(data)
    findings = [f.message for f in datasets.rows_findings([source(name, data)], "sft", "dataset")]
    load = lambda: hf_datasets.load_dataset("json", data_files=str(tmp_path / name), split="train", cache_dir=str(tmp_path / "cache")).to_list()  # noqa: E731
    if says is None:
        assert len(load()) == 2 and not findings, findings
    else:
        with pytest.raises(hf_datasets.exceptions.DatasetGenerationError):
            load()
        assert [m.startswith(f"{name} row 2: {says}") for m in findings] == [True], findings


def test_a_row_nested_thousands_deep_is_a_422_and_its_runs_pages_open(api, project, browser):
    # json's RecursionError escaped the check: START, the file's preview and the run's own pages were 500s.
    files = {"train.jsonl": (json.dumps({"prompt": "q", "completion": "a"}) + "\n" + nested(5000) + "\n").encode()}
    assert start_refused(api, project, files) == ["train.jsonl row 2: the row nests lists and objects more than 63 levels deep (itself counted): "
                                                 "the trainer's reader refuses the whole file for it; flatten the row"]
    assert preview_problems(api, "train.jsonl")[0]["row"] == 2
    run_id = TrainingRun.objects.latest("pk").pk
    for url in (reverse("training:run", args=[run_id]), reverse("training:run_tab", args=[run_id, "datasets"]), reverse("training:edit", args=[run_id])):
        assert browser("owner").get(url).status_code == 200, url


def test_a_key_given_twice_in_a_row_is_refused_naming_it(api, project):
    # The row read as its last "messages" ("oops"), and the finding said its messages were not a list: the user saw a good list.
    row = '{"messages": ' + json.dumps(CHAT["messages"]) + ', "messages": "oops"}'
    messages = start_refused(api, project, {"train.jsonl": jsonl([CHAT]) + row.encode() + b"\n"})
    assert messages == ['train.jsonl row 2: the key "messages" appears twice in one object (JSON keeps the last one, so the first is lost): keep one of them']
    one_file = datasets.rows_findings([source("t.json", b'[{"text": "a", "text": "b"}]')], "sft", "dataset")
    assert [f.message for f in one_file] == ['t.json row 1: the file has an object with the key "text" twice (JSON keeps the last one, so the first is lost): keep one of them']


def test_an_assistant_message_with_no_text_is_refused_as_an_empty_completion_is(api, project):
    # An empty "completion" was refused, an empty assistant message trained: the model learnt to answer nothing.
    empty = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]}
    calls = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                          {"role": "tool", "content": "1"}, {"role": "assistant", "content": "one"}]}
    messages = start_refused(api, project, {"train.jsonl": jsonl([CHAT, calls, empty])})
    assert messages == ['train.jsonl row 3: "messages"[1].content is empty: an assistant message with no text (and no tool_calls) would teach the model '
                        "to answer nothing; write its answer or drop the message"], messages


def test_a_raw_control_character_in_a_string_is_named_with_its_column():
    # The message ended "(Invalid control character at)": json's text, cut from its own position.
    findings = datasets.rows_findings([source("t.jsonl", b'{"text": "a\tb"}\n')], "sft", "dataset")
    assert [f.message for f in findings] == ["t.jsonl row 1: not valid JSON at column 12: a control character (a raw tab, carriage return or line "
                                             "break) inside a string; write it as \\t, \\r or \\n"]


def test_an_entry_typed_as_another_shape_than_its_rows_is_refused(api, project):
    # {"type": "prompt_completion"} on chat rows trained as chat: the type was ignored without a word.
    messages = start_refused(api, project, {"train.jsonl": jsonl([CHAT] * 2)}, "dataset.type", dataset={"ref": "rows@main", "type": "prompt_completion"})
    assert messages == ['type says prompt/completion rows, and the rows of train.jsonl are chat messages (messages) (columns: messages): the run '
                        'trains on an entry as its rows are, whatever its type; set type to "chat", or leave it out'], messages
    run_id = TrainingRun.objects.latest("pk").pk
    assert api.patch(f"/api/training-runs/{run_id}", {"dataset": {"ref": "rows@main", "type": "chat"}}).status_code == 200
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
