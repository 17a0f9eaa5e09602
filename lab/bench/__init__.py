"""Benchmarks behind ``manage.py bench``.

Every benchmark measures its own baseline in the same run (the machines are
shared and noisy, so absolute times mean little) and returns a ratio with the
target it must meet. A module registers its benchmarks with ``@benchmark``;
``BENCH_MODULES`` lists the modules the command imports.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BENCH_MODULES = (
    "lab.bench.orchestration",
    "lab.bench.diffs",
    "lab.bench.pages",
    "lab.bench.records",
    "lab.bench.trajectories",
    "lab.bench.memory",
    "lab.bench.concurrency",
    "lab.bench.shared",
    "lab.bench.llm",
)


@dataclass
class BenchResult:
    """What one benchmark measured. ``ratio`` is compared with ``target``:
    lower is better unless ``higher_is_better``. ``lines`` are the figures
    printed before the verdict (absolute times, counts, sizes)."""

    ratio: float
    target: float
    label: str
    lines: list[str] = field(default_factory=list)
    higher_is_better: bool = False
    # Secondary checks that must also hold for a PASS (name -> ok).
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        within = self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target
        return within and all(self.checks.values())

    def verdict(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        failed = [name for name, ok in self.checks.items() if not ok]
        extra = f" (failed: {', '.join(failed)})" if failed else ""
        status = "PASS" if self.passed else "FAIL"
        return f"{self.label}: ratio {self.ratio:.3f} (target {sign} {self.target:g}) {status}{extra}"


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    run: Callable[..., BenchResult]
    # Keyword arguments ``--quick`` passes (small sizes for a smoke run).
    quick: dict[str, Any] = field(default_factory=dict)
    # Takes ``keep`` / ``reuse`` (the command's --keep-data / --reuse-data):
    # its generated database can be kept and measured again.
    reusable: bool = False
    # Works in a throwaway database of its own (not the configured one).
    own_database: bool = False


REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    title: str,
    *,
    quick: dict[str, Any] | None = None,
    reusable: bool = False,
    own_database: bool = False,
) -> Callable[[Callable[..., BenchResult]], Callable[..., BenchResult]]:
    """Register ``function(**sizes) -> BenchResult`` under ``name``."""

    def register(function: Callable[..., BenchResult]) -> Callable[..., BenchResult]:
        REGISTRY[name] = Benchmark(
            name=name,
            title=title,
            run=function,
            quick=dict(quick or {}),
            reusable=reusable,
            own_database=own_database,
        )
        return function

    return register


def load_benchmarks() -> dict[str, Benchmark]:
    for module in BENCH_MODULES:
        importlib.import_module(module)
    return REGISTRY


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    elapsed: list[float] = [0.0]
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.perf_counter() - start


# The fields of /proc/stat's "cpu" line (proc(5)), in jiffies summed over every core.
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_jiffies() -> dict[str, int]:
    """The machine's CPU time so far by kind, from /proc/stat (empty where there is none)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            values = stat.readline().split()[1 : 1 + len(_CPU_FIELDS)]
    except OSError:
        return {}
    return dict(zip(_CPU_FIELDS, (int(value) for value in values), strict=False))


@dataclass(frozen=True)
class Load:
    """How busy the machine was over a span: the load averages at its end and
    the shares of the cores' time that were idle (idle and I/O wait), taken
    by the hypervisor (steal) and busy (all the rest: this run and every
    other tenant's processes) between its start and its end."""

    averages: tuple[float, float, float]
    idle: float
    steal: float
    busy: float

    @classmethod
    def between(cls, before: dict[str, int], after: dict[str, int]) -> Load:
        spent = {name: after.get(name, 0) - before.get(name, 0) for name in _CPU_FIELDS}
        total = sum(spent.values()) or 1
        idle = (spent["idle"] + spent["iowait"]) / total
        steal = spent["steal"] / total
        return cls(averages=os.getloadavg(), idle=idle, steal=steal, busy=1.0 - idle - steal)

    def text(self) -> str:
        one, five, fifteen = self.averages
        return (
            f"load {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {os.cpu_count()} cores; "
            f"CPU over the span {100 * self.busy:.0f} % busy, {100 * self.idle:.0f} % idle, "
            f"{100 * self.steal:.0f} % stolen"
        )


@contextmanager
def load_meter() -> Iterator[list[Load]]:
    """``with load_meter() as load: ...`` then ``load[0]`` is the machine's
    load over the block: every figure a shared machine prints needs it beside."""
    measured: list[Load] = []
    before = cpu_jiffies()
    try:
        yield measured
    finally:
        measured.append(Load.between(before, cpu_jiffies()))
