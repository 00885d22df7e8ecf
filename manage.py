#!/usr/bin/env python
"""Django's command-line utility for Studio."""
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:  # a bad environment: the message names the variable, a traceback adds nothing
        sys.exit(f"Studio cannot start: {exc}")


if __name__ == "__main__":
    main()
