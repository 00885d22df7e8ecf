"""The one table from "how the engine's job ended" to seed 000's error codes, for every backend.

The local backend sees an exit status and a signal; dstack sees the container's exit status and a
termination reason; Modal sees the exception the function raised. They all end up here, so the
same failure reads the same whichever backend ran it.
"""
from __future__ import annotations

import signal

from training.backends.base import PollResult
from training.models import ErrorCode

LOG_TAIL_LINES = 200
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")
# Exit statuses a shell reports for a process killed by a signal: 128 + signal number.
SIGKILL_EXIT = 128 + signal.SIGKILL


def exit_result(returncode: int | None, sig: int | None, log_tail: list[str]) -> PollResult:
    """Map an engine exit (return code, or the signal that killed it) to a PollResult."""
    tail = log_tail[-LOG_TAIL_LINES:]
    if returncode == 0 and not sig:
        return PollResult("succeeded", log_tail=tail)
    if sig == signal.SIGKILL or returncode == SIGKILL_EXIT:
        return PollResult("failed", ErrorCode.OOM, "the engine was killed (SIGKILL), most likely by the kernel's OOM killer: use a smaller model or batch", tail)
    if oom_in(tail):
        return PollResult("failed", ErrorCode.OOM, "the engine ran out of GPU memory: lower the batch size or max_length", tail)
    how = f"signal {sig}" if sig else f"exit code {returncode}"
    return PollResult("failed", ErrorCode.TRAINING_ERROR, f"the engine stopped with {how}", tail)


def oom_in(tail: list[str]) -> bool:
    return any(marker in line for line in tail[-50:] for marker in OOM_MARKERS)


def capacity_unavailable(message: str) -> PollResult:
    return PollResult("failed", ErrorCode.CAPACITY_UNAVAILABLE, message)


def provisioning_error(message: str, log_tail: list[str] | None = None) -> PollResult:
    return PollResult("failed", ErrorCode.PROVISIONING_ERROR, message, (log_tail or [])[-LOG_TAIL_LINES:])
