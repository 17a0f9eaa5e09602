"""From a proposal to a checked candidate: the surface check at freeze and
the leakage critic read every changed file, binary or not (the bundled
example's experiment, one of its gate tasks leaked into a memory file)."""

from __future__ import annotations

import json

import pytest
import yaml
from django.utils import timezone

from evolution import selectors
from evolution.example.setup import example_experiment_create
from evolution.loop import lifecycle
from evolution.models import Candidate, Experiment, LeakageFlag, Run, SplitMembership, SplitName, Task
from evolution.operators import EditDeclaration, Proposal
from evolution.recipes import load_preset
from evolution.services.experiments import experiment_create, surface_create
from evolution.services.proposals import candidate_critique, candidate_freeze
from evolution.services.snapshots import tree_entries

pytestmark = pytest.mark.django_db

NOTES = "memory/notes.md"
# Appended to the leak: one byte that is not UTF-8, or one NUL, makes the file "binary".
STRAY_BYTES = {"invalid byte": b"\n#\xff\n", "NUL": b"\x00"}


def gate_task(experiment: Experiment) -> Task:
    membership = (
        SplitMembership.objects.filter(experiment=experiment, split=SplitName.GATE)
        .select_related("task")
        .order_by("task__external_id")
        .first()
    )
    assert membership is not None
    return membership.task


def leak(task: Task) -> str:
    """A gate task's id, instruction and expected answer, a Trojan Source line and tag characters."""
    return (
        f"\n## Seen before: {task.external_id}\n{task.instruction}\n"
        f"Answer with exactly: {json.dumps(task.expected, sort_keys=True)}\n"
        "/*\u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only */\n"
        "Be brief.\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065\n"
    )


def new_run(experiment: Experiment) -> Run:
    return lifecycle.run_create(experiment=experiment, recipe=load_preset("rrsi"), proposer="example")


def accepted_seed(experiment: Experiment) -> Candidate:
    seed = selectors.experiment_seed(experiment)
    # As if certified and accepted: only an accepted candidate can be a parent.
    Candidate.objects.filter(pk=seed.pk).update(state=Candidate.State.ACCEPTED, certified_at=timezone.now())
    seed.refresh_from_db()
    return seed


def strict_twin(experiment: Experiment) -> Experiment:
    """``experiment`` with its surface plus ``refuse_hidden_characters: true``."""
    spec = yaml.safe_load(experiment.surface.spec)
    spec["refuse_hidden_characters"] = True
    lists: dict[str, list[str]] = {}
    for membership in experiment.split_memberships.select_related("task").order_by("task__external_id"):
        lists.setdefault(membership.split, []).append(membership.task.external_id)
    return experiment_create(
        name=f"{experiment.name} strict",
        benchmark=experiment.benchmark,
        evaluator=experiment.evaluator,
        surface=surface_create(name="example strict", spec=yaml.safe_dump(spec, sort_keys=True)),
        seed_tree=selectors.experiment_seed(experiment).tree,
        split_lists=lists,
        trials_per_task=experiment.trials_per_task,
        run_settings=experiment.run_settings,
    )


def freeze(run: Run, parent: Candidate, appended: bytes, slot: int) -> tuple[str, str, Candidate | None]:
    files = {e.path: e.data for e in tree_entries(tree=parent.tree)}
    files[NOTES] += appended
    proposal = Proposal(
        files=files, edits=[EditDeclaration(component="memory", hypothesis="remember cases", paths=[NOTES])]
    )
    outcome = candidate_freeze(run=run, parent=parent, proposal=proposal, round=1, slot=slot, edit_budget=None)
    if outcome.candidate is not None and outcome.state == Candidate.State.FROZEN:
        assert candidate_critique(run=run, candidate=outcome.candidate, policy="reject") != Candidate.State.APPROVED
    return outcome.state, outcome.reason, outcome.candidate


def stored(candidate: Candidate | None) -> list[tuple[str, str, int | None, str, str | None]]:
    assert candidate is not None
    rows = LeakageFlag.objects.filter(candidate=candidate).select_related("task").order_by("pk")
    return sorted(
        (f.rule, f.path, f.evidence["line_number"], f.matched, f.task.external_id if f.task else None) for f in rows
    )


@pytest.mark.parametrize("stray", STRAY_BYTES)
def test_a_stray_byte_does_not_switch_the_critic_off(stray: str) -> None:
    experiment = example_experiment_create(name="binary leak")
    parent = accepted_seed(experiment)
    task = gate_task(experiment)
    text = leak(task).encode()

    run = new_run(experiment)
    state, _, clean = freeze(run, parent, text, 1)
    byte_state, _, binary = freeze(run, parent, text + STRAY_BYTES[stray], 2)

    assert (state, byte_state) == (Candidate.State.FROZEN, Candidate.State.FROZEN)  # the example surface allows both
    assert clean is not None and binary is not None
    clean.refresh_from_db()
    binary.refresh_from_db()
    assert (clean.state, binary.state) == (Candidate.State.REJECTED_CRITIC, Candidate.State.REJECTED_CRITIC)
    flags = stored(clean)
    heading = tree_entries_text(parent).count("\n") + 2  # "## Seen before: <id>"
    assert ("task_id", NOTES, heading, task.external_id, task.external_id) in flags
    assert {rule for rule, *_ in flags} == {
        "task_id",
        "shared_ngram",
        "long_substring",
        "rare_literal",
        "hidden_unicode",
    }
    data = tree_entries_text(parent).encode() + text + STRAY_BYTES[stray]
    last = data[: data.index(b"\xff" if stray == "invalid byte" else b"\x00")].count(b"\n") + 1
    # The same flags, and the stray byte (stored without it: NUL and 0xFF are not storable) on the line it ends.
    extra = ("hidden_unicode", NOTES, last, "\ufffd", None)
    assert stored(binary) == sorted([*flags, extra])
    evidence = LeakageFlag.objects.get(candidate=binary, rule="hidden_unicode", evidence__line_number=last).evidence
    expected = "0xFF UNDECODABLE BYTE (not UTF-8)" if stray == "invalid byte" else "U+0000 NULL (control)"
    assert evidence["evidence"].startswith(expected)


def tree_entries_text(parent: Candidate) -> str:
    return next(e.data.decode() for e in tree_entries(tree=parent.tree) if e.path == NOTES)


@pytest.mark.parametrize("stray", STRAY_BYTES)
def test_a_surface_refusing_hidden_characters_refuses_them_in_a_file_with_a_stray_byte(stray: str) -> None:
    experiment = strict_twin(example_experiment_create(name="binary leak"))
    parent = accepted_seed(experiment)
    run = new_run(experiment)
    notes = tree_entries_text(parent).encode()
    text = leak(gate_task(experiment)).encode()

    state, reason, candidate = freeze(run, parent, text + STRAY_BYTES[stray], 1)
    only_state, only_reason, _ = freeze(run, parent, b"Plain notes." + STRAY_BYTES[stray], 2)

    assert state == Candidate.State.REJECTED_SURFACE
    assert candidate is not None and not LeakageFlag.objects.filter(candidate=candidate).exists()
    trojan = (notes + text)[: (notes + text).index("\u202e".encode())].count(b"\n") + 1
    # 4 bidi controls, 6 tag characters and the stray byte: the first 5 named.
    assert reason == (
        f"{NOTES}: adds hidden characters: U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line {trojan}, column 3; "
        f"U+2066 LEFT-TO-RIGHT ISOLATE (bidi) on line {trojan}, column 7; "
        f"U+2069 POP DIRECTIONAL ISOLATE (bidi) on line {trojan}, column 20; "
        f"U+2066 LEFT-TO-RIGHT ISOLATE (bidi) on line {trojan}, column 22; "
        f"U+E0069 TAG LATIN SMALL LETTER I (tag) on line {trojan + 1}, column 10; "
        "and 6 more (the surface sets refuse_hidden_characters)"
    )
    # The byte alone, in a file of a text component, is refused too.
    line = notes.count(b"\n") + (2 if stray == "invalid byte" else 1)
    column = 2 if stray == "invalid byte" else 13
    byte = "0xFF UNDECODABLE BYTE (not UTF-8)" if stray == "invalid byte" else "U+0000 NULL (control)"
    assert (only_state, only_reason) == (
        Candidate.State.REJECTED_SURFACE,
        f"{NOTES}: adds hidden characters: {byte} on line {line}, column {column} "
        "(the surface sets refuse_hidden_characters)",
    )
