"""gunicorn settings for production: `gunicorn -c studio/gunicorn.conf.py studio.wsgi:application`.

gthread workers keep HTTP connections alive, so an engine's reporter (one POST a second, bursts of
batches while it drains) does not pay a TCP handshake per batch. Everything is read from the
environment; the defaults suit a small machine (2 processes × 4 threads).
"""
from __future__ import annotations

import os

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
# Long enough for a full-log download; a stuck worker is still replaced.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "15"))
# Recycle workers now and then so a slow leak cannot grow without bound.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "20000"))
max_requests_jitter = max_requests // 10
accesslog = os.environ.get("GUNICORN_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
# Behind a TLS-terminating proxy, trust its X-Forwarded-* only from these addresses.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
