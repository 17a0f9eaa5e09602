"""The same edit proposed again on another parent, as a later round or run proposes it: frozen and critiqued by the
loop's own services, so it is flagged and held for review like the first (issue 40, item 4)."""

from __future__ import annotations

import pytest

from evolution import operators
from evolution.loop.lifecycle import run_recipe
from evolution.models import AtomicEdit, Candidate, Experiment, ReviewItem
from evolution.services import proposals
from evolution.services.snapshots import tree_entries


def repeated_item(experiment: Experiment) -> tuple[ReviewItem, ReviewItem]:
    """The oldest open review item with a flagged edit that can be proposed again, alone, on another accepted
    parent with the same diff, and the review item the critic opens for that proposal (``propose_again``)."""
    items = ReviewItem.objects.filter(candidate__experiment=experiment, state=ReviewItem.State.OPEN).order_by("pk")
    for item in items:
        for edit in item.candidate.edits.filter(flags__isnull=False).distinct().order_by("index"):
            again = propose_again(edit)
            if again is not None:
                return item, again
    pytest.fail("no flagged edit of an open review item can be proposed again with the same diff")


def propose_again(edit: AtomicEdit) -> ReviewItem | None:
    """``edit`` proposed alone on another accepted parent whose files at the edit's paths equal its first
    parent's (so its diff is the same), frozen and critiqued by the loop's services with the run's recipe.
    Returns the new candidate's review item; None when no parent gives the same diff or the critic does not
    hold it."""
    flagged = edit.candidate
    assert flagged.parent is not None and flagged.run is not None
    first_parent = {e.path: e for e in tree_entries(tree=flagged.parent.tree)}
    flagged_files = {e.path: e for e in tree_entries(tree=flagged.tree)}
    run = flagged.run
    recipe = run_recipe(run)
    for parent in Candidate.objects.filter(experiment=flagged.experiment, state=Candidate.State.ACCEPTED).order_by(
        "pk"
    ):
        if parent.pk == flagged.parent_id:
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
        try:
            outcome = proposals.candidate_freeze(
                run=run,
                parent=parent,
                proposal=proposal,
                round=flagged.round or 0,
                slot=90 + parent.pk % 9,
                edit_budget=None,
                label=f"edit #{edit.index} of #{flagged.pk} again, on #{parent.pk}",
            )
        except proposals.ProposalRejected:
            continue
        if outcome.candidate is None:
            continue  # a tree the experiment has already
        proposals.candidate_critique(run=run, candidate=outcome.candidate, policy=recipe.critique.leakage_policy)
        again = ReviewItem.objects.filter(candidate=outcome.candidate).first()
        if again is None:
            continue
        assert again.candidate.edits.get().diff == edit.diff
        return again
    return None
