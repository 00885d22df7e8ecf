"""gunicorn settings for production: `gunicorn -c studio/gunicorn.conf.py studio.wsgi:application`.

gthread workers keep HTTP connections alive, so an engine's reporter (one POST a second, bursts of
batches while it drains) does not pay a TCP handshake per batch. Everything is read from the
environment; the defaults suit a small machine (2 processes × 4 threads).
"""
from __future__ import annotations

import os


def envint(name: str, default: int) -> int:
    """An integer setting; a bad value stops gunicorn with one line naming the variable, not a traceback."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not an integer: give a whole number, e.g. {default}") from None


bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = envint("GUNICORN_WORKERS", 2)
worker_class = "gthread"
threads = envint("GUNICORN_THREADS", 4)
# Long enough for a full-log download; a stuck worker is still replaced.
timeout = envint("GUNICORN_TIMEOUT", 60)
graceful_timeout = envint("GUNICORN_GRACEFUL_TIMEOUT", 20)
keepalive = envint("GUNICORN_KEEPALIVE", 15)
# Recycle workers now and then so a slow leak cannot grow without bound.
max_requests = envint("GUNICORN_MAX_REQUESTS", 20000)
max_requests_jitter = max_requests // 10
accesslog = os.environ.get("GUNICORN_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
# Behind a TLS-terminating proxy, trust its X-Forwarded-* only from these addresses.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
