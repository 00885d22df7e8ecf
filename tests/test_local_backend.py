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


def test_the_run_folder_is_the_studio_users_alone_and_the_spec_0600(settings, tmp_path):
    import stat

    from training.backends.base import JobSpec
    from training.backends.local import LocalBackend, run_dir

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_STOP_GRACE_SECONDS = 1
    job = JobSpec(run_id=7, attempt=1, method="sft", base_model="org/none", dataset=[], config={}, compute={},
                  ingest_url="http://127.0.0.1:9/none", ingest_token="ing_secret-token")
    backend = LocalBackend()
    job_id = backend.submit(job)
    try:
        folder = run_dir(7, 1)
        for path in (folder.parent, folder):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        assert stat.S_IMODE((folder / "spec.json").stat().st_mode) == 0o600
    finally:
        backend.stop(7, 1, job_id)
