"""The offline example: support-request routing with a simulated, harness-driven policy (see README.md)."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent
# The proposal operator that edits this example's harness offline (proposer.py).
PROPOSER = "example"


@cache
def benchmark_name() -> str:
    """The name the example's benchmark is loaded under (evaluator.toml)."""
    name: str = tomllib.loads((EXAMPLE_DIR / "evaluator.toml").read_text())["benchmark"]["name"]
    return name


def preset_proposer(*, benchmark: str) -> str | None:
    """The proposal operator a preset runs with, unless told otherwise, on an
    experiment of ``benchmark``: the example's own offline proposer on the
    example (the presets' ``llm`` needs a model endpoint, which someone
    trying the presets on the example should not need); None elsewhere (the
    preset's own)."""
    return PROPOSER if benchmark == benchmark_name() else None
