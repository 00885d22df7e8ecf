"""Supervises one engine process for the local backend. Imports no Django.

    python -m training.backends.local_runner RUN_DIR [--sandbox PLAN.json] [--slots DIR (--gpus N --devices 0,1,.. | --cpu-slots K)] -- COMMAND...

The local backend starts this in a new session (its own process group); the engine inherits the
group, so STOP can signal both at once.

Slots: before it starts the engine, the runner takes the machine's devices the job asked for, one
`flock` on DIR/gpu-<device>.lock a GPU (or one of K DIR/cpu-<k>.lock for a CPU job), and holds them
until it exits: a killed runner, or the end of the job's group, frees them with no clean-up. The
engine sees exactly its GPUs (CUDA_VISIBLE_DEVICES; none for a CPU job). Until it has them all it
waits, saying why in RUN_DIR/waiting.json (the backend's poll reads it) and engine.log; a SIGTERM
(STOP) then ends it at once. Waiters take their turns first come, first served: each holds a ticket
in DIR/queue-<gpu|cpu> (take_ticket), and only the oldest live one tries the free slots; retrying in
turn let whichever retried first win. The runner writes the engine's output to RUN_DIR/engine.log
and, when the engine exits, RUN_DIR/exit.json ({"returncode", "signal", "oom_kills"}) so the exit can
be mapped to an error code even though the runner is not the Studio's child any more. With
--sandbox, the engine runs inside training.backends.sandbox (which mirrors its exit and writes
engine.pid itself, as the engine's pid is only known inside).

A SIGKILL alone does not say who sent it: the kernel's OOM killer, or a `kill -9` / a supervisor.
"oom_kills" is the evidence: how much the kernel's OOM-kill counter grew while the engine ran, 0 when
it is readable and did not grow, null when none could be read (unknown, not zero).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

CGROUP_ROOT = Path("/sys/fs/cgroup")
WAITING_NAME = "waiting.json"
RETRY_SECONDS = 1.0


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


def holder_of(run_dir: Path) -> str:
    """What a slot's lock file says about its holder: the run and attempt (RUNS_DIR/<run>/attempt-<n>)."""
    return f"run {run_dir.parent.name} (attempt {run_dir.name.removeprefix('attempt-')})"


def try_slots(paths: list[Path], want: int) -> tuple[list[IO[str]], list[str]]:
    """All or nothing: `want` of the slots in `paths` locked (their files held open) and marked as
    this job's, or none and the holders of the busy ones. Holding a part while waiting for the rest
    would let two jobs each hold half of what the other needs, for ever."""
    held: list[IO[str]] = []
    busy: list[Path] = []
    for path in paths:
        if len(held) == want:
            break
        f = path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            busy.append(path)
            continue
        held.append(f)
    if len(held) < want:
        for taken in held:
            taken.close()
        return [], [path.read_text().strip() or "a job starting" for path in busy]
    return held, []


def take_ticket(queue: Path, run_dir: Path) -> tuple[Path, IO[str]]:
    """This job's place in the queue of a pool of slots: a file named by the time it came (and the
    pid, for ties), marked as this job's and held with a flock until it has its slots. A waiter that
    died (killed, crashed) no longer holds its ticket's lock, so the others pass it with no clean-up.
    It is locked before it gets its name, so no waiter ever sees it unlocked while it waits."""
    queue.mkdir(parents=True, exist_ok=True)
    stem = f"{time.time_ns():020d}-{os.getpid()}"
    name, draft = f"{stem}.ticket", queue / f"{stem}.draft"  # not a ticket (the queue reads *.ticket) until it is held
    f = draft.open("a+")
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(holder_of(run_dir))
    f.flush()
    os.rename(draft, queue / name)
    return queue / name, f


def waiting_before(ticket: Path) -> list[str]:
    """The jobs still waiting in `ticket`'s queue that came before it, oldest first; the tickets of
    dead waiters are removed on the way."""
    ahead = []
    for path in sorted(ticket.parent.glob("*.ticket")):
        if path.name >= ticket.name:
            break
        try:
            f = path.open("r")
        except FileNotFoundError:  # it took its slots, or was removed as dead
            continue
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its waiter holds it: alive and waiting
                ahead.append(f.read().strip() or "a job starting")
                continue
            path.unlink(missing_ok=True)  # no waiter holds it (dead, or it just took its slots)
    return ahead


def wait_for_slots(run_dir: Path, slots_dir: Path, paths: list[Path], want: int, what: str, pool: str, log: IO[bytes]) -> list[IO[str]]:
    """Block until `want` of `paths` are this job's, in its turn; say why it waits, and when that changes.
    Only the oldest waiter tries the slots, so a job is never passed by one that came after it, even
    one that asks for fewer GPUs (which would otherwise keep a job asking for many waiting for ever)."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    ticket, hold = take_ticket(slots_dir / f"queue-{pool}", run_dir)
    said = ""
    while True:
        ahead = waiting_before(ticket)
        if not ahead:
            held, holders = try_slots(paths, want)
            if held:
                break
            message = f"waits for {what}, held by {', '.join(sorted(set(holders)))}: it starts once they are free"
        else:
            names = ", ".join(ahead[:3]) + (", …" if len(ahead) > 3 else "")
            message = (f"waits for {what}, after {len(ahead)} job{'s' if len(ahead) > 1 else ''} that came before it "
                       f"({names}): it starts in its turn")
        if message != said:
            tmp = run_dir / (WAITING_NAME + ".tmp")
            tmp.write_text(json.dumps({"message": message}))
            os.replace(tmp, run_dir / WAITING_NAME)
            log.write(f"[runner] {message}\n".encode())
            said = message
        time.sleep(RETRY_SECONDS)
    ticket.unlink(missing_ok=True)  # before the lock goes, so no waiter takes it for a dead one's
    hold.close()
    for f in held:
        f.seek(0)
        f.truncate()
        f.write(holder_of(run_dir))
        f.flush()
    return held


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]] | None:
    if "--" not in argv:
        return None
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="local_runner")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sandbox", type=Path, help="the plan of the sandbox the engine runs in (training.backends.sandbox)")
    parser.add_argument("--slots", type=Path, help="the folder of the machine's slot lock files")
    parser.add_argument("--gpus", type=int, default=0, help="how many of --devices this job takes")
    parser.add_argument("--devices", default="", help="the machine's GPUs, comma-separated (CUDA_VISIBLE_DEVICES entries)")
    parser.add_argument("--cpu-slots", type=int, default=0, help="how many CPU jobs may train at once")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    return (args, command) if command else None


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print("usage: local_runner RUN_DIR [--sandbox PLAN.json] [--slots DIR (--gpus N --devices 0,1,.. | --cpu-slots K)] -- COMMAND...", file=sys.stderr)
        return 2
    args, command = parsed
    run_dir = args.run_dir
    if args.sandbox:
        command = [sys.executable, "-m", "training.backends.sandbox", str(args.sandbox), "--", *command]
    # The job id names this process: a worker lost before it saved the id can find it here (find_job).
    (run_dir / "runner.pid").write_text(str(os.getpid()))
    env = dict(os.environ)
    with open(run_dir / "engine.log", "ab", buffering=0) as log:
        held: list[IO[str]] = []
        if args.slots is not None:
            # While it waits, nothing runs yet: a SIGTERM (STOP) ends the runner at once.
            devices = [d for d in args.devices.split(",") if d]
            if args.gpus > len(devices):  # START refuses this; the machine lost GPUs since
                log.write(f"[runner] this machine has {len(devices)} GPUs and the job asks for {args.gpus}: it cannot start\n".encode())
                write_exit(run_dir, {"returncode": 1, "signal": None, "oom_kills": None})
                return 0
            if args.gpus:
                paths = [args.slots / f"gpu-{d}.lock" for d in devices]
                what = f"{args.gpus} GPU{'s' if args.gpus > 1 else ''} of this machine's {len(devices)}"
                held = wait_for_slots(run_dir, args.slots, paths, args.gpus, what, "gpu", log)
                taken = [Path(f.name).stem.removeprefix("gpu-") for f in held]
            else:
                paths = [args.slots / f"cpu-{k}.lock" for k in range(args.cpu_slots)]
                what = f"a CPU slot (STUDIO_LOCAL_MAX_CPU_JOBS={args.cpu_slots})"
                held = wait_for_slots(run_dir, args.slots, paths, 1, what, "cpu", log)
                taken = []
            # Exactly its GPUs, whatever the machine has: torchrun's ranks and a single engine alike count from cuda:0.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(taken)
            log.write(f"[runner] took {'GPU ' + ', '.join(taken) if taken else 'a CPU slot'}: the engine starts\n".encode())
        # A group SIGTERM is meant for the engine (it flushes and exits); the runner outlives it to
        # record the exit. SIGKILL after the grace period takes the runner too, which is fine then.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        counters = oom_kill_counters()
        # The engine holds its slots too: an engine left behind by a killed runner keeps them until STOP ends the group.
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 pass_fds=[f.fileno() for f in held], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        if args.sandbox:
            # The sandbox writes engine.pid (the engine's pid is only known inside it) once the engine runs.
            while not (run_dir / "engine.pid").exists() and child.poll() is None:
                time.sleep(0.05)
        else:
            (run_dir / "engine.pid").write_text(str(child.pid))
        # Only now: the backend's poll reads "waiting" until engine.pid says the engine runs.
        (run_dir / WAITING_NAME).unlink(missing_ok=True)
        returncode = child.wait()
    write_exit(run_dir, {"returncode": returncode, "signal": -returncode if returncode < 0 else None,
                         "oom_kills": oom_kills_between(counters, oom_kill_counters())})
    return 0


def write_exit(run_dir: Path, result: dict) -> None:
    tmp = run_dir / "exit.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, run_dir / "exit.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
