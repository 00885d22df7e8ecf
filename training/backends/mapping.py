"""The one table from "how the engine's job ended" to seed 000's error codes, for every backend.

The local backend sees an exit status and a signal; dstack sees the container's exit status and a
termination reason; Modal sees the exception the function raised. They all end up here, so the
same failure reads the same whichever backend ran it.
"""
from __future__ import annotations

import signal

from training.backends.base import PollResult
from training.engine.reporter import UNDELIVERED_EXIT
from training.models import ErrorCode

LOG_TAIL_LINES = 200
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")
# Exit statuses a shell reports for a process killed by a signal: 128 + signal number.
SIGKILL_EXIT = 128 + signal.SIGKILL
# What to change after the kernel's OOM killer took the engine.
LESS_MEMORY = "use a smaller model, or lower per_device_train_batch_size or max_length"


def exit_result(returncode: int | None, sig: int | None, log_tail: list[str], oom_kills: int | None = None) -> PollResult:
    """Map an engine exit (return code, or the signal that killed it) to a PollResult.

    `oom_kills` is how many OOM kills the kernel counted while the engine ran (the local runner
    reads the counters): 0 means a SIGKILL came from someone else, None that nobody could tell."""
    tail = log_tail[-LOG_TAIL_LINES:]
    if returncode == 0 and not sig:
        return PollResult("succeeded", log_tail=tail)
    if returncode == UNDELIVERED_EXIT and not sig:
        return PollResult("succeeded", log_tail=tail, reports_undelivered=True)
    killed = sig == signal.SIGKILL or returncode == SIGKILL_EXIT
    if killed and oom_kills:
        return PollResult("failed", ErrorCode.OOM, f"the engine was killed (SIGKILL) by the kernel's OOM killer (the kernel counted an OOM kill while the engine ran): it ran out of memory (the machine's, or its container's limit); {LESS_MEMORY}", tail)
    if killed and oom_kills is None:
        return PollResult("failed", ErrorCode.OOM, f"the engine was killed (SIGKILL), possibly by the kernel's OOM killer (no OOM-kill counter could be read to tell): {LESS_MEMORY}", tail)
    if oom_in(tail):
        return PollResult("failed", ErrorCode.OOM, "the engine ran out of GPU memory: lower the batch size or max_length", tail)
    if killed:
        return PollResult("failed", ErrorCode.TRAINING_ERROR, "the engine was killed (SIGKILL) from outside the Studio, not out of memory as far as the kernel's OOM-kill counters show: find what killed it (a `kill -9`, a supervisor or job scheduler, a container runtime) and stop it, then start the run again", tail)
    how = f"signal {sig}" if sig else f"exit code {returncode}"
    return PollResult("failed", ErrorCode.TRAINING_ERROR, f"the engine stopped with {how}", tail)


def oom_in(tail: list[str]) -> bool:
    return any(marker in line for line in tail[-50:] for marker in OOM_MARKERS)


def capacity_unavailable(message: str) -> PollResult:
    return PollResult("failed", ErrorCode.CAPACITY_UNAVAILABLE, message)


def provisioning_error(message: str, log_tail: list[str] | None = None) -> PollResult:
    return PollResult("failed", ErrorCode.PROVISIONING_ERROR, message, (log_tail or [])[-LOG_TAIL_LINES:])
