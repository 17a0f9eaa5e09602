"""A run's life: create, pause, resume, cancel; and the recipe a run follows.

Each function changes the run in one transaction and sends ``run_advance`` after commit when there is work;
the state machine itself is ``evolution.loop.steps``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from evolution import example, operators
from evolution.loop.enqueue import advance_after_commit, propose_send
from evolution.loop.state import RunState
from evolution.models import (
    CANDIDATE_IN_FLIGHT,
    RUN_LIVE,
    RUN_UNFINISHED,
    Candidate,
    Evaluation,
    Experiment,
    Recipe,
    Run,
    Trial,
)
from evolution.recipes import PRESET_NAMES, RecipeError, parse_recipe, recipe_digest, recipe_to_dict, run_recipe
from evolution.recipes import Recipe as RecipeSpec
from evolution.services.candidates import candidates_transition

__all__ = [
    "ACTIVE",
    "IN_FLIGHT",
    "LIVE",
    "LoopError",
    "default_proposer",
    "recipe_store",
    "run_candidates",
    "run_cancel",
    "run_create",
    "run_pause",
    "run_recipe",
    "run_resume",
    "run_start",
    "stop_in_flight",
]

ACTIVE = (Run.Status.RUNNING,)
# Runs that still gate what they evaluate (a paused run gates once resumed).
LIVE = RUN_LIVE
IN_FLIGHT = CANDIDATE_IN_FLIGHT


class LoopError(ValueError):
    pass


def recipe_store(*, recipe: RecipeSpec) -> Recipe:
    """The recipe row for this exact recipe (one per digest)."""
    digest = recipe_digest(recipe)
    row, _ = Recipe.objects.get_or_create(
        digest=digest, defaults={"name": recipe.name, "version": recipe.version, "spec": recipe_to_dict(recipe)}
    )
    return row


def check_llm_endpoints(recipe: RecipeSpec) -> None:
    """A run whose proposer or critic is an ``llm`` operator needs its
    endpoint configured now, not a round later."""
    from evolution.llm import LLMConfigError, config_from

    stages = (("proposal", recipe.proposal), ("critique", recipe.critique))
    for stage, spec in stages:
        if spec.operator == "llm" and (stage != "critique" or recipe.critique.enabled):
            try:
                config_from(spec.params)
            except LLMConfigError as exc:
                # Both ways forward, so nobody has to look them up.
                offline = (
                    "run an offline proposer instead (--proposer example on the bundled example, "
                    "the proposer field on the dashboard)"
                    if stage == "proposal"
                    else "use the rules critic instead (critique operator: rules)"
                )
                raise LoopError(
                    f"the llm {stage} operator is not configured ({exc}): configure its endpoint "
                    f"(RSI_LLM_BASE_URL and RSI_LLM_MODEL, or the recipe's {stage} params; docs/llm.md), "
                    f"or {offline}"
                ) from exc


def run_create(
    *,
    experiment: Experiment,
    recipe: RecipeSpec,
    rounds: int | None = None,
    k: int | None = None,
    proposer: str | None = None,
    user: Any = None,
    start: Candidate | None = None,
) -> Run:
    """Create a run of ``recipe`` (with ``rounds``, ``k`` and ``proposer``
    overriding the recipe's) and start it after commit. One active run per
    experiment. The run starts from ``start`` (the seed or an accepted
    candidate of the experiment; by default the experiment's best accepted
    candidate, ``load.best_candidate``, else the seed): its baseline, its
    first parent, and what its gains are measured from."""
    overrides: dict[str, Any] = {}
    if proposer is not None:
        overrides["proposal"] = {"operator": proposer}
    if rounds is not None:
        overrides["rounds"] = rounds
    if k is not None:
        overrides.setdefault("evaluation", {})["trials_per_task"] = k
    if overrides:
        data = recipe_to_dict(recipe)
        for key, value in overrides.items():
            if isinstance(value, dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        if rounds is not None and recipe.rounds == recipe.edit_budget.T:
            data["edit_budget"] = {**data["edit_budget"], "T": rounds}
        recipe = parse_recipe(data, known_operators=operators.known_operators())
    else:
        parse_recipe(recipe_to_dict(recipe), known_operators=operators.known_operators())
    check_llm_endpoints(recipe)
    with transaction.atomic():
        locked = Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
        if Run.objects.filter(experiment=locked, status__in=RUN_UNFINISHED).exists():
            raise LoopError(f"experiment {locked.name!r} has an active run already")
        if locked.seed_candidate_id is None:
            raise LoopError("the experiment has no seed candidate")
        start = _start_candidate(locked, start)
        run = Run.objects.create(
            experiment=locked,
            start_candidate=start,
            recipe=recipe_store(recipe=recipe),
            status=Run.Status.RUNNING,
            rounds=recipe.rounds,
            started_by=user,
            started_at=timezone.now(),
            state=RunState().to_json(),
        )
        Experiment.objects.filter(pk=locked.pk).update(status=Experiment.Status.RUNNING)
        Experiment.objects.filter(pk=locked.pk, recipe__isnull=True).update(recipe=run.recipe)
        advance_after_commit(run.pk)
    return run


def default_proposer(*, experiment: Experiment, recipe: str | RecipeSpec) -> str | None:
    """The proposal operator a run uses when its start names none: on the bundled example a preset (given by
    name) runs with the example's offline proposer (the presets' ``llm`` needs an endpoint, which someone trying
    the presets there should not need); anything else runs with its recipe's own (None)."""
    if isinstance(recipe, str) and recipe in PRESET_NAMES:
        return example.preset_proposer(benchmark=experiment.benchmark.name)
    return None


def run_start(
    *,
    experiment: Experiment,
    recipe: str | RecipeSpec,
    rounds: int | None = None,
    k: int | None = None,
    candidates_per_round: int | None = None,
    proposer: str | None = None,
    start: Candidate | int | None = None,
    user: Any = None,
) -> Run:
    """Start a run: the one way the command, the admin, the dashboard and the API start one. ``recipe`` is a
    spec, or a name (a preset, ``run-<id>`` for an earlier run's recipe, ``own`` for the experiment's;
    ``selectors.recipe_for_start``); with no ``proposer`` the ``default_proposer``; ``start`` a candidate or
    the id of one of the experiment's (default: ``run_create``'s). Every refusal is a LoopError whose
    message is meant for the person starting the run; nothing is created then."""
    from evolution.selectors import recipe_for_start

    try:
        spec = recipe_for_start(name=recipe, experiment=experiment) if isinstance(recipe, str) else recipe
        if candidates_per_round is not None and candidates_per_round != spec.candidates_per_round:
            data = recipe_to_dict(spec)
            data["candidates_per_round"] = candidates_per_round
            spec = parse_recipe(data)
        if isinstance(start, int):
            found = Candidate.objects.filter(pk=start, experiment=experiment).first()
            if found is None:
                raise LoopError(f"no candidate #{start} in this experiment")
            start = found
        return run_create(
            experiment=experiment,
            recipe=spec,
            rounds=rounds,
            k=k,
            proposer=proposer or default_proposer(experiment=experiment, recipe=recipe),
            user=user,
            start=start,
        )
    except RecipeError as exc:
        raise LoopError(str(exc)) from exc


def _start_candidate(experiment: Experiment, start: Candidate | None) -> Candidate:
    """The candidate a new run starts from; LoopError when ``start`` cannot be one."""
    from evolution.loop.load import best_candidate

    if start is None:
        chosen = best_candidate(experiment) or experiment.seed_candidate
        assert chosen is not None  # the caller checked the seed
        return chosen
    start = Candidate.objects.get(pk=start.pk)
    if start.experiment_id != experiment.pk:
        raise LoopError(f"candidate {start.pk} belongs to another experiment")
    if start.pk != experiment.seed_candidate_id and start.state != Candidate.State.ACCEPTED:
        raise LoopError(
            f"candidate {start.pk} is {start.get_state_display().lower()}: a run starts from the seed or from an "
            "accepted candidate"
        )
    return start


def run_pause(*, run: Run, reason: str = "") -> bool:
    """Pause a running run; ``reason`` (when the platform pauses it, not a person) is kept as a "pause" event
    the dashboard shows."""
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(status=Run.Status.PAUSED)
        if updated:
            Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.PAUSED)
            if reason:
                locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
                state = RunState.of(locked)
                state.event(locked.current_round, "pause", f"paused: {reason}")
                state.save(locked)
                locked.save(update_fields=["state"])
    return bool(updated)


def run_resume(*, run: Run) -> bool:
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status=Run.Status.PAUSED).update(status=Run.Status.RUNNING)
        if updated:
            Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.RUNNING)
            _resend_proposals(run.pk)
            advance_after_commit(run.pk)
    return bool(updated)


def _resend_proposals(run_id: int) -> None:
    """A run paused while proposing: round_propose stopped between slots and
    nothing sends it again before the lease (the proposing step), so resuming
    sends it now. Filling slots is idempotent; a round_propose still finishing
    its slot keeps or drops that slot under the run's lock."""
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    state = RunState.of(run)
    if state.phase == "proposing":
        propose_send(run, state)


def run_cancel(*, run: Run, reason: str = "cancelled") -> bool:
    """Stop a run: its unfinished evaluations are cancelled (their trials are
    never claimed again) and in-flight candidates are marked cancelled."""
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status__in=RUN_UNFINISHED).update(
            status=Run.Status.CANCELLED, stop_reason=reason, finished_at=timezone.now()
        )
        if updated:
            stop_in_flight(run.pk)
            Experiment.objects.filter(pk=run.experiment_id).update(status=_status_after_cancel(run))
    return bool(updated)


def _status_after_cancel(run: Run) -> str:
    """The experiment's status once ``run`` is cancelled: Finished when another of its runs finished (a run
    cancelled on top of finished ones does not undo them), else Cancelled."""
    finished = Run.objects.filter(experiment_id=run.experiment_id, status=Run.Status.FINISHED).exclude(pk=run.pk)
    return Experiment.Status.FINISHED if finished.exists() else Experiment.Status.CANCELLED


def run_candidates(run_id: int) -> QuerySet[Candidate]:
    """The candidates a run gates: the ones it proposed, and the ones that joined it (a candidate of an ended run
    approved later is evaluated for the live run's next gate, ``evolution.loop.late``)."""
    joined = Evaluation.objects.filter(run_id=run_id, purpose=Evaluation.Purpose.CANDIDATE).values("candidate_id")
    return Candidate.objects.filter(Q(run_id=run_id) | Q(pk__in=joined))


def stop_in_flight(run_id: int) -> None:
    """Cancel the run's unfinished evaluations, their unclaimed or running trials, and its in-flight candidates."""
    Evaluation.objects.filter(run_id=run_id, state=Evaluation.State.RUNNING).update(state=Evaluation.State.CANCELLED)
    # The state checked on the trial's own row (no join: see trial_claim), so a
    # trial finished meanwhile is not overwritten as cancelled.
    in_run = Evaluation.objects.filter(run_id=run_id).values("pk")
    Trial.objects.filter(evaluation_id__in=in_run, state__in=[Trial.State.PENDING, Trial.State.RUNNING]).update(
        state=Trial.State.CANCELLED
    )
    candidates_transition(
        candidates=run_candidates(run_id).filter(state__in=IN_FLIGHT + (Candidate.State.FROZEN,)),
        to=Candidate.State.CANCELLED,
        reason="run stopped",
    )
