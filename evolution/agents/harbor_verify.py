"""Grade one trial of a Harbor-style task: run its tests/test.sh, read the reward.

    harbor_verify.py --output DIR --expected FILE

FILE (the trial's private ``expected.json``) holds ``{"expected": {"tests":
{"test.sh": "...", ...}, "workspace_files": {"name": "sha256", ...},
"timeout_seconds": 30}, "criteria": [...]}``: the task's ``tests/`` folder
(never shown to the agent) and the digests of the files the workspace
started with.

Harbor's convention is a container where the agent worked in ``/app``, the
tests are in ``/tests`` and the script writes its reward to
``/logs/verifier/reward.txt`` (or ``reward.json``). Without a container the
tests are written next to FILE, and the script is run by bash with those
absolute paths mapped: ``/app`` to the agent's workspace
(``DIR/workspace``), ``/tests`` to the tests folder and ``/logs/verifier``
to a folder next to FILE (the output folder is read-only for the verifier).
The same places are in the environment as WORKSPACE, TESTS_DIR and
LOGS_DIR. The script runs with the workspace as its working directory.

Prints one JSON verdict: ``passed`` (reward >= 1), ``score`` (the reward,
which must be in [0, 1]), ``criteria`` (``[{"id": "reward", "met", "value"}]``),
``submitted`` and ``valid_output`` (the workspace holds a file the agent
created or changed). Exit status 0 with a verdict, 2 when the tests are
unusable or wrote no reward. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT = 30.0
LOG_TAIL_CHARS = 4000


class GradeError(Exception):
    pass


def map_paths(script: str, *, workspace: Path, tests: Path, logs: Path) -> str:
    """Rewrite Harbor's absolute container paths to the trial's folders."""
    mapping = {"/logs/verifier": logs, "/tests": tests, "/app": workspace}
    for old, new in mapping.items():
        # Whole path components only: /application or my/tests are left alone.
        script = re.sub(r"(?<![\w./-])" + re.escape(old) + r"(?![\w.-])", str(new), script)
    return script


def workspace_changed(workspace: Path, initial: dict[str, str]) -> bool:
    """True when the workspace holds a file that is new or differs from the initial digests."""
    if not workspace.is_dir():
        return False
    for path in sorted(workspace.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        name = path.relative_to(workspace).as_posix()
        if initial.get(name) != hashlib.sha256(path.read_bytes()).hexdigest():
            return True
    return False


def read_reward(logs: Path) -> float:
    text_file, json_file = logs / "reward.txt", logs / "reward.json"
    if text_file.is_file():
        raw = text_file.read_text(encoding="utf-8").strip()
        try:
            reward = float(raw)
        except ValueError as exc:
            raise GradeError(f"reward.txt must hold a number, got {raw[:80]!r}") from exc
    elif json_file.is_file():
        data = json.loads(json_file.read_text(encoding="utf-8"))
        value = data.get("reward") if isinstance(data, dict) else data
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise GradeError("reward.json must hold a number or an object with a numeric `reward`")
        reward = float(value)
    else:
        raise GradeError("the tests wrote no reward (/logs/verifier/reward.txt or reward.json)")
    if not math.isfinite(reward) or not 0 <= reward <= 1:
        raise GradeError(f"reward {reward!r} is outside [0, 1]")
    return reward


def write_tests(tests: Any, folder: Path, *, workspace: Path, logs: Path) -> None:
    if not isinstance(tests, dict) or not isinstance(tests.get("test.sh"), str):
        raise GradeError("the task has no tests/test.sh")
    for name, text in tests.items():
        target = (folder / name).resolve()
        if not isinstance(text, str) or folder.resolve() not in target.parents:
            raise GradeError(f"bad test file {name!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(map_paths(text, workspace=workspace, tests=folder, logs=logs), encoding="utf-8")


def image_env(expected: dict[str, Any], *, workspace: Path, tests: Path, logs: Path) -> dict[str, str]:
    """The ENV lines of the task's Dockerfile (its recipe's ``env``), which
    Harbor's tests see as the image's environment; container paths in their
    values are mapped as in the scripts (``ENV DATA=/app/data.json``)."""
    recipe = expected.get("environment")
    values = recipe.get("env") if isinstance(recipe, dict) else None
    if not isinstance(values, dict):
        return {}
    return {
        str(name): map_paths(str(value), workspace=workspace, tests=tests, logs=logs) for name, value in values.items()
    }


# What the trial gives a verifier with the network (evolution.environments.host_network_env; this
# script runs in the sandbox with the standard library alone, so the names are listed here too).
NETWORK_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
)


def grade(output: Path, expected_doc: dict[str, Any], private: Path) -> dict[str, Any]:
    expected = expected_doc.get("expected")
    if not isinstance(expected, dict):
        raise GradeError("expected file needs an object `expected`")
    workspace, tests, logs = output / "workspace", private / "tests", private / "logs" / "verifier"
    logs.mkdir(parents=True, exist_ok=True)
    write_tests(expected.get("tests"), tests, workspace=workspace, logs=logs)
    submitted = workspace_changed(workspace, expected.get("workspace_files") or {})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(private)}
    env.update(image_env(expected, workspace=workspace, tests=tests, logs=logs))
    env.update(WORKSPACE=str(workspace), TESTS_DIR=str(tests), LOGS_DIR=str(logs))
    # A task with the network reaches the registries through the machine's proxy (the trial passes these).
    env.update({name: os.environ[name] for name in NETWORK_VARIABLES if name in os.environ})
    timeout = float(expected.get("timeout_seconds") or DEFAULT_TIMEOUT)
    try:
        process = subprocess.run(
            ["bash", str(tests / "test.sh")],
            cwd=workspace if workspace.is_dir() else private,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GradeError(f"tests/test.sh ran longer than {timeout} s") from exc
    log = (process.stdout + process.stderr).decode(errors="replace")[-LOG_TAIL_CHARS:]
    try:
        reward = read_reward(logs)
    except GradeError as exc:
        raise GradeError(f"{exc}; test.sh exited with {process.returncode}; output tail:\n{log}") from exc
    passed = reward >= 1.0
    return {
        "passed": passed,
        "score": reward,
        "criteria": [{"id": "reward", "met": passed, "value": reward}],
        "submitted": submitted,
        "valid_output": submitted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--expected", required=True, type=Path)
    options = parser.parse_args(argv)
    try:
        expected_doc = json.loads(options.expected.read_text(encoding="utf-8"))
        if not isinstance(expected_doc, dict):
            raise GradeError("expected file must hold a JSON object")
        verdict = grade(options.output.absolute(), expected_doc, options.expected.absolute().parent)
    except (OSError, ValueError, GradeError) as exc:
        print(json.dumps({"error": f"cannot grade: {exc}"}))
        sys.stderr.write(f"harbor_verify: {exc}\n")
        return 2
    print(json.dumps(verdict, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
