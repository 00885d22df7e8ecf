"""Rate limits on token authentication failures, per client address, in the shared cache (Redis).

A client address that sent STUDIO_RATELIMIT_AUTH_FAILURES bad tokens (API or ingest) within the
current STUDIO_RATELIMIT_WINDOW_SECONDS window gets 429 for every token it sends until the window
ends — a valid one too, or guessing would still reveal a hit by its 200. Fixed windows: one INCR
per failure, one GET per token request. If the cache is down the limit is skipped (logged), never
the request failed: authentication itself does not depend on Redis.

The address is REMOTE_ADDR. Behind a reverse proxy, have the proxy (or gunicorn's
forwarded_allow_ips) set it to the real client's address.
"""
from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from studio.errors import ApiError

log = logging.getLogger(__name__)


class TooManyRequests(ApiError):
    status = 429
    default_detail = "Too many failed authentication attempts from this address: wait and try again with a valid token."

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"Too many failed authentication attempts from this address: try again in {retry_after} s with a valid token.")
        self.retry_after = retry_after


def _window() -> tuple[int, int]:
    """(window number, seconds left in it)."""
    size = max(1, settings.STUDIO_RATELIMIT_WINDOW_SECONDS)
    now = int(time.time())
    return now // size, size - now % size


def _key(request: HttpRequest, window: int) -> str:
    return f"authfail:{request.META.get('REMOTE_ADDR', '')}:{window}"


def check_auth_allowed(request: HttpRequest) -> None:
    """Raise TooManyRequests when this address is over its failure budget. Call before checking a token."""
    limit = settings.STUDIO_RATELIMIT_AUTH_FAILURES
    if limit <= 0:
        return
    window, left = _window()
    try:
        failures = cache.get(_key(request, window)) or 0
    except Exception as exc:  # noqa: BLE001 - fail open: see the module docstring
        log.warning("rate limit skipped, the cache is unavailable: %s", exc)
        return
    if failures >= limit:
        raise TooManyRequests(left)


def note_auth_failure(request: HttpRequest) -> None:
    if settings.STUDIO_RATELIMIT_AUTH_FAILURES <= 0:
        return
    window, left = _window()
    key = _key(request, window)
    try:
        if not cache.add(key, 1, timeout=left + 1):
            cache.incr(key)
    except Exception as exc:  # noqa: BLE001 - fail open
        log.warning("rate limit not counted, the cache is unavailable: %s", exc)
