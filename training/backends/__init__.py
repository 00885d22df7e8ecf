"""Backend registry. Adding a backend = a module with a Backend subclass, registered here."""
from __future__ import annotations

from training.backends.base import Backend
from training.backends.local import LocalBackend
from training.backends.remote import DstackBackend, ModalBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (LocalBackend(), DstackBackend(), ModalBackend())}


def get_backend(name: str) -> Backend | None:
    return BACKENDS.get(name)
