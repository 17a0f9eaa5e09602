"""Review decisions on flagged candidates: one per item, picked up by the loop."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from evolution import operators
from evolution.loop import lifecycle
from evolution.loop.review import review_decide, review_decide_partial
from evolution.models import (
    AtomicEdit,
    Candidate,
    Evaluation,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    ReviewDecision,
    ReviewItem,
    Run,
)
from evolution.services.review import ReviewConflict, ReviewError, derive_files, review_claim, review_release
from evolution.services.snapshots import tree_entries, tree_store
from evolution.trees import FileEntry
from tests.evolution.test_loop import start
from tests.factories import make_tiny_experiment, seed_of
from tests.loop_driver import drive
from tests.operators import GENERIC_NOTE, tiny_proposer

pytestmark = pytest.mark.django_db


def first_flagged(run: Run) -> bool:
    return ReviewItem.objects.filter(candidate__run=run).exists()


def held_at_first_flag() -> tuple[Run, ReviewItem]:
    """An rrsi run driven until its first flagged candidate waits in the review queue (the run still runs)."""
    run = drive(start("rrsi"), until=first_flagged)
    assert run.status == Run.Status.RUNNING
    return run, ReviewItem.objects.get(candidate__run=run)


@pytest.fixture
def held() -> tuple[Run, ReviewItem]:
    return held_at_first_flag()


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob")


def test_an_approved_candidate_is_evaluated_and_gated_by_the_loop(held: tuple[Run, ReviewItem], alice: User) -> None:
    run, item = held
    decision = review_decide(item=item, user=alice, approve=True, reason="generic enough")
    assert decision.verdict == ReviewDecision.Verdict.APPROVE
    candidate = Candidate.objects.get(pk=item.candidate_id)
    assert candidate.state == Candidate.State.EVALUATING
    drive(run)
    assert Evaluation.objects.filter(candidate=candidate, state=Evaluation.State.CERTIFIED).exists()
    assert GateDecision.objects.filter(run=run, candidate=candidate).exists()


def test_a_rejected_candidate_is_dropped_and_never_evaluated(held: tuple[Run, ReviewItem], alice: User) -> None:
    run, item = held
    review_decide(item=item, user=alice, approve=False, reason="copies a task id")
    drive(run)
    candidate = Candidate.objects.get(pk=item.candidate_id)
    assert candidate.state == Candidate.State.REJECTED_REVIEW
    assert not Evaluation.objects.filter(candidate=candidate).exists()
    assert not GateDecision.objects.filter(candidate=candidate).exists()


def test_a_held_candidate_blocks_nothing_else(held: tuple[Run, ReviewItem]) -> None:
    run, item = held
    finished = drive(run)
    assert finished.status == Run.Status.FINISHED
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED


def test_one_decision_per_item_and_the_second_reviewer_is_told(
    held: tuple[Run, ReviewItem], alice: User, bob: User
) -> None:
    _, item = held
    review_claim(item=item, user=alice)
    with pytest.raises(ReviewConflict, match="already claimed by alice"):
        review_claim(item=item, user=bob)
    with pytest.raises(ReviewConflict, match="claimed by alice"):
        review_decide(item=item, user=bob, approve=True, reason="looks fine")
    review_decide(item=item, user=alice, approve=False, reason="leaks an id")
    with pytest.raises(ReviewConflict, match="already decided"):
        review_decide(item=item, user=alice, approve=True, reason="changed my mind")
    assert ReviewDecision.objects.filter(item=item).count() == 1


def test_a_reason_is_required(held: tuple[Run, ReviewItem], alice: User) -> None:
    _, item = held
    with pytest.raises(ReviewError, match="reason is required"):
        review_decide(item=item, user=alice, approve=False, reason="  ")
    assert not ReviewDecision.objects.exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED


def test_approving_after_the_run_was_cancelled_evaluates_the_candidate_for_a_late_gate(
    held: tuple[Run, ReviewItem], alice: User
) -> None:
    run, item = held
    lifecycle.run_cancel(run=run)
    review_decide(item=item, user=alice, approve=True, reason="generic")
    # Its run is over: it is evaluated for that run, which gates it against its parent (test_late_decisions.py).
    evaluation = Evaluation.objects.get(candidate_id=item.candidate_id)
    assert (evaluation.run_id, evaluation.purpose) == (run.pk, Evaluation.Purpose.CANDIDATE)
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.EVALUATING


# --- Rejecting some edits and keeping the rest -----------------------------------


@operators.register("proposal", "review-test-copy")
def copy_proposer(view: operators.ProposerView) -> operators.Proposal:
    """Slot 0: a leaky edit plus the very note tiny-test's slot 1 adds, so
    that without the leak the candidate duplicates slot 1's."""
    if view.slot != 0:
        return tiny_proposer(view)
    failing = sorted({e.task_id for e in view.evidence if not e.passed})
    files = dict(view.parent_files)
    files[f"answers/{failing[0]}.txt"] = b"no\n"
    files[f"notes/round{view.round}.md"] = f"Check the answer twice (round {view.round}).\n".encode()
    return operators.Proposal(
        files=files,
        edits=[
            operators.EditDeclaration("memory", "A hard-coded answer.", [f"answers/{failing[0]}.txt"]),
            operators.EditDeclaration("memory", "A reminder.", [f"notes/round{view.round}.md"]),
        ],
    )


def held_by(proposer: str) -> tuple[Run, ReviewItem]:
    run = drive(start("rrsi", proposal={"operator": proposer}), until=first_flagged)
    assert run.status == Run.Status.RUNNING
    return run, ReviewItem.objects.get(candidate__run=run, candidate__label__endswith="s0")


@pytest.fixture
def mixed() -> tuple[Run, ReviewItem]:
    return held_by("review-test-mixed")


def files_of(candidate: Candidate) -> dict[str, bytes]:
    return {entry.path: entry.data for entry in tree_entries(tree=candidate.tree)}


def nothing_written(item: ReviewItem, candidates_before: int) -> None:
    item.refresh_from_db()
    assert item.state == ReviewItem.State.OPEN
    assert not ReviewDecision.objects.filter(item=item).exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED
    assert Candidate.objects.count() == candidates_before
    assert not Candidate.objects.filter(origin=Candidate.Origin.DERIVED).exists()


def test_rejecting_the_leaky_edits_derives_a_clean_candidate_that_the_loop_evaluates_and_gates(
    mixed: tuple[Run, ReviewItem], alice: User
) -> None:
    run, item = mixed
    flagged = item.candidate
    leaky = list(flagged.edits.filter(paths__0__startswith="answers/").order_by("index"))
    generic = flagged.edits.get(paths=["notes/generic.md"])
    assert len(leaky) == 2 and LeakageFlag.objects.filter(candidate=flagged, edit__in=leaky).exists()

    review_claim(item=item, user=alice)
    decision = review_decide_partial(
        item=item, user=alice, rejected_edits=[e.pk for e in leaky], reason="the answers are hard-coded"
    )

    item.refresh_from_db()
    flagged.refresh_from_db()
    derived = decision.derived_candidate
    assert derived is not None
    assert item.state == ReviewItem.State.PARTIAL
    assert decision.verdict == ReviewDecision.Verdict.REJECT_EDITS
    assert decision.reviewer == alice and decision.reason == "the answers are hard-coded"
    assert set(decision.rejected_edits.all()) == set(leaky)
    assert flagged.state == Candidate.State.REJECTED_REVIEW
    assert derived.origin == Candidate.Origin.DERIVED
    assert (derived.parent_id, derived.run_id, derived.round) == (flagged.parent_id, run.pk, flagged.round)
    # The tree: the parent's files plus the kept note, none of the rejected answers.
    assert flagged.parent is not None
    parent_files = files_of(flagged.parent)
    assert files_of(derived) == {**parent_files, "notes/generic.md": GENERIC_NOTE}
    assert not any(path.startswith("answers/") for path in files_of(derived))
    assert [(e.component, e.hypothesis, e.paths) for e in derived.edits.all()] == [
        (generic.component, generic.hypothesis, generic.paths)
    ]
    # The critic ran again and found nothing; the evaluation started at once.
    assert not LeakageFlag.objects.filter(candidate=derived).exists()
    assert derived.state == Candidate.State.EVALUATING

    finished = drive(run)
    assert finished.status == Run.Status.FINISHED, finished.error
    derived.refresh_from_db()
    assert Evaluation.objects.filter(candidate=derived, state=Evaluation.State.CERTIFIED).exists()
    gate = GateDecision.objects.get(run=run, candidate=derived)
    assert derived.state == (Candidate.State.ACCEPTED if gate.accepted else Candidate.State.REJECTED_GATE)
    assert LedgerEntry.objects.filter(candidate=derived, hypothesis=generic.hypothesis).count() == 1
    assert not Evaluation.objects.filter(candidate=flagged).exists()


def test_a_derived_candidate_that_still_leaks_is_flagged_again_and_waits_for_review(
    mixed: tuple[Run, ReviewItem], alice: User
) -> None:
    run, item = mixed
    first_leak = item.candidate.edits.get(index=0)
    decision = review_decide_partial(item=item, user=alice, rejected_edits=[first_leak.pk], reason="one leak")
    derived = decision.derived_candidate
    assert derived is not None
    assert derived.state == Candidate.State.FLAGGED
    assert derived.origin == Candidate.Origin.DERIVED
    assert set(files_of(derived)) >= {"notes/generic.md", item.candidate.edits.get(index=1).paths[0]}
    assert first_leak.paths[0] not in files_of(derived)
    flags = LeakageFlag.objects.filter(candidate=derived)
    assert flags.exists() and {f.path for f in flags} == {item.candidate.edits.get(index=1).paths[0]}
    again = ReviewItem.objects.get(candidate=derived)
    assert again.state == ReviewItem.State.OPEN
    assert not Evaluation.objects.filter(candidate=derived).exists()
    # The new item is reviewed like any other: approve the rest.
    second = derived.edits.get(paths=[item.candidate.edits.get(index=1).paths[0]])
    final = review_decide_partial(item=again, user=alice, rejected_edits=[second.pk], reason="the other leak")
    assert final.derived_candidate is not None
    assert final.derived_candidate.state == Candidate.State.EVALUATING
    assert final.derived_candidate is not None
    assert item.candidate is not None
    assert final.derived_candidate.parent_id == item.candidate.parent_id


def test_a_derived_candidate_is_checked_by_the_critic_and_evaluated_even_when_the_run_is_over(
    mixed: tuple[Run, ReviewItem], alice: User
) -> None:
    run, item = mixed
    lifecycle.run_cancel(run=run)
    leaky = item.candidate.edits.filter(paths__0__startswith="answers/")
    decision = review_decide_partial(item=item, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks")
    derived = decision.derived_candidate
    assert derived is not None
    assert not LeakageFlag.objects.filter(candidate=derived).exists()
    assert derived.state == Candidate.State.EVALUATING
    assert Evaluation.objects.get(candidate=derived).run_id == run.pk


def test_partial_decisions_need_a_reason_and_a_proper_selection(mixed: tuple[Run, ReviewItem], alice: User) -> None:
    run, item = mixed
    before = Candidate.objects.count()
    edits = list(item.candidate.edits.order_by("index"))
    other = AtomicEdit.objects.exclude(candidate=item.candidate).first()
    assert other is not None
    cases: list[tuple[dict[str, Any], str]] = [
        ({"rejected_edits": [edits[0].pk], "reason": " "}, "reason is required"),
        ({"rejected_edits": [], "reason": "leaks"}, "select at least one"),
        ({"rejected_edits": [e.pk for e in edits], "reason": "leaks"}, "reject the whole candidate"),
        ({"rejected_edits": [other.pk], "reason": "leaks"}, f"not atomic edits of candidate {item.candidate_id}"),
        ({"rejected_edits": ["x"], "reason": "leaks"}, "not edit ids"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ReviewError, match=message):
            review_decide_partial(item=item, user=alice, **kwargs)
        nothing_written(item, before)


def test_a_path_shared_by_a_rejected_and_a_kept_edit_is_refused_and_nothing_is_written(
    mixed: tuple[Run, ReviewItem], alice: User
) -> None:
    _, item = mixed
    before = Candidate.objects.count()
    first, _, generic = item.candidate.edits.order_by("index")
    AtomicEdit.objects.filter(pk=generic.pk).update(paths=["notes/generic.md", first.paths[0]])
    with pytest.raises(ReviewError, match=f"{first.paths[0]} is changed by both a rejected and a kept edit"):
        review_decide_partial(item=item, user=alice, rejected_edits=[first.pk], reason="leaks")
    nothing_written(item, before)


def test_a_derived_tree_identical_to_an_existing_candidate_is_refused(alice: User) -> None:
    run, item = held_by("review-test-copy")
    before = Candidate.objects.count()
    twin = Candidate.objects.get(run=run, round=item.candidate.round, label__endswith="s1")
    leak = item.candidate.edits.get(index=0)
    with pytest.raises(ReviewError, match=f"identical to candidate {twin.pk}"):
        review_decide_partial(item=item, user=alice, rejected_edits=[leak.pk], reason="leaks")
    nothing_written(item, before)


def test_a_partial_decision_is_one_decision_and_conflicts_like_the_others(
    mixed: tuple[Run, ReviewItem], alice: User, bob: User
) -> None:
    _, item = mixed
    leak = item.candidate.edits.get(index=0)
    review_claim(item=item, user=alice)
    with pytest.raises(ReviewConflict, match="claimed by alice"):
        review_decide_partial(item=item, user=bob, rejected_edits=[leak.pk], reason="mine")
    review_decide_partial(item=item, user=alice, rejected_edits=[leak.pk], reason="leaks")
    with pytest.raises(ReviewConflict, match="already decided"):
        review_decide_partial(item=item, user=alice, rejected_edits=[leak.pk], reason="again")
    with pytest.raises(ReviewConflict, match="already decided"):
        review_decide(item=item, user=alice, approve=True, reason="again")
    assert ReviewDecision.objects.filter(item=item).count() == 1
    assert Candidate.objects.filter(origin=Candidate.Origin.DERIVED).count() == 1


def test_a_claim_can_be_released_by_its_owner_only(held: tuple[Run, ReviewItem], alice: User, bob: User) -> None:
    _, item = held
    review_claim(item=item, user=alice)
    with pytest.raises(ReviewConflict, match="only the reviewer who claimed it"):
        review_release(item=item, user=bob)
    released = review_release(item=item, user=alice)
    assert (released.state, released.claimed_by_id) == (ReviewItem.State.OPEN, None)
    assert review_claim(item=item, user=bob).claimed_by == bob


def test_derive_files_restores_the_parent_content_of_rejected_paths() -> None:
    parent = [
        FileEntry("a.txt", "100644", b"a0"),
        FileEntry("b.txt", "100755", b"b0"),
        FileEntry("gone.txt", "100644", b"g"),
    ]
    flagged = [
        FileEntry("a.txt", "100644", b"a1"),
        FileEntry("b.txt", "100755", b"b1"),
        FileEntry("new.txt", "100644", b"n"),
    ]
    derived = derive_files(
        parent=parent, flagged=flagged, rejected_paths=["b.txt", "new.txt", "gone.txt"], kept_paths=["a.txt"]
    )
    assert derived == [
        FileEntry("a.txt", "100644", b"a1"),
        FileEntry("b.txt", "100755", b"b0"),
        FileEntry("gone.txt", "100644", b"g"),
    ]
    with pytest.raises(ReviewError, match="a.txt is changed by both"):
        derive_files(parent=parent, flagged=flagged, rejected_paths=["a.txt"], kept_paths=["a.txt", "b.txt"])


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_deciding_at_once_make_one_decision_on_postgresql(postgres: None) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    seed = seed_of(experiment)
    tree = tree_store(entries=[*tree_entries(tree=seed.tree), FileEntry("notes/race.md", "100644", b"race\n")])
    candidate = Candidate.objects.create(
        experiment=experiment, parent=seed, tree=tree, origin=Candidate.Origin.PROPOSED, state=Candidate.State.FLAGGED
    )
    item = ReviewItem.objects.create(candidate=candidate)
    reviewers = [User.objects.create_user("alice"), User.objects.create_user("bob")]
    start_together = threading.Barrier(len(reviewers))
    outcomes: list[str] = []

    def decide(user: User, approve: bool) -> None:
        try:
            start_together.wait(timeout=10)
            review_decide(item=item, user=user, approve=approve, reason=f"{user} decides")
            outcomes.append("decided")
        except ReviewConflict as exc:
            outcomes.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(user, n == 0)) for n, user in enumerate(reviewers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(outcomes) == 2 and outcomes.count("decided") == 1
    loser = next(text for text in outcomes if text != "decided")
    assert loser.startswith("this item was already decided (")
    decision = ReviewDecision.objects.get(item=item)
    candidate.refresh_from_db()
    expected = Candidate.State.APPROVED if decision.verdict == ReviewDecision.Verdict.APPROVE else "rejected_review"
    assert candidate.state == expected
