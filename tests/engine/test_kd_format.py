from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from training.engine import kd_format


def _sample(n: int = 7, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, size=(n, k)).astype(np.uint32)
    lps = -rng.random((n, k)).astype(np.float16)
    return ids, lps


def test_sidecar_layout_is_header_then_ids_then_fp16(tmp_path: Path) -> None:
    ids, lps = _sample()
    path = tmp_path / "s.kd"
    kd_format.write_sidecar(path, ids, lps, vocab_size=500, token_hash="0123456789abcdef")
    raw = path.read_bytes()
    assert len(raw) == 1024 + 6 * 4 * 7
    assert raw[:8] == b"KD.LOGP\n"
    assert struct.unpack_from("<6i", raw, 8) == (1, 4, 7, 500, 0, 0)
    assert raw[64:80] == b"0123456789abcdef"
    assert np.array_equal(np.frombuffer(raw, "<u4", 28, 1024).reshape(7, 4), ids)
    assert np.array_equal(np.frombuffer(raw, "<f2", 28, 1024 + 4 * 28).reshape(7, 4), lps)


def test_read_back_and_validity(tmp_path: Path) -> None:
    ids, lps = _sample()
    path = tmp_path / "s.kd"
    kd_format.write_sidecar(path, ids, lps, vocab_size=500, token_hash="feedfacecafebeef")
    header, rid, rlp = kd_format.read_sidecar(path)
    assert (header.k, header.n_tokens, header.vocab_size, header.token_hash) == (4, 7, 500, "feedfacecafebeef")
    assert np.array_equal(rid, ids) and np.array_equal(rlp, lps)
    assert kd_format.is_valid(path, "feedfacecafebeef", 4)
    assert not kd_format.is_valid(path, "0000000000000000", 4)  # other tokenisation
    assert not kd_format.is_valid(path, "feedfacecafebeef", 8)  # other K
    path.write_bytes(path.read_bytes()[:-2])  # truncated by an interrupted copy
    assert not kd_format.is_valid(path, "feedfacecafebeef", 4)


def test_hash_changes_with_sequence_boundaries() -> None:
    tokens = np.arange(10, dtype=np.uint32)
    a = kd_format.tokenisation_hash(tokens, np.array([0, 5, 10]), 100)
    b = kd_format.tokenisation_hash(tokens, np.array([0, 4, 10]), 100)
    assert a != b and len(a) == 16
