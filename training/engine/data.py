"""Loading the spec's datasets into one `datasets.Dataset`, and recognising row shapes."""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from .spec import EVAL_SPLIT_MAX, DatasetRef, Spec, SpecError

_EXT_TO_BUILDER = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# CSV cells are text: a cell of one of these columns that starts with "[" is a JSON list inside the
# cell (a chat's messages, a conversational prompt or answer). Studio's dataset checks read it so
# (datahub.datasets), and START checks the messages in it, so the engine trains on the same lists.
CSV_JSON_COLUMNS = ("messages", "prompt", "chosen", "rejected", "completion")


def is_data_path(path: str) -> bool:
    """A file the trainer reads rows from (`path` relative to its dataset folder or repo, with forward
    slashes): a known format, not a dot-file or under a dot-folder. Studio's dataset checks use the
    same rule, so START checks the very files a run trains on."""
    parts = PurePosixPath(path).parts
    return PurePosixPath(path).suffix.lower() in _EXT_TO_BUILDER and not any(part.startswith(".") for part in parts)


def data_files(paths: Iterable[str]) -> list[str]:
    """The data files among `paths` (relative, forward slashes), in the order they train in: by path,
    folder by folder, the same for a local folder and a Data Hub repo."""
    return sorted((p for p in paths if is_data_path(p)), key=lambda p: PurePosixPath(p).parts)


# A file or folder named as the Hub names an evaluation split (test.jsonl, validation-00000-of-00001.parquet,
# eval/rows.jsonl): a run trains on every data file, so such a file is trained on, which is rarely meant.
EVAL_SPLIT = re.compile(r"(test|tests|validation|valid|val|eval|evaluation|dev)([-_.]|$)", re.IGNORECASE)


def eval_split_files(files: Iterable[str]) -> list[str]:
    """The data files among `files` that are named like an evaluation split. Studio's dataset checks say
    so before START, and the engine in the run's log: neither refuses them (held-out rows are the spec's eval_dataset)."""
    return [f for f in files if any(EVAL_SPLIT.match(part) for part in PurePosixPath(f).parts)]


def eval_split_warning(files: Iterable[str], where: str) -> str | None:
    named = eval_split_files(files)
    if not named:
        return None
    return (f"{where}: {', '.join(named)} {'is' if len(named) == 1 else 'are'} named like an evaluation split, and a run trains on every "
            "data file of its dataset: move evaluation files to another branch or repo if they are not for training")


def csv_cell(column: str, value: Any) -> Any:
    """A CSV cell as START reads it: the JSON list in it for a column of CSV_JSON_COLUMNS, else as it is
    (a cell that starts with "[" but is not JSON stays text, e.g. "[1] the first answer")."""
    if isinstance(value, str) and column in CSV_JSON_COLUMNS and value[:1] == "[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _load_one(ref: DatasetRef, where: str, log: Callable[[str], None]) -> Any:
    import datasets

    if ref.data_hub:
        return _load_data_hub(ref, where, log)
    path = Path(ref.path)
    if path.is_file():
        if path.suffix.lower() not in _EXT_TO_BUILDER:
            raise SpecError(f"{where}.path: unsupported file type {path.suffix!r} (use .jsonl, .json, .parquet or .csv)")
        return _load_files(path.parent, [path.name], where)
    if path.is_dir():
        files = data_files(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
        if files:
            _warn_eval_split(files, where, log)
            return _load_files(path, files, where)
        return datasets.load_from_disk(str(path))
    if path.is_absolute() or ref.path.startswith("."):
        raise SpecError(f"{where}.path: {ref.path!r} does not exist")
    # Anything else is a Hugging Face dataset id, loaded as the Hub lays out its splits (its train
    # split); the container's HF cache/mirror decides whether it resolves.
    return datasets.load_dataset(ref.path, revision=ref.revision, split="train")


def _warn_eval_split(files: list[str], where: str, log: Callable[[str], None]) -> None:
    warning = eval_split_warning(files, where)
    if warning:
        log(f"warning: {warning}")


def _load_data_hub(ref: DatasetRef, where: str, log: Callable[[str], None]) -> Any:
    """A Data Hub dataset repo at its pinned commit, through the Studio's HF-compatible /hub
    (HF_ENDPOINT, HF_TOKEN): every data file of the commit, as a local folder of them loads. Not
    `load_dataset(repo)`: the Hub's split-by-file-name rule would train on train.jsonl alone, or
    fail on a repo whose only file is test.jsonl, while START checked every file."""
    from huggingface_hub import HfApi, snapshot_download

    # Read now, as the environment loader does, rather than when huggingface_hub was imported.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    files = data_files(HfApi(endpoint=endpoint).list_repo_files(ref.path, repo_type="dataset", revision=ref.revision))
    if not files:
        raise SpecError(f"{where}.path: {ref.path}@{ref.revision} has no .jsonl, .json, .parquet or .csv file to train on")
    _warn_eval_split(files, where, log)
    # Escaped: allow_patterns are fnmatch patterns, and a Data Hub path may hold *, ? or [.
    folder = snapshot_download(ref.path, repo_type="dataset", revision=ref.revision, endpoint=endpoint,
                               allow_patterns=[glob.escape(f) for f in files])
    return _load_files(Path(folder), files, where)


def _load_files(folder: Path, files: list[str], where: str) -> Any:
    """The rows of `files` (relative to `folder`), in order: the files of one format one after another,
    and a dataset of several formats is those parts one after another, in the order each format first
    appears. Each file loads on its own and the files join by column name, a column one file lacks
    being empty (null) in its rows: datasets' loader of several files at once takes the first file's
    columns and fails on a later file with one more ("column names don't match"), which START took.
    CSV cells read as START reads them (_load_csv, _parse_csv_cells)."""
    import datasets

    groups: dict[str, list[tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="studio-data-") as aliases:
        for n, f in enumerate(files):
            path = folder / f
            if "::" in str(path):
                # datasets reads "::" in a data file's path as fsspec's chaining of URLs ("zip://a.csv::b.zip")
                # and finds no such file, with no way to escape it; START checked the file, so it loads
                # through a link of a plain name, in its place in the order. The rows are in datasets'
                # cache once load_dataset returns, so the links can go then.
                link = Path(aliases) / f"{n}{path.suffix}"
                link.symlink_to(path.absolute())
                path = link
            groups.setdefault(_EXT_TO_BUILDER[path.suffix.lower()], []).append((f, str(path)))
        parts = [_parse_csv_cells(_load_csv(path), where, f) if builder == "csv"
                 # Escaped: datasets reads data_files as glob patterns, and a name may hold *, ? or [.
                 else datasets.load_dataset(builder, data_files=[glob.escape(path)], split="train")
                 for builder, named in groups.items() for f, path in named]
    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(_plain_strings(parts))
    except ValueError as exc:
        raise SpecError(f"{where}.path: its files give the same column different types, so they cannot "
                        f"train as one dataset ({exc}): give the column one type in every file") from None


def _load_csv(path: str) -> Any:
    """A CSV file with every cell as the text it holds, as START reads it (Python's csv module): not
    pandas' guesses, which read an all-number column as numbers and a cell "NA", "null" or empty as a
    missing value (NaN), so a run trained on other values than START checked, or failed on them."""
    import datasets

    with open(path, encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(fh), [])
    features = datasets.Features({column: datasets.Value("string") for column in header})
    return datasets.load_dataset("csv", data_files=[glob.escape(path)], split="train", features=features, keep_default_na=False)


def _parse_csv_cells(dataset: Any, where: str, path: str) -> Any:
    """CSV rows with the JSON lists in their cells parsed (csv_cell), as START checked them. A column
    whose cells are lists in some rows and text in others cannot be one column of the dataset (nor
    one kind of row to the trainer): a SpecError saying which file and column and what to do (START
    refuses it naming the row: datahub.datasets.CsvColumnForms)."""
    order = list(dataset.column_names)
    for column in [c for c in order if c in CSV_JSON_COLUMNS]:
        cells = [csv_cell(column, value) for value in dataset[column]]
        if not any(isinstance(cell, list) for cell in cells):
            continue
        text = next((cell for cell in cells if isinstance(cell, str)), None)
        if text is not None:
            raise SpecError(f"{where}.path: the {column!r} column of {path} holds JSON lists of messages in some cells and "
                            f"plain text in others (e.g. {text[:40]!r}): write every {column} cell as a JSON list of "
                            '{role, content} messages, or every one as text')
        # Built whole rather than mapped batch by batch, so one column type covers every row's messages
        # (a tool_calls key on a later row's message, say). Added before the text column goes: a
        # dataset left without columns would have no rows to add it to.
        parsed = f"{column} (parsed)"
        dataset = dataset.add_column(parsed, cells).remove_columns(column).rename_column(parsed, column)
    return dataset.select_columns(order)


def _plain_strings(parts: list[Any]) -> list[Any]:
    """`parts` with their large_string text (at any depth) as string, so they concatenate: pandas reads
    a CSV's text as large_string, the JSON and most Parquet readers as string, and datasets refuses to
    join the two ("features can't be aligned"), though it is the same text. A column of single values
    (not lists) whose type differs between parts is text in all of them, as a CSV's cells are (an `id`
    of numbers in a JSON file beside one of a CSV file, or beside text ids in another file): START
    checks the fields a method trains on, not the type of every other column."""
    import datasets

    def plain(feature: Any) -> Any:
        if isinstance(feature, datasets.Value) and feature.dtype == "large_string":
            return datasets.Value("string")
        if isinstance(feature, dict):
            return {key: plain(value) for key, value in feature.items()}
        if isinstance(feature, datasets.List):
            return datasets.List(plain(feature.feature), length=feature.length)
        if isinstance(feature, datasets.LargeList):
            return datasets.LargeList(plain(feature.feature))
        return feature

    features = [datasets.Features(plain(dict(part.features))) for part in parts]
    for column in {column for f in features for column in f}:
        types = [f[column] for f in features if column in f]
        if all(isinstance(t, datasets.Value) for t in types) and len(set(map(str, types))) > 1:
            for f in features:
                if column in f:
                    f[column] = datasets.Value("string")
    return [part if f == part.features else part.cast(f) for part, f in zip(parts, features, strict=True)]


def load_rows(refs: list[DatasetRef], log: Callable[[str], None] = lambda line: None, name: str = "dataset") -> Any:
    """Every entry's rows as one table; `log` gets a warning for files named like an evaluation split.
    `name`: the spec's field the entries came from (dataset, eval_dataset), for the errors."""
    import datasets

    parts = [_load_one(ref, f"{name}[{i}]", log) for i, ref in enumerate(refs)]
    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(_plain_strings(parts))
    except ValueError as exc:
        raise SpecError(f"{name}: its entries give the same column different types, so they cannot train as one dataset ({exc}): "
                        "give datasets whose columns hold the same kinds of values, or train on one") from None


def load_eval_rows(spec: Spec, train: Any, log: Callable[[str], None]) -> tuple[Any, Any]:
    """(training rows, held-out rows or None). eval_split holds out that fraction of the training rows,
    drawn with the run's seed before anything packs them, so no packed row mixes eval and train rows;
    an eval dataset loads as the training dataset does, and must have the training rows' shape."""
    if spec.eval_datasets:
        held = load_rows(spec.eval_datasets, name="eval_dataset")
        held_format, train_format = row_format(held, "eval_dataset"), row_format(train)
        if held_format != train_format:
            raise SpecError(f"eval_dataset: its rows are {held_format} rows and the training rows are {train_format}: "
                            "give evaluation rows of the training rows' shape")
        log(f"eval: {len(held)} rows (from {', '.join(eval_source(ref) for ref in spec.eval_datasets)})")
        return train, held
    split = spec.config.get("eval_split")
    if split is None:
        return train, None
    count = int(len(train) * float(split))
    if count < 1:
        raise SpecError(f"config.eval_split: {split} of {len(train)} rows holds out no row: {split_advice(len(train))}, or remove eval_split")
    parts = train.train_test_split(test_size=count, seed=spec.seed, shuffle=True)
    log(f"eval: {count} rows (from eval_split {split}); {len(parts['train'])} rows train")
    return parts["train"], parts["test"]


def split_advice(rows: int) -> str:
    """What to set when eval_split holds out no row of `rows`: the smallest fraction that holds out one,
    rounded up (1/64 = 0.015625 said as 0.0156 held out none again), or an eval_dataset when even
    EVAL_SPLIT_MAX would not."""
    if rows < 1 / EVAL_SPLIT_MAX:
        return f"{rows} row{'s are' if rows != 1 else ' is'} too few to hold any out: give an eval_dataset"
    digits = 2 - math.floor(math.log10(1 / rows))  # three significant digits
    units = math.ceil(10**digits / rows)
    while int(rows * (units / 10**digits)) < 1:  # as the engine counts it, in floats
        units += 1
    return f"set eval_split to at least {units / 10**digits:.{digits}f}".rstrip("0") + ", or give an eval_dataset"


def eval_source(ref: DatasetRef) -> str:
    """An eval dataset entry as the log names it: repo@commit, an HF id or a path."""
    return f"{ref.path}@{ref.revision}" if ref.revision else ref.path


def detect_shape(columns: Any) -> str:
    """The row shape from the column names: 'preference', 'chat', 'prompt_completion', 'prompts'
    (prompts only, for GRPO), 'text' or 'unknown'. Studio's dataset validation uses the same rule."""
    cols = set(columns)
    if {"prompt", "chosen", "rejected"} <= cols:
        return "preference"
    if "messages" in cols:
        return "chat"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if "prompt" in cols:
        return "prompts"
    if "text" in cols:
        return "text"
    return "unknown"


def row_format(dataset: Any, name: str = "dataset") -> str:
    """'chat' (messages), 'text', 'prompt_completion' or 'preference': the shapes the trainers read."""
    cols = set(dataset.column_names)
    shape = detect_shape(cols)
    if shape == "prompts" and "text" in cols:
        return "text"
    if shape not in ("prompts", "unknown"):
        return shape
    raise SpecError(f"{name}: rows need messages, text, prompt/completion or prompt/chosen/rejected columns; got {sorted(cols)}")


def with_system_prompt(dataset: Any, system_prompt: str | None) -> Any:
    """Prepend the run's system prompt to chat rows that have none of their own."""
    if not system_prompt or "messages" not in dataset.column_names:
        return dataset

    def add(row: dict[str, Any]) -> dict[str, Any]:
        msgs = row["messages"]
        if msgs and msgs[0].get("role") == "system":
            return row
        return {"messages": [{"role": "system", "content": system_prompt}, *msgs]}

    return dataset.map(add)


def with_system_prompt_in_pairs(dataset: Any, system_prompt: str | None) -> Any:
    """Give preference rows the run's system prompt: a conversational prompt without a system turn of
    its own gets one first; a text pair becomes a chat (system + user prompt, assistant answers), as
    GRPO's text prompts do, so the model's chat template applies to both answers alike."""
    if not system_prompt:
        return dataset
    system = {"role": "system", "content": system_prompt}

    def add(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return {"prompt": [system, {"role": "user", "content": prompt}],
                    "chosen": _as_answer(row["chosen"]), "rejected": _as_answer(row["rejected"])}
        if prompt and prompt[0].get("role") == "system":
            return row
        return {"prompt": [system, *prompt]}

    return dataset.map(add)


def _as_answer(completion: Any) -> Any:
    return [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
