"""Encryption at rest for project secrets (Fernet, key stretched from STUDIO_ENCRYPTION_KEY)."""
from __future__ import annotations

import base64
import hashlib
import secrets
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(key_material: str) -> Fernet:
    digest = hashlib.sha256(key_material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(plaintext: str) -> bytes:
    return _fernet(settings.STUDIO_ENCRYPTION_KEY).encrypt(plaintext.encode())


class UndecryptableSecret(ValueError):
    """A stored secret this key cannot read: STUDIO_ENCRYPTION_KEY changed since it was saved."""


def decrypt(ciphertext: bytes) -> str:
    try:
        return _fernet(settings.STUDIO_ENCRYPTION_KEY).decrypt(bytes(ciphertext)).decode()
    except InvalidToken as exc:
        raise UndecryptableSecret("secret cannot be decrypted: STUDIO_ENCRYPTION_KEY changed since it was saved") from exc


def hash_token(token: str) -> str:
    """Tokens are 256-bit random strings, so a plain SHA-256 is enough (no salt or stretching)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def same_hash(a: str, b: str) -> bool:
    return secrets.compare_digest(a.encode(), b.encode())
