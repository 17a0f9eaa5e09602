"""Grow an experiment for scale tests: many more candidates, trials and steps.

Rows are written in bulk, shaped like the loop's (edits, certified-state
evaluations with one trial per task on every split, gate decisions, ledger
entries, flags held for review), so that a page's query count can be
compared between the small example world and a much larger one.
"""

from __future__ import annotations

from django.utils import timezone

from evolution.models import (
    AtomicEdit,
    Candidate,
    Evaluation,
    Experiment,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    ReviewItem,
    SplitMembership,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from evolution.services.snapshots import tree_entries, tree_store
from evolution.trees import FileEntry
from tests.factories import seed_of

STATES = (Candidate.State.REJECTED_GATE, Candidate.State.FLAGGED, Candidate.State.REJECTED_SURFACE)


def grow(experiment: Experiment, *, candidates: int = 40, steps: int = 0) -> None:
    """Add ``candidates`` candidates (children of the seed, rounds after the
    run's last) with their rows; with ``steps``, one more trial of the last
    candidate carries a trajectory of that many steps."""
    seed = seed_of(experiment)
    run = experiment.runs.order_by("-pk").first()
    seed_files = tree_entries(tree=seed.tree)
    memberships = list(SplitMembership.objects.filter(experiment=experiment).values_list("task_id", "split"))
    first_round = (run.rounds if run else 0) + 1
    now = timezone.now()
    last = None
    for number in range(candidates):
        tree = tree_store(
            entries=[*seed_files, FileEntry(f"notes/grow-{number}.md", "100644", f"note {number}\n".encode())]
        )
        state = STATES[number % len(STATES)]
        candidate = Candidate.objects.create(
            experiment=experiment,
            run=run,
            parent=seed,
            tree=tree,
            origin=Candidate.Origin.PROPOSED,
            state=state,
            round=first_round + number // 5,
            label=f"grown {number}",
        )
        edit = AtomicEdit.objects.create(
            candidate=candidate,
            index=0,
            component="memory",
            hypothesis=f"A note about case {number} helps.",
            paths=[f"notes/grow-{number}.md"],
            diff=f"+note {number}\n",
        )
        evaluation = Evaluation.objects.create(
            experiment=experiment,
            candidate=candidate,
            run=run,
            splits=sorted({split for _, split in memberships}),
            k=1,
            state=Evaluation.State.CERTIFIED,
            trials_total=len(memberships),
            trials_finished=len(memberships),
            finished_at=now,
        )
        Trial.objects.bulk_create(
            Trial(
                evaluation=evaluation,
                candidate=candidate,
                task_id=task_id,
                split=split,
                index=0,
                state=Trial.State.DONE,
                outcome=Trial.Outcome.PASS if (task_id + number) % 3 else Trial.Outcome.FAIL,
                score=1.0 if (task_id + number) % 3 else 0.0,
                tokens=100 + number,
                steps=3,
                wall_time=0.1,
                valid_output=True,
                submitted=True,
                finished_at=now,
            )
            for task_id, split in memberships
        )
        assert candidate.round is not None
        if run is not None:
            GateDecision.objects.create(
                run=run,
                candidate=candidate,
                current=seed,
                round=candidate.round,
                accepted=False,
                rule="score",
                explanation="no gain beyond the noise band",
                numbers={"dS": 0.0, "dC": 0.01},
            )
            LedgerEntry.objects.create(
                run=run,
                edit=edit,
                candidate=candidate,
                round=candidate.round,
                component="memory",
                hypothesis=edit.hypothesis,
                delta_score=0.0,
                delta_cost=0.01,
                accepted=False,
            )
        if state == Candidate.State.FLAGGED:
            LeakageFlag.objects.create(
                candidate=candidate,
                edit=edit,
                rule="task-id",
                path=edit.paths[0],
                line=f"note {number}",
                matched=f"{number}",
                task_id=memberships[number % len(memberships)][0],
            )
            ReviewItem.objects.create(candidate=candidate)
        last = (candidate, evaluation)
    if steps and last is not None:
        candidate, evaluation = last
        task_id, split = next((t, s) for t, s in memberships if s == "train")
        trial = Trial.objects.create(
            evaluation=evaluation,
            candidate=candidate,
            task_id=task_id,
            split=split,
            index=1,
            state=Trial.State.DONE,
            outcome=Trial.Outcome.FAIL,
            score=0.0,
            tokens=steps * 10,
            steps=steps,
            finished_at=now,
        )
        trajectory = Trajectory.objects.create(trial=trial, schema_version="ATIF-v1.4", step_count=steps)
        TrajectoryStep.objects.bulk_create(
            (
                TrajectoryStep(
                    trajectory=trajectory,
                    step_id=step_id,
                    source="agent" if step_id % 2 else "user",
                    message=f"step {step_id}",
                    metrics={"prompt_tokens": 5, "completion_tokens": 5},
                )
                for step_id in range(1, steps + 1)
            ),
            batch_size=2000,
        )
