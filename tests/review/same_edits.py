"""The same edit proposed again on another parent, as a later round or run proposes it: frozen and critiqued by the
loop's own services, so it is flagged and held for review like the first (issue 40, item 4)."""

from __future__ import annotations

import pytest

from evolution import operators
from evolution.loop.lifecycle import run_recipe
from evolution.models import Candidate, Experiment, ReviewItem
from evolution.services import proposals
from evolution.services.snapshots import tree_entries


def single_edit_items(experiment: Experiment) -> list[ReviewItem]:
    """Open review items whose candidate declares one atomic edit, oldest first."""
    items = ReviewItem.objects.filter(candidate__experiment=experiment, state=ReviewItem.State.OPEN).order_by("pk")
    return [item for item in items if item.candidate.edits.count() == 1]


def propose_again(item: ReviewItem, *, used: set[int] | None = None) -> ReviewItem:
    """The item's one edit proposed on another parent (an accepted candidate, or the seed, whose files at the
    edit's paths equal the first parent's, so the edit's diff is the same), frozen and critiqued by the loop's
    services with the run's recipe; returns the new candidate's review item. ``used``: parents not to take."""
    flagged = item.candidate
    edit = flagged.edits.get()
    assert flagged.parent is not None and flagged.run is not None
    first_parent = {e.path: e for e in tree_entries(tree=flagged.parent.tree)}
    flagged_files = {e.path: e for e in tree_entries(tree=flagged.tree)}
    taken = {flagged.parent_id, *(used or set())}
    for parent in Candidate.objects.filter(
        experiment=flagged.experiment, state__in=[Candidate.State.ACCEPTED, Candidate.State.REJECTED_GATE]
    ).order_by("pk"):
        if parent.pk in taken:
            continue
        files = {e.path: e for e in tree_entries(tree=parent.tree)}
        if any(
            (files[p].data if p in files else None) != (first_parent[p].data if p in first_parent else None)
            for p in edit.paths
        ):
            continue  # the edit would have another diff against this parent
        for path in edit.paths:
            if path in flagged_files:
                files[path] = flagged_files[path]
            else:
                files.pop(path, None)
        proposal = operators.Proposal(
            files={path: entry.data for path, entry in files.items()},
            edits=[operators.EditDeclaration(edit.component, edit.hypothesis, list(edit.paths))],
        )
        run = flagged.run
        outcome = proposals.candidate_freeze(
            run=run,
            parent=parent,
            proposal=proposal,
            round=flagged.round or 0,
            slot=90 + parent.pk % 9,
            edit_budget=None,
            label=f"same edit on #{parent.pk}",
        )
        if outcome.candidate is None:
            continue  # a tree the experiment has already
        recipe = run_recipe(run)
        proposals.candidate_critique(run=run, candidate=outcome.candidate, policy=recipe.critique.leakage_policy)
        again = ReviewItem.objects.filter(candidate=outcome.candidate).first()
        assert again is not None, f"the critic did not hold candidate {outcome.candidate.pk} for review"
        assert again.candidate.edits.get().diff == edit.diff
        if used is not None:
            used.add(parent.pk)
        return again
    pytest.fail(f"no other parent gives edit #{edit.index} of candidate {flagged.pk} the same diff")
