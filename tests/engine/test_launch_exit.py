"""How `python -m training.engine.launch` (torchrun for a data-parallel run) exits when a rank dies of a
signal: as a shell reports it, 128 + the signal, so the backends read a rank the kernel's OOM killer
took (SIGKILL) as a kill and not as torchrun's plain exit 1. Real torchrun, two CPU processes, and a
rank that really is SIGKILLed: a CPU job cannot be made to meet the OOM killer on cue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from training.backends.mapping import exit_result
from training.models import ErrorCode

REPO = Path(__file__).resolve().parents[2]

RANK_SCRIPT = """
import os, signal, sys, time
if os.environ["RANK"] == os.environ["DYING_RANK"]:
    time.sleep(1)
    os.kill(os.getpid(), int(os.environ["DYING_SIGNAL"]))
    time.sleep(30)
time.sleep(60)
sys.exit(0)
"""


def launch(tmp_path: Path, rank: int, signum: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    command = [sys.executable, "-m", "training.engine.launch", "--standalone", "--nproc_per_node", "2", str(script)]
    env = {**os.environ, "DYING_RANK": str(rank), "DYING_SIGNAL": str(int(signum)), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_killed_by_sigkill_makes_the_launch_exit_137_which_reads_as_a_kill(tmp_path: Path, rank: int) -> None:
    proc = launch(tmp_path, rank, signal.SIGKILL)

    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-3000:]
    assert "the launch exits with 137" in proc.stderr
    # The local runner counted an OOM kill while the job ran: the run failed out of memory.
    assert exit_result(proc.returncode, None, [], oom_kills=1).error_code == ErrorCode.OOM
    # Nobody could count: still a kill, possibly the OOM killer; not "the engine stopped with exit code 1".
    assert exit_result(proc.returncode, None, [], oom_kills=None).error_code == ErrorCode.OOM


def test_a_rank_killed_by_another_signal_exits_as_the_shell_reports_it(tmp_path: Path) -> None:
    proc = launch(tmp_path, 1, signal.SIGSEGV)

    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr[-3000:]
