"""How the engine is launched on a run's GPUs, and which of its processes this one is. Stdlib only:
the backends build their command with it (the Studio's local backend, dstack's task, the Modal app).

SFT and DPO train data-parallel on every GPU of the run: one process a GPU under
`torch.distributed.run`, each on the GPU of its LOCAL_RANK, only rank 0 reporting to the Studio.
GRPO and DISTILL train in one process, on one GPU, whatever the run asked for.

`python -m training.engine.launch TORCHRUN-ARGS...` is torchrun that exits as rank 0 did (main()).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_PARALLEL_METHODS = ("sft", "dpo")
# A CPU run has no accelerator count; this asks for that many CPU processes (gloo). For tests and
# development only: it is read by whatever builds the command, not a run's config.
CPU_PROCESSES_ENV = "STUDIO_ENGINE_CPU_PROCESSES"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_COUNT = re.compile(r"^[A-Za-z][A-Za-z0-9-]*(?::(\d+))?$")


def gpu_count(compute: dict[str, Any] | None) -> int:
    """The GPUs a run's `compute.accelerators` asks for ("H100:8" → 8, "L4" → 1); 0 for the CPU."""
    accelerators = str((compute or {}).get("accelerators") or "CPU").strip()
    match = _COUNT.match(accelerators)
    if not match or accelerators.upper() == "CPU":
        return 0
    return int(match[1]) if match[1] else 1


def processes_for(method: str, compute: dict[str, Any] | None) -> int:
    """How many engine processes train this run: one per GPU for SFT/DPO, else one."""
    if method not in DATA_PARALLEL_METHODS:
        return 1
    gpus = gpu_count(compute)
    if gpus == 0:
        gpus = int(os.environ.get(CPU_PROCESSES_ENV) or 1)
    return max(gpus, 1)


def engine_argv(python: str, spec_path: str, method: str, compute: dict[str, Any] | None) -> list[str]:
    """The command that runs the engine on `spec_path`: torchrun (through main() below) with one
    process per GPU when the run trains data-parallel, else the engine alone."""
    engine = ["-m", "training.engine", "--spec", spec_path]
    n = processes_for(method, compute)
    if n == 1:
        return [python, *engine]
    return [python, "-m", "training.engine.launch", "--standalone", "--nproc_per_node", str(n), *engine]


def engine_shell_command(python: str, spec_path: str, method: str, compute: dict[str, Any] | None) -> str:
    return shlex.join(engine_argv(python, spec_path, method, compute))


@dataclass(frozen=True)
class Rank:
    """This process's place among the run's training processes (torchrun's environment)."""

    index: int = 0
    local: int = 0
    world: int = 1
    launch_id: str = ""

    @property
    def is_main(self) -> bool:
        return self.index == 0


def this_rank() -> Rank:
    world = int(os.environ.get("WORLD_SIZE") or 1)
    if world <= 1:
        return Rank()
    return Rank(int(os.environ.get("RANK") or 0), int(os.environ.get("LOCAL_RANK") or 0), world, os.environ.get("TORCHELASTIC_RUN_ID") or "")


def failure_path(output_dir: Path, rank: Rank) -> Path:
    """Where a rank other than 0 leaves its failure for rank 0 to report (one launch's files only)."""
    return output_dir / ".ranks" / f"{rank.launch_id or 'launch'}-rank{rank.index}-failed.json"


def failure_of_another_rank(output_dir: Path, rank: Rank) -> dict[str, Any] | None:
    """The error another rank of this launch failed with, if one did."""
    for path in sorted((output_dir / ".ranks").glob(f"{rank.launch_id or 'launch'}-rank*-failed.json")):
        try:
            error = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(error, dict):
            return error
    return None


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have the kernel send this process `signum` when its parent dies. torchrun starts each rank in a
    session of its own, out of reach of a signal to the job's process group: should torchrun be killed
    (STOP's SIGKILL after its grace period), the rank dies too instead of training on a GPU nobody pays
    attention to. `parent`: the pid the caller forked from (runstudio's parts call this between fork and
    exec); one that died before the signal was set is not watched by the kernel, so this sends it now."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):  # not Linux: torchrun's own shutdown still ends the ranks
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def exit_status(failures: dict[int, Any]) -> int | None:
    """The status the launch exits with for torchrun's failed ranks (global rank → its failure, whose
    `exitcode` is the rank's exit status, or minus the signal that killed it), None to let torchrun's
    own exit 1 stand.

    Rank 0 is the rank that reports, so the status it chose (4: trained, reports undelivered; 1: it
    failed and said why) stands. A rank killed by a signal exits as a shell would report it (128 +
    the signal): a rank the kernel's OOM killer took is a SIGKILL, and the backends read 137 as such
    (the local runner then tells the OOM killer from a `kill -9` by its counters). The first rank to
    fail is the one that counts: torchrun ends the others after it with SIGTERM, and records those
    too, with timestamps in whole seconds (so within a second, a SIGTERM comes after the rest)."""
    rank0 = failures.get(0)
    if rank0 is not None and rank0.exitcode > 0:
        return int(rank0.exitcode)
    first = min(failures.values(), key=lambda failure: (failure.timestamp, failure.exitcode == -signal.SIGTERM))
    if first.exitcode < 0:
        return 128 - int(first.exitcode)
    return None


def main(argv: list[str]) -> int:
    """torchrun, exiting as exit_status() says. torchrun exits 1 whenever a rank does not exit 0, so
    an engine that trained to its end and spooled its last reports (exit 4, __main__'s
    UNDELIVERED_EXIT) read as a failed run, and a rank the OOM killer took as a plain failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as exc:
        status = exit_status(exc.failures)
        if status is None:
            raise
        print(f"launch: a rank failed ({exc.get_first_failure()[1].message}); the launch exits with {status}", file=sys.stderr, flush=True)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
