"""A commit's files (or a folder's) as one .tar, streamed: GET /api/hub/repos/{name}/archive and the
repo page's Download repo / Download folder.

Tar, not zip: a tar is each file's header, then its bytes, one file after another, so it streams
front to back without seeking and holds nothing of a file but the piece being sent. A zip written
without seeking must put each file's CRC-32 and size after its bytes (data descriptors) and needs
ZIP64 past 4 GiB, both of which some unzip tools read badly. A tar's size is known before its first
byte (the sizes are in the tree), so the answer has a Content-Length and a cut-off download shows as one.

Every file is its blob's bytes from the blob storage (datahub.storage): the Data Hub keeps whole
files there, a large safetensors included, never a Git LFS pointer (the HF API's `lfs` fields only
describe the blob). The Data Hub keeps no file mode, so each member is a regular file of mode 0644,
named by its path in the repo (a folder's archive keeps the folder in the names), dated by its
commit. There is no size limit: bytes move in storage.CHUNK_SIZE pieces.
"""
from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

from datahub import repos, storage
from datahub.models import Commit, Repo, TreeEntry, blob_path

BLOCK = tarfile.BLOCKSIZE
FILE_MODE = 0o644
# Two empty blocks end a tar.
END = b"\0" * (2 * BLOCK)


@dataclass(frozen=True)
class Member:
    path: str
    sha256: str
    size: int


def members_of(entries: QuerySet[TreeEntry]) -> list[Member]:
    """What the archive holds, read before the answer starts: the stream then reads only the
    blob storage, after the request's database work is done."""
    return [Member(path, sha256, size) for path, sha256, size in entries.order_by("path").values_list("path", "blob__sha256", "blob__size")]


def header(member: Member, mtime: int) -> bytes:
    """The member's tar header: ustar, or pax for what ustar cannot hold (a path over 100
    characters, non-ASCII names, a file of 8 GiB or more)."""
    info = tarfile.TarInfo(member.path)
    info.size, info.mode, info.mtime = member.size, FILE_MODE, mtime
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> int:
    return -size % BLOCK


def archive_size(members: Iterable[Member], mtime: int) -> int:
    return sum(len(header(m, mtime)) + m.size + padding(m.size) for m in members) + len(END)


def blob_chunks(member: Member) -> Iterator[bytes]:
    sent = 0
    for chunk in storage.iter_range(storage.open_blob(blob_path(member.sha256)), 0, member.size):
        sent += len(chunk)
        yield chunk
    if sent != member.size:
        # A short member would shift every header after it: better a cut-off download than a wrong file.
        raise OSError(f"the blob of {member.path} holds {sent} of its {member.size} bytes")


def stream(members: list[Member], mtime: int) -> Iterator[bytes]:
    for member in members:
        yield header(member, mtime)
        yield from blob_chunks(member)
        yield b"\0" * padding(member.size)
    yield END


def archive_name(repo: Repo, ref: str, commit: Commit, folder: str) -> str:
    """`<repo>-<ref>.tar`, a commit id shortened to 10 digits (no branch or tag looks like one:
    repos.check_ref_name), and a folder's path after it."""
    label = commit.pk[:10] if repos.COMMIT_RE.match(ref) else ref
    return "-".join([repo.name, label, *(folder.split("/") if folder else [])]) + ".tar"


def archive_response(repo: Repo, ref: str, commit: Commit, folder: str, entries: QuerySet[TreeEntry]) -> StreamingHttpResponse:
    """The .tar of `entries` (those of `commit` under `folder`, "" for all), streamed."""
    members, mtime = members_of(entries), int(commit.created_at.timestamp())
    response = StreamingHttpResponse(stream(members, mtime), content_type="application/x-tar")
    response["Content-Length"] = str(archive_size(members, mtime))
    response["Content-Disposition"] = content_disposition_header(True, archive_name(repo, ref, commit, folder))
    response["X-Repo-Commit"] = commit.pk
    return response
