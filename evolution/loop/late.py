"""Decisions that arrive after a run's last gate, and the check that nothing waits with no work scheduled.

A reviewer is rarely fast enough: a run often ends with flagged candidates still waiting. Approving one (or
deriving a clean one from it) afterwards must lead somewhere, so ``candidate_evaluate_late`` evaluates it on the
splits its gate reads: for the next gate of the experiment's live run when there is one (the candidate joins
that run), otherwise for the run that proposed it, whose ``run_advance`` then gates it against its parent with
the loop's own gate (``steps.late_gate`` -> ``steps.gate_decide``). An operator can ask for the same from a
candidate's page or the API, on the gate's splits or on every split.

``stranded_reap`` (called by the lease reaper) finds candidates in a waiting state with nothing scheduled for
them and schedules them, or ends them with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction

from evolution.loop.lifecycle import LIVE, LoopError, run_recipe
from evolution.loop.propose import candidate_evaluate
from evolution.loop.steps import transfer_splits
from evolution.measurements import COUNTED_PURPOSES
from evolution.measurements import UNFINISHED_EVALUATIONS as UNFINISHED
from evolution.models import Candidate, Evaluation, Run, Trial
from evolution.recipes import Recipe as RecipeSpec
from evolution.services import evaluation as evaluation_services
from evolution.services.candidates import candidates_transition
from evolution.services.records import review_missing

__all__ = ["SCOPES", "LateError", "LateOutcome", "candidate_evaluate_late", "gating_run", "stranded_reap"]

logger = logging.getLogger(__name__)

# "gate": the splits the gate reads (the recipe's evolve splits); "all": those and the transfer splits.
SCOPES = ("gate", "all")
# States from which a candidate can still be measured (the others wait for a person, or are over).
MEASURABLE = (
    Candidate.State.APPROVED,
    Candidate.State.CERTIFIED,
    Candidate.State.ACCEPTED,
    Candidate.State.REJECTED_GATE,
)
NOT_YET: dict[str, str] = {
    Candidate.State.FROZEN: "it waits for the critic",
    Candidate.State.FLAGGED: "it waits for a reviewer: approve it (or derive a clean candidate) first",
}


class LateError(ValueError):
    """The candidate cannot be evaluated now; the message says why."""


@dataclass(frozen=True)
class LateOutcome:
    """What ``candidate_evaluate_late`` set in motion, in words for the page and the API."""

    message: str
    run_id: int | None  # the run whose gate decides it (None: already decided, only measured further)
    joined: bool  # True: it joins a live run's next gate; False: its own ended run gates it
    evaluations: list[int] = field(default_factory=list)


def live_run(experiment_id: int) -> Run | None:
    """The experiment's run that still gates (running or paused), if any: one at most."""
    return Run.objects.filter(experiment_id=experiment_id, status__in=LIVE).order_by("-pk").first()


def gating_run(candidate: Candidate) -> Run | None:
    """The run whose gate decides ``candidate``: the run of its latest candidate evaluation, else its own."""
    latest = (
        Evaluation.objects.filter(candidate=candidate, purpose=Evaluation.Purpose.CANDIDATE, run__isnull=False)
        .order_by("-pk")
        .values_list("run_id", flat=True)
        .first()
    )
    run_id = latest or candidate.run_id
    return Run.objects.filter(pk=run_id).first() if run_id is not None else None


def _measured_splits(candidate: Candidate, purposes: Sequence[str]) -> set[str]:
    """Splits with trials of ``candidate`` certified or under way, in evaluations of ``purposes``."""
    return set(
        Trial.objects.filter(
            candidate=candidate,
            evaluation__purpose__in=purposes,
            evaluation__state__in=(*UNFINISHED, Evaluation.State.CERTIFIED),
        )
        .values_list("split", flat=True)
        .distinct()
    )


def _start(candidate: Candidate, run: Run, recipe: RecipeSpec, splits: list[str], purpose: str) -> Evaluation:
    return evaluation_services.evaluation_start(
        candidate=candidate,
        splits=splits,
        k=recipe.evaluation.trials_per_task,
        purpose=purpose,
        seed=recipe.seed,
        run=run,
    )


def _transfer_allowed(run: Run, recipe: RecipeSpec, scope: str) -> None:
    """Refuse "all" when the recipe never runs sealed and held-out tasks and the experiment has some."""
    if scope == "all" and recipe.evaluation.sealed == "never" and transfer_splits(run):
        raise LateError(
            f"run {run.pk}'s recipe says evaluation.sealed: never: its sealed and held-out tasks are not run "
            "(evaluate on the gate's splits)"
        )


def _advance_after_commit(run_id: int) -> None:
    from evolution.loop.enqueue import advance_after_commit

    advance_after_commit(run_id)


def candidate_evaluate_late(*, candidate_id: int, scope: str = "gate") -> LateOutcome:
    """Evaluate a candidate on the splits its gate reads (``scope`` "gate") or on every split ("all"), and see
    that a gate decides it if none has.

    An approved candidate is evaluated for the experiment's live run when there is one (it joins that run's
    next gate), else for its own run, which gates it against its parent once certified. A certified candidate
    no gate has decided gets its gate (and, with "all", its transfer splits). A decided candidate (or the seed)
    is measured on the splits it has no trials on yet; nothing is repeated. Raises ``LateError`` when the
    candidate cannot be evaluated (it waits for the critic or a reviewer, has critic flags and no certified review
    decision approving it, was rejected before any measurement, failed, or there is nothing left to measure; with
    "all", when the recipe says ``evaluation.sealed: never``). Safe to repeat: a second call finds the work under way.
    """
    if scope not in SCOPES:
        raise LateError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    with transaction.atomic():
        candidate = Candidate.objects.select_for_update(no_key=True).get(pk=candidate_id)
        if candidate.state in NOT_YET:
            raise LateError(f"candidate {candidate.pk} is not evaluated: {NOT_YET[candidate.state]}")
        if candidate.state == Candidate.State.EVALUATING or candidate.state == Candidate.State.EVALUATED:
            raise LateError(f"candidate {candidate.pk} is being evaluated already")
        if candidate.state not in MEASURABLE:
            raise LateError(f"candidate {candidate.pk} is {candidate.get_state_display().lower()}: it is not evaluated")
        missing = review_missing(candidate_id=candidate.pk)
        if missing:
            # A state edited to "approved" is no review: the gate would certify a candidate nobody cleared.
            raise LateError(f"candidate {candidate.pk} is not evaluated: {missing}")
        if candidate.state == Candidate.State.APPROVED:
            return _evaluate_approved(candidate, scope)
        return _evaluate_measured(candidate, scope)


def _evaluate_approved(candidate: Candidate, scope: str) -> LateOutcome:
    live = live_run(candidate.experiment_id)
    run = live or (Run.objects.filter(pk=candidate.run_id).first() if candidate.run_id else None)
    if run is None:
        raise LateError(f"candidate {candidate.pk} belongs to no run and the experiment has no live run to join")
    try:
        recipe = run_recipe(run)
        _transfer_allowed(run, recipe, scope)
        evaluation = candidate_evaluate(run=run, recipe=recipe, candidate=candidate)
        started = [evaluation.pk]
        transfer = [s for s in transfer_splits(run) if s not in evaluation.splits]
        if scope == "all" and transfer:
            started.append(_start(candidate, run, recipe, transfer, Evaluation.Purpose.TRANSFER).pk)
    except (LoopError, evaluation_services.EvaluationError) as exc:
        raise LateError(f"candidate {candidate.pk} cannot be evaluated: {exc}") from exc
    if live is not None:
        message = f"candidate {candidate.pk} is evaluated for run {run.pk} and joins its next gate"
    else:
        message = f"candidate {candidate.pk} is evaluated; run {run.pk} gates it against its parent once certified"
    return LateOutcome(message, run.pk, live is not None, started)


def _evaluate_measured(candidate: Candidate, scope: str) -> LateOutcome:
    gated = candidate.gate_decisions.exists()
    run = gating_run(candidate) or live_run(candidate.experiment_id)
    if run is None:
        run = Run.objects.filter(experiment_id=candidate.experiment_id).order_by("-pk").first()
    if run is None:
        raise LateError("the experiment has no run yet: start one (its baseline measures the seed)")
    recipe = run_recipe(run)
    _transfer_allowed(run, recipe, scope)
    evolve = [s for s in recipe.evaluation.evolve_splits if s not in _measured_splits(candidate, COUNTED_PURPOSES)]
    everywhere = _measured_splits(candidate, [p for p, _ in Evaluation.Purpose.choices])
    transfer = [s for s in transfer_splits(run) if s not in everywhere] if scope == "all" else []
    started: list[int] = []
    try:
        if evolve:
            started.append(_start(candidate, run, recipe, evolve, Evaluation.Purpose.CANDIDATE).pk)
        if transfer:
            started.append(_start(candidate, run, recipe, transfer, Evaluation.Purpose.TRANSFER).pk)
    except evaluation_services.EvaluationError as exc:
        raise LateError(f"candidate {candidate.pk} cannot be evaluated: {exc}") from exc
    measured = ", ".join([*evolve, *transfer])
    if not gated and candidate.state == Candidate.State.CERTIFIED:
        if run.status not in LIVE and not evolve:
            # With a new evaluation of the gate's splits, its certification sends run_advance.
            _advance_after_commit(run.pk)
        what = f"evaluated on {measured}; " if measured else ""
        message = f"candidate {candidate.pk}: {what}run {run.pk} gates it"
        return LateOutcome(message, run.pk, run.status in LIVE, started)
    if not started:
        wanted = "the gate's splits" if scope == "gate" else "every split"
        raise LateError(f"candidate {candidate.pk} has been measured on {wanted} already: nothing to evaluate")
    return LateOutcome(f"candidate {candidate.pk} is evaluated on {measured}", None, False, started)


# --- The reaper's check ---------------------------------------------------------------


def stranded_reap() -> dict[str, int]:
    """Find candidates waiting with nothing scheduled for them and schedule them or end them with a reason:

    - approved, with no evaluation under way: evaluated (``candidate_evaluate_late``), or cancelled with the
      reason it cannot be;
    - evaluating or evaluated, with no evaluation under way (its evaluations were cancelled or failed without
      moving it): cancelled or failed, with the reason;
    - certified, undecided, whose gating run has ended: that run's ``run_advance`` is sent (it gates it late).

    Flagged candidates wait for a person, which is work scheduled. Safe to run at any time: every action is
    conditional or idempotent. Returns counts.
    """
    counts = {"scheduled": 0, "ended": 0, "gates": 0}
    unfinished = Evaluation.objects.filter(state__in=UNFINISHED).values("candidate_id")
    ours = Candidate.objects.exclude(origin__in=[Candidate.Origin.SEED, Candidate.Origin.IMPORTED])
    for candidate_id in (
        ours.filter(state=Candidate.State.APPROVED).exclude(pk__in=unfinished).values_list("pk", flat=True)
    ):
        try:
            candidate_evaluate_late(candidate_id=candidate_id, scope="gate")
            counts["scheduled"] += 1
        except LateError as exc:
            counts["ended"] += candidates_transition(
                candidates=Candidate.objects.filter(pk=candidate_id, state=Candidate.State.APPROVED),
                to=Candidate.State.CANCELLED,
                reason=f"approved, but could not be evaluated: {exc}",
            )
    for candidate in ours.filter(state__in=[Candidate.State.EVALUATING, Candidate.State.EVALUATED]).exclude(
        pk__in=unfinished
    ):
        counts["ended"] += _end_unmeasured(candidate)
    runs: set[int] = set()
    for candidate in ours.filter(state=Candidate.State.CERTIFIED, gate_decisions__isnull=True):
        run = gating_run(candidate)
        if run is not None and run.status not in LIVE:
            runs.add(run.pk)
    for run_id in sorted(runs):
        with transaction.atomic():
            _advance_after_commit(run_id)
    counts["gates"] = len(runs)
    if any(counts.values()):
        logger.info("stranded candidates: %s", counts)
    return counts


def _end_unmeasured(candidate: Candidate) -> int:
    last = Evaluation.objects.filter(candidate=candidate).order_by("-pk").first()
    if last is not None and last.state == Evaluation.State.CANCELLED:
        to, reason = Candidate.State.CANCELLED, f"its evaluation {last.pk} was cancelled"
    else:
        detail = f"evaluation {last.pk} is {last.state}" if last is not None else "it has no evaluation"
        to, reason = Candidate.State.FAILED, f"its evaluation ended without a result ({detail})"
    return candidates_transition(
        candidates=Candidate.objects.filter(pk=candidate.pk, state=candidate.state), to=to, reason=reason
    )
