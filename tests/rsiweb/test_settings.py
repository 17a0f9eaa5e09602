"""Settings come from the environment; production misconfiguration is a startup error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PRINT_SETTINGS = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'rsiweb.settings'; django.setup(); "
    "from django.conf import settings as s; "
    "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.DEBUG)"
)


def settings_process(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "RSI_VAR_DIR": str(tmp_path / "var")}
    return subprocess.run(
        [sys.executable, "-c", PRINT_SETTINGS],
        cwd=REPO_ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_embedded_defaults_need_no_variables(tmp_path: Path) -> None:
    result = settings_process({}, tmp_path)
    assert result.returncode == 0, result.stderr
    # Django's debug pages (settings on a 500, URL patterns on a 404) are off unless asked for.
    assert result.stdout.split() == ["django.db.backends.sqlite3", "filesystem://", "False"]
    assert (tmp_path / "var" / "secret_key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "var" / "records_key").exists()
    assert (tmp_path / "var").stat().st_mode & 0o777 == 0o700


def test_debug_pages_only_when_asked_for(tmp_path: Path) -> None:
    result = settings_process({"RSI_DEBUG": "1"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[2] == "True"
    # DEBUG=1 is the laptop set-up (its default), not a request for debug pages.
    result = settings_process({"DEBUG": "1"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[2] == "False"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "0"}, "SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off"),
        ({"DEBUG": "0", "SECRET_KEY": "x" * 50}, "RSI_RECORDS_KEY (or RSI_RECORDS_KEY_FILE) must be set"),
        (
            {"DEBUG": "0", "SECRET_KEY": "x" * 50, "RSI_RECORDS_KEY": "k" * 40},
            "ALLOWED_HOSTS must be set when DEBUG is off",
        ),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"RSI_DEBUG": "maybe"}, "RSI_DEBUG='maybe' is not a boolean"),
        (
            {"DEBUG": "0", "RSI_DEBUG": "1", "SECRET_KEY": "x" * 50, "RSI_RECORDS_KEY": "k" * 40},
            "RSI_DEBUG=1 shows settings on error pages; it is refused with DEBUG=0 (production)",
        ),
        ({"DATABASE_URL": "mysql://root@localhost/db"}, "is not supported (use sqlite or postgres)"),
        ({"DATABASE_URL": "nonsense"}, "DATABASE_URL is not usable"),
        ({"CELERY_BROKER_URL": "sqs://queue"}, "CELERY_BROKER_URL scheme 'sqs' is not supported"),
        ({"RSI_SANDBOX": "sometimes"}, "RSI_SANDBOX='sometimes' must be auto, required or off"),
        ({"RSI_TRIAL_TIMEOUT": "soon"}, "RSI_TRIAL_TIMEOUT='soon' is not an integer"),
        ({"RSI_TRIAL_RAMP_SECONDS": "-2"}, "RSI_TRIAL_RAMP_SECONDS=-2.0 cannot be negative"),
    ],
)
def test_misconfiguration_is_an_explicit_startup_error(env: dict[str, str], message: str, tmp_path: Path) -> None:
    result = settings_process(env, tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_production_does_not_generate_keys(tmp_path: Path) -> None:
    settings_process({"DEBUG": "0"}, tmp_path)
    assert not (tmp_path / "var" / "secret_key").exists()


@pytest.mark.parametrize(
    ("url", "engine"),
    [
        ("postgres://user:pw@db.example:5432/rsi", "django.db.backends.postgresql"),
        ("sqlite:////tmp/other.sqlite3", "django.db.backends.sqlite3"),
    ],
)
def test_database_url_selects_the_engine(url: str, engine: str, tmp_path: Path) -> None:
    result = settings_process({"DATABASE_URL": url}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == engine


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "amqp://guest:guest@127.0.0.1:5672//"])
def test_server_brokers_are_used_unchanged(url: str, tmp_path: Path) -> None:
    result = settings_process({"CELERY_BROKER_URL": url}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1] == url


def test_production_settings_start_with_secrets_from_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s" * 60)
    records_key = tmp_path / "records"
    records_key.write_text("r" * 60)
    env = {
        "DEBUG": "0",
        "SECRET_KEY_FILE": str(secret),
        "RSI_RECORDS_KEY_FILE": str(records_key),
        "ALLOWED_HOSTS": "rsi.example.org",
    }
    result = settings_process(env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[2] == "False"


def test_trial_folders_go_to_a_roomy_tmpfs_when_there_is_one(tmp_path: Path) -> None:
    """scratch_root takes the shared-memory folder only when the mount table
    says it is a tmpfs, it is writable and it holds at least the floor;
    anything else (another file system, too small, no mount table) is the
    temporary directory."""
    import tempfile

    from rsiweb.settings import scratch_root

    shm = tmp_path / "shm"
    shm.mkdir()
    table = tmp_path / "mounts"
    table.write_text(f"proc /proc proc rw 0 0\ntmpfs {shm} tmpfs rw,nosuid,nodev 0 0\n")
    elsewhere = Path(tempfile.gettempdir())
    assert scratch_root(str(table), str(shm), min_bytes=1) == shm
    assert scratch_root(str(table), str(shm), min_bytes=1 << 60) == elsewhere
    table.write_text(f"/dev/vda {shm} ext4 rw 0 0\n")
    assert scratch_root(str(table), str(shm), min_bytes=1) == elsewhere
    assert scratch_root(str(tmp_path / "no-such-table"), str(shm), min_bytes=1) == elsewhere
