#!/usr/bin/env python3
"""The two set-up commands: ``python3.11 dev.py run`` and ``python3.11 dev.py test``.

Standard library only: it must work on a fresh machine that has nothing but
Python 3.11. It creates ``.venv/`` on first use, installs the pinned
requirements (again only when a requirements file changed), then runs the
product or the test suite inside that environment.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"


def say(message: str) -> None:
    print(f"[rsiweb] {message}", flush=True)


def ensure_venv(requirements: str) -> None:
    """Create the virtual environment and install ``requirements`` into it.

    The hash of the requirement files is stamped into the venv so a re-run
    with unchanged files installs nothing.
    """
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"rsiweb needs Python 3.11 (this is {sys.version.split()[0]}): run it as python3.11 dev.py ...")
    if not PYTHON.exists():
        say(f"creating the virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    files = sorted(ROOT.glob("requirements*.txt"))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files) + requirements.encode()).hexdigest()
    stamp = VENV / f".installed-{requirements}"
    if stamp.exists() and stamp.read_text() == digest:
        return
    say(f"installing {requirements} (first run or changed requirements)")
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "-r", str(ROOT / requirements)], check=True)
    stamp.write_text(digest)


def manage(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(PYTHON), "manage.py", *args], cwd=ROOT, check=True, env=env)


def web_server_command(host: str, port: str) -> list[str]:
    """The web server ``run`` starts: Django's development server.

    DEBUG is off unless RSI_DEBUG=1 (so an error never shows settings or URL
    patterns), and runserver serves the static files (stylesheets, scripts,
    the admin's) only with DEBUG or ``--insecure``. This is a development
    server on one machine; a deployment serves STATIC_ROOT from its proxy.
    """
    return [str(PYTHON), "manage.py", "runserver", "--noreload", "--insecure", f"{host}:{port}"]


def run() -> int:
    ensure_venv("requirements.txt")
    env = dict(os.environ)
    host = env.get("RSI_HOST", "127.0.0.1")
    port = env.get("RSI_PORT", "8000")
    manage("migrate", "--no-input", env=env)
    rounds = env.get("RSI_EXAMPLE_ROUNDS", "3")
    if rounds != "0":
        say(f"loading the example; on first start it also runs {rounds} rounds of it (about a minute) so the")
        say("screens open on real candidates, diffs, flags and trajectories (RSI_EXAMPLE_ROUNDS=0 skips this)")
    manage("load_example", "--rounds", rounds, env=env)
    manage("ensure_admin", env=env)
    worker = subprocess.Popen(
        [
            str(PYTHON),
            "-m",
            "celery",
            "-A",
            "rsiweb",
            "worker",
            "--beat",
            "--loglevel=INFO",
            "--concurrency=2",
            f"--schedule={ROOT / 'var' / 'celerybeat-schedule'}",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    web = subprocess.Popen(
        web_server_command(host, port),
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    url = f"http://{host}:{port}/"
    time.sleep(2)
    say(f"web server: {url}   (admin: {url}admin/)")
    password_file = Path(env.get("RSI_VAR_DIR") or ROOT / "var") / "admin-password"
    if password_file.exists():
        say(f"log in as admin with password {password_file.read_text().strip()}   (kept in {password_file})")
    else:
        say("log in with the admin account you created earlier")
    say("a Celery worker with the lease reaper is running; press Ctrl-C to stop both")
    try:
        while web.poll() is None and worker.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for process in (web, worker):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in (web, worker):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    failed = [name for name, p in (("web server", web), ("worker", worker)) if p.returncode not in (0, -15, None)]
    if failed:
        say(f"stopped: {', '.join(failed)} exited with an error")
        return 1
    return 0


def test(pytest_args: list[str]) -> int:
    ensure_venv("requirements-dev.txt")
    lint = subprocess.run([str(PYTHON), "-m", "ruff", "check", "."], cwd=ROOT)
    if lint.returncode != 0:
        say("ruff check failed")
        return lint.returncode
    # Types: [tool.mypy] in pyproject.toml says what and how strictly; its
    # incremental cache (.mypy_cache/) makes a run after a small change quick.
    types = subprocess.run([str(PYTHON), "-m", "mypy"], cwd=ROOT)
    if types.returncode != 0:
        say("mypy failed")
        return types.returncode
    return subprocess.run([str(PYTHON), "-m", "pytest", *pytest_args], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"run", "test"}:
        print(__doc__)
        print("usage: python3.11 dev.py run | python3.11 dev.py test [pytest arguments]")
        return 2
    if argv[0] == "run":
        return run()
    return test(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
