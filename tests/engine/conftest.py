"""Fixtures for the engine tests: tiny models built once per session, and a real HTTP ingest stub."""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

TOKEN = "attempt-token"
# bench/device_check.sh reruns these tests on a GPU (ENGINE_TEST_ACCELERATORS=GPU:1): what a run reports
# that only a GPU has (MFU against the card's peak, GPU memory) is then expected, not refused.
ON_GPU = os.environ.get("ENGINE_TEST_ACCELERATORS", "CPU") != "CPU"
GPU_ONLY_PROGRESS = {"mfu", "gpu_memory_gb"} if ON_GPU else set()
EXPECTED_ATTENTION = "attention: " if ON_GPU else "attention: sdpa (CPU)"  # flash or sdpa on a GPU, by what is installed


class IngestStub:
    """Records every POSTed batch; answers 200, or the status codes queued in `responses`."""

    def __init__(self, port: int = 0) -> None:
        self.attempts: list[dict[str, Any]] = []  # every request, with the status we answered
        self.responses: list[int] = []
        self.always: int | None = None
        self.max_body: int | None = None  # a body over it is answered 413, as Studio answers one over its limit
        # A status for this body, or a status and the JSON to answer with, or None for the rest.
        self.answer: Callable[[dict[str, Any]], int | tuple[int, dict[str, Any]] | None] | None = None
        self.seen_ids: set[str] = set()
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                size = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(size))
                auth = self.headers.get("Authorization")
                with stub.lock:
                    code = stub.responses.pop(0) if stub.responses else (stub.always or 200)
                    answer = stub.answer(body) if stub.answer else None
                    code, reply = answer if isinstance(answer, tuple) else (answer or code, None)
                    if stub.max_body is not None and size > stub.max_body:
                        code = 413
                    if auth != f"Bearer {TOKEN}":
                        code = 403
                    duplicate = body.get("batch_id") in stub.seen_ids
                    if code == 200:
                        stub.seen_ids.add(body.get("batch_id"))
                    stub.attempts.append({"status": code, "body": body, "auth": auth, "duplicate": duplicate, "size": size})
                payload = json.dumps(reply or {"ok": code == 200, "duplicate": duplicate}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/api/ingest/runs/1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def batches(self) -> list[dict[str, Any]]:
        """Accepted batches, each applied once (the server dedups on batch_id)."""
        with self.lock:
            out, seen = [], set()
            for a in self.attempts:
                if a["status"] == 200 and a["body"]["batch_id"] not in seen:
                    seen.add(a["body"]["batch_id"])
                    out.append(a["body"])
            return out

    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for b in self.batches:
            for m in b["metrics"]:
                series[m["key"]].append((m["step"], m["value"]))
        return series

    def series(self, key: str) -> list[float]:
        return [v for _, v in sorted(self.metrics()[key])]

    def collect(self, field: str) -> list[Any]:
        return [x for b in self.batches for x in b[field]]

    def scalars(self, field: str) -> list[Any]:
        return [b[field] for b in self.batches if b[field] is not None]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest() -> Iterator[IngestStub]:
    stub = IngestStub()
    yield stub
    stub.close()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from training.engine.tiny import build_demo_datasets, build_tiny_models

    root = tmp_path_factory.mktemp("tiny")
    return {**build_tiny_models(root / "models"), **build_demo_datasets(root / "datasets")}


def make_spec(
    method: str, base_model: str, datasets: list[str], out: Path, config: dict[str, Any], ingest: IngestStub | None = None, **extra: Any
) -> dict[str, Any]:
    spec = {
        "run_id": 1,
        "attempt": 1,
        "method": method,
        "base_model": base_model,
        "base_model_revision": None,
        "dataset": [{"path": p, "type": None, "revision": None} for p in datasets],
        # The device check (bench/device_check.sh) reruns these tests on a GPU by setting these two.
        "config": {"precision": os.environ.get("ENGINE_TEST_PRECISION", "fp32"), "seed": 1, **config},
        "compute": {"backend": "local", "accelerators": os.environ.get("ENGINE_TEST_ACCELERATORS", "CPU")},
        "ingest": {"url": ingest.url, "token": TOKEN} if ingest else None,
        "output_dir": str(out),
        "resume_from": None,
    }
    spec.update(extra)
    return spec


def run_inprocess(spec: dict[str, Any]) -> int:
    """Run the engine in this process with the same error contract as the CLI (minus signal handling)."""
    from training.engine.__main__ import execute
    from training.engine.reporter import Reporter
    from training.engine.spec import parse_spec

    parsed = parse_spec(spec)
    reporter = Reporter(
        parsed.ingest_url, parsed.ingest_token, flush_interval=0.2, heartbeat_interval=float(spec["config"].get("heartbeat_interval_seconds", 10))
    )
    return execute(parsed, reporter)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)
