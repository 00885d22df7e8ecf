"""The embedded default's SQLite: its busy database answered as a 503, and text compared the way
PostgreSQL does where the app relies on it.

SQLite takes one writer at a time. A writer waits for the others up to the busy timeout (settings:
OPTIONS["timeout"]), then fails with "database is locked": that is no bug of the request, and
database_busy makes it a 503 with Retry-After (the engines' reporter and htmx's banner say to send
it again) rather than a 500.

SQLite's built-in LIKE folds case for ASCII letters only, so on the embedded default the run list's
search ("any case") missed "Über" for "über" where PostgreSQL's UPPER(...) LIKE UPPER(...) finds it.
Django's SQLite backend compiles every pattern lookup (contains, icontains, startswith, ...) to LIKE,
and SQLite lets an application replace the like() function behind the operator: this one folds case
for every letter and keeps the rest of LIKE (% and _ wildcards, the ESCAPE character)."""
from __future__ import annotations

import re
from functools import lru_cache

from django.conf import settings
from django.db import OperationalError

from studio.errors import Finding, ServiceUnavailable

BUSY_MESSAGES = ("database is locked", "database is busy")
BUSY_RETRY_AFTER = 5  # seconds: a few of the ~10-100 ms writes the waiting ones queue behind


def database_busy(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 for an error saying the database stayed locked by other writers past the busy
    timeout (nothing of the failed write was stored); None for any other error."""
    if not isinstance(exc, OperationalError) or not str(exc).startswith(BUSY_MESSAGES):
        return None
    waited = settings.DATABASES["default"].get("OPTIONS", {}).get("timeout", 5)
    return ServiceUnavailable(
        f"The database is busy: other writes held it for the {waited:g} s this request waited, so its change was not made.",
        [Finding("database", f"busy: send the request again in {BUSY_RETRY_AFTER} s (Retry-After); a report batch or chunk sent again is applied once")],
        BUSY_RETRY_AFTER)


@lru_cache(maxsize=256)
def like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    parts: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            parts.append(re.escape(next(chars, "")))
        elif ch == "%":
            parts.append(".*")
        elif ch == "_":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL | re.IGNORECASE)


def like(pattern: str | None, value: object, escape: str | None = None) -> bool | None:
    """SQLite calls like(Y, X[, Z]) for `X LIKE Y [ESCAPE Z]`: the pattern comes first."""
    if pattern is None or value is None:
        return None
    return like_pattern(pattern, escape).fullmatch(str(value)) is not None


def register_functions(sender, connection, **kwargs) -> None:
    """connection_created receiver: install like() on each new SQLite connection (a no-op elsewhere)."""
    if connection.vendor != "sqlite":
        return
    connection.connection.create_function("like", 2, like, deterministic=True)
    connection.connection.create_function("like", 3, like, deterministic=True)
