"""The proposers on the reasoning-gym harness: the offline one's edit kinds, and the LLM proposer's path
(its prompt from the view, its answer applied to the harness and measured). Pure: no database, no model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from evolution.llm_operators import apply_answer, proposer_messages
from evolution.operators import ProposerView
from evolution.rgym import proposer
from evolution.rgym.bench import evidence_of, score, seed_files
from evolution.rgym.tasks import config_read, tasks_by_split

pytestmark = pytest.mark.usefixtures("reasoning_gym_installed")

SURFACE = {"prompts/system.md": "prompt", "memory/answers.md": "memory", "config.toml": "config"}


def view(*, seed: int, files: dict[str, str], weights: dict[str, float] | None = None) -> ProposerView:
    tasks = tasks_by_split(config_read(), per_split=2)
    components = {path: SURFACE.get(path, "skill") for path in files}
    return ProposerView(
        round=1,
        slot=0,
        seed=seed,
        parent_files={path: text.encode() for path, text in files.items()},
        components=components,
        evidence=evidence_of(tasks["train"]),
        ledger=[],
        edit_budget=None,
        stalled=False,
        explore_components=[],
        pruning_targets=[],
        params={"family_weights": weights} if weights else {},
    )


@pytest.mark.parametrize(
    ("family", "kind", "path"),
    [("generic", "skill", "skills/"), ("memorize", "memory", "memory/"), ("leaky", "prompt", "prompts/")],
)
def test_the_offline_proposer_writes_the_drawn_family(family: str, kind: str, path: str) -> None:
    weights = {f: float(f == family) for f in proposer.FAMILIES}
    proposal = proposer.propose(view(seed=3, files=seed_files(), weights=weights))

    assert [e.component for e in proposal.edits] == [kind]
    assert all(p.startswith(path) for p in proposal.edits[0].paths)
    assert proposal.note.endswith(f"({family})")


def test_the_offline_proposer_says_when_nothing_is_left() -> None:
    files = seed_files()
    for name in ("skill-word-sorting", "skill-gcd", "skill-chain-sum", "skill-letters-ignore-case"):
        files = proposer.edit_apply(name, files)

    generics_only = replace(view(seed=0, files=files), params={"edits": ["skill-gcd", "skill-chain-sum"]})

    with pytest.raises(proposer.NothingToPropose):
        proposer.propose(generics_only)
    # Any other family still changes the harness.
    assert proposer.propose(view(seed=0, files=files)).edits


def test_the_llm_proposer_path_works_on_the_reasoning_gym_harness() -> None:
    files = seed_files()
    messages = proposer_messages(view(seed=0, files=files))
    text = "\n".join(m["content"] for m in messages)
    assert "skills/arithmetic.md" in text and "Greatest Common Divisor" in text
    # An answer a model could give: a gcd skill as a whole file. The proposer applies it and the package grades it.
    answer = {
        "edits": [
            {
                "component": "skill",
                "hypothesis": "A gcd procedure.",
                "files": {"skills/gcd.md": proposer.SKILLS["skills/gcd.md"]},
            }
        ]
    }
    parsed = apply_answer({p: t.encode() for p, t in files.items()}, json.loads(json.dumps(answer)))
    edited = {p: d.decode() for p, d in parsed.files.items()}
    gate = tasks_by_split(config_read(), per_split=2, families=("gcd",))["gate"]

    assert score(edited, gate).score == 1.0
    assert score(files, gate).score < 1.0
