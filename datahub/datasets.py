"""Dataset files in a repo: reading rows (JSONL, JSON, CSV, Parquet) as a stream, detecting the row
shape, previewing the first rows, and checking every row against a training method.

Findings name the file, the row (1-based: the line for JSONL, the data row for CSV and Parquet) and
the field, e.g. `train.jsonl row 57: "chosen" is empty`, in a dataset of one file as in a folder.
The rule is what the engine's reader and trainer can read: text that is UTF-8 (a leading byte order
mark allowed), every row an object, the first object row's shape and the first good row's form (text
or messages) kept by every row and every file of the dataset, and every dataset entry of the run
(the engine trains on them joined into one table), a row's fields in the one form the method's
trainer reads, and a CSV column's cells all JSON lists or all text. A RULER run's prompts are
checked as its loader reads them. Each file is checked up to DATAHUB_VALIDATE_MAX_ROWS rows; a file
with more is a notice, not a finding. A row over DATAHUB_MAX_ROW_BYTES is a finding, and a JSON
Lines row that large is never parsed. A commit never changes, so the findings of a (commit, method)
pair are cached.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import reprlib
import sys
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from itertools import dropwhile, islice
from pathlib import Path
from typing import Any, BinaryIO, cast

from django.conf import settings
from django.core.cache import cache

from datahub import storage
from datahub.models import Commit, TreeEntry
from studio.errors import BadRequest, Finding, joined
from studio.templatetags.studio_ui import binary_h
from training.engine.data import (  # the trainer's own rules, so validation and training agree
    CSV_JSON_COLUMNS,
    csv_cell,
    detect_shape,
    eval_split_warning,
    is_data_path,
)
from training.engine.ruler import PROMPT_COLUMNS as RULER_COLUMNS

FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SHAPES = ("chat", "prompt_completion", "preference", "prompts", "text")
SHAPE_LABELS = {
    "chat": "chat messages (messages)",
    "prompt_completion": "prompt/completion",
    "preference": "prompt/chosen/rejected",
    "prompts": "prompts (prompt)",
    "text": "plain text (text)",
    "unknown": "an unknown shape",
}
METHOD_SHAPES = {
    "sft": ("chat", "prompt_completion", "text"),
    "distill": ("chat", "prompt_completion", "text"),
    "dpo": ("preference",),
    "grpo": ("prompts", "prompt_completion", "preference"),
}
# Not a method: the rows of a GRPO run's RULER prompts (config.ruler_task_args.dataset), which the
# engine's RULER loader reads from the first of RULER_COLUMNS a row has, as text.
RULER = "ruler"
# The fields the trainer reads from each row of a shape.
SHAPE_KEYS = {"chat": ("messages",), "preference": ("prompt", "chosen", "rejected"), "prompt_completion": ("prompt", "completion"),
              "prompts": ("prompt",), "text": ("text",)}
ROLES = ("system", "user", "assistant", "tool")
# A value's kind as JSON names it, for findings ("must be an object, not null").
JSON_TYPES = {dict: "object", list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
MAX_FINDINGS = 20
MAX_JSON_ARRAY_BYTES = 64 * 1024 * 1024
# pandas, the engine's CSV reader, reads a field of any length: csv's default limit (131,072
# characters) refused a longer one as "not valid CSV"; DATAHUB_MAX_ROW_BYTES bounds a row instead.
csv.field_size_limit(sys.maxsize)


class RowError(ValueError):
    pass


class RowTooLarge(RowError):
    """A row over DATAHUB_MAX_ROW_BYTES. The trainer cuts a row to max_length tokens only after
    tokenizing all of it (a 30 MB row: minutes and gigabytes), so such a row is refused, not trained."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the row is {binary_h(size)} ({size:,} bytes), over the {binary_h(limit)} ({limit:,} bytes) one row may have "
                         "(DATAHUB_MAX_ROW_BYTES): split it into shorter rows or shorten it (the trainer keeps only the first "
                         "max_length tokens of a row)")


def _too_large(limit: int, *texts: str) -> RowTooLarge | None:
    """A RowTooLarge when `texts` (a row's line, or its fields) hold more than `limit` bytes of UTF-8.
    Cheap for a row of at most limit / 4 characters, which cannot (a character is at most 4 bytes)."""
    if sum(map(len, texts)) * 4 <= limit:
        return None
    size = sum(len(t.encode("utf-8", "surrogateescape")) for t in texts)
    return RowTooLarge(size, limit) if size > limit else None


def _json_size(row: Any) -> int:
    """A row's size in bytes written as one compact JSON line: the size of a row of a .json array or a
    Parquet file, whose bytes in the file are not one line's."""
    return len(json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8", "surrogateescape"))


def file_format(path: str) -> str | None:
    for ext, fmt in FORMATS.items():
        if path.lower().endswith(ext):
            return fmt
    return None


def data_entries(commit: Commit) -> list[TreeEntry]:
    entries = TreeEntry.objects.filter(commit=commit).select_related("blob").order_by("path")
    return [e for e in entries if is_data_path(e.path)]


@dataclass(frozen=True)
class Source:
    """One data file, wherever it lives: a blob of a commit, or a file on the Studio's machine."""

    path: str  # as findings name it
    size: int
    open: Callable[[], BinaryIO]
    version: str = ""  # a local file's size and modification time: what moves when it changes


def commit_sources(commit: Commit) -> list[Source]:
    return [commit_sources_of(e) for e in data_entries(commit)]


def local_sources(path: Path) -> list[Source]:
    """A local dataset as the engine reads it: the file itself, or the data files of a folder."""
    def source(file: Path, name: str) -> Source:
        stat = file.stat()
        return Source(name, stat.st_size, lambda: file.open("rb"), f"{stat.st_size}:{stat.st_mtime_ns}")

    if path.is_file():
        return [source(path, path.name)]
    files = sorted(p for p in path.rglob("*") if p.is_file() and is_data_path(p.relative_to(path).as_posix()))
    return [source(p, p.relative_to(path).as_posix()) for p in files]


# ---- reading rows ------------------------------------------------------------------------------

def iter_rows(entry: TreeEntry | Source) -> Iterator[tuple[int, Any]]:
    """(row number, row) pairs; a row that cannot be parsed comes back as a RowError."""
    source = entry if isinstance(entry, Source) else commit_sources_of(entry)
    fmt = file_format(source.path)
    fh = source.open()
    try:
        if fmt == "parquet":
            yield from _parquet_rows(fh)
        elif fmt == "csv":
            yield from _csv_rows(fh)
        else:
            yield from _json_rows(fh, source.size)
    finally:
        fh.close()


def commit_sources_of(entry: TreeEntry) -> Source:
    def open_it() -> BinaryIO:
        opened = storage.open_blob(entry.blob.storage_name)
        return cast(BinaryIO, getattr(opened, "file", opened))  # the raw binary file under Django's File wrapper

    return Source(entry.path, entry.blob.size, open_it)


def _json_rows(fh, size: int) -> Iterator[tuple[int, Any]]:
    # utf-8-sig: a leading byte order mark is no part of the first row (the engine's reader skips it too).
    # surrogateescape: a byte that is not UTF-8 becomes a lone surrogate that _undecodable finds on its
    # row, where the engine's reader fails the whole file with a UnicodeDecodeError.
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape")
    limit = settings.DATAHUB_MAX_ROW_BYTES
    first, blank_lines = text.read(1), 0  # the lines before the first value still count in line numbers
    while first and first.isspace():
        blank_lines += first == "\n"
        first = text.read(1)
    if first == "[":  # a JSON array (.json): small enough to load, or refused
        if size > MAX_JSON_ARRAY_BYTES:
            yield 1, RowError("a JSON array this large cannot be checked: store it as JSON Lines (.jsonl)")
            return
        whole = "\n" * blank_lines + first + text.read()
        bad = _undecodable(whole)
        if bad is not None:
            on_line = whole.count("\n", 0, bad.start()) + 1
            yield 1, RowError(f"the file is not valid UTF-8 ({_byte(bad)} on line {on_line}): save it as UTF-8")
            return
        try:
            rows = json.loads(whole, object_pairs_hook=_unique_keys)
        except DuplicateKey as exc:
            yield 1, RowError(f'the file has an object with the key "{exc.key}" twice (JSON keeps the last one, so the first is lost): keep one of them')
            return
        except RecursionError:
            yield 1, RowError(f"the file nests lists and objects too deep to read: the trainer reads at most {MAX_NESTING} levels; flatten its rows")
            return
        except ValueError as exc:
            yield 1, RowError(f"the file is not valid JSON ({exc})")
            return
        walk = whole.count("[") + whole.count("{") > MAX_NESTING or SURROGATE_ESCAPE.search(whole)
        for number, row in enumerate(rows, start=1):
            if walk and (problem := _value_problem(row)):
                yield number, RowError(problem)
            elif size > limit and (row_size := _json_size(row)) > limit:  # size <= limit: no row of it can be larger
                yield number, RowTooLarge(row_size, limit)
            else:
                yield number, row
        return
    for number, line in enumerate(_lines(first, text, limit), start=1 + blank_lines):
        if isinstance(line, RowTooLarge):
            yield number, line
            continue
        if not line.strip():
            continue
        bad = _undecodable(line)
        if bad is not None:
            yield number, RowError(f"not valid UTF-8 ({_byte(bad)} at column {bad.start() + 1}): save the file as UTF-8")
            continue
        try:
            yield number, parse_row(line)
        except ValueError as exc:
            yield number, RowError(_line_problem(line, exc))


# The lists and objects a row may nest, itself counted: the engine's reader (pyarrow, through
# datasets) fails the whole file on a 64th ("Recursion level in ArrowSchema struct exceeded"), and
# json gives up on some thousand with a RecursionError that failed the check (a 500) instead.
MAX_NESTING = 63
# A JSON escape of a surrogate: a pair (\ud83d\ude00) is one character; one alone is no text, and
# the engine's reader refuses the file for it ("The surrogate pair in string is invalid").
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
TOO_DEEP = (f"the row nests lists and objects more than {MAX_NESTING} levels deep (itself counted): the trainer's reader "
            "refuses the whole file for it; flatten the row")


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    if len(row) < len(pairs):
        seen: set[str] = set()
        raise DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))  # type: ignore[func-returns-value]
    return row


def parse_row(text: str) -> Any:
    """One JSON value, as json.loads reads it, or a RowError for what the engine's reader would fail the
    whole file on (nesting past MAX_NESTING, a lone surrogate escape) or read otherwise than it looks
    (a key given twice: the last one wins, and the first is silently lost)."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        return RowError(f'the key "{exc.key}" appears twice in one object (JSON keeps the last one, so the first is lost): keep one of them')
    except RecursionError:
        return RowError(TOO_DEEP)
    problem = None
    if text.count("[") + text.count("{") > MAX_NESTING or SURROGATE_ESCAPE.search(text):  # else neither can be: no walk
        problem = _value_problem(value)
    return RowError(problem) if problem else value


def _value_problem(value: Any) -> str | None:
    """Nesting past MAX_NESTING or a lone surrogate in `value` (walked without recursion)."""
    pending, deepest = [(value, 1)], 0
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item) and _lone(item):
                return (f"a string holds a lone surrogate escape ({_escaped(item)}), which is no character: the trainer's reader "
                        "refuses the whole file for it; fix that \\u escape or drop it")
            continue
        if not isinstance(item, (list, dict)):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            return TOO_DEEP
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        pending += [(child, depth + 1) for child in children]
    return None


def _lone(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escaped(text: str) -> str:
    bad = LONE_SURROGATE.search(text)
    return f"\\u{ord(bad.group()):04x}" if bad else "?"


# What errors="surrogateescape" decodes a byte that is not UTF-8 to: U+DC80 to U+DCFF (no UTF-8 text
# holds a lone surrogate, and a JSON escape such as "\udce9" is six ASCII characters, not one).
UNDECODABLE = re.compile("[\udc80-\udcff]")


def _undecodable(text: str) -> re.Match[str] | None:
    """Where `text`, decoded with errors="surrogateescape", had its first byte that is not UTF-8."""
    return None if text.isascii() else UNDECODABLE.search(text)


def _byte(bad: re.Match[str]) -> str:
    return f"the byte 0x{ord(bad.group()) - 0xDC00:02X}"


def _line_problem(line: str, exc: ValueError) -> str:
    """Where on its line a JSON Lines row breaks. json's own "line 2 column 1" counts within the
    row (line 2 being past its newline when the row is cut short), not the file's lines."""
    if not isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc})"
    if exc.msg.startswith("Invalid control character"):  # json's msg ends "at", meant for its own position
        return (f"not valid JSON at column {exc.pos + 1}: a control character (a raw tab, carriage return or line break) "
                "inside a string; write it as \\t, \\r or \\n")
    if exc.pos >= len(line.rstrip("\r\n")):
        return f"not valid JSON: the line ends before the value is complete ({exc.msg})"
    return f"not valid JSON at column {exc.pos + 1} ({exc.msg})"


def _lines(first: str, text, limit: int) -> Iterator[str | RowTooLarge]:
    """The lines of `text` from its character `first` on, read at most limit + 1 characters at a time:
    a line over `limit` bytes comes back as a RowTooLarge, and is never held whole."""
    line = first + text.readline(limit) if first else ""
    while line:
        if len(line) * 4 <= limit:  # most lines: too short to be too large
            yield line
        elif len(line) <= limit or line.endswith("\n"):
            yield _too_large(limit, line) or line
        else:  # over `limit` characters, so over `limit` bytes: the rest is counted, not kept
            size = len(line.encode("utf-8", "surrogateescape"))
            while not line.endswith("\n") and (line := text.readline(limit)):
                size += len(line.encode("utf-8", "surrogateescape"))
            yield RowTooLarge(size, limit)
        line = text.readline(limit + 1)


def _csv_rows(fh) -> Iterator[tuple[int, Any]]:
    """Data rows, numbered from 1 after the header (blank lines are no rows); a problem names the
    file's line too, which a quoted field with a newline makes differ from the row.

    As the engine's reader (pandas, through datasets) reads them: a row with more fields than the
    header is a RowError, as pandas refuses it ("Expected 2 fields in line 6, saw 4", and on the
    first row it silently shifts every column under an index instead). A shorter row is not, as
    pandas fills its missing fields with nulls: DictReader's None, which the shape checks find empty.
    A quote that is never closed is a RowError naming the line it opens on, as pandas fails the file
    ("EOF inside string"); csv reads the rest of the file into that field, which looked like a row
    short of fields ('"completion" is empty'), or like no problem at all when it was the last field."""
    lines = _CsvLines(io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline=""))  # as _json_rows
    reader = csv.DictReader(lines)
    limit = settings.DATAHUB_MAX_ROW_BYTES
    number = 0
    try:
        if reader.fieldnames and lines.ended:
            yield 1, _unclosed_quote(reader.fieldnames[-1], reader.line_num)
            return
        bad = next(filter(None, map(_undecodable, reader.fieldnames or ())), None)
        if bad is not None:
            yield 1, RowError(f"the header line is not valid UTF-8 ({_byte(bad)}): save the file as UTF-8")
            return
        for number, row in enumerate(reader, start=1):
            if lines.ended:  # this row took in the rest of the file: the last of its fields opened a quote never closed
                yield number, _unclosed_quote(_last_field(row), reader.line_num)
                return
            if None in row:  # DictReader's restkey: the fields past the header's
                header = len(reader.fieldnames or ())
                yield number, RowError(f"line {reader.line_num} has {header + len(row[None])} fields, the header has {header}: "
                                       'put a field that holds a comma in double quotes ("a, b"), or remove the extra fields')
                continue
            bad_field = next(((k, bad) for k, v in row.items() if isinstance(v, str) and (bad := _undecodable(v))), None)
            if bad_field is not None:
                yield number, RowError(f'not valid UTF-8 ({_byte(bad_field[1])} in "{bad_field[0]}", on line {reader.line_num}): save the file as UTF-8')
                continue
            too_large = _too_large(limit, *filter(None, row.values()))  # its fields, as the engine reads them
            if too_large is not None:
                yield number, too_large
                continue
            yield number, {k: csv_cell(k, v) for k, v in row.items()}
    except csv.Error as exc:
        yield number + 1, RowError(f"line {reader.line_num} is not valid CSV ({exc})")


class _CsvLines:
    """A CSV file's lines as the csv reader reads them, and whether it asked for one past the last.
    It asks for the next line in the middle of a row only while that row's quoted field is open
    (the default dialect has no escape character), so a row it returns after asking past the end
    has a quote that is never closed. Python's reader then keeps the rest of the file as that
    field, silently; pandas, the engine's reader, fails the whole file ("EOF inside string")."""

    def __init__(self, text: Iterator[str]) -> None:
        self.text = text
        self.ended = False

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = next(self.text, None)
        if line is None:
            self.ended = True
            raise StopIteration
        return line


def _last_field(row: dict[Any, Any]) -> str:
    """The last field of a CSV record as DictReader gives it: the last past the header's (in the list
    under its restkey, None), or else the last the record had (its restval, None, fills the rest)."""
    if row.get(None):
        return row[None][-1]
    return next((value for value in reversed(row.values()) if value is not None), "")


# Where the csv reader's lines end: text read with newline="" ends a line at any of these.
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _unclosed_quote(field: str, lines: int) -> RowError:
    """The finding for a quoted CSV field whose closing quote never comes: `field` is what the csv
    reader kept of it (the rest of the file from its opening quote on), `lines` the file's lines."""
    line = lines - len(LINE_BREAK.findall(field)) + field.endswith(("\n", "\r"))  # the line of its opening quote
    start = LINE_BREAK.split(field, maxsplit=1)[0]
    start = start if len(start) <= 30 else f"{start[:30]}…"
    rest = f"line {line}" if line == lines else f"lines {line} to {lines}"
    return RowError(f'line {line} opens a quoted field ("{start}) that is never closed, so the rest of the file ({rest}) reads as '
                    'that one field: close the quote where the field ends, or, if the " is part of the text, write it as "" '
                    'inside a quoted field ("a ""quoted"" word")')


def _parquet_rows(fh) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(fh)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one finding
        yield 1, RowError(f"not a readable Parquet file ({exc})")
        return
    limit = settings.DATAHUB_MAX_ROW_BYTES
    number = 0
    for batch in pf.iter_batches(batch_size=1024):
        measure = batch.nbytes * 2 > limit  # as JSON, a row is at most about twice its Arrow bytes (quotes, escapes)
        for row in batch.to_pylist():
            number += 1
            yield number, RowTooLarge(size, limit) if measure and (size := _json_size(row)) > limit else row


# ---- shapes ------------------------------------------------------------------------------------

def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, (list, dict)) and not value)


def _need(row: dict, key: str) -> str | None:
    if key not in row:
        return f'"{key}" is missing'
    if _empty(row[key]):
        return f'"{key}" is empty'
    value = row[key]
    if isinstance(value, list):
        return _messages_problem(value, key)
    if not isinstance(value, str):
        return f'"{key}" must be text or a list of messages, not {_json_type(value)}'
    return None


def _messages_problem(messages: Any, key: str = "messages", need_assistant: bool = False) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f'"{key}" must be a non-empty list of {{role, content}} messages'
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return f'"{key}"[{i}] must be an object with role and content'
        if msg.get("role") not in ROLES:
            return f'"{key}"[{i}].role must be one of {", ".join(ROLES)} (got {reprlib.repr(msg.get("role"))})'
        if not isinstance(msg.get("content"), str) and not msg.get("tool_calls"):
            return f'"{key}"[{i}].content must be text'
        if msg["role"] == "assistant" and isinstance(msg.get("content"), str) and not msg["content"].strip() and not msg.get("tool_calls"):
            return (f'"{key}"[{i}].content is empty: an assistant message with no text (and no tool_calls) would teach the model '
                    "to answer nothing; write its answer or drop the message")
    if need_assistant and not any(m.get("role") == "assistant" for m in messages):
        return f'"{key}" has no assistant message to learn from'
    return None


def row_problem(row: Any, shape: str) -> str | None:
    """What is wrong with one row of `shape`, as a phrase naming the field; None when it is fine."""
    if isinstance(row, RowError):
        return str(row)
    if not isinstance(row, dict):
        return f"must be an object, not {_json_type(row)}"
    if shape == "chat":
        if "messages" not in row:
            return '"messages" is missing'
        return _messages_problem(row["messages"], need_assistant=True)
    for key in SHAPE_KEYS[shape]:
        problem = _need(row, key)
        if problem:
            return problem
    if shape == "preference" and row["chosen"] == row["rejected"]:
        return '"chosen" and "rejected" are the same: a preference pair needs two different answers'
    return None


def _json_type(value: Any) -> str:
    return JSON_TYPES.get(type(value), type(value).__name__)


class FirstRowForm:
    """Whether each field of a file's rows is text or a list of messages, as its first good row has it.
    The trainer reads every row the way it reads the first (TRL decides once whether the data is
    conversational), so a later row of the other form failed the run inside the engine
    ("'list' object has no attribute 'endswith'")."""

    def __init__(self, shape: str) -> None:
        self.keys = SHAPE_KEYS[shape]
        self.first: tuple[int, tuple[bool, ...]] | None = None  # the row's number, and which of its fields are text

    def problem(self, number: int, row: dict) -> str | None:
        """What is wrong with the form of row `number`; give it the rows that row_problem passed, in order."""
        texts = tuple(isinstance(row[key], str) for key in self.keys)
        if self.first is None:
            self.first = (number, texts)
            return None
        first, first_texts = self.first
        if texts == first_texts:
            return None
        key, text = next((k, t) for k, t, was in zip(self.keys, texts, first_texts, strict=True) if t != was)
        form, first_form = _forms(text)
        return (f'"{key}" is {form}, and in row {first} it is {first_form}: write it as {first_form} here too, '
                "as the trainer reads every row the way it reads the file's first")

    def unlike(self, other: FirstRowForm, other_path: str) -> str | None:
        """What is wrong with this file's first good row (given to problem() already) when `other`, of
        the dataset's file `other_path`, has a field in the other form: the engine joins the files into
        one table, whose column holds one form (the load fails on "Couldn't cast")."""
        if self.first is None or other.first is None or self.keys != other.keys:
            return None
        texts, (first, first_texts) = self.first[1], other.first
        key, text = next(((k, t) for k, t, was in zip(self.keys, texts, first_texts, strict=True) if t != was), (None, False))
        if key is None:
            return None
        form, first_form = _forms(text)
        return (f'"{key}" is {form}, and in {other_path} (row {first}) it is {first_form}: the trainer reads all of a '
                f"dataset's files as one table, each column in one form; write it as {first_form} in this file too")

    def mixed(self, shape: str, method: str, system_prompt: bool = False) -> str | None:
        """What is wrong with the forms of this file's first good row (given to problem() already) for
        `method`'s trainer; every later row has the same forms, or problem() said otherwise. TRL joins
        a row's prompt and answers into one sequence (prompt + completion), which needs both text or
        both lists of messages; GRPO reads the prompt alone; DISTILL tokenizes prompt/completion as text.
        DPO with a `system_prompt` makes a text prompt a chat (system + user) before TRL reads it, so a
        text prompt goes with answers that are lists of messages (and no other mix)."""
        if self.first is None:
            return None
        lists = [k for k, text in zip(self.keys, self.first[1], strict=True) if not text]
        texts = [k for k in self.keys if k not in lists]
        if method == "distill" and shape == "prompt_completion" and lists:
            return (f"{_quoted(lists)} {_is(lists)} {_a_list(lists)} of messages: DISTILL reads prompt/completion rows as text; "
                    f"write {_quoted(lists)} as text in every row, or give chat rows (messages)")
        if method not in ("sft", "dpo") or shape not in ("prompt_completion", "preference") or not lists or not texts:
            return None
        if method == "dpo" and system_prompt and texts == ["prompt"]:
            return None
        # A DPO text prompt beside message answers trains once a system prompt makes the prompt a chat.
        chat = (', or set config.system_prompt (DPO then makes a text prompt a chat of the system prompt and the user\'s prompt)'
                if method == "dpo" and texts == ["prompt"] else "")
        return (f"{_quoted(texts)} {_is(texts)} text and {_quoted(lists)} {_is(lists)} {_a_list(lists)} of messages: {method.upper()} needs a row's "
                f"{joined(list(self.keys))} in one form, as TRL joins them into one sequence; write {_quoted(texts)} as "
                f"{_a_list(texts)} of {{role, content}} messages too, or {_quoted(lists)} as text, in every row{chat}")


class CsvColumnForms:
    """Whether each JSON-list column (CSV_JSON_COLUMNS) of a CSV file holds lists in some cells and
    text in others, which the engine cannot read as one column (training.engine.data._parse_csv_cells
    stops the run): one finding a column, at the first cell of the other form. Every cell counts, an
    empty one as text (the engine reads it as ""), not only the fields the method trains on."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, bool]] = {}  # a column's first row, and whether its cell was a list
        self.reported: set[str] = set()

    def problem(self, number: int, row: dict) -> str | None:
        for column in CSV_JSON_COLUMNS:
            if column not in row or column in self.reported:
                continue
            is_list = isinstance(row[column], list)
            first, first_list = self.first.setdefault(column, (number, is_list))
            if is_list != first_list:
                self.reported.add(column)
                form, first_form = ("a JSON list of messages", "text") if is_list else ("text", "a JSON list of messages")
                return (f'the "{column}" cell is {form}, and in row {first} it is {first_form}: the trainer reads a CSV column '
                        f"as JSON lists of messages or as text, not both; write every {column} cell as a JSON list of "
                        "{role, content} messages, or every one as text")
        return None


def _forms(text: bool) -> tuple[str, str]:
    """A field's form and the other one, as findings name them."""
    return ("text", "a list of messages") if text else ("a list of messages", "text")


def _quoted(keys: list[str]) -> str:
    return joined([f'"{k}"' for k in keys])


def _is(keys: list[str]) -> str:
    return "is" if len(keys) == 1 else "are"


def _a_list(keys: list[str]) -> str:
    return "a list" if len(keys) == 1 else "lists"


def _meant_shape(row: dict, shape: str, wanted: tuple[str, ...]) -> str | None:
    """The shape of `wanted` that `row` (detected as `shape`, which the method does not train on) was
    meant to be: one with a column the row has beyond those of its own shape. A preference row without
    "rejected" reads as prompts (prompt, chosen): it is meant as a preference row that lacks a field."""
    own = set(SHAPE_KEYS.get(shape, ()))
    extra = {s: len((set(SHAPE_KEYS[s]) - own) & row.keys()) for s in wanted}
    meant = max(wanted, key=lambda s: extra[s])
    return meant if extra[meant] else None


def _other_data_or_method(shape: str) -> str:
    """What to do about a dataset whose only file has rows of `shape` that the method does not train on."""
    methods = [m.upper() for m, shapes in METHOD_SHAPES.items() if shape in shapes]
    return "give a dataset of such rows" + (f", or train on these rows with {' or '.join(methods)}" if methods else "")


def unknown_shape_problem(columns: list[str]) -> str:
    """What to do about rows whose columns match no shape any method trains on."""
    takes = "; ".join(f"{method.upper()} takes {' or '.join(SHAPE_LABELS[s] for s in shapes)}" for method, shapes in METHOD_SHAPES.items())
    return f"the columns ({', '.join(columns) or 'none'}) match no shape a method trains on ({takes}): rename the columns to one of these"


def ruler_column(row: dict) -> str | None:
    """The column RULER reads a file's prompts from: the first of RULER_COLUMNS that its first row has."""
    return next((c for c in RULER_COLUMNS if c in row), None)


def ruler_columns_problem(columns: list[str]) -> str:
    """What to do about RULER prompts in rows with none of the columns its loader reads."""
    names = f"{', '.join(RULER_COLUMNS[:-1])} or {RULER_COLUMNS[-1]}"
    return (f"rows have no {names} column (columns: {', '.join(columns) or 'none'}): RULER reads each prompt from the "
            f'first of those a row has; rename the column that holds the prompts to "{RULER_COLUMNS[0]}"')


def ruler_row_problem(row: Any, column: str) -> str | None:
    """What is wrong with one row of RULER prompts read from `column`, as a phrase naming the field."""
    if isinstance(row, RowError):
        return str(row)
    if not isinstance(row, dict):
        return f"must be an object, not {_json_type(row)}"
    if column not in row:
        return f'"{column}" is missing'
    value = row[column]
    if _empty(value):
        return f'"{column}" is empty'
    if isinstance(value, list):  # the loader takes str(value): the policy and the judge would read a Python list
        return f'"{column}" is a list of messages: RULER gives each prompt to the policy and the judge as text; write it as text'
    if not isinstance(value, str):
        return f'"{column}" must be text, not {_json_type(value)}'
    return None


def _shape_label(shape: str, method: str) -> str:
    return f'prompts in "{shape}"' if method == RULER else SHAPE_LABELS[shape]


# ---- preview and method checks -----------------------------------------------------------------

# Whose rule the preview applies to a row's forms: the method that reads the shape with TRL's joining.
PREVIEW_METHODS = {"prompt_completion": "sft", "preference": "dpo"}
# What the preview shows of a row, in characters of its text (each key and string, and one for each
# other value): a field at most PREVIEW_FIELD_CHARS, a row at most PREVIEW_ROW_CHARS, a key (a name)
# at most PREVIEW_KEY_CHARS. Rows may be up to DATAHUB_MAX_ROW_BYTES each; a preview of 200 of them
# holds at most some 800,000 characters of their text.
PREVIEW_FIELD_CHARS = 1_000
PREVIEW_ROW_CHARS = 4_000
PREVIEW_KEY_CHARS = 100


def cut_row(row: Any, number: int, cuts: list[dict[str, Any]]) -> Any:
    """`row` as the preview shows it: a string past its share of the text is cut short with a marker
    of its full length ("… [cut: 30,000,000 characters in all]"), and a list or object keeps the items
    it has room for. Each cut goes to `cuts`: the row, the field's path (`messages[3].content`; "" for
    the row itself; `<key>` for a key, as `meta.<key>`) and its full length in characters or items.
    The stored file is not changed."""
    def cut(value: Any, room: int, path: str) -> tuple[Any, int]:
        """`value` in at most `room` characters (and the markers of what was cut), and those it used."""
        if isinstance(value, str):
            if len(value) <= room:
                return value, len(value)
            cuts.append({"row": number, "field": path, "characters": len(value)})
            return f"{value[:room]}… [cut: {len(value):,} characters in all]", room
        if not isinstance(value, (list, dict)):
            return value, 1
        out: list[tuple[Any, Any]] = []
        used = 0
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if used >= room:
                cuts.append({"row": number, "field": path, "items": len(value)})
                break
            if isinstance(value, dict):
                key, size = cut(str(key), min(PREVIEW_KEY_CHARS, room - used), f"{path}.<key>" if path else "<key>")
                used += size
            at = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}" if path else str(key)
            # Each field of the row gets at most PREVIEW_FIELD_CHARS: one long field leaves the others room.
            share = room - used if path or isinstance(value, list) else min(PREVIEW_FIELD_CHARS, room - used)
            item, size = cut(item, share, at)
            out.append((key, item))
            used += max(size, 1)
        return (dict(out) if isinstance(value, dict) else [item for _, item in out]), used

    return cut(row, PREVIEW_ROW_CHARS if isinstance(row, dict) else PREVIEW_FIELD_CHARS, "")[0]


PREVIEW_AFTER_MAX = 10_000_000  # a page's rows are read from the file's start: a bound on that read


def preview(commit: Commit, path: str | None = None, limit: int = 20, after: int = 0) -> dict:
    """The rows of a dataset file after row number `after` (a page: `limit` of them), its shape, and
    what START would say of them; `next_after` is the `after` of the next page, None at the file's end."""
    entries = data_entries(commit)
    if path is not None:
        entries = [e for e in entries if e.path == path]
    if not entries:
        raise BadRequest("There is no dataset file to preview.", [Finding("path", "give a .jsonl, .json, .csv or .parquet file of the repo")])
    chosen = entries[0]
    rows: list[Any] = []
    numbers: list[int] = []
    problems: list[dict[str, Any]] = []
    read = list(islice(dropwhile(lambda item: item[0] <= after, iter_rows(chosen)), limit + 1))  # one more: is there a next page?
    next_after = read[limit - 1][0] if len(read) > limit else None
    for number, row in read[:limit]:
        if isinstance(row, RowError):
            problems.append({"row": number, "message": str(row)})
        else:
            rows.append(row)
            numbers.append(number)  # a bad row leaves a gap: row 12 is the 11th good one after a bad row 11
    # In the file's own order (prompt before completion, as written), first seen first.
    columns = list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))
    shape = detect_shape(columns)
    cuts: list[dict[str, Any]] = []
    shown = [cut_row(r, n, cuts) for n, r in zip(numbers, rows, strict=True)]
    columns = list(dict.fromkeys(k for r in shown if isinstance(r, dict) for k in r))  # a key too can be cut
    if shape == "unknown" and rows:  # no method trains on these rows: START would refuse the file, not a row
        problems.append({"row": numbers[0], "message": unknown_shape_problem(columns)})
    elif shape in SHAPE_KEYS:  # what START would say of these rows for a method that trains on this shape
        form = FirstRowForm(shape)
        for n, r in zip(numbers, rows, strict=True):
            first_row = form.first is None
            problem = row_problem(r, shape) or form.problem(n, r)
            if problem is None and first_row:  # as the method that trains on this shape with TRL would say it
                problem = form.mixed(shape, PREVIEW_METHODS.get(shape, ""))
            if problem:
                problems.append({"row": n, "message": problem})
    problems.sort(key=lambda p: int(p["row"]))
    return {
        "path": chosen.path,
        "format": file_format(chosen.path),
        "shape": shape,
        "columns": columns,
        "rows": shown,
        "row_numbers": numbers,
        "problems": problems,
        "cut": cuts,
        "files": [e.path for e in entries] if path is None else [chosen.path],
        "next_after": next_after,
    }


@dataclass(frozen=True)
class RowNeeds:
    """Columns every row needs beyond the method's own: a GRPO environment's ``ROW_KEYS``."""

    keys: tuple[str, ...]
    who: str  # "builtin/gsm-maths", named in each finding

    def problem(self, row: dict, skip: frozenset[str] = frozenset()) -> tuple[str, str] | None:
        """The first needed key this row lacks or leaves empty, with the finding's text; keys in `skip`
        (columns already reported as absent from the whole file) are not looked at."""
        for key in self.keys:
            if key in skip:
                continue
            if row.get(key) is None or (isinstance(row[key], str) and not row[key].strip()):
                state = "missing" if key not in row else "empty"
                return key, (f'"{key}" is {state}: {self.who} scores each completion against the row\'s {", ".join(self.keys)}; '
                             "add it to every row, or leave dataset empty to use the environment's own prompts")
        return None

    def absent_column(self, key: str, where: str) -> str:
        """One finding for a column that no checked row of a file has, instead of one per row; `where`
        names the file ("data/a.jsonl ")."""
        return (f'{where}has no "{key}" column, which {self.who} reads from every row (its ROW_KEYS: '
                f'{", ".join(self.keys)}): add the column, or leave dataset empty to use the environment\'s own prompts')

    def cache_key(self) -> str:
        return f"{self.who}:{','.join(self.keys)}"


@dataclass(frozen=True)
class RowsCheck:
    """What checking a dataset's rows found: `findings` refuse START; `notices` say what was not
    checked (the rows of a file past DATAHUB_VALIDATE_MAX_ROWS) and refuse nothing."""

    findings: list[Finding]
    notices: list[Finding]
    # The dataset's first file with a shape (its path, shape and first row's columns), and its first
    # good row (the file's path, the row's number, and which of the shape's fields are text): what
    # the run's other dataset entries must agree with (entries_findings).
    shape: tuple[str, str, list[str]] | None = None
    forms: tuple[str, int, tuple[bool, ...]] | None = None
    # How many rows the dataset has, when every one was read (None past DATAHUB_VALIDATE_MAX_ROWS, or
    # when the check stopped early): what an eval_split holds out of (training.validation.eval_findings).
    rows: int | None = None


def method_check(commit: Commit, method: str, field: str, needs: RowNeeds | None = None, system_prompt: bool = False) -> RowsCheck:
    def check() -> RowsCheck:
        entries = commit_sources(commit)
        if not entries and (method in METHOD_SHAPES or method == RULER):
            return RowsCheck([Finding(field, f"{commit.repo.full_name}@{commit.pk[:10]} has no .jsonl, .json, .csv or .parquet file to train on")], [])
        return check_rows(entries, method, field, needs, lambda path: (
            f"delete {path} from the branch (its Delete on the repo's Files tab, or DELETE /api/hub/repos/{commit.repo.name}/files) "
            f"or move it to another branch or repo"), system_prompt)

    return cached_check(f"{commit.pk}:{method}:{field}:{needs.cache_key() if needs else ''}:{system_prompt:d}", check)


def local_check(path: Path, method: str, field: str, needs: RowNeeds | None = None, system_prompt: bool = False) -> RowsCheck:
    """The same checks for a dataset on the Studio's machine (the local backend reads it there).
    Cached while no file of it changes (name, size and modification time)."""
    if path.is_file() and not file_format(path.name):
        return RowsCheck([Finding(field, f"{path} is not a .jsonl, .json, .csv or .parquet file: give a dataset file of one of those formats, or a folder of them")], [])
    sources = local_sources(path)
    if not sources:
        return RowsCheck([Finding(field, f"{path} holds no .jsonl, .json, .csv or .parquet file to train on")], [])
    stamp = hashlib.sha1(repr([str(path)] + [(s.path, s.version) for s in sources]).encode()).hexdigest()
    return cached_check(f"local:{stamp}:{method}:{field}:{needs.cache_key() if needs else ''}:{system_prompt:d}",
                        lambda: check_rows(sources, method, field, needs, lambda file: f"move {file} out of {path}", system_prompt))


# Bumped when the rules change, so a commit's result cached under the old ones is not used.
CACHE_VERSION = 9


def cached_check(key: str, check: Callable[[], RowsCheck]) -> RowsCheck:
    """`check()`'s result, kept an hour under `key` (which names a commit, or a local dataset's file
    stamps) and the rules it was checked by."""
    key = f"datahub:rows:v{CACHE_VERSION}:{settings.DATAHUB_VALIDATE_MAX_ROWS}:{settings.DATAHUB_MAX_ROW_BYTES}:{key}"
    try:
        cached = cache.get(key)
    except Exception:  # noqa: BLE001 - the cache is an optimisation: Redis down (restarting) must not fail START
        cached = None
    if cached is not None:
        return RowsCheck([Finding(f, m) for f, m in cached["findings"]], [Finding(f, m) for f, m in cached["notices"]],
                         cached["shape"], cached["forms"], cached["rows"])
    result = check()
    with suppress(Exception):
        cache.set(key, {"findings": [(f.field, f.message) for f in result.findings], "notices": [(f.field, f.message) for f in result.notices],
                        "shape": result.shape, "forms": result.forms, "rows": result.rows}, 3600)
    return result


def rows_findings(sources: list[Source], method: str, field: str, needs: RowNeeds | None = None,
                  set_aside: Callable[[str], str] = lambda path: f"remove {path}", system_prompt: bool = False) -> list[Finding]:
    return check_rows(sources, method, field, needs, set_aside, system_prompt).findings


def check_rows(sources: list[Source], method: str, field: str, needs: RowNeeds | None = None,
               set_aside: Callable[[str], str] = lambda path: f"remove {path}", system_prompt: bool = False) -> RowsCheck:
    """Every row of every file, up to DATAHUB_VALIDATE_MAX_ROWS a file, against what `method` trains
    on (and `needs`); at most MAX_FINDINGS. The first object row of a file decides its shape, and the
    first good one whether each field is text or messages; rows before it are checked too.
    A file of the wrong shape among others is a finding that ends with `set_aside(path)`: how to take
    that file out of the dataset (the run trains on every data file). A needed column that every row
    checked so far lacks (at the end of the file, or when the findings reach MAX_FINDINGS) is one
    finding for the file, not one per row; rows that are bad on their own keep their own findings.
    A file with more rows than the limit is a notice: a row past it fails the run only in the engine.
    Every finding names its file ("train.jsonl row 3: ..."), in a dataset of one file as in a folder:
    the file to fix is never left to guess.
    The engine joins the files into one table, so a file whose shape, or a field's form, differs from
    the dataset's first file's is refused too, naming both files, as is a CSV column of JSON lists in
    some cells and text in others. `system_prompt`: the run sets one (DPO reads text prompts as chats).
    `method` RULER checks a RULER run's prompts as its loader reads them."""
    if method != RULER and method not in METHOD_SHAPES:
        return RowsCheck([], [])
    max_rows = settings.DATAHUB_VALIDATE_MAX_ROWS
    findings: list[Finding] = []
    notices: list[Finding] = []
    split = eval_split_warning([entry.path for entry in sources], field) if method != RULER else None
    if split:  # trained on all the same: said beside the Start button and in the run's log, refused nowhere
        notices.append(Finding(field, split.removeprefix(f"{field}: ")))
    first_shape: tuple[str, str, list[str]] | None = None  # the dataset's first file with a shape: its path, shape and columns
    first_form: tuple[str, FirstRowForm] | None = None  # the dataset's first file with a good row: its path, and that row's forms
    rows: int | None = 0  # rows read, every file's; None once a file's rows past max_rows go unread
    for entry in sources:
        where = f"{entry.path} "  # every finding names its file, in a dataset of one file as in a folder of them
        shape = None
        form: FirstRowForm | None = None
        # This file's findings, each with the needed key a row lacked entirely (None for any other problem).
        pending: list[tuple[Finding, str | None]] = []
        lacking = dict.fromkeys(needs.keys if needs is not None else (), 0)
        checked = 0  # rows of this file checked against `needs`
        absent: frozenset[str] = frozenset()
        csv_forms = CsvColumnForms() if file_format(entry.path) == "csv" and method != RULER else None
        for number, row in iter_rows(entry):
            if number > max_rows:
                rows = None
                notices.append(Finding(field, f"only the first {max_rows:,} rows of {entry.path} were checked before START (DATAHUB_VALIDATE_MAX_ROWS): "
                                              "a problem in a later row fails the run when the trainer reaches it; check the rest of the file, "
                                              "or ask the Studio's administrator to raise the limit"))
                break
            if rows is not None:
                rows += 1
            if shape is None and isinstance(row, dict):
                shape, refusal = _file_shape(row, method, entry.path, len(sources) > 1, set_aside)
                if refusal is None and first_shape is not None and shape != first_shape[1]:
                    refusal = _mixed_shapes(entry.path, shape, sorted(row), first_shape, method, set_aside)
                if refusal is not None:
                    pending.append((Finding(field, f"{where}{refusal}"), None))
                    break
                first_shape = first_shape or (entry.path, shape, sorted(row))
                form = None if method == RULER else FirstRowForm(shape)
            # Before the first object row, `shape` is None: a row there is a RowError or not an object, whatever the shape.
            problem = row_problem(row, "text") if shape is None else ruler_row_problem(row, shape) if method == RULER else row_problem(row, shape)
            if problem is None and form is not None and shape is not None and isinstance(row, dict):
                first_row = form.first is None
                problem = form.problem(number, row)  # None for the file's first good row, whose forms it keeps
                if first_row:  # the forms every row of the file has, or form.problem says otherwise
                    problem = form.mixed(shape, method, system_prompt) or (form.unlike(first_form[1], first_form[0]) if first_form else None)
                    first_form = first_form or (entry.path, form)
            if problem is None and csv_forms is not None and isinstance(row, dict):
                problem = csv_forms.problem(number, row)
            key = None
            if problem is None and needs is not None and isinstance(row, dict):
                checked += 1
                for k in lacking:
                    lacking[k] += k not in row
                found = needs.problem(row, absent)
                if found is not None:
                    key, problem = found[0] if found[0] not in row else None, found[1]
            if problem:
                pending.append((Finding(field, f"{where}row {number}: {problem}"), key))
                if len(findings) + len(pending) >= MAX_FINDINGS and needs is not None:
                    absent = _collapse_absent(pending, lacking, checked, absent, needs, field, where)
                if len(findings) + len(pending) >= MAX_FINDINGS:
                    findings += [f for f, _ in pending]
                    findings.append(Finding(field, f"stopped after {MAX_FINDINGS} problems: fix these and start again"))
                    return RowsCheck(findings, notices, first_shape, _first_forms(first_form))
        if needs is not None:
            absent = _collapse_absent(pending, lacking, checked, absent, needs, field, where)
        findings += [f for f, _ in pending]
        if shape is None and not findings:
            findings.append(Finding(field, no_rows(where)))
    return RowsCheck(findings, notices, first_shape, _first_forms(first_form), rows)


def _first_forms(first_form: tuple[str, FirstRowForm] | None) -> tuple[str, int, tuple[bool, ...]] | None:
    if first_form is None or first_form[1].first is None:
        return None
    return first_form[0], *first_form[1].first


def entries_findings(checks: list[tuple[str, RowsCheck]], method: str) -> list[Finding]:
    """What is wrong with a run's dataset entries (`checks`: each entry's field and RowsCheck, in the
    dataset's order) taken together. The engine joins the entries into one table as it joins one
    entry's files: an entry of another shape trains with its rows empty (null) in the first entry's
    columns (SFT: "the dataset is not conversational"), and a field in the other form fails the load."""
    shaped = [(field, check.shape, check.forms) for field, check in checks if check.shape is not None]
    if len(shaped) < 2:
        return []
    first_field, (first_path, first_shape, first_columns), first_forms = shaped[0]
    findings = []
    todo = "or remove {field} and train on it in a run of its own"
    for field, (path, shape, columns), forms in shaped[1:]:
        if shape != first_shape:
            label, first_label = _shape_label(shape, method), _shape_label(first_shape, method)
            findings.append(Finding(field, (
                f"rows look like {label} (columns: {', '.join(columns)}, in {path}), and {first_field}'s rows like {first_label} "
                f"(columns: {', '.join(first_columns)}, in {first_path}): the run trains on all of its dataset entries as one table, "
                f"where each entry's rows would have the other's columns empty; keep one shape per run: give {field} rows of "
                f"{first_label} too, {todo.format(field=field)}")))
            continue
        if forms is None or first_forms is None:
            continue
        (forms_path, number, texts), (first_forms_path, first_number, first_texts) = forms, first_forms
        key, text = next(((k, t) for k, t, was in zip(SHAPE_KEYS[shape], texts, first_texts, strict=True) if t != was), (None, False))
        if key is not None:
            form, first_form = _forms(text)
            findings.append(Finding(field, (
                f'"{key}" is {form} ({forms_path} row {number}), and in {first_field} it is {first_form} ({first_forms_path} row '
                f"{first_number}): the run trains on all of its dataset entries as one table, each column in one form; write "
                f'"{key}" as {first_form} in {field} too, {todo.format(field=field)}')))
    return findings


def _file_shape(row: dict, method: str, path: str, several: bool, set_aside: Callable[[str], str]) -> tuple[str, str | None]:
    """The shape of the file at `path` whose first object row is `row`, as `method` reads it (for
    RULER, the column its prompts are in), and the finding that refuses the whole file, if any."""
    if method == RULER:
        column = ruler_column(row)
        if column is None:
            return "unknown", ruler_columns_problem(sorted(row)) + (f", or {set_aside(path)}" if several else "")
        return column, None
    wanted = METHOD_SHAPES[method]
    shape = detect_shape(row.keys())
    if shape in wanted:
        return shape, None
    meant = _meant_shape(row, shape, wanted)
    if meant is not None:
        return meant, None  # its missing field is this row's finding
    expected = " or ".join(SHAPE_LABELS[s] for s in wanted)
    todo = set_aside(path) if several else _other_data_or_method(shape)
    return shape, f"rows look like {SHAPE_LABELS[shape]} (columns: {', '.join(sorted(row))}); {method.upper()} trains on {expected} rows: {todo}"


def _mixed_shapes(path: str, shape: str, columns: list[str], first: tuple[str, str, list[str]], method: str,
                  set_aside: Callable[[str], str]) -> str:
    """What to do about the file at `path`, whose rows are of another shape than the dataset's first
    file's (`first`: its path, shape and columns). The engine joins a dataset's files into one table:
    files of one format fail to load ("column names don't match"), and files of two formats join with
    each file's rows empty (null) in the other's columns, which the trainer then reads."""
    first_path, first_shape, first_columns = first
    label, first_label = _shape_label(shape, method), _shape_label(first_shape, method)
    return (f"rows look like {label} (columns: {', '.join(columns)}), and {first_path} rows like {first_label} (columns: "
            f"{', '.join(first_columns)}): the run trains on all of a dataset's files as one table, where each file's rows "
            f"would have the other's columns empty; keep one shape per dataset: write {path}'s rows as {first_label} too, "
            f"or {set_aside(path)} and train on it in a run of its own")


def _collapse_absent(pending: list[tuple[Finding, str | None]], lacking: dict[str, int], checked: int,
                     absent: frozenset[str], needs: RowNeeds, field: str, where: str) -> frozenset[str]:
    """Needed keys that every checked row of the file lacked become one finding each, in `pending` in
    place of their per-row findings (where the first of those was); returns the keys now reported absent."""
    new = frozenset(k for k, n in lacking.items() if checked and n == checked and k not in absent)
    if not new:
        return absent
    kept = [(f, k) for f, k in pending if k not in new]
    first = next((i for i, (_, k) in enumerate(pending) if k in new), len(kept))
    column: list[tuple[Finding, str | None]] = [(Finding(field, needs.absent_column(k, where)), None) for k in needs.keys if k in new]
    pending[:] = kept[:first] + column + kept[first:]
    return absent | new


def no_rows(where: str) -> str:
    """What START says of a dataset file without a single row, and the preview of that file too;
    `where` names the file ("data/a.jsonl ")."""
    return f"{where}has no rows: add rows to it, or train on a dataset that has some"
