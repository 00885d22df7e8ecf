"""The `.kd` sidecar: a teacher's top-K next-token logprobs for one tokenised shard.

Layout (shared with the surogate engine, so sidecars interoperate):
  bytes 0..1023  header: bytes 0-7 magic ``KD.LOGP\\n``; little-endian int32 at int32 index
                 2 version (=1), 3 k, 4 n_tokens, 5 vocab_size, 6 logprob dtype (0 = fp16), 7 reserved;
                 bytes 64-79 the shard's tokenisation hash as 16 ASCII hex chars
  then           n_tokens x k uint32 token ids
  then           n_tokens x k fp16 logprobs
Row i is the teacher's distribution predicting token i+1 of the shard's token stream.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"KD.LOGP\n"
HEADER_BYTES = 1024
VERSION = 1
DTYPE_FP16 = 0


@dataclass
class KDHeader:
    k: int
    n_tokens: int
    vocab_size: int
    token_hash: str
    version: int = VERSION
    dtype: int = DTYPE_FP16


def tokenisation_hash(token_ids: np.ndarray, offsets: np.ndarray, vocab_size: int) -> str:
    """16 hex chars identifying exactly this token stream (and how it is cut into sequences)."""
    h = hashlib.sha256()
    h.update(struct.pack("<i", vocab_size))
    h.update(np.ascontiguousarray(token_ids, dtype="<u4").tobytes())
    h.update(np.ascontiguousarray(offsets, dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def expected_size(k: int, n_tokens: int) -> int:
    return HEADER_BYTES + 6 * k * n_tokens  # 4 bytes id + 2 bytes fp16 per entry


def write_sidecar(path: str | Path, ids: np.ndarray, logprobs: np.ndarray, vocab_size: int, token_hash: str) -> None:
    """Write atomically: an interrupted write never leaves a file that passes `is_valid`."""
    n_tokens, k = ids.shape
    if logprobs.shape != (n_tokens, k):
        raise ValueError("ids and logprobs must have the same (n_tokens, k) shape")
    if len(token_hash) != 16:
        raise ValueError("token_hash must be 16 hex chars")
    header = bytearray(HEADER_BYTES)
    header[0:8] = MAGIC
    struct.pack_into("<6i", header, 8, VERSION, k, n_tokens, vocab_size, DTYPE_FP16, 0)
    header[64:80] = token_hash.encode("ascii")
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(header)
        fh.write(np.ascontiguousarray(ids, dtype="<u4").tobytes())
        fh.write(np.ascontiguousarray(logprobs, dtype="<f2").tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_header(path: str | Path) -> KDHeader:
    with Path(path).open("rb") as fh:
        raw = fh.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES or raw[0:8] != MAGIC:
        raise ValueError(f"{path}: not a KD.LOGP sidecar")
    version, k, n_tokens, vocab_size, dtype, _reserved = struct.unpack_from("<6i", raw, 8)
    return KDHeader(k=k, n_tokens=n_tokens, vocab_size=vocab_size, token_hash=raw[64:80].decode("ascii"), version=version, dtype=dtype)


def read_sidecar(path: str | Path) -> tuple[KDHeader, np.ndarray, np.ndarray]:
    """Header plus memory-mapped (n_tokens, k) ids and fp16 logprobs."""
    header = read_header(path)
    n, k = header.n_tokens, header.k
    ids = np.memmap(path, dtype="<u4", mode="r", offset=HEADER_BYTES, shape=(n, k))
    logprobs = np.memmap(path, dtype="<f2", mode="r", offset=HEADER_BYTES + 4 * n * k, shape=(n, k))
    return header, ids, logprobs


def is_valid(path: str | Path, token_hash: str, k: int) -> bool:
    """True when a complete sidecar for exactly this tokenisation and K already exists."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        header = read_header(p)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return (
        header.version == VERSION
        and header.dtype == DTYPE_FP16
        and header.k == k
        and header.token_hash == token_hash
        and p.stat().st_size == expected_size(k, header.n_tokens)
    )
