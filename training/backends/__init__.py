"""Backend registry. Adding a backend = a module with a Backend subclass, registered here.

Backends are imported on first use: `python -m training.backends.local_runner` imports this package
inside the engine's process group, where neither Django nor the remote SDKs belong.
"""
from __future__ import annotations

from importlib import import_module

REGISTRY = {
    "local": "training.backends.local.LocalBackend",
    "dstack": "training.backends.dstack.DstackBackend",
    "modal": "training.backends.modal.ModalBackend",
}


class _Backends(dict):
    """name → the one Backend instance, created when first asked for."""

    def __missing__(self, name: str):
        if name not in REGISTRY:
            raise KeyError(name)
        module, _, cls = REGISTRY[name].rpartition(".")
        backend = self[name] = getattr(import_module(module), cls)()
        return backend

    def get(self, name, default=None):
        try:
            return self[name]
        except (KeyError, TypeError):
            return default


BACKENDS = _Backends()


def get_backend(name: str):
    """The Backend registered as `name`, or None."""
    return BACKENDS.get(name)
