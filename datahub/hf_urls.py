"""The HF Hub-compatible read API, mounted at /hub/ (HF_ENDPOINT=http://<studio>/hub)."""
from __future__ import annotations

urlpatterns: list = []
