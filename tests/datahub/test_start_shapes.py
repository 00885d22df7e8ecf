"""START's dataset check beyond one row and one file: the files of a dataset, which the engine joins
into one table, keep one row shape and one form per field; a row's fields are in the one form its
method's trainer reads; and a RULER run's prompts are checked as the engine's RULER loader reads them."""
from __future__ import annotations

import pytest

from datahub import commits, datasets, repos
from studio.services import set_secret
from tests.conftest import assert_error, sft_body
from tests.datahub.conftest import jsonl
from tests.datahub.test_start_rows import DPO, preview_problems, source, start_accepted, start_refused
from training.models import TrainingRun

TEXT = {"text": "hello there"}
PAIR = {"prompt": "q", "completion": "a"}
CHAT_PAIR = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
HUB_SET_ASIDE = ("delete b.jsonl from the branch (its Delete on the repo's Files tab, or DELETE /api/hub/repos/rows/files) "
                 "or move it to another branch or repo")
RULER_FIELD = "config.ruler_task_args.dataset"


def test_files_of_one_dataset_with_different_row_shapes_are_refused_naming_both(api, project, tmp_path):
    # Each file passed on its own, and the engine trains on them joined into one table: JSON files of
    # other columns fail to load ("column names don't match"); files of two formats join with each
    # file's rows empty (null) in the other's columns, which the trainer then reads.
    messages = start_refused(api, project, {"a.jsonl": jsonl([TEXT] * 2), "b.jsonl": jsonl([PAIR] * 2)})
    assert messages == ["b.jsonl rows look like prompt/completion (columns: completion, prompt), and a.jsonl rows like plain text (text) "
                        "(columns: text): the run trains on all of a dataset's files as one table, where each file's rows would have the "
                        "other's columns empty; keep one shape per dataset: write b.jsonl's rows as plain text (text) too, "
                        f"or {HUB_SET_ASIDE} and train on it in a run of its own"], messages
    # Chat rows beside text rows, of two formats, in a folder on the Studio's machine.
    findings = datasets.local_check(_folder(tmp_path, {"a.csv": b"text\nhello\n", "b.jsonl": jsonl([CHAT])}), "sft", "dataset").findings
    assert [f.message.split(": the run trains")[0] for f in findings] == [
        "b.jsonl rows look like chat messages (messages) (columns: messages), and a.csv rows like plain text (text) (columns: text)"]
    assert findings[0].message.endswith(f"or move b.jsonl out of {tmp_path / 'data'} and train on it in a run of its own")
    # Files of one shape are one dataset.
    assert not datasets.rows_findings([source("a.jsonl", jsonl([PAIR])), source("b.csv", b"prompt,completion\nq,a\n")], "sft", "dataset")


def test_the_engine_joins_a_folder_of_two_shapes_with_empty_columns(tmp_path, monkeypatch):
    """What START now refuses trains, in the engine, on rows whose other shape's columns are null."""
    import datasets as hf_datasets

    from training.engine.data import load_rows
    from training.engine.spec import DatasetRef

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = _folder(tmp_path, {"a.csv": b"text\nhello\n", "b.jsonl": jsonl([PAIR])})
    assert load_rows([DatasetRef(str(folder), None, None, False)]).to_list() == [
        {"text": "hello", "prompt": None, "completion": None}, {"text": None, "prompt": "q", "completion": "a"}]


def test_a_field_that_is_text_in_one_file_and_messages_in_another_is_refused_naming_both(api, project):
    # Each file kept one form, so each passed; joined, the column cannot be both (the load fails on "Couldn't cast").
    messages = start_refused(api, project, {"a.jsonl": jsonl([PAIR] * 2), "b.jsonl": jsonl([CHAT_PAIR] * 2)})
    assert messages == ['b.jsonl row 1: "prompt" is a list of messages, and in a.jsonl (row 1) it is text: the trainer reads all of '
                        "a dataset's files as one table, each column in one form; write it as text in this file too"], messages
    findings = datasets.rows_findings([source("a.jsonl", jsonl([CHAT_PAIR])), source("b.jsonl", jsonl([PAIR]))], "grpo", "dataset")
    assert [f.message.split(": the trainer")[0] for f in findings] == ['b.jsonl row 1: "prompt" is text, and in a.jsonl (row 1) it is a list of messages']


def test_a_row_with_a_text_prompt_and_message_answers_is_refused_naming_the_fields(api, project):
    # TRL joins a row's prompt and answer (prompt + completion): text and a list fail with a TypeError.
    mixed = [{"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}] * 3
    messages = start_refused(api, project, {"train.jsonl": jsonl(mixed)})
    assert messages == ['train.jsonl row 1: "prompt" is text and "completion" is a list of messages: SFT needs a row\'s prompt and completion in one '
                        'form, as TRL joins them into one sequence; write "prompt" as a list of {role, content} messages too, '
                        'or "completion" as text, in every row'], messages
    assert [p["row"] for p in preview_problems(api, "train.jsonl")] == [1]
    # DPO's prompt and answers the other way round.
    prefs = [{"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}]
    findings = datasets.rows_findings([source("t.jsonl", jsonl(prefs))], "dpo", "dataset")
    assert [f.message for f in findings] == ['t.jsonl row 1: "chosen" and "rejected" are text and "prompt" is a list of messages: DPO needs a row\'s '
                                             "prompt, chosen and rejected in one form, as TRL joins them into one sequence; write \"chosen\" "
                                             'and "rejected" as lists of {role, content} messages too, or "prompt" as text, in every row']
    # GRPO reads the prompt alone: its other columns may be in either form.
    assert not datasets.rows_findings([source("t.jsonl", jsonl(mixed))], "grpo", "dataset")
    assert not datasets.rows_findings([source("t.jsonl", jsonl(prefs))], "grpo", "dataset")
    # DISTILL tokenizes prompt/completion rows as text.
    findings = datasets.rows_findings([source("t.jsonl", jsonl([CHAT_PAIR]))], "distill", "dataset")
    assert [f.message for f in findings] == ['t.jsonl row 1: "prompt" and "completion" are lists of messages: DISTILL reads prompt/completion rows '
                                             'as text; write "prompt" and "completion" as text in every row, or give chat rows (messages)']
    # One form per row is what TRL reads.
    assert not datasets.rows_findings([source("t.jsonl", jsonl([CHAT_PAIR, CHAT_PAIR]))], "sft", "dataset")


def test_a_dpo_run_on_mixed_rows_is_refused_at_start(api, project):
    prefs = [{"prompt": "q", "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}]
    messages = start_refused(api, project, {"train.jsonl": jsonl(prefs)}, **DPO)
    assert [m.split(": DPO")[0] for m in messages] == ['train.jsonl row 1: "prompt" is text and "chosen" and "rejected" are lists of messages'], messages


def ruler(dataset: str) -> dict:
    return {"method": "grpo", "dataset": None, "config": {
        "rl_mode": "ruler", "ruler_task_args": {"dataset": dataset, "system_prompt": "Score it"},
        "judge": {"mode": "external", "endpoint": "http://judge.example/v1", "api_key_secret": "judge-key"}}}


@pytest.mark.parametrize("column", ["question", "text"])
def test_ruler_prompts_in_a_question_or_text_column_are_accepted(api, project, tmp_path, column):
    # The engine's RULER loader reads a prompt, question or text column; START checked them as GRPO
    # rows and refused these ("match no shape", or "rows look like plain text").
    set_secret(project, "judge-key", "sk")
    run = start_accepted(api, project, {"prompts.jsonl": jsonl([{column: "Write a poem"}] * 2)}, **ruler("rows@main"))
    assert run.start_requested_at is not None
    local = tmp_path / "prompts.csv"
    local.write_text(f"{column}\nWrite a poem\n")
    run_id = api.post("/api/training-runs", sft_body(**ruler(str(local)))).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    # A missing or empty prompt is named in that column.
    findings = datasets.rows_findings([source("p.jsonl", jsonl([{column: "a"}, {column: ""}, {"other": "b"}]))], datasets.RULER, RULER_FIELD)
    assert [f.message for f in findings] == [f'p.jsonl row 2: "{column}" is empty', f'p.jsonl row 3: "{column}" is missing']


def test_ruler_prompts_the_loader_cannot_read_are_refused_naming_its_columns(api, project):
    set_secret(project, "judge-key", "sk")
    messages = start_refused(api, project, {"prompts.jsonl": jsonl([CHAT])}, RULER_FIELD, **ruler("rows@main"))
    assert messages == ['prompts.jsonl rows have no prompt, question or text column (columns: messages): RULER reads each prompt from the first of those '
                        'a row has; rename the column that holds the prompts to "prompt"'], messages
    run_id = api.post("/api/training-runs", sft_body(**ruler("rows@main"))).json()["id"]
    # A list of messages reached the policy and the judge as its Python form (the loader takes str() of it).
    commits.commit_files(repos.find_repo(project, "rows"), "main", {"prompts.jsonl": jsonl([{"prompt": [{"role": "user", "content": "q"}]}])}, "chat prompts")
    errors = api.post(f"/api/training-runs/{run_id}/start").json()["errors"]
    assert [e["message"] for e in errors if e["field"] == RULER_FIELD] == [
        'prompts.jsonl row 1: "prompt" is a list of messages: RULER gives each prompt to the policy and the judge as text; write it as text']
    # Files whose prompts are in different columns join with the other's column empty: the loader skips those rows.
    commits.commit_files(repos.find_repo(project, "rows"), "main", {"prompts.jsonl": jsonl([{"prompt": "p"}]),
                                                                    "questions.jsonl": jsonl([{"question": "q"}])}, "two columns")
    errors = api.post(f"/api/training-runs/{run_id}/start").json()["errors"]
    assert [e["message"].split(": the run")[0] for e in errors if e["field"] == RULER_FIELD] == [
        'questions.jsonl rows look like prompts in "question" (columns: question), and prompts.jsonl rows like prompts in "prompt" (columns: prompt)']
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None


def _folder(tmp_path, files: dict[str, bytes]):
    folder = tmp_path / "data"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def start_errors(api, body: dict) -> list[tuple[str, str]]:
    """START a run of `body`: a 422 (the run stays unstarted), its dataset findings as (field, message)."""
    run_id = api.post("/api/training-runs", sft_body(**body)).json()["id"]
    errors = assert_error(api.post(f"/api/training-runs/{run_id}/start"), 422)["errors"]
    assert TrainingRun.objects.get(pk=run_id).start_requested_at is None
    return [(e["field"], e["message"]) for e in errors if e["field"].startswith("dataset")]


def test_dataset_entries_of_different_shapes_or_forms_are_refused_naming_both(api, project, tmp_path):
    # Each entry passed on its own; the engine joins them into one table: chat rows beside
    # prompt/completion rows trained with each other's columns null (SFT: "the dataset is not
    # conversational"), and a field in the other form failed the load ("features can't be aligned").
    chat, pairs = tmp_path / "chat.jsonl", tmp_path / "pairs.jsonl"
    chat.write_bytes(jsonl([CHAT] * 2))
    pairs.write_bytes(jsonl([PAIR] * 2))
    assert start_errors(api, {"dataset": [str(chat), {"ref": str(pairs)}]}) == [("dataset[1]", (
        "rows look like prompt/completion (columns: completion, prompt, in pairs.jsonl), and dataset[0]'s rows like chat messages "
        "(messages) (columns: messages, in chat.jsonl): the run trains on all of its dataset entries as one table, where each entry's "
        "rows would have the other's columns empty; keep one shape per run: give dataset[1] rows of chat messages (messages) too, "
        "or remove dataset[1] and train on it in a run of its own"))]
    # A Data Hub entry first, a local one second: the order is the dataset's, whatever the kind.
    repos_ = repos.create_repo(project, "rows", "dataset")
    commits.commit_files(repos_, "main", {"train.jsonl": jsonl([CHAT_PAIR] * 2)}, "data")
    assert start_errors(api, {"dataset": ["rows@main", str(pairs)]}) == [("dataset[1]", (
        '"prompt" is text (pairs.jsonl row 1), and in dataset[0] it is a list of messages (train.jsonl row 1): the run trains on all '
        'of its dataset entries as one table, each column in one form; write "prompt" as a list of messages in dataset[1] too, '
        "or remove dataset[1] and train on it in a run of its own"))]
    # Entries of one shape and form start.
    run_id = api.post("/api/training-runs", sft_body(dataset=[str(pairs), str(pairs)])).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202


def test_a_csv_column_of_json_lists_and_text_is_refused_naming_the_row(api, project, tmp_path):
    # The engine stops on such a column whether or not the trainer reads it (training.engine.data);
    # START took it when the column was not one of the shape's fields.
    from training.engine.data import load_rows
    from training.engine.spec import DatasetRef, SpecError

    data = tmp_path / "chat.csv"
    data.write_text('messages,prompt\n"[{""role"": ""user"", ""content"": ""hi""}, {""role"": ""assistant"", ""content"": ""yo""}]",'
                    '"[{""role"": ""user"", ""content"": ""hi""}]"\n'
                    '"[{""role"": ""user"", ""content"": ""2+2?""}, {""role"": ""assistant"", ""content"": ""4""}]",what is 2+2?\n')
    assert start_errors(api, {"dataset": str(data)}) == [("dataset", (
        'chat.csv row 2: the "prompt" cell is text, and in row 1 it is a JSON list of messages: the trainer reads a CSV column as JSON lists '
        "of messages or as text, not both; write every prompt cell as a JSON list of {role, content} messages, or every one as text"))]
    with pytest.raises(SpecError, match=r"the 'prompt' column of chat\.csv holds JSON lists of messages in some cells and plain text"):
        load_rows([DatasetRef(str(data))])


DPO_MIXED = [{"prompt": f"Colour {i}?", "chosen": [{"role": "assistant", "content": "blue"}],
              "rejected": [{"role": "assistant", "content": "red"}]} for i in range(2)]


def test_dpo_text_prompts_beside_message_answers_start_with_a_system_prompt(api, project, tmp_path):
    # The engine makes a text prompt a chat (system + user) when the run sets system_prompt, and then
    # trains these rows (tests/engine/test_dpo.py); without one TRL fails on them.
    data = tmp_path / "pairs.jsonl"
    data.write_bytes(jsonl(DPO_MIXED))
    body = {**DPO, "dataset": str(data)}
    assert start_errors(api, body) == [("dataset", (
        'pairs.jsonl row 1: "prompt" is text and "chosen" and "rejected" are lists of messages: DPO needs a row\'s prompt, chosen and rejected in '
        'one form, as TRL joins them into one sequence; write "prompt" as a list of {role, content} messages too, or "chosen" and '
        '"rejected" as text, in every row, or set config.system_prompt (DPO then makes a text prompt a chat of the system prompt '
        "and the user's prompt)"))]
    run_id = api.post("/api/training-runs", sft_body(**{**body, "config": {**DPO["config"], "system_prompt": "Name the colour."}})).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    # A conversational prompt beside text answers stays refused: the system prompt changes neither.
    prefs = [{"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}]
    assert datasets.rows_findings([source("t.jsonl", jsonl(prefs))], "dpo", "dataset", system_prompt=True)


def test_a_later_file_with_a_column_the_first_lacks_starts_and_loads(api, project, tmp_path):
    # datasets' loader of several files takes the first file's columns and failed on a later file
    # with one more ("column names don't match"); the engine loads each file and joins them by column.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.engine.data import load_rows
    from training.engine.spec import DatasetRef

    folder = _folder(tmp_path, {"a.jsonl": jsonl([PAIR]), "b.jsonl": jsonl([{**PAIR, "id": "b-1"}]),
                                "c.csv": b"prompt,completion\nq,a\n", "d.csv": b"prompt,completion,id\nq,a,d-1\n"})
    pq.write_table(pa.table({"prompt": ["q"], "completion": ["a"]}), folder / "e.parquet")
    pq.write_table(pa.table({"prompt": ["q"], "completion": ["a"], "id": ["f-1"]}), folder / "f.parquet")
    run_id = api.post("/api/training-runs", sft_body(dataset=str(folder))).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    assert [row.get("id") for row in load_rows([DatasetRef(str(folder))]).to_list()] == [None, "b-1", None, "d-1", None, "f-1"]
