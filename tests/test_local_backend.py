"""The local backend's process hygiene: the engine never sees the Studio's secrets."""
from __future__ import annotations

from training.backends.local import ENV_ALLOW_LIST, engine_env


def test_engine_environment_is_an_allow_list(monkeypatch):
    for name in ("SECRET_KEY", "DATABASE_URL", "STUDIO_ENCRYPTION_KEY", "REDIS_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "do-not-leak")
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    env = engine_env({"EXTRA": "1"})
    assert "do-not-leak" not in env.values()
    assert env["HF_HOME"] == "/cache/hf" and env["EXTRA"] == "1"
    assert set(env) <= set(ENV_ALLOW_LIST) | {"PYTHONPATH", "PYTHONUNBUFFERED", "EXTRA"}
