"""Fixtures for the RL environment tests (catalogue, packages, staging, RULER)."""
from __future__ import annotations

from pathlib import Path

import pytest

CATALOGUE = Path(__file__).resolve().parents[2] / "environments" / "catalogue"


@pytest.fixture
def catalogue_dir() -> Path:
    return CATALOGUE
