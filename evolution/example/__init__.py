"""The offline example: support-request routing with a simulated, harness-driven policy (see README.md)."""

from __future__ import annotations

import re
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


# The offline proposer of the reasoning-gym benchmark (evolution/rgym/proposer.py); its name is read from
# rgym/benchmark.toml here, so this module needs neither the package nor Django.
RGYM_PROPOSER = "rgym"
OFFLINE_PROPOSERS = (PROPOSER, RGYM_PROPOSER)


@cache
def rgym_benchmark_name() -> str:
    """The name the reasoning-gym benchmark is loaded under (rgym/benchmark.toml)."""
    path = EXAMPLE_DIR.parent / "rgym" / "benchmark.toml"
    name: str = tomllib.loads(path.read_text())["benchmark"]["name"]
    return name


def preset_proposer(*, benchmark: str) -> str | None:
    """The proposal operator a preset runs with, unless told otherwise, on an
    experiment of ``benchmark``: the offline proposer whose edits that
    benchmark's harness understands (the presets' ``llm`` needs a model
    endpoint, which someone trying the presets offline should not need).
    The example's own on the example and on its ``load_example --tasks N``
    subsets (``<name>-first-N``); ``rgym`` on reasoning-gym and its
    ``--tasks N`` subsets (``reasoning-gym-N-per-split``); None elsewhere
    (the preset's own)."""
    example, rgym = benchmark_name(), rgym_benchmark_name()
    if benchmark == example or re.fullmatch(rf"{re.escape(example)}-first-\d+", benchmark):
        return PROPOSER
    if benchmark == rgym or re.fullmatch(rf"{re.escape(rgym)}-\d+-per-split", benchmark):
        return RGYM_PROPOSER
    return None


def proposer_mismatch(*, benchmark: str, proposer: str) -> str | None:
    """Why ``proposer`` cannot edit a harness of ``benchmark``: an offline proposer of one of the bundled
    benchmarks named on the other (its edits would change nothing, or files the surface does not have); None
    when nothing is known against it."""
    own = preset_proposer(benchmark=benchmark)
    if own is None or proposer == own or proposer not in OFFLINE_PROPOSERS:
        return None
    return (
        f"the offline proposer {proposer!r} edits another benchmark's harness; on {benchmark!r} use "
        f"--proposer {own} (the default there) or a model-driven proposer"
    )
