"""The trust suite behind ``manage.py trust_suite``.

Each scenario injects one fault for real (a SIGKILL of a worker or of its
child at a chosen point, a raw SQL write, a file changed on disk, a crafted
diff or request) into a fresh experiment and checks that the platform ends in
the expected safe state. A scenario is a function of one ``TrialContext``
registered with ``@scenario``; it returns a short detail string when the
platform ended safe, raises ``TrustFailure`` when it did not, and
``Inapplicable`` when this host cannot inject the fault (no bubblewrap, say):
the suite reports those apart, never as passed.

``SCENARIO_MODULES`` lists the modules the command imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evolution.models import Experiment
    from lab.trust.context import Suite

SCENARIO_MODULES = (
    "lab.trust.crash",
    "lab.trust.tamper",
    "lab.trust.evidence",
    "lab.trust.sandbox_abuse",
    "lab.trust.hidden",
)

# The two benchmarks every scenario runs on: the bundled example (exact-match
# answers, a Python harness) and the Harbor-style task folder (a command-line
# agent, tests/test.sh writing a reward).
BENCHMARKS = ("example", "harbor")


class TrustFailure(Exception):
    """The platform did not end in the expected safe state."""


class Inapplicable(Exception):
    """This host cannot inject the fault (say why); reported, never passed."""


@dataclass
class TrialContext:
    """What a scenario gets for one trial.

    ``experiment`` is a fresh experiment of ``benchmark`` created for this
    trial alone (same benchmark, evaluator, seed harness and splits as the
    suite's other trials of that benchmark, so certified records compare).
    ``workdir`` is an empty folder of this trial's. ``suite`` is the
    ``lab.trust.context.Suite`` running the trials: workers, brokers,
    control runs and digests (see there).
    """

    benchmark: str
    trial: int
    experiment: Experiment
    workdir: Path
    suite: Suite | None  # None for a scenario run in-process, without workers (tests/trust)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    number: int
    name: str
    title: str
    run: Callable[[TrialContext], str]
    # Scenarios that need real worker processes (and so a shared broker).
    needs_worker: bool = False


REGISTRY: dict[str, Scenario] = {}


def scenario(
    number: int, name: str, title: str, *, needs_worker: bool = False
) -> Callable[[Callable[[TrialContext], str]], Callable[[TrialContext], str]]:
    """Register ``function(ctx) -> detail`` as scenario ``name``. Several
    functions may share a ``number`` (the issue's scenario 2 has three
    injection points: ``2a``..., named apart)."""

    def register(function: Callable[[TrialContext], str]) -> Callable[[TrialContext], str]:
        if name in REGISTRY:
            raise ValueError(f"scenario {name!r} registered twice")
        REGISTRY[name] = Scenario(number=number, name=name, title=title, run=function, needs_worker=needs_worker)
        return function

    return register


def load_scenarios() -> dict[str, Scenario]:
    for module in SCENARIO_MODULES:
        importlib.import_module(module)
    return dict(sorted(REGISTRY.items(), key=lambda item: (item[1].number, item[0])))


def expect(condition: bool, message: str) -> None:
    """Raise ``TrustFailure(message)`` unless ``condition``."""
    if not condition:
        raise TrustFailure(message)
