"""The embedded default's SQLite, made to compare text the way PostgreSQL does where the app relies on it.

SQLite's built-in LIKE folds case for ASCII letters only, so on the embedded default the run list's
search ("any case") missed "Über" for "über" where PostgreSQL's UPPER(...) LIKE UPPER(...) finds it.
Django's SQLite backend compiles every pattern lookup (contains, icontains, startswith, ...) to LIKE,
and SQLite lets an application replace the like() function behind the operator: this one folds case
for every letter and keeps the rest of LIKE (% and _ wildcards, the ESCAPE character)."""
from __future__ import annotations

import re
from functools import lru_cache


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
