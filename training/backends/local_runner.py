"""Supervises one engine process for the local backend. Imports no Django.

    python -m training.backends.local_runner RUN_DIR [--sandbox PLAN.json] -- python -m training.engine --spec RUN_DIR/spec.json

The local backend starts this in a new session (its own process group); the engine inherits the
group, so STOP can signal both at once. The runner writes the engine's output to RUN_DIR/engine.log
and, when the engine exits, RUN_DIR/exit.json ({"returncode", "signal", "oom_kills"}) so the exit can
be mapped to an error code even though the runner is not the Studio's child any more. With
--sandbox, the engine runs inside training.backends.sandbox (which mirrors its exit and writes
engine.pid itself, as the engine's pid is only known inside).

A SIGKILL alone does not say who sent it: the kernel's OOM killer, or a `kill -9` / a supervisor.
"oom_kills" is the evidence: how much the kernel's OOM-kill counter grew while the engine ran, 0 when
it is readable and did not grow, null when none could be read (unknown, not zero).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_oom_kill(path: Path) -> int | None:
    """The `oom_kill N` line of a kernel counter file, or None when it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def oom_kill_counters() -> dict[str, int]:
    """The OOM-kill counters this process can read: the machine's (/proc/vmstat) and its own memory
    cgroup's, which the engine shares (v2 memory.events, v1 memory.oom_control). Unreadable ones (old
    kernel, no cgroup memory controller, no permission) are left out."""
    files = {"vmstat": Path("/proc/vmstat")}
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        memberships = []
    for line in memberships:
        controllers, _, path = line.partition(":")[2].partition(":")  # "ID:CONTROLLERS:PATH"
        if controllers == "":
            files["cgroup"] = CGROUP_ROOT / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            files["cgroup_v1"] = CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.oom_control"
    counts = {name: read_oom_kill(path) for name, path in files.items()}
    return {name: count for name, count in counts.items() if count is not None}


def oom_kills_between(before: dict[str, int], after: dict[str, int]) -> int | None:
    """How many OOM kills the kernel counted while the engine ran: in the runner's own memory cgroup
    (the engine's) when that counter was readable both times, since on a shared host the machine's
    counter also grows for other containers' kills; else on the whole machine; None when neither was."""
    for name in ("cgroup", "cgroup_v1", "vmstat"):
        if name in before and name in after:
            return after[name] - before[name]
    return None


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") not in (1, 3) or (argv.index("--") == 3 and argv[1] != "--sandbox"):
        print("usage: local_runner RUN_DIR [--sandbox PLAN.json] -- COMMAND...", file=sys.stderr)
        return 2
    run_dir, command = Path(argv[0]), argv[argv.index("--") + 1:]
    sandbox = argv[2] if argv[1] == "--sandbox" else None
    if sandbox:
        command = [sys.executable, "-m", "training.backends.sandbox", sandbox, "--", *command]
    # A group SIGTERM is meant for the engine (it flushes and exits); the runner outlives it to
    # record the exit. SIGKILL after the grace period takes the runner too, which is fine then.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The job id names this process: a worker lost before it saved the id can find it here (find_job).
    (run_dir / "runner.pid").write_text(str(os.getpid()))
    counters = oom_kill_counters()
    with open(run_dir / "engine.log", "ab", buffering=0) as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        if not sandbox:
            (run_dir / "engine.pid").write_text(str(child.pid))
        returncode = child.wait()
    result = {"returncode": returncode, "signal": -returncode if returncode < 0 else None,
              "oom_kills": oom_kills_between(counters, oom_kill_counters())}
    tmp = run_dir / "exit.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, run_dir / "exit.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
