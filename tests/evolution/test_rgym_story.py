"""The mechanism behind the story, on a benchmark we did not write (reasoning-gym), by rules the critic
does not use.

Sealed tasks are fresh draws (other seeds) of the generators the train tasks came from, so a memorized
answer cannot transfer by construction of reasoning-gym's code, not by a threshold of ours. The test
measures, with ``evolution.rgym.bench`` (the agent and the package's own ``score_answer``, no database):
a memorizing edit (a table of the train answers) raises train more than a general solver skill but
transfers worse to sealed. It prints the measured direction. The counter-check breaks the mechanism (a
table that also holds the sealed answers) and shows the same rule then fails.
"""

from __future__ import annotations

import pytest

from evolution.rgym.bench import measure

pytestmark = pytest.mark.usefixtures("reasoning_gym_installed")

GENERAL = "skill-word-sorting"
MEMORIZING = "memory-answer-table"


def transfers_worse(*, memorize_sealed: bool = False) -> tuple[bool, str]:
    """Whether the memorizing edit's sealed gain over the seed harness is below the general edit's while
    its train gain is above it; and the figures, as a line."""
    seed = measure([])
    general = measure([GENERAL])
    memorizing = measure([MEMORIZING], memorize_sealed=memorize_sealed)
    gain = {
        name: {split: result[split].score - seed[split].score for split in ("train", "gate", "sealed")}
        for name, result in ((GENERAL, general), (MEMORIZING, memorizing))
    }
    line = " | ".join(
        f"{name}: train {g['train']:+.3f} gate {g['gate']:+.3f} sealed {g['sealed']:+.3f}" for name, g in gain.items()
    )
    holds = gain[MEMORIZING]["train"] > gain[GENERAL]["train"] and gain[MEMORIZING]["sealed"] < gain[GENERAL]["sealed"]
    return holds, line


def test_a_memorizing_edit_transfers_worse_on_fresh_seeds_than_a_general_one() -> None:
    holds, line = transfers_worse()
    print(f"measured gains over the seed harness: {line}; memorizing transfers worse: {holds}")
    assert holds, line


def test_the_rule_fails_when_the_memorized_table_also_covers_sealed() -> None:
    # A broken mechanism: the table holds the sealed answers too, so sealed "transfers" perfectly.
    holds, line = transfers_worse(memorize_sealed=True)
    print(f"with sealed answers in the table: {line}")
    assert not holds, line
