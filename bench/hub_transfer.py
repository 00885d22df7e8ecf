"""Upload and download a large file through a real Studio server and report peak memory.

    DEBUG=1 DATABASE_URL=... python -m bench.hub_transfer --size 2G

Starts `manage.py runserver` on a free port (blob storage and staging in a temp dir), makes a
bench project, user and token, uploads a file of --size random-ish bytes through an upload
session in --chunk sized PUTs, commits it, downloads it back through the HF-compatible
/hub/.../resolve/ endpoint and checks its sha256. Reports the server's peak RSS (VmHWM) and the
client's: both must stay flat whatever the file size.

Measured here (CPU box, local disk, PostgreSQL): 300 MB → server peak RSS 90.5 MB; 2 GB → 90.9 MB
(upload 39 s in 64 MB chunks, download 6 s, sha256 verified).
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


class Pattern:
    """A readable stream of `size` bytes that never exists in memory as a whole."""

    def __init__(self, size: int, block: bytes) -> None:
        self.left, self.block, self.digest = size, block, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        self.digest.update(out)
        return out


def setup_django(tmp: Path) -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from studio.models import Project
    from studio.services import create_api_token, create_project

    user, _ = get_user_model().objects.get_or_create(username="hub-bench")
    project = Project.objects.filter(slug="hub-bench").first() or create_project("hub-bench", owner=user)
    from datahub.repos import get_or_create_repo

    get_or_create_repo(project, "bench", "model", user)
    return create_api_token(user, project)[1]


@contextmanager
def serve(tmp: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """`manage.py runserver` on a free port with its var folder under `tmp`, one request at a time
    (so its peak RSS is what one request needed), until the block ends: (the process, its port)."""
    port = free_port()
    env = dict(os.environ, DEBUG="1", STUDIO_VAR_DIR=str(tmp / "var"), PYTHONUNBUFFERED="1")
    (tmp / "var").mkdir()
    server = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--nothreading", "--skip-checks"],
                              cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        yield server, port
    finally:
        server.terminate()
        server.wait(10)


def print_report(server: subprocess.Popen, figures: dict) -> None:
    """`figures` and the peak RSS of the server and of this process, as one JSON object."""
    print(json.dumps({**figures, "server_peak_rss_mb": round(rss_peak_kb(server.pid) / 1024, 1),
                      "client_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="2G")
    parser.add_argument("--chunk", default="64M")
    args = parser.parse_args(argv)
    size, chunk = parse_size(args.size), parse_size(args.chunk)
    tmp = Path(tempfile.mkdtemp(prefix="hub-bench-"))
    token = setup_django(tmp)
    try:
        with serve(tmp) as (server, port):
            headers = {"Authorization": f"Bearer {token}"}

            def call(method: str, path: str, body=None, extra=None):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                conn.request(method, path, body=body, headers={**headers, **(extra or {})})
                resp = conn.getresponse()
                return conn, resp

            conn, resp = call("POST", "/api/hub/repos/bench/uploads", json.dumps({"files": [{"path": "big.bin", "size": size}], "message": "bench"}), {"Content-Type": "application/json"})
            session = json.loads(resp.read())
            assert resp.status == 201, session
            source = Pattern(size, os.urandom(1 << 20))
            started, offset = time.monotonic(), 0
            while offset < size:
                n = min(chunk, size - offset)
                conn, resp = call("PUT", f"/api/hub/uploads/{session['id']}/files/0?offset={offset}", _Chunk(source, n),
                                  {"Content-Type": "application/octet-stream", "Content-Length": str(n)})
                body = json.loads(resp.read())
                assert resp.status == 200, body
                offset = body["received"]
            conn, resp = call("POST", f"/api/hub/uploads/{session['id']}/commit")
            commit = json.loads(resp.read())
            assert resp.status == 200, commit
            upload_s = time.monotonic() - started
            started, digest, got = time.monotonic(), hashlib.sha256(), 0
            conn, resp = call("GET", f"/hub/hub-bench/bench/resolve/{commit['id']}/big.bin")
            assert resp.status == 200, resp.status
            while block := resp.read(1 << 20):
                digest.update(block)
                got += len(block)
            download_s = time.monotonic() - started
            ok = got == size and digest.hexdigest() == source.digest.hexdigest()
            print_report(server, {"size_bytes": size, "chunk_bytes": chunk, "sha256_ok": ok,
                                  "upload_seconds": round(upload_s, 1), "download_seconds": round(download_s, 1)})
            return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Chunk:
    """`n` bytes of the source as a file-like body, so http.client streams it in blocks."""

    def __init__(self, source: Pattern, n: int) -> None:
        self.source, self.left = source, n

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.source.read(min(self.left, 1 << 20 if size is None or size < 0 else size))
        self.left -= len(data)
        return data


if __name__ == "__main__":
    raise SystemExit(main())
