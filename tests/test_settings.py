"""Settings load loudly: a bad environment stops the process with a message naming the variable.

Each case boots Django in a fresh subprocess, because settings are read once at import.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Variables the settings read; each case starts without any of them.
SETTINGS_VARS = (
    "DEBUG", "SECRET_KEY", "SECRET_KEY_FILE", "STUDIO_ENCRYPTION_KEY", "STUDIO_ENCRYPTION_KEY_FILE", "DATABASE_URL",
    "DATABASE_URL_FILE", "REDIS_URL", "REDIS_URL_FILE", "ALLOWED_HOSTS", "DB_CONN_MAX_AGE", "STUDIO_STOP_GRACE_SECONDS",
    "STUDIO_LOCAL_ROOTS", "STUDIO_LOCAL_MAX_CPU_JOBS", "STUDIO_PUBLIC_URL", "STUDIO_RUNS_DIR",
    "STUDIO_VAR_DIR", "CELERY_QUEUE", "CACHE_KEY_PREFIX",
)
PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "s" * 50, "STUDIO_ENCRYPTION_KEY": "e" * 32}
PRINT = "import django; django.setup(); from django.conf import settings as s; print(repr({attr}))"


def boot(env: dict[str, str], code: str = "import django; django.setup()") -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS and not k.startswith("PYTEST")}
    clean.update(DJANGO_SETTINGS_MODULE="studio.settings", **env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean, capture_output=True, text=True, timeout=60)


def assert_refused(result: subprocess.CompletedProcess, variable: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "ImproperlyConfigured" in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert variable in last, last


@pytest.mark.parametrize("env, variable", [
    ({"DEBUG": "maybe"}, "DEBUG"),
    ({"DEBUG": "0"}, "SECRET_KEY"),
    ({"DEBUG": "0", "SECRET_KEY": "s" * 50}, "STUDIO_ENCRYPTION_KEY"),
    ({**PRODUCTION, "DATABASE_URL": "nonsense"}, "DATABASE_URL"),
    ({**PRODUCTION, "DATABASE_URL": "mysqlx://nowhere/db"}, "DATABASE_URL"),
    ({**PRODUCTION, "REDIS_URL": "http://x"}, "REDIS_URL"),
    ({**PRODUCTION, "DB_CONN_MAX_AGE": "forever"}, "DB_CONN_MAX_AGE"),
    ({**PRODUCTION, "STUDIO_STOP_GRACE_SECONDS": "ten"}, "STUDIO_STOP_GRACE_SECONDS"),
    ({**PRODUCTION, "STUDIO_LOCAL_ROOTS": "/data,models"}, "STUDIO_LOCAL_ROOTS"),
    ({**PRODUCTION, "STUDIO_PUBLIC_URL": "ftp:/x"}, "STUDIO_PUBLIC_URL"),
    ({**PRODUCTION, "STUDIO_PUBLIC_URL": "studio.example.com"}, "STUDIO_PUBLIC_URL"),
    ({**PRODUCTION, "SECRET_KEY": "", "SECRET_KEY_FILE": "/nonexistent/secret"}, "SECRET_KEY_FILE"),
    ({**PRODUCTION, "ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS"),
    ({**PRODUCTION, "STUDIO_RUNS_DIR": "var/runs"}, "STUDIO_RUNS_DIR"),
    ({**PRODUCTION, "STUDIO_VAR_DIR": "var"}, "STUDIO_VAR_DIR"),
    ({"DEBUG": "1", "STUDIO_VAR_DIR": "./var"}, "STUDIO_VAR_DIR"),
    ({**PRODUCTION, "DATAHUB_VALIDATE_MAX_ROWS": "all"}, "DATAHUB_VALIDATE_MAX_ROWS"),
    ({**PRODUCTION, "DATAHUB_VALIDATE_MAX_ROWS": "0"}, "DATAHUB_VALIDATE_MAX_ROWS"),
    ({**PRODUCTION, "DATAHUB_MAX_ROW_BYTES": "4MB"}, "DATAHUB_MAX_ROW_BYTES"),
    ({**PRODUCTION, "DATAHUB_MAX_ROW_BYTES": "0"}, "DATAHUB_MAX_ROW_BYTES"),
    ({**PRODUCTION, "STUDIO_LOCAL_SANDBOX": "yes"}, "STUDIO_LOCAL_SANDBOX"),
    ({**PRODUCTION, "STUDIO_LOCAL_MAX_CPU_JOBS": "0"}, "STUDIO_LOCAL_MAX_CPU_JOBS"),
    ({**PRODUCTION, "STUDIO_LOCAL_MAX_CPU_JOBS": "all"}, "STUDIO_LOCAL_MAX_CPU_JOBS"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_environment_stops_startup_naming_the_variable(env, variable):
    assert_refused(boot(env), variable)


def test_local_cpu_jobs_default_to_a_quarter_of_the_cpus_and_at_least_one():
    result = boot({"DEBUG": "1"}, PRINT.format(attr="s.STUDIO_LOCAL_MAX_CPU_JOBS"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.strip()) == max(1, len(os.sched_getaffinity(0)) // 4)
    assert boot({"DEBUG": "1", "STUDIO_LOCAL_MAX_CPU_JOBS": "3"}, PRINT.format(attr="s.STUDIO_LOCAL_MAX_CPU_JOBS")).stdout.strip() == "3"


def test_production_environment_boots():
    result = boot({**PRODUCTION, "DATABASE_URL": "postgres://u:p@db:5432/studio", "REDIS_URL": "redis://cache:6379/0"},
                  PRINT.format(attr="(s.DEBUG, s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL)"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr((False, "django.db.backends.postgresql", "redis://cache:6379/0"))


def test_embedded_defaults_need_nothing_in_debug():
    result = boot({"DEBUG": "1"}, PRINT.format(attr="(s.DATABASES['default']['ENGINE'], s.REDIS_URL.startswith('redis+socket://'))"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr(("django.db.backends.sqlite3", True))


def test_the_default_var_dir_is_the_repos_own(tmp_path):
    # make studio sets no STUDIO_VAR_DIR: its default is var/ in the repository, wherever the process starts.
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS and not k.startswith("PYTEST")}
    code = "import django; django.setup(); from django.conf import settings as s; print(s.VAR_DIR)"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**clean, "DJANGO_SETTINGS_MODULE": "studio.settings", "DEBUG": "1",
                            "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(REPO / "var")


def test_secret_key_file_is_read(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text("from-a-file-" + "k" * 40 + "\n")
    result = boot({"DEBUG": "0", "SECRET_KEY_FILE": str(key_file), "STUDIO_ENCRYPTION_KEY": "e" * 32}, PRINT.format(attr="s.SECRET_KEY"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr("from-a-file-" + "k" * 40)


def test_encryption_key_file_is_read(tmp_path):
    key_file = tmp_path / "enc"
    key_file.write_text("file-encryption-key")
    result = boot({**PRODUCTION, "STUDIO_ENCRYPTION_KEY": "", "STUDIO_ENCRYPTION_KEY_FILE": str(key_file)}, PRINT.format(attr="s.STUDIO_ENCRYPTION_KEY"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr("file-encryption-key")


@pytest.mark.parametrize("raw, expected", [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("false", False), ("No", False), ("off", False)])
def test_debug_accepts_the_usual_booleans(raw, expected):
    result = boot({**PRODUCTION, "DEBUG": raw}, PRINT.format(attr="s.DEBUG"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr(expected)


def test_allowed_hosts_is_a_comma_list():
    env = {**PRODUCTION, "ALLOWED_HOSTS": " studio.example.com , .internal ,", "STUDIO_PUBLIC_URL": "https://studio.example.com"}
    result = boot(env, PRINT.format(attr="s.ALLOWED_HOSTS"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr(["studio.example.com", ".internal"])


def test_the_readmes_plain_http_settings_turn_off_the_redirect_secure_cookies_and_hsts():
    plain_http = {"SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0", "SECURE_HSTS_SECONDS": "0"}
    code = PRINT.format(attr="(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)")
    result = boot({**PRODUCTION, **plain_http}, code)
    assert result.stdout.strip() == "(False, False, False, 0)", result.stderr[-2000:]


@pytest.mark.parametrize("hosts, public_url", [
    ("studio.example.com", "http://127.0.0.1:8000"),  # STUDIO_PUBLIC_URL's default
    ("studio.example.com,localhost", "https://studio.internal:8443/"),
    (".example.com", "https://example.org"),
    ("127.0.0.1", "http://[::1]:8000"),
])
def test_a_public_url_whose_host_is_not_allowed_stops_startup_naming_both(hosts, public_url):
    # Every report of every run would be a 400 (Invalid HTTP_HOST header): runs trained to the end, then failed.
    result = boot({**PRODUCTION, "ALLOWED_HOSTS": hosts, "STUDIO_PUBLIC_URL": public_url})
    assert_refused(result, "STUDIO_PUBLIC_URL")
    assert "ALLOWED_HOSTS" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("hosts, public_url", [
    ("studio.example.com", "https://studio.example.com"),
    (".example.com", "https://studio.example.com:8443/studio"),
    ("*", "http://10.0.0.5:8000"),
    ("localhost,[::1]", "http://[::1]:8000"),
    ("localhost", "http://user@localhost:8000"),
])
def test_a_public_url_on_an_allowed_host_boots(hosts, public_url):
    result = boot({**PRODUCTION, "ALLOWED_HOSTS": hosts, "STUDIO_PUBLIC_URL": public_url}, PRINT.format(attr="s.STUDIO_PUBLIC_URL"))
    assert result.returncode == 0, result.stderr[-2000:]


def readme_section(title: str) -> str:
    return (REPO / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_states_the_real_allowed_hosts_default():
    # It said "localhost"; testserver, 127.0.0.1 and [::1] are allowed too.
    result = boot(PRODUCTION, PRINT.format(attr="','.join(s.ALLOWED_HOSTS)"))
    assert result.returncode == 0, result.stderr[-2000:]
    default = eval(result.stdout.strip())  # noqa: S307 - our own repr of a str
    assert f"| `ALLOWED_HOSTS` | `{default}` |" in readme_section("Settings (environment)")


def test_management_commands_need_the_encryption_key_as_the_readme_says():
    # The README listed SECRET_KEY, DATABASE_URL and REDIS_URL; createapitoken stopped without STUDIO_ENCRYPTION_KEY too.
    result = boot({**PRODUCTION, "STUDIO_ENCRYPTION_KEY": ""}, "import runpy, sys; sys.argv = ['manage.py', 'createapitoken', 'alice', '--project', 'acme']; runpy.run_path('manage.py', run_name='__main__')")
    assert result.returncode != 0 and "STUDIO_ENCRYPTION_KEY is not set" in result.stderr, result.stderr[-2000:]
    production_env = readme_section("Administration").split("In production, give them the server's environment", 1)[1].split(")", 1)[0]
    assert all(f"`{name}`" in production_env for name in ("SECRET_KEY", "STUDIO_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL"))


def test_two_studios_on_one_redis_database_get_two_cache_prefixes():
    # One Studio's login budget and reconciler marks must not be the other's: the prefix follows the queue
    # (and the database), and CACHE_KEY_PREFIX still overrides it.
    shared = {**PRODUCTION, "REDIS_URL": "redis://cache:6379/0"}
    code = PRINT.format(attr="s.CACHES['default']['KEY_PREFIX']")
    first = boot({**shared, "DATABASE_URL": "postgres://u:p@db/team_a", "CELERY_QUEUE": "team-a"}, code)
    second = boot({**shared, "DATABASE_URL": "postgres://u:p@db/team_b", "CELERY_QUEUE": "team-b"}, code)
    same_db = boot({**shared, "DATABASE_URL": "postgres://u:p@db/team_a", "CELERY_QUEUE": "team-b"}, code)
    assert first.returncode == second.returncode == same_db.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert len({first.stdout, second.stdout, same_db.stdout}) == 3
    override = boot({**shared, "CELERY_QUEUE": "team-a", "CACHE_KEY_PREFIX": "mine"}, code)
    assert override.stdout.strip() == repr("mine")


@pytest.mark.parametrize("variable", ["GUNICORN_WORKERS", "GUNICORN_THREADS", "GUNICORN_TIMEOUT", "GUNICORN_MAX_REQUESTS"])
def test_a_bad_gunicorn_number_stops_it_with_one_line_naming_the_variable(variable):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GUNICORN_", "PYTEST"))}
    result = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "studio/gunicorn.conf.py", "--check-config", "studio.wsgi:application"],
                            cwd=REPO, env={**clean, variable: "two"}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr[-2000:]
    assert result.stderr.startswith(f"{variable}='two' is not an integer: give a whole number, e.g. ")
