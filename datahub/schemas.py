from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from datahub.datasets import PREVIEW_FIELD_CHARS, PREVIEW_ROW_CHARS

# The largest file an upload session takes: 4 TiB. Far above any real model file (a 405B model's
# whole fp16 weights in one GGUF are ~0.8 TiB; safetensors shards are a few GB), and far below what
# a bigint column holds (8 EiB), which a larger size reached as a 500 on the INSERT.
MAX_FILE_SIZE = 4 * 1024**4
MAX_FILE_SIZE_TEXT = "4 TiB (4398046511104 bytes)"


class RepoIn(Schema):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    type: Literal["model", "dataset", "experiment", "environment"] = "model"
    description: str = Field("", max_length=5000)


class RepoOut(Schema):
    id: int
    name: str
    full_name: str
    type: str
    description: str
    default_branch: str
    created_at: datetime


class BranchIn(Schema):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=128)
    from_ref: str = Field("main", alias="from", min_length=1, max_length=200)


class TagIn(Schema):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    ref: str = Field("main", min_length=1, max_length=200)


class RefOut(Schema):
    name: str
    commit: str


class RefPageOut(Schema):
    """A page of a repo's branches, in the shape of the other paged lists (GET /api/training-runs)."""
    items: list[RefOut]
    count: int = Field(description="Branches in the whole list")


class CommitOut(Schema):
    id: str
    parents: list[str]
    author: str
    message: str
    created_at: datetime


class FileOut(Schema):
    path: str
    size: int
    sha256: str


class TreeOut(Schema):
    repo: str
    ref: str
    commit: str
    files: list[FileOut]


class DiffOut(Schema):
    base: str
    head: str
    added: list[FileOut]
    removed: list[FileOut]
    changed: list[FileOut]


class PreviewCutOut(Schema):
    row: int = Field(description="The row's number, as row_numbers has it")
    field: str = Field(description='Where in the row, e.g. "completion" or "messages[3].content"; "" for the row itself, '
                                   '"<key>" for a key (a name) cut short, as "meta.<key>"')
    characters: int | None = Field(None, description="A string's full length: the preview shows its start, then "
                                                     '"… [cut: N characters in all]"')
    items: int | None = Field(None, description="A list's or object's full number of items: the preview shows the first ones")


class PreviewOut(Schema):
    commit: str
    path: str
    format: str
    shape: str
    columns: list[str]
    rows: list[Any] = Field(description="The rows, each cut to a few thousand characters of text (see cut)")
    row_numbers: list[int] = Field(description="Each of rows' own number, as problems number rows (a row that is a problem leaves a gap)")
    next_after: int | None = Field(None, description="The after= of the next page (this page's last row number); null at the file's end")
    problems: list[dict[str, Any]]
    cut: list[PreviewCutOut] = Field(description="What the preview cut short to stay small, whatever the rows: each long string "
                                                 f"({PREVIEW_FIELD_CHARS:,} characters a field, {PREVIEW_ROW_CHARS:,} a row) and each "
                                                 "list or object past that room. The file itself keeps every row whole")
    files: list[str]


class UploadFileIn(Schema):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=1024)
    size: int = Field(ge=0, strict=True, description=f"The file's size in bytes, at most {MAX_FILE_SIZE_TEXT}",
                      json_schema_extra={"maximum": MAX_FILE_SIZE})
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("size")
    @classmethod
    def at_most_max_file_size(cls, value: int) -> int:
        if value > MAX_FILE_SIZE:
            raise PydanticCustomError("file_too_large", "a file is at most {limit}: split a larger one into parts (e.g. safetensors shards) and upload each",
                                      {"limit": MAX_FILE_SIZE_TEXT})
        return value


class UploadIn(Schema):
    model_config = ConfigDict(extra="forbid")
    branch: str = Field("main", min_length=1, max_length=128)
    message: str = Field("", max_length=5000)
    parent: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    files: list[UploadFileIn] = Field(min_length=1, max_length=10_000)


class FilesDeleteIn(Schema):
    """What DELETE /api/hub/repos/{name}/files removes, and the repo page's Delete of a file."""

    model_config = ConfigDict(extra="forbid")
    branch: str = Field("main", min_length=1, max_length=128)
    paths: list[str] = Field(min_length=1, max_length=10_000, description="Files, or folders with every file under them, on the branch's head")
    message: str = Field("", max_length=5000, description="The commit message; by default it names what was deleted")
    parent: str | None = Field(None, pattern=r"^[0-9a-f]{40}$", description="When given, the branch must still be at this commit (409 otherwise)")


class UploadFileOut(Schema):
    index: int
    path: str
    size: int
    received: int
    complete: bool


class UploadOut(Schema):
    id: str
    repo: str
    branch: str
    state: str
    commit: str | None
    reason: str | None = Field(description="When state is aborted: why, and what to do (start a new upload session); else null")
    files: list[UploadFileOut]


class UploadCommitIn(Schema):
    model_config = ConfigDict(extra="forbid")
    message: str | None = Field(default=None, max_length=5000)  # default= by name: mypy reads a positional default as none


class ChunkOut(Schema):
    index: int
    received: int
    size: int
    complete: bool
