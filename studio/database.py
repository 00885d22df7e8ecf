"""The database errors a request answers with a 503 to send again, rather than a 500: the embedded
SQLite busy past its wait (studio.sqlite.database_busy), or a database the Studio cannot reach (its
server is down, restarting, or not where DATABASE_URL points). The API's handler (studio.api) and
the pages' middleware (studio.middleware) share them; every other database error stays a 500."""

from __future__ import annotations

from django.db import InterfaceError, OperationalError, connection

from studio.errors import Finding, ServiceUnavailable
from studio.sqlite import database_busy

UNREACHABLE_RETRY_AFTER = 10  # seconds: a restarting database server, or a failover, is back in about that
UNREACHABLE_ADVICE = "check that the database server runs and that DATABASE_URL points at it"


def database_unreachable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 for an error raised because this thread has no working connection: opening one failed
    (refused, timed out, bad password) or the server dropped it. None for any other error, such as a
    query the database refused on a live connection: that is a bug to see as a 500 with its traceback."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return None
    raw = connection.connection  # None when connecting failed; psycopg marks a dropped one closed
    if raw is not None and not getattr(raw, "closed", False):
        return None
    return ServiceUnavailable(
        "The Studio cannot reach its database, so the request could not be completed.",
        [Finding("database", f"unreachable: send the request again in {UNREACHABLE_RETRY_AFTER} s (Retry-After); if it persists, {UNREACHABLE_ADVICE}")],
        UNREACHABLE_RETRY_AFTER,
    )


def database_unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 for a database that is busy or unreachable; None for any other error."""
    return database_busy(exc) or database_unreachable(exc)
