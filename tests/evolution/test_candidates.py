"""The candidate state machine: nothing uncertified or undecided is a parent."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from evolution.models import AtomicEdit, Candidate, Tree
from evolution.services.candidates import (
    CandidateError,
    EditInput,
    candidate_accept,
    candidate_create,
    candidate_transition,
)
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from tests.factories import evaluate_seed_inline, make_tiny_experiment, seed_id, seed_of

pytestmark = pytest.mark.django_db

EDIT = EditInput(component="prompt", hypothesis="Saying no by default fixes the odd tasks.", paths=["default.txt"])


def a_tree(text: str) -> Tree:
    return tree_store(entries=[FileEntry("default.txt", "100644", text.encode())])


@pytest.mark.parametrize(
    "state",
    [s for s in Candidate.State.values if s != Candidate.State.ACCEPTED],
)
def test_only_an_accepted_candidate_can_be_a_parent(state: str) -> None:
    experiment = make_tiny_experiment(tasks=2)
    seed = seed_of(experiment)
    Candidate.objects.filter(pk=seed.pk).update(state=state)
    with pytest.raises(CandidateError, match="only a certified, accepted candidate can be a parent"):
        candidate_create(parent=seed, tree=a_tree("no\n"), edits=[EDIT])
    assert Candidate.objects.filter(experiment=experiment).count() == 1
    assert not AtomicEdit.objects.exists()


def test_a_certified_and_accepted_seed_becomes_a_parent() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(experiment, splits=("train",))
    seed = Candidate.objects.get(pk=seed_id(experiment))
    assert candidate_accept(candidate=seed)
    child = candidate_create(parent=seed, tree=a_tree("no\n"), edits=[EDIT], round=1)
    assert child.state == Candidate.State.FROZEN
    assert child.parent_id == seed.pk
    assert list(child.edits.values_list("component", "hypothesis")) == [("prompt", EDIT.hypothesis)]


def test_accepting_an_uncertified_candidate_does_nothing() -> None:
    experiment = make_tiny_experiment(tasks=2)
    seed = seed_of(experiment)
    assert candidate_accept(candidate=seed) is False
    assert Candidate.objects.get(pk=seed.pk).state == Candidate.State.APPROVED


def test_database_refuses_accepted_without_certification() -> None:
    experiment = make_tiny_experiment(tasks=2)
    with pytest.raises(IntegrityError), transaction.atomic():
        Candidate.objects.filter(pk=seed_id(experiment)).update(state=Candidate.State.ACCEPTED)
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.APPROVED


def test_duplicate_tree_is_refused() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    evaluate_seed_inline(experiment, splits=("train",))
    seed = Candidate.objects.get(pk=seed_id(experiment))
    candidate_accept(candidate=seed)
    with pytest.raises(CandidateError, match="duplicate"):
        candidate_create(parent=seed, tree=seed.tree, edits=[EDIT])
    assert Candidate.objects.filter(experiment=experiment).count() == 1


def test_unknown_component_kind_is_refused() -> None:
    experiment = make_tiny_experiment(tasks=2)
    with pytest.raises(CandidateError, match="unknown component kind 'prompts'"):
        candidate_create(parent=seed_of(experiment), tree=a_tree("x"), edits=[EditInput("prompts", "h")])


def test_transitions_follow_the_state_machine() -> None:
    experiment = make_tiny_experiment(tasks=2)
    seed = seed_of(experiment)  # approved
    assert seed is not None
    assert candidate_transition(candidate=seed, to=Candidate.State.CERTIFIED) is False
    assert candidate_transition(candidate=seed, to=Candidate.State.EVALUATING) is True
    assert candidate_transition(candidate=seed, to=Candidate.State.EVALUATING) is False
    assert Candidate.objects.get(pk=seed.pk).state == Candidate.State.EVALUATING
