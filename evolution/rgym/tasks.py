"""The reasoning-gym benchmark's tasks, drawn from the installed package. Pure: no Django, no network.

``benchmark.toml`` names the families and the seed range of every split; a task is one (family, seed).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

RGYM_DIR = Path(__file__).resolve().parent
SPLIT_NAMES = ("train", "gate", "sealed")


@dataclass(frozen=True)
class Config:
    benchmark: dict[str, Any]
    evaluator: dict[str, Any]
    families: tuple[str, ...]
    heldout_families: tuple[str, ...]
    seeds: dict[str, range]
    k: int


def config_read(path: Path = RGYM_DIR / "benchmark.toml") -> Config:
    data = tomllib.loads(path.read_text())
    seeds = {name: range(int(s["start"]), int(s["start"]) + int(s["count"])) for name, s in data["seeds"].items()}
    ranges = sorted(seeds.values(), key=lambda r: r.start)
    if any(a.stop > b.start for a, b in zip(ranges, ranges[1:], strict=False)):
        raise ValueError(f"{path}: the seed ranges of the splits overlap")
    return Config(
        benchmark=data["benchmark"],
        evaluator=data["evaluator"],
        families=tuple(data["benchmark"]["families"]),
        heldout_families=tuple(data["benchmark"]["heldout_families"]),
        seeds=seeds,
        k=int(data["trials"]["k"]),
    )


# What to run when the package is missing (it is not in requirements.txt).
INSTALL_HINT = ".venv/bin/pip install -r requirements-rgym.txt"


def package_version() -> str:
    """The installed reasoning-gym's version (its ``__version__`` attribute lags the release: 0.1.19 in 0.1.25).

    ValueError, saying how to install it, when the package is not installed.
    """
    try:
        return metadata.version("reasoning-gym")
    except metadata.PackageNotFoundError:
        raise ValueError(f"the reasoning-gym package is not installed; install it with {INSTALL_HINT}") from None


def task_id(family: str, seed: int) -> str:
    return f"{family}-{seed}"


def draw(family: str, seed: int) -> dict[str, Any]:
    """The generator's item for (family, seed): question, answer and metadata, as JSON values."""
    import reasoning_gym

    entry = reasoning_gym.create_dataset(family, seed=seed, size=1)[0]
    data: dict[str, Any] = json.loads(json.dumps(entry, default=str))
    return data


@dataclass(frozen=True)
class Drawn:
    """A task as the platform stores it (``evolution.services.experiments.TaskInput``'s fields)."""

    external_id: str
    instruction: str
    expected: dict[str, Any]
    criteria: list[dict[str, Any]]
    metadata: dict[str, Any]


def task_input(family: str, seed: int, *, split: str, version: str) -> Drawn:
    """One task: the question is the instruction; (family, seed, version) and the generator's item are the
    private expected data, so they enter the task's digest and so the digest of its split."""
    entry = draw(family, seed)
    return Drawn(
        external_id=task_id(family, seed),
        instruction=str(entry["question"]),
        expected={"family": family, "seed": seed, "version": version, "entry": entry},
        criteria=[{"id": "answer", "description": "reasoning-gym's score_answer gives the answer 1.0"}],
        metadata={"family": family, "seed": seed, "reasoning_gym": version},
    )


def tasks_by_split(
    config: Config, *, per_split: int | None = None, families: tuple[str, ...] | None = None
) -> dict[str, list[Drawn]]:
    """The tasks of every split (and ``heldout``), ``per_split`` seeds of each family at most."""
    version = package_version()
    out: dict[str, list[Drawn]] = {}
    for split, seeds in config.seeds.items():
        names = config.heldout_families if split == "heldout" else (families or config.families)
        chosen = list(seeds)[:per_split] if per_split is not None else list(seeds)
        out[split] = [task_input(f, s, split=split, version=version) for f in names for s in chosen]
    return out
