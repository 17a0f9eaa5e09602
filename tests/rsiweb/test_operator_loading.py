"""Operators are loaded once, by ``EvolutionConfig.ready()`` (docs/architecture.md): no other module calls
``operators_load``, and a fresh process has every operator as soon as ``django.setup()`` returns."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGES = ("evolution", "review", "api", "lab", "rsiweb")
LOADER = Path("evolution/apps.py")

SETUP_AND_LIST = (
    "import json, django; django.setup(); from evolution import operators; "
    "print(json.dumps({stage: sorted(names) for stage, names in operators.known_operators().items()}))"
)


def operator_loads(root: Path) -> list[str]:
    """Calls of ``operators_load`` (as ``operators_load()`` or ``x.operators_load()``) outside ``LOADER``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root) == LOADER:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    function = node.func
                    name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
                    if name == "operators_load":
                        found.append(f"{path.relative_to(root)}:{node.lineno} calls operators_load")
    return found


def test_only_the_app_config_loads_the_operators() -> None:
    assert operator_loads(REPO_ROOT) == []


def test_the_rule_fires_on_a_tree_that_breaks_it(tmp_path: Path) -> None:
    files = {
        "evolution/apps.py": "from evolution import operators\n\noperators.operators_load()\n",
        "evolution/operators.py": "def operators_load():\n    pass\n",
        "review/views/runs.py": "from evolution import operators\n\ndef form():\n    operators.operators_load()\n",
        "lab/trust/tamper.py": "from evolution.operators import operators_load\n\noperators_load()\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert operator_loads(tmp_path) == [
        "review/views/runs.py:4 calls operators_load",
        "lab/trust/tamper.py:3 calls operators_load",
    ]


def test_a_process_has_every_operator_once_django_is_set_up() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rsiweb.settings", "RSI_OPERATOR_MODULES": "tests.operators"}
    result = subprocess.run(
        [sys.executable, "-c", SETUP_AND_LIST], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "parent_selection": ["archive", "best", "latest_accepted", "pareto"],
        "proposal": ["command", "example", "llm", "review-test-mixed", "rgym", "tiny-held", "tiny-test"],
        "critique": ["llm", "rules"],
        "gate": ["regularized", "unregularized"],
        "pruning": ["window"],
    }
