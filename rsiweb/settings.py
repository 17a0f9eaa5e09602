"""Settings for rsiweb, read from the environment only.

The embedded default (no variables set) is a laptop setup: SQLite in WAL mode
and a file-system Celery broker, both under the git-ignored ``var/`` folder,
with a secret key and a records key generated once into ``var/``.

Production (``DEBUG=0``) refuses to start on a missing secret, host list or
records key instead of falling back to something unsafe. Django's own debug
pages (a traceback with the settings, every URL pattern on a 404) are off in
both, unless asked for with ``RSI_DEBUG=1`` on a development set-up.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

# Lets the code write the generic types django-stubs gives (``admin.ModelAdmin[Run]``).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# The laptop set-up (keys generated into var/, local hosts, plain HTTP) unless
# DEBUG=0, which is production: secrets and hosts required, HTTPS, secure
# cookies. The variable keeps its name so existing deployments stay production.
RSI_DEVELOPMENT = env_bool("DEBUG", True)
# Django's debug pages show the settings (a DATABASE_URL with its password)
# on a 500 and every URL pattern on a 404: only when asked for, never in
# production. Without them errors get the app's pages (templates/4xx.html, 500.html).
DEBUG = env_bool("RSI_DEBUG", False)
if DEBUG and not RSI_DEVELOPMENT:
    raise ImproperlyConfigured("RSI_DEBUG=1 shows settings on error pages; it is refused with DEBUG=0 (production)")

# Everything the embedded setup writes lives here; production may point it
# elsewhere, but never relies on it for the database or the broker.
VAR_DIR = Path(env_str("RSI_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)
# Private: it holds the SQLite database and the keys, and trials may run as
# another (unprivileged) user on this machine.
VAR_DIR.chmod(0o700)


def _key_from_file(path: Path) -> str:
    """Read a key generated once into var/, creating it on first use.

    Safe to call from several processes at once: the first writer wins via
    O_EXCL and the others read what it wrote.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        key = secrets.token_urlsafe(50)
        handle.write(key)
    return key


def _required_secret(name: str, file_name: str) -> str:
    value = env_str(name)
    if value:
        return value
    file_var = env_str(f"{name}_FILE")
    if file_var:
        try:
            return Path(file_var).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_var!r} cannot be read: {exc}") from exc
    if RSI_DEVELOPMENT:
        return _key_from_file(VAR_DIR / file_name)
    raise ImproperlyConfigured(
        f"{name} (or {name}_FILE) must be set when DEBUG is off; "
        "the generated development key is only used with DEBUG=1"
    )


SECRET_KEY = _required_secret("SECRET_KEY", "secret_key")
# The key that signs the certified-record chain. Kept outside the database on
# purpose: someone who can rewrite tables cannot re-sign the chain.
RSI_RECORDS_KEY = _required_secret("RSI_RECORDS_KEY", "records_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if RSI_DEVELOPMENT else [])
if not RSI_DEVELOPMENT and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# A refused form gets the app's 403 page, not Django's.
CSRF_FAILURE_VIEW = "review.views.errors.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "evolution",
    "review",
    "api",
    "lab",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "review.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "rsiweb.urls"

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
                "review.context.access",
            ],
        },
    },
]

WSGI_APPLICATION = "rsiweb.wsgi.application"

# --- REST API (api/) --------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["api.permissions.CanView"],
    # JSON within the input limits (depth, finite numbers): api/parsers.py.
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.LimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.Cursor",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": [],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "rsiweb API",
    "DESCRIPTION": "Harness evolution experiments: runs, candidates, certified results, trials, trajectories, review.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # Swagger UI served from this server (no CDN), its script as a file (the CSP forbids inline scripts).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Request bodies larger than this are refused with 413 (trajectory uploads are the largest).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("RSI_MAX_BODY_BYTES", 20 * 1024 * 1024)

# --- Database -----------------------------------------------------------------

_default_sqlite = VAR_DIR / "rsiweb.sqlite3"
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{_default_sqlite}")
try:
    _conn_max_age = env_int("RSI_DB_CONN_MAX_AGE", 0)
    # A connection kept between requests or tasks is checked before its first
    # use in the next one, so a database restart costs a reconnect, not a
    # failed task.
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=_conn_max_age, conn_health_checks=_conn_max_age > 0)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not usable: {exc}") from exc


# The statements a worker runs every trial are prepared on the server once
# per connection (evolution/prepared.py). Off (0) behind a pooler that does
# not keep prepared statements (PgBouncer in transaction mode before 1.21).
RSI_DB_PREPARED_STATEMENTS = env_bool("RSI_DB_PREPARED_STATEMENTS", True)


def pool_size(slots: int) -> int:
    """The database pool a trial worker of ``slots`` threads needs: a slot
    holds a connection only while it claims, writes its inputs out and
    finishes (tens of milliseconds of a trial of seconds or minutes), and
    the worker's one lease-renewal thread only while it renews."""
    return max(4, min(slots, 4 + slots // 8))


if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db["OPTIONS"] = {
        # WAL lets the web server read while a worker writes; IMMEDIATE takes
        # the write lock at BEGIN so concurrent writers queue instead of
        # failing with "database is locked" half-way through a transaction.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file (not :memory:) so that worker processes started by the tests
    # see the same test database.
    # RSI_TEST_DB_SUFFIX (set per test session) keeps concurrent sessions apart.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test_rsiweb{env_str('RSI_TEST_DB_SUFFIX')}.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # A pool of connections shared by the threads of one process (the trial
    # worker's slots): each borrows one for a burst of queries and gives it
    # back, so dozens of waiting trials hold a few connections, and a trial
    # does not pay a new connection (about 5 ms of the server's CPU) twice.
    _pool_size = env_int("RSI_DB_POOL_SIZE", 0)
    if _pool_size > 0:
        if _db.get("CONN_MAX_AGE"):
            raise ImproperlyConfigured("RSI_DB_POOL_SIZE and RSI_DB_CONN_MAX_AGE exclude each other")
        _db["OPTIONS"] = {
            **_db.get("OPTIONS", {}),
            "pool": {"min_size": 1, "max_size": _pool_size, "timeout": env_int("RSI_DB_POOL_TIMEOUT", 60)},
        }
else:
    raise ImproperlyConfigured(f"DATABASE_URL engine {_db['ENGINE']} is not supported (use sqlite or postgres)")

DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth, i18n, static -------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
# Content-Security-Policy of every non-admin page (review.middleware has the default).
RSI_CSP = env_str("RSI_CSP", "")
# The model price table that turns tokens into money (evolution/pricing.py); empty: evolution/prices.json.
RSI_PRICE_TABLE = env_str("RSI_PRICE_TABLE", "")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))

SESSION_COOKIE_SECURE = not RSI_DEVELOPMENT
CSRF_COOKIE_SECURE = not RSI_DEVELOPMENT
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not RSI_DEVELOPMENT)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if RSI_DEVELOPMENT else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not RSI_DEVELOPMENT
# Preload is on in production so `check --deploy` passes clean; it only asks
# browsers to accept inclusion, the domain owner still submits it (or sets 0).
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not RSI_DEVELOPMENT)
# Behind a TLS proxy that sets X-Forwarded-Proto and appends X-Forwarded-For.
RSI_BEHIND_PROXY = env_bool("RSI_BEHIND_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if RSI_BEHIND_PROXY else None

# Login throttling (review/throttle.py): after this many failed logins for one
# username, or from one client address, within the window, further attempts
# are refused with 429 until the window has passed.
RSI_LOGIN_FAILURES = env_int("RSI_LOGIN_FAILURES", 5)
# Higher per address: colleagues behind one office NAT share it.
RSI_LOGIN_ADDRESS_FAILURES = env_int("RSI_LOGIN_ADDRESS_FAILURES", 20)
RSI_LOGIN_WINDOW_SECONDS = env_int("RSI_LOGIN_WINDOW_SECONDS", 900)

# --- Celery -------------------------------------------------------------------

_broker_dir = Path(env_str("RSI_BROKER_DIR", str(VAR_DIR / "broker")))
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
_broker_scheme = urlsplit(CELERY_BROKER_URL).scheme
if _broker_scheme == "filesystem":
    # Kombu's file-system transport needs no server: producers and consumers
    # exchange message files in one folder.
    _broker_dir.joinpath("queue").mkdir(parents=True, exist_ok=True)
    _broker_dir.joinpath("processed").mkdir(parents=True, exist_ok=True)
    _broker_dir.joinpath("control").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        # The default of 1 s caps a worker at about one task a second, since
        # with prefetch 1 it polls again after every task.
        "polling_interval": 0.05,
        "store_processed": False,
    }
elif _broker_scheme in {"redis", "rediss", "amqp", "amqps", "pyamqp"}:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("RSI_BROKER_VISIBILITY_TIMEOUT", 3600)}
elif not RSI_DEVELOPMENT or _broker_scheme != "memory":
    raise ImproperlyConfigured(f"CELERY_BROKER_URL scheme {_broker_scheme!r} is not supported")

CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False
# Celery's Django fix-up closes every database connection before and after
# each task, whatever CONN_MAX_AGE says, except that it lets them live for
# CELERY_DB_REUSE_MAX tasks at a time: set past reach, so the fix-up never
# closes them, and rsiweb/celery.py closes them at a task's edges by
# Django's own rule instead (close_old_connections).
CELERY_DB_REUSE_MAX = sys.maxsize // 2
# Trials wait on a sandboxed subprocess (a model API, in real agents) and
# use little CPU, so they go to a queue of their own that a worker with a
# thread pool serves with many slots (``--pool=threads --concurrency=N``),
# while proposals, certification and the loop's steps stay on the default
# queue of a prefork worker (docs/deployment.md says how to size both). Both
# queues are declared, so a worker started without ``-Q`` consumes both.
RSI_TRIAL_QUEUE = env_str("RSI_TRIAL_QUEUE", "trials")
CELERY_TASK_DEFAULT_QUEUE = "celery"
# Each queue with its own direct exchange, as Celery makes a missing queue.
CELERY_TASK_QUEUES = tuple(Queue(name, Exchange(name), routing_key=name) for name in ("celery", RSI_TRIAL_QUEUE))
CELERY_TASK_ROUTES = {"evolution.trial_run": {"queue": RSI_TRIAL_QUEUE}}
# How long a trial held back by a limit (the experiment's trials in flight,
# its model endpoint's) waits before its message is sent again.
RSI_TRIAL_DEFER_SECONDS = env_float("RSI_TRIAL_DEFER_SECONDS", 1.0)
# A trial worker with none of its slots busy starts its next trials spread
# over this many seconds, not all at once (evolution/ramp.py); 0: at once.
RSI_TRIAL_RAMP_SECONDS = env_float("RSI_TRIAL_RAMP_SECONDS", 0.0)
if RSI_TRIAL_RAMP_SECONDS < 0:
    raise ImproperlyConfigured(f"RSI_TRIAL_RAMP_SECONDS={RSI_TRIAL_RAMP_SECONDS!r} cannot be negative")
CELERY_BEAT_SCHEDULE = {
    "lease-reaper": {
        "task": "evolution.lease_reap",
        "schedule": float(env_int("RSI_REAPER_INTERVAL", 30)),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- rsiweb's own knobs (RSI_*) -----------------------------------------------

# A review decision waits this many seconds before it takes effect, so the
# reviewer can undo a wrong click (docs/review.md#corrections); 0: at once.
RSI_REVIEW_UNDO_SECONDS = env_int("RSI_REVIEW_UNDO_SECONDS", 10)

# Harness snapshot limits: a file larger than this is refused on import.
RSI_MAX_FILE_BYTES = env_int("RSI_MAX_FILE_BYTES", 2 * 1024 * 1024)
RSI_MAX_TREE_FILES = env_int("RSI_MAX_TREE_FILES", 5000)

# Limits on structured input (JSON, YAML, JSONL, gzip) from the API, commands,
# bundles and workspaces: RSI_MAX_INPUT_DEPTH, RSI_MAX_YAML_NODES, sizes and
# counts. Their defaults are in evolution/limits.py, the table in docs/security.md;
# each is overridden by the environment variable of the same name.
from evolution.limits import DEFAULTS as _INPUT_LIMITS  # noqa: E402  (plain data, no Django needed)

globals().update({_name: env_int(_name, _default) for _name, _default in _INPUT_LIMITS.items()})

# Trial sandbox. "auto" uses bubblewrap where a probe shows it works and
# records the profile "none" otherwise; "required" refuses to run trials
# without it; "off" never uses it.
RSI_SANDBOX = env_str("RSI_SANDBOX", "auto")
if RSI_SANDBOX not in {"auto", "required", "off"}:
    raise ImproperlyConfigured(f"RSI_SANDBOX={RSI_SANDBOX!r} must be auto, required or off")
RSI_TRIAL_TIMEOUT = env_int("RSI_TRIAL_TIMEOUT", 60)
RSI_TRIAL_LEASE_SECONDS = env_int("RSI_TRIAL_LEASE_SECONDS", 300)
# A running recipe comparison whose command wrote no heartbeat for this long is shown interrupted (one whose
# command ran on this host is shown so as soon as that process is gone). Inline, a heartbeat comes between
# the loop's steps, which take minutes on a busy machine: hence half an hour.
RSI_COMPARISON_STALE_SECONDS = env_int("RSI_COMPARISON_STALE_SECONDS", 1800)


def scratch_root(mounts: str = "/proc/mounts", shm: str = "/dev/shm", min_bytes: int = 2 << 30) -> Path:
    """Where trial folders go by default: ``shm`` when it is a writable
    tmpfs of at least ``min_bytes``, else the temporary directory.

    A trial makes and removes some thirty files and folders in a few
    milliseconds. On a journalled disk that the database's fsyncs share,
    that took 15 % of the platform's time in the orchestration benchmark;
    in memory it costs next to nothing. A small ``/dev/shm`` (64 MB in a
    container, by default) would fail trials that write more, hence the floor.
    """
    try:
        with open(mounts, encoding="utf-8") as table:
            tmpfs = any(line.split()[1:3] == [shm, "tmpfs"] for line in table if len(line.split()) > 2)
        if tmpfs and os.access(shm, os.W_OK | os.X_OK):
            size = os.statvfs(shm)
            if size.f_frsize * size.f_blocks >= min_bytes:
                return Path(shm)
    except OSError:
        pass
    return Path(tempfile.gettempdir())


# Trial workspaces. Not under VAR_DIR: an unprivileged trial user must be
# able to reach its workspace but never the database or the keys.
RSI_WORK_DIR = Path(env_str("RSI_WORK_DIR", str(scratch_root() / f"rsiweb-work-{os.getuid()}")))

# Task environments built here from Debian packages (evolution/environments.py):
# one root filesystem per recipe digest, and one base per Debian suite.
RSI_ENVIRONMENTS_DIR = Path(env_str("RSI_ENVIRONMENTS_DIR", str(VAR_DIR / "environments")))
# Where the Debian bases are kept (default: beside the environments). CI points it
# at a cache outside its clone, so each run reuses the last run's base.
RSI_ENVIRONMENT_BASES_DIR = Path(env_str("RSI_ENVIRONMENT_BASES_DIR", str(RSI_ENVIRONMENTS_DIR)))

# Tests that need PostgreSQL, Redis or a worker fail instead of skipping
# when this is set (CI sets it).
RSI_REQUIRE_SERVICES = env_bool("RSI_REQUIRE_SERVICES", False)

# Extra modules that register operators (proposers, gates...), comma-separated.
RSI_OPERATOR_MODULES = env_list("RSI_OPERATOR_MODULES", [])

# The Python interpreter trials and verifiers are started with.
RSI_PYTHON = env_str("RSI_PYTHON", sys.executable)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("RSI_LOG_LEVEL", "INFO")},
}
