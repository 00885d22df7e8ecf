"""How many tokens a run's dataset has, for DISTILL's storage estimate on NEW RUN: counted with the
student's tokenizer when the Studio can read both (a local file or folder, a Data Hub ref), else
estimated from the rows' characters or the files' size. Answers are cached (a commit never changes;
a local file is keyed by its size and modification time), as the form asks on every change."""
from __future__ import annotations

import hashlib
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.cache import cache

from studio.errors import ApiError
from training.refs import dataset_entries, inside_local_roots, ref_kind

# Over this many bytes of data files the rows are not read on a page request: the files' size is.
COUNT_MAX_BYTES = 32 * 1024 * 1024
CHARS_PER_TOKEN = 4  # English text in the BPE tokenizers of current models; the estimate says so
CACHE_SECONDS = 3600


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    basis: str  # how it was found: "tokenizer", "characters" (of the rows' text) or "bytes" (of the files)
    measured: int = 0  # the characters or bytes it was estimated from

    @property
    def source(self) -> str:
        """How it was found, as the estimate shows it: "counted with the student's tokenizer ..."."""
        if self.basis == "tokenizer":
            return "counted with the student's tokenizer over the rows' text"
        if self.basis == "bytes":
            return f"estimated from the data files' size ({self.measured:,} bytes, at about {CHARS_PER_TOKEN} bytes a token)"
        return f"estimated from the rows' {self.measured:,} characters at about {CHARS_PER_TOKEN} a token (the student's tokenizer is not readable here)"


def dataset_sources(project, ref: str) -> tuple[list, str] | None:
    """The data files of one dataset ref the Studio can read here, and a stamp that moves when they
    change; None for an HF id, or a path or ref that does not resolve."""
    from datahub.datasets import commit_sources, file_format, local_sources
    from datahub.refs import parse_ref

    if ref_kind(ref) == "hub":
        if project is None:
            return None
        try:
            _, commit = parse_ref(project, ref, "dataset")
        except ApiError:
            return None
        return commit_sources(commit), f"commit:{commit.pk}"
    if ref_kind(ref) != "path":
        return None
    path = Path(ref).expanduser()
    if not (path.is_absolute() and inside_local_roots(path) and path.exists()) or (path.is_file() and not file_format(path.name)):
        return None
    sources = local_sources(path)
    return sources, "local:" + repr([str(path)] + [(s.path, s.version) for s in sources])


def row_text(row: Any) -> str:
    """The text the trainer tokenises from a row: message contents, prompt and completion, or text."""
    if isinstance(row, dict):
        if isinstance(row.get("messages"), list):
            return "\n".join(str(m.get("content") or "") for m in row["messages"] if isinstance(m, dict))
        return "\n".join(str(row[key]) for key in ("prompt", "completion", "text") if isinstance(row.get(key), str))
    return ""


def student_tokenizer(project, base_model: str | None) -> tuple[Any, str] | None:
    """The student's tokenizer (from its tokenizer.json, when the Studio can read it) and its hash."""
    from tokenizers import Tokenizer

    from training.validation import model_file_reader

    read = model_file_reader(project, base_model)
    raw = read("tokenizer.json") if read else None
    if raw is None:
        return None
    try:
        return Tokenizer.from_str(raw.decode()), hashlib.sha1(raw).hexdigest()
    except Exception:  # noqa: BLE001 - a tokenizer.json that tokenizers cannot load: estimate from characters instead
        return None


def count_rows(sources: list, tokenizer: Any) -> int:
    """Tokens (with the tokenizer) or characters (without) of every row's text, one end token a row."""
    from datahub.datasets import RowError, iter_rows

    total = 0
    for source in sources:
        texts = [row_text(row) for _, row in iter_rows(source) if not isinstance(row, RowError)]
        if tokenizer is None:
            total += sum(len(text) for text in texts)
        else:
            total += sum(len(encoding.ids) + 1 for encoding in tokenizer.encode_batch(texts, add_special_tokens=False))
    return total


def count_one(project, ref: str, tokenizer: tuple[Any, str] | None) -> TokenCount | None:
    found = dataset_sources(project, ref)
    if found is None:
        return None
    sources, stamp = found
    size = sum(source.size for source in sources)
    if not sources or size == 0:
        return None
    if size > COUNT_MAX_BYTES:
        return TokenCount(size // CHARS_PER_TOKEN, "bytes", size)
    key = "training:dataset-tokens:v2:" + hashlib.sha1(f"{stamp}:{tokenizer[1] if tokenizer else 'chars'}".encode()).hexdigest()
    with suppress(Exception):  # the cache is an optimisation: Redis restarting must not fail the page
        cached = cache.get(key)
        if cached is not None:
            return TokenCount(*cached)
    if tokenizer is not None:
        answer = TokenCount(count_rows(sources, tokenizer[0]), "tokenizer")
    else:
        chars = count_rows(sources, None)
        answer = TokenCount(max(1, chars // CHARS_PER_TOKEN), "characters", chars)
    with suppress(Exception):
        cache.set(key, (answer.tokens, answer.basis, answer.measured), CACHE_SECONDS)
    return answer


def dataset_tokens(project, dataset: Any, base_model: str | None) -> TokenCount | None:
    """The tokens of every entry of `dataset` together; None when any entry cannot be read here. The
    characters or bytes it says it estimated from are every entry's too, not one entry's."""
    entries = dataset_entries(dataset)
    if not entries:
        return None
    tokenizer = student_tokenizer(project, base_model)
    counts = [count_one(project, entry.ref, tokenizer) for entry in entries]
    if any(count is None for count in counts):
        return None
    known = [count for count in counts if count is not None]
    totals = [TokenCount(sum(c.tokens for c in known if c.basis == basis), basis, sum(c.measured for c in known if c.basis == basis))
              for basis in sorted({c.basis for c in known})]
    return totals[0] if len(totals) == 1 else CombinedCount(sum(t.tokens for t in totals), "mixed", 0, tuple(totals))


@dataclass(frozen=True)
class CombinedCount(TokenCount):
    """Entries found different ways (one counted, one estimated): each way's share says how."""

    parts: tuple[TokenCount, ...] = ()

    @property
    def source(self) -> str:
        return "; ".join(f"{part.tokens:,} tokens {part.source}" for part in self.parts)
