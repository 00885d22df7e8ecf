"""Supervises one engine process for the local backend. Imports no Django.

    python -m training.backends.local_runner RUN_DIR -- python -m training.engine --spec RUN_DIR/spec.json

The local backend starts this in a new session (its own process group); the engine inherits the
group, so STOP can signal both at once. The runner writes the engine's output to RUN_DIR/engine.log
and, when the engine exits, RUN_DIR/exit.json ({"returncode", "signal"}) so the exit can be mapped
to an error code even though the runner is not the Studio's child any more.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1:
        print("usage: local_runner RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir, command = Path(argv[0]), argv[2:]
    # A group SIGTERM is meant for the engine (it flushes and exits); the runner outlives it to
    # record the exit. SIGKILL after the grace period takes the runner too, which is fine then.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(run_dir / "engine.log", "ab", buffering=0) as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        (run_dir / "engine.pid").write_text(str(child.pid))
        returncode = child.wait()
    result = {"returncode": returncode, "signal": -returncode if returncode < 0 else None}
    tmp = run_dir / "exit.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, run_dir / "exit.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
