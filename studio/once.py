"""A form whose answer shows a secret once (a new API token): reloading that answer sends the form
again, which made a second one without a word. The form carries a one-time key; the first POST with
it acts, a repeat is told what the first did. The keys live in the shared cache (Redis) for a day."""
from __future__ import annotations

import logging
import secrets

from django.core.cache import cache
from django.http import HttpRequest

log = logging.getLogger(__name__)

FIELD = "once"
KEPT_S = 24 * 3600


def new_key() -> str:
    return secrets.token_urlsafe(16)


def first_send(request: HttpRequest) -> bool:
    """True unless this user already sent a form with the key it carries. A form without a key (a page
    from before keys, a script) acts as before; with the cache down, the form acts (logged)."""
    key = request.POST.get(FIELD, "")
    if not key:
        return True
    try:
        return bool(cache.add(f"once:{request.user.pk}:{key[:64]}", 1, KEPT_S))
    except Exception:  # noqa: BLE001 - a cache outage must not stop a user from making a token
        log.warning("once: the cache cannot be reached; a repeated form acts again", exc_info=True)
        return True
