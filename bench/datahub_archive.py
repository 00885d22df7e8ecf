"""Download a Data Hub repo with a large file as a .tar through a real Studio server and report peak memory.

    DEBUG=1 DATABASE_URL=... python -m bench.datahub_archive --size 2G

Commits a file of --size random-ish bytes (written in pieces, never whole in memory) and a small
config.json to a new repo of bench.hub_transfer's project (its token and server too), then streams
GET /api/hub/repos/<repo>/archive through tarfile's stream mode, checking each member's sha256
against what was committed. Prints one JSON object: the server's peak RSS (VmHWM), which must stay
flat whatever the size (datahub.archives sends a MiB at a time), and the client's.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from bench.hub_transfer import Pattern, parse_size, print_report, serve, setup_django


def commit_files(size: int) -> tuple[str, dict[str, str]]:
    """A new repo of the bench project (an earlier run's repo names bytes that went with its temp
    dir), and the sha256 of each file its commit holds."""
    from datahub import commits, repos
    from studio.models import Project

    repo = repos.create_repo(Project.objects.get(slug="hub-bench"), f"archive-{time.time_ns()}", "model")
    weights = Pattern(size, os.urandom(1 << 20))
    commits.commit_files(repo, "main", {"weights/model.safetensors": weights, "config.json": b"{}"}, "archive bench")
    return repo.name, {"weights/model.safetensors": weights.digest.hexdigest(), "config.json": hashlib.sha256(b"{}").hexdigest()}


def read_archive(response: http.client.HTTPResponse) -> dict[str, str]:
    """The sha256 of each member, read from the stream a MiB at a time."""
    digests = {}
    with tarfile.open(fileobj=response, mode="r|") as tar:
        for member in tar:
            digest, fh = hashlib.sha256(), tar.extractfile(member)
            while block := fh.read(1 << 20):
                digest.update(block)
            digests[member.name] = digest.hexdigest()
    return digests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="2G")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    tmp = Path(tempfile.mkdtemp(prefix="hub-archive-bench-"))
    os.environ["DATAHUB_ROOT"] = str(tmp / "hub")  # where this process commits and the server reads
    token = setup_django(tmp)
    try:
        started = time.monotonic()
        name, committed = commit_files(size)
        commit_s = time.monotonic() - started
        with serve(tmp) as (server, port):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            started = time.monotonic()
            conn.request("GET", f"/api/hub/repos/{name}/archive", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()[:500]
            length = int(resp.headers["Content-Length"])
            ok = read_archive(resp) == committed
            print_report(server, {"size_bytes": size, "archive_bytes": length, "sha256_ok": ok,
                                  "commit_seconds": round(commit_s, 1), "download_seconds": round(time.monotonic() - started, 1)})
            return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
