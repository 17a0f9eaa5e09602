"""``manage.py check --deploy`` passes with the documented production settings."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from tests.conftest import REPO_ROOT


def production_env() -> dict[str, str]:
    """The production environment of README.md and docs/security.md."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RSI_", "DJANGO_"))}
    env.update(
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(64),
        RSI_RECORDS_KEY=secrets.token_urlsafe(48),
        ALLOWED_HOSTS="rsi.example.org",
        CSRF_TRUSTED_ORIGINS="https://rsi.example.org",
        RSI_BEHIND_PROXY="1",
        DATABASE_URL="postgres://rsi:secret@db.internal:5432/rsi",
        CELERY_BROKER_URL="redis://broker.internal:6379/0",
        DJANGO_SETTINGS_MODULE="rsiweb.settings",
    )
    return env


def run_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_the_documented_production_settings() -> None:
    result = run_check(production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr and "security.W" not in result.stdout + result.stderr


def test_check_deploy_fails_on_a_weak_production_setting() -> None:
    # The same check must be able to fail: a short secret key is a warning.
    env = production_env()
    env["SECRET_KEY"] = "short"
    result = run_check(env)
    assert result.returncode != 0
    assert "security.W009" in result.stdout + result.stderr


def test_production_refuses_to_start_without_its_secrets() -> None:
    env = production_env()
    del env["SECRET_KEY"]
    result = run_check(env)
    assert result.returncode != 0
    assert "SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off" in result.stderr
