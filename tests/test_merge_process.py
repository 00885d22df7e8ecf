"""The merge runs in its own process (training.checkpoints): one whose worker dies goes with it, so a
merge delivered again (acks_late) is never a second one beside the first, writing the same folder."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.conftest import wait_for


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_merge_process_dies_with_the_worker_that_started_it(tmp_path):
    # A stand-in worker starts a long child exactly as _merge starts the merge, then is SIGKILLed.
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        from functools import partial
        import django
        django.setup()
        from training.checkpoints import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=partial(die_with_parent, os.getpid()))
        open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
        time.sleep(120)
    """)], cwd=os.getcwd(), env={**os.environ, "DJANGO_SETTINGS_MODULE": "studio.settings"})
    pid_file = tmp_path / "child.pid"
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, message="the worker to start its child")
        child = int(pid_file.read_text())
        assert alive(child)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        wait_for(lambda: not alive(child), 10, message="the child to die with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
        if pid_file.exists() and alive(int(pid_file.read_text() or 0)):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
