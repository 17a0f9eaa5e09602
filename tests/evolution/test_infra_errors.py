"""Failures of the platform are never scores (issue 18, item 3).

An evaluation in which more trials than the recipe allows (``evaluation.max_infra_error_rate``, 10% by
default) ended in infrastructure errors (the sandbox or the grader failed) is not certified: the evaluation and
the candidate are failed with the errors' kinds and counts, a run evaluating a candidate pauses with that
message, and nothing reads the evaluation as S = 0. An agent that crashes failed its task: that is a score.
Real subprocesses: the tiny evaluator's agent and a verifier that fails.
"""

from __future__ import annotations

import pytest

from evolution.loop import certify as loop_certify
from evolution.loop import lifecycle, load
from evolution.loop.state import RunState
from evolution.models import Candidate, CertifiedResult, Evaluation, Experiment, Run, Trial
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from evolution.services import evaluation as evaluation_services
from evolution.services import records as record_services
from evolution.services.experiments import evaluator_upsert
from tests.factories import (
    TINY_AGENT,
    TINY_VERIFIER,
    make_tiny_experiment,
    run_evaluation_inline,
    seed_of,
    tiny_evaluator_tree,
)

pytestmark = pytest.mark.django_db

# The agent of the tiny evaluator, which also names its task in its output for the grader below.
NAMING_AGENT = TINY_AGENT + "(out / 'task.txt').write_text(task_id)\n"


def crashing_verifier(crash: set[int]) -> str:
    """The tiny verifier, crashing on the tasks whose number is in ``crash`` (t00 is 0, t01 is 1, ...)."""
    return (
        "import pathlib, sys\n"
        "args = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n"
        f"CRASH = {sorted(crash)!r}\n"
        "if int((pathlib.Path(args['--output']) / 'task.txt').read_text()[1:]) in CRASH:\n"
        "    sys.exit('grader: database unreachable')\n"
    ) + TINY_VERIFIER


def with_evaluator(experiment: Experiment, *, agent: str = NAMING_AGENT, verifier: str = TINY_VERIFIER) -> Experiment:
    evaluator = evaluator_upsert(
        name=f"{experiment.evaluator.name}-variant-{abs(hash((agent, verifier))) % 10**8}",
        files=tiny_evaluator_tree(agent=agent, verifier=verifier),
        runner_argv=experiment.evaluator.runner_argv,
        verifier_argv=experiment.evaluator.verifier_argv,
        env_allowlist=["PATH"],
        timeout_seconds=30,
    )
    Experiment.objects.filter(pk=experiment.pk).update(evaluator=evaluator)
    experiment.refresh_from_db()
    return experiment


def evaluate(
    experiment: Experiment, *, run: Run | None = None, purpose: str = Evaluation.Purpose.BASELINE
) -> Evaluation:
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train", "gate"], purpose=purpose, run=run
    )
    run_evaluation_inline(evaluation)
    return evaluation


def test_an_evaluation_the_grader_failed_is_not_certified_as_a_score() -> None:
    experiment = with_evaluator(make_tiny_experiment(tasks=8, k=2), verifier=crashing_verifier(set(range(8))))
    evaluation = evaluate(experiment)
    assert evaluation.state == Evaluation.State.FAILED
    total = Trial.objects.filter(evaluation=evaluation).count()
    assert total > 0
    assert evaluation.error == (
        f"not a score: {total} of {total} trials (100%) ended in infrastructure errors (verifier_crash {total}), "
        "more than the 10% the recipe allows (evaluation.max_infra_error_rate)"
    )
    assert not CertifiedResult.objects.filter(evaluation=evaluation).exists()
    seed = Candidate.objects.get(pk=evaluation.candidate_id)
    assert seed.state == Candidate.State.FAILED and seed.state_reason == evaluation.error
    # Nothing reads it as S = 0: the measurement finds no trial at all.
    assert load.candidate_stats(seed, ["train", "gate"], "pass_at_1") is None


def test_a_few_infrastructure_errors_within_the_recipes_share_still_certify() -> None:
    # One task of eight crashes the grader: 2 of 12 train+gate trials is ~17%, above 10%; one of a bigger set
    # is not. With the default split ratios train+gate hold 6 tasks of 8.
    experiment = make_tiny_experiment(tasks=8, k=2)
    gate_tasks = sorted(
        int(m.task.external_id[1:]) for m in experiment.split_memberships.filter(split__in=["train", "gate"])
    )
    with_evaluator(experiment, verifier=crashing_verifier({gate_tasks[0]}))
    evaluation = evaluate(experiment)
    errors = Trial.objects.filter(evaluation=evaluation, error_kind="verifier_crash").count()
    total = Trial.objects.filter(evaluation=evaluation).count()
    assert (errors, total) == (2, 12)
    assert evaluation.state == Evaluation.State.FAILED
    assert "2 of 12 trials (17%)" in evaluation.error

    lenient = make_tiny_experiment(tasks=8, k=2, like=experiment, name="lenient")
    recipe = recipe_to_dict(load_preset("rrsi"))
    recipe["evaluation"] = {**recipe["evaluation"], "max_infra_error_rate": 0.2}
    run = lifecycle_run(lenient, recipe)
    evaluation = evaluate(lenient, run=run)
    assert evaluation.state == Evaluation.State.CERTIFIED, evaluation.error


def lifecycle_run(experiment: Experiment, recipe: dict[str, object]) -> Run:
    """A run row of ``recipe`` for ``experiment``, not started (its evaluations are driven here)."""
    return Run.objects.create(
        experiment=experiment,
        recipe=lifecycle.recipe_store(recipe=parse_recipe(recipe)),
        status=Run.Status.RUNNING,
        rounds=1,
        state=RunState(phase="evaluating").to_json(),
    )


def test_an_agent_that_crashes_failed_its_task_which_is_a_score() -> None:
    crashing_agent = "import sys\nsys.exit('the harness broke')\n"
    experiment = with_evaluator(make_tiny_experiment(tasks=8, k=2), agent=crashing_agent)
    evaluation = evaluate(experiment)
    assert evaluation.state == Evaluation.State.CERTIFIED
    assert set(Trial.objects.filter(evaluation=evaluation).values_list("error_kind", flat=True)) == {"agent_crash"}
    stats = load.candidate_stats(Candidate.objects.get(pk=evaluation.candidate_id), ["train", "gate"], "pass_at_1")
    assert stats is not None and stats.score == 0.0


def test_a_run_whose_candidate_evaluation_fails_so_pauses_and_says_why() -> None:
    experiment = with_evaluator(make_tiny_experiment(tasks=8, k=2), verifier=crashing_verifier(set(range(8))))
    run = lifecycle_run(experiment, recipe_to_dict(load_preset("rrsi")))
    evaluation = evaluate(experiment, run=run, purpose=Evaluation.Purpose.CANDIDATE)
    assert evaluation.state == Evaluation.State.FAILED
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED
    events = RunState.of(run).special_events()
    assert [e["kind"] for e in events] == ["pause"]
    assert events[0]["text"] == f"paused: candidate {evaluation.candidate_id}: {evaluation.error}"


def test_certification_reports_infrastructure_errors_and_the_loop_decides_to_pause() -> None:
    experiment = with_evaluator(make_tiny_experiment(tasks=8, k=2), verifier=crashing_verifier(set(range(8))))
    run = lifecycle_run(experiment, recipe_to_dict(load_preset("rrsi")))
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train", "gate"], purpose=Evaluation.Purpose.CANDIDATE, run=run
    )
    for trial_id in Trial.objects.filter(evaluation=evaluation).values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="inline")

    # The service refuses and says why; the run is the loop's business, so it is left running.
    outcome = record_services.evaluation_certify(evaluation_id=evaluation.pk)
    evaluation.refresh_from_db()
    assert evaluation.state == Evaluation.State.FAILED
    assert outcome.record is None
    assert outcome.refused == outcome.infra_errors == evaluation.error
    assert evaluation.error.startswith("not a score: ")
    assert (outcome.run_id, outcome.candidate_id, outcome.purpose) == (run.pk, evaluation.candidate_id, "candidate")
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert RunState.of(run).special_events() == []
    # Asked again (a duplicate message), neither the service nor the loop finds anything changed: no pause.
    assert record_services.evaluation_certify(evaluation_id=evaluation.pk).run_id is None
    assert loop_certify.result_certify(evaluation_id=evaluation.pk) is None
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING

    # The loop's certification of the same refusal pauses the run, in the refusal's transaction.
    Evaluation.objects.filter(pk=evaluation.pk).update(state=Evaluation.State.COMPLETE, error="")
    assert loop_certify.result_certify(evaluation_id=evaluation.pk) is None
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED
    assert [e["text"] for e in RunState.of(run).special_events()] == [
        f"paused: candidate {evaluation.candidate_id}: {Evaluation.objects.get(pk=evaluation.pk).error}"
    ]
