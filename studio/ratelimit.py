"""Rate limits on authentication failures, per client address, in the shared cache (Redis).

A client address that sent STUDIO_RATELIMIT_AUTH_FAILURES bad tokens (API, ingest, the Hub's) or
wrong passwords within the current STUDIO_RATELIMIT_WINDOW_SECONDS window gets 429 instead of 401/403
for every further bad token until the window ends. A valid token is checked first and always taken:
many clients share an address (every local engine reports over 127.0.0.1, and behind a proxy every
user has the proxy's), so refusing it would let one client's typos lock out all the others, and with
256-bit tokens learning that a guess hit is worth nothing. Passwords are stricter, as they can be
guessed: every password check (studio.auth.RateLimitedModelBackend: /login/ and the admin's
/admin/login/) is counted before the password is, and over the budget it is a 429 without checking,
the right password too; a right one gives its count back, so only wrong ones use the budget up. Their
budget is per address and user name, apart from the tokens': behind a proxy every user has one
address, and one user's typos must not lock the others out of logging in.
Fixed windows, counted with one atomic INCR per attempt before it is judged, so concurrent requests
each see their own count (reading the count, checking a slow password, then writing it let a burst
past the budget). If the cache is down the limit is skipped (logged), never the request failed:
authentication itself does not depend on Redis.

The address is REMOTE_ADDR. gunicorn sets it from the connection's peer and does not rewrite it from
X-Forwarded-For (forwarded_allow_ips only trusts the proxy's scheme headers), so behind a reverse proxy
every client counts as the proxy's address unless the proxy passes the client's own (e.g. gunicorn's
--proxy-protocol with a proxy that speaks it).
"""
from __future__ import annotations

import hashlib
import logging
import time
from typing import NoReturn

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

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def _window() -> tuple[int, int]:
    """(window number, seconds left in it)."""
    size = max(1, settings.STUDIO_RATELIMIT_WINDOW_SECONDS)
    now = int(time.time())
    return now // size, size - now % size


def _key(request: HttpRequest, window: int, scope: str) -> str:
    return f"authfail:{request.META.get('REMOTE_ADDR', '')}:{scope}:{window}"


def login_scope(username: str) -> str:
    """A password's failure budget is per address and user name (see the module docstring)."""
    return "login:" + hashlib.sha256(username.strip().lower().encode()).hexdigest()[:16]


def check_auth_allowed(request: HttpRequest, scope: str = "") -> None:
    """Raise TooManyRequests when this address is already over its failure budget, counting nothing
    (ingest's request without a token); credentials that are checked use count_auth_attempt."""
    limit = settings.STUDIO_RATELIMIT_AUTH_FAILURES
    if limit <= 0:
        return
    window, left = _window()
    try:
        failures = cache.get(_key(request, window, scope)) or 0
    except Exception as exc:  # noqa: BLE001 - fail open: see the module docstring
        log.warning("rate limit skipped, the cache is unavailable: %s", exc)
        return
    if failures >= limit:
        raise TooManyRequests(left)


def count_auth_attempt(request: HttpRequest, scope: str = "") -> str | None:
    """Count one attempt against this address's budget (for `scope`: a password's user name) and
    raise TooManyRequests when it is over; call it before checking the credential, so that requests
    sent at once are each counted before any is judged. Returns the counter's key, for
    refund_auth_attempt (None when nothing was counted)."""
    limit = settings.STUDIO_RATELIMIT_AUTH_FAILURES
    if limit <= 0:
        return None
    window, left = _window()
    key = _key(request, window, scope)
    try:
        # add sets the expiry with the first attempt; INCR is atomic, so every attempt gets its own count.
        count = 1 if cache.add(key, 1, timeout=left + 1) else cache.incr(key)
    except Exception as exc:  # noqa: BLE001 - fail open
        log.warning("rate limit not counted, the cache is unavailable: %s", exc)
        return None
    if count > limit:
        raise TooManyRequests(left)
    return key


def refund_auth_attempt(key: str | None) -> None:
    """Give back an attempt that count_auth_attempt counted and that turned out valid."""
    if key is None:
        return
    try:
        cache.decr(key)
    except ValueError:
        pass  # its window has ended, and the count with it
    except Exception as exc:  # noqa: BLE001 - fail open
        log.warning("rate limit not refunded, the cache is unavailable: %s", exc)


def refuse_bad_credentials(request: HttpRequest, error: Exception) -> NoReturn:
    """Raise `error` (a 401/403) for credentials that were checked and are not valid, counting the
    failure; TooManyRequests instead when it is over this address's failure budget."""
    count_auth_attempt(request)
    raise error
