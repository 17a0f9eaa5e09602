"""What the record chain binds, compared field by field (issue 37).

A gate record binds the critic's flags and the review decision a flagged
candidate rests on, so a review skipped by editing a state is refused by the
evaluate path and named by ``verify_records``; stored split totals and
certified evaluations are checked against the records; every field a record
binds (a candidate's parent, the run settings, a run's recipe, the held-out
benchmarks) is compared, in the database and in a bundle, and a bundle's
candidates no record names are refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from rest_framework.test import APIClient

from evolution import digests, records
from evolution.loop import late, lifecycle
from evolution.loop.review import review_decide
from evolution.models import (
    Benchmark,
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Experiment,
    GateDecision,
    LeakageFlag,
    Recipe,
    ReviewDecision,
    ReviewItem,
    Run,
    Task,
    Trial,
)
from evolution.services import records as records_module
from evolution.services.bundles import BundleError, bundle_build, bundle_import, bundle_verify
from evolution.services.records import (
    _split_totals_of,
    records_verify,
    scores_verify,
    trial_rows_by_seq,
    trial_rows_differing,
)
from lab.bench.records import certified_chain
from tests.evolution.test_decision_records import reviewed_run
from tests.evolution.test_late_decisions import ended_with_two_open_reviews, settle, user_in
from tests.evolution.test_loop import tiny_recipe
from tests.factories import make_tiny_experiment, seed_of
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db


@pytest.fixture
def ended() -> tuple[Run, list[ReviewItem]]:
    """A finished rrsi run whose two flagged candidates still wait for review."""
    return ended_with_two_open_reviews()


def problems_of(experiment_id: int) -> list[str]:
    return records_verify(experiment=Experiment.objects.get(pk=experiment_id)).problems


# --- Item 3: a review skipped by editing a state ---------------------------------------------


def test_a_flagged_candidate_set_approved_in_the_database_is_not_evaluated(
    ended: tuple[Run, list[ReviewItem]],
) -> None:
    _, (first, _) = ended
    flags = LeakageFlag.objects.filter(candidate_id=first.candidate_id).count()
    assert flags > 0
    Candidate.objects.filter(pk=first.candidate_id).update(state=Candidate.State.APPROVED)
    api = APIClient()
    api.force_authenticate(user_in("operator"))
    answer = api.post(f"/api/v1/candidates/{first.candidate_id}/evaluate/", {"scope": "gate"}, format="json")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": f"candidate {first.candidate_id} is not evaluated: it has {flags} critic flag(s) "
        "and no certified review decision approving it"
    }
    assert not Evaluation.objects.filter(candidate_id=first.candidate_id).exists()
    # verify_records names the approved state nobody cleared.
    tree = first.candidate.tree_id
    assert (
        f"experiment {ended[0].experiment_id} {ended[0].experiment.name!r}: candidate {tree[:12]}: state 'approved', "
        "but the critic held it for review and no certified review decision approved it"
    ) in problems_of(ended[0].experiment_id)


def test_a_gate_without_the_review_is_named_by_verification(
    ended: tuple[Run, list[ReviewItem]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, (first, _) = ended
    flags = LeakageFlag.objects.filter(candidate_id=first.candidate_id).count()
    Candidate.objects.filter(pk=first.candidate_id).update(state=Candidate.State.APPROVED)
    # As the evaluate path did before it checked the review: the candidate is measured and gated.
    monkeypatch.setattr(late, "review_missing", lambda *, candidate_id: "", raising=False)
    late.candidate_evaluate_late(candidate_id=first.candidate_id, scope="gate")
    settle(run)
    gate = GateDecision.objects.select_related("record").get(candidate_id=first.candidate_id)
    assert gate.record is not None
    tree = first.candidate.tree_id
    label = f"experiment {run.experiment_id} {run.experiment.name!r}: "
    problems = problems_of(run.experiment_id)
    assert (
        f"{label}record #{gate.record.seq}: candidate {tree[:12]}: gated with {flags} critic flag(s) "
        "and no certified review decision approving it"
    ) in problems
    assert gate.record.payload["schema"] == records.GATE_SCHEMA
    assert gate.record.payload["critic"]["flags"] == flags and gate.record.payload["review"] is None
    # Deleting the flags does not help: the gate record binds how many there were.
    LeakageFlag.objects.filter(candidate_id=first.candidate_id).delete()
    ReviewItem.objects.filter(pk=first.pk).delete()
    problems = problems_of(run.experiment_id)
    assert (
        f"{label}record #{gate.record.seq}: candidate {tree[:12]}: its critic flags differ from the gate record's "
        f"(0 stored, the record binds {flags})"
    ) in problems
    assert (
        f"{label}record #{gate.record.seq}: candidate {tree[:12]}: gated with {flags} critic flag(s) "
        "and no certified review decision approving it"
    ) in problems
    # So does the bundle.
    bundle = bundle_build(experiment=run.experiment)
    assert (
        f"record #{gate.record.seq}: candidate {tree[:12]}: gated with {flags} critic flag(s) "
        "and no certified review decision approving it"
    ) in bundle_verify(bundle, key=settings.RSI_RECORDS_KEY)


def test_the_gate_record_binds_the_critic_flags_and_the_review_approval(ended: tuple[Run, list[ReviewItem]]) -> None:
    run, (first, _) = ended
    review_decide(item=first, user=User.objects.create_user("alice"), approve=True, reason="generic enough")
    settle(run)
    review = ReviewDecision.objects.select_related("record").get(item=first)
    gate = GateDecision.objects.select_related("record").get(candidate_id=first.candidate_id)
    assert review.record is not None and gate.record is not None
    flags = list(
        LeakageFlag.objects.filter(candidate_id=first.candidate_id).values_list("rule", "path", "line", "matched")
    )
    assert gate.record.payload["critic"] == {"flags": len(flags), "digest": records.flags_digest(flags)}
    assert gate.record.payload["review"] == {"seq": review.record.seq, "record": review.record.record_digest}
    assert problems_of(run.experiment_id) == []
    # An intact bundle carries the flags and verifies.
    bundle = bundle_build(experiment=run.experiment)
    assert sorted(
        map(tuple, next(c for c in bundle["candidates"] if c["tree"] == first.candidate.tree_id)["flags"])
    ) == (sorted(flags))
    assert bundle_verify(copy.deepcopy(bundle), key=settings.RSI_RECORDS_KEY) == []
    # One flag edited: named.
    edited = LeakageFlag.objects.filter(candidate_id=first.candidate_id).order_by("pk")[0]
    LeakageFlag.objects.filter(pk=edited.pk).update(rule="nothing")
    assert any(
        f"record #{gate.record.seq}: candidate {first.candidate.tree_id[:12]}: its critic flags differ" in p
        for p in problems_of(run.experiment_id)
    )
    # A bundle whose flags were dropped no longer verifies either.
    for candidate in bundle["candidates"]:
        candidate["flags"] = []
    assert (
        f"record #{gate.record.seq}: candidate {first.candidate.tree_id[:12]}: its critic flags differ from the gate "
        f"record's (0 stored, the record binds {len(flags)})"
    ) in bundle_verify(bundle, key=settings.RSI_RECORDS_KEY)


def test_a_version_1_gate_record_of_a_flagged_candidate_needs_a_review_approval() -> None:
    gate = {"schema": records.GATE_SCHEMA_V1, "candidate": {"tree": "t" * 64}}
    approval = {"schema": records.REVIEW_SCHEMA, "candidate": {"tree": "t" * 64}, "review": {"verdict": "approve"}}
    flagged = {"t" * 64: records.critic_outcome([("rule", "p", "l", "m")])}
    assert records.review_basis_problems([(3, "d3", gate)], flagged) == [
        f"record #3: candidate {'t' * 12}: gated with 1 critic flag(s) and no certified review decision approving it"
    ]
    assert records.review_basis_problems([(3, "d3", gate)], {}, held=["t" * 64]) == [
        f"record #3: candidate {'t' * 12}: gated with 0 critic flag(s) and no certified review decision approving it"
    ]
    assert records.review_basis_problems([(2, "d2", approval), (3, "d3", gate)], flagged) == []
    assert records.review_basis_problems([(3, "d3", gate)], {}) == []


# --- Items 5 and 6: forged scores and fields bound but never compared --------------------------


def edit_split_totals(run: Run) -> str:
    stats = EvaluationSplitStats.objects.filter(evaluation__run=run).order_by("pk")[0]
    EvaluationSplitStats.objects.filter(pk=stats.pk).update(passed=stats.passed + 1, score_sum=stats.score_sum + 1)
    return f"evaluation {stats.evaluation_id}, split {stats.split!r}: stored totals differ from its certified trials"


def edit_split_tokens(run: Run) -> str:
    # The token sum alone (a 64-bit sum: the database may return it as a Decimal).
    stats = EvaluationSplitStats.objects.filter(evaluation__run=run).order_by("-pk")[0]
    EvaluationSplitStats.objects.filter(pk=stats.pk).update(tokens_sum=stats.tokens_sum + 1)
    return f"evaluation {stats.evaluation_id}, split {stats.split!r}: stored totals differ from its certified trials"


def split_totals_without_trials(run: Run) -> str:
    # Totals stored for a split the evaluation ran no trial on.
    stats = EvaluationSplitStats.objects.filter(evaluation__run=run).order_by("pk")[0]
    ran = set(Trial.objects.filter(evaluation_id=stats.evaluation_id).values_list("split", flat=True))
    split = next(name for name in ("gate", "sealed", "train", "heldout") if name not in ran)
    EvaluationSplitStats.objects.filter(pk=stats.pk).update(split=split)
    return f"evaluation {stats.evaluation_id}, split {split!r}: stored totals differ from its certified trials"


def edit_evaluation_splits(run: Run) -> str:
    # Another split added to one certified evaluation; the others (the same splits text) still agree.
    record = CertifiedResult.objects.filter(evaluation__run=run).select_related("evaluation").order_by("seq")[0]
    splits = record.evaluation.splits
    Evaluation.objects.filter(pk=record.evaluation_id).update(splits=[*splits, "heldout"])
    return f"record #{record.seq}: evaluation splits differ(s) from the certified one"


def extra_certified_evaluation(run: Run) -> str:
    candidate = Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_GATE).order_by("pk")[0]
    evaluation = Evaluation.objects.create(
        experiment=run.experiment, candidate=candidate, run=run, splits=["gate"], state=Evaluation.State.CERTIFIED
    )
    return f"evaluation {evaluation.pk} is certified, but no record binds it"


def reparent(run: Run) -> str:
    candidate = Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_GATE).order_by("pk")[0]
    others = Candidate.objects.filter(run=run).exclude(pk=candidate.pk)
    other = (others.exclude(pk=candidate.parent_id) if candidate.parent_id is not None else others).order_by("pk")[0]
    Candidate.objects.filter(pk=candidate.pk).update(parent=other)
    seq = candidate.certified_results.order_by("seq")[0].seq
    return f"record #{seq}: candidate parent differ(s) from the certified one"


def edit_run_settings(run: Run) -> str:
    Experiment.objects.filter(pk=run.experiment_id).update(run_settings={"seed": 12345})
    return "run settings differ(s) from the certified one"


def swap_run_recipe(run: Run) -> str:
    spec = {**run.recipe.spec, "seed": 4242}
    other = Recipe.objects.create(name="other", version=1, spec=spec, digest=digests.json_digest(spec))
    Run.objects.filter(pk=run.pk).update(recipe=other)
    gate = GateDecision.objects.filter(run=run).select_related("record").order_by("pk")[0]
    assert gate.record is not None
    return f"record #{gate.record.seq}: the recipe of its run differs from the certified one"


def add_heldout_benchmark(run: Run) -> str:
    elsewhere = Benchmark.objects.create(name="elsewhere", title="elsewhere")
    Task.objects.create(benchmark=elsewhere, external_id="x", instruction="x")
    run.experiment.heldout_benchmarks.add(elsewhere)
    return "held-out benchmarks differ from the tasks of the held-out split"


def extra_imported_candidate(run: Run) -> str:
    # A rejection no review made, passed off as one an imported workspace brought along.
    rejected = Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_CRITIC).order_by("pk").first()
    rejected = rejected or Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_GATE).order_by("pk")[0]
    Candidate.objects.filter(pk=rejected.pk).update(origin=Candidate.Origin.IMPORTED, state="rejected_review")
    return f"candidate {rejected.tree_id[:12]}: origin 'imported' in an experiment that was not imported"


DATABASE_FORGERIES: list[Callable[[Run], str]] = [
    edit_split_totals,
    edit_split_tokens,
    split_totals_without_trials,
    edit_evaluation_splits,
    extra_certified_evaluation,
    reparent,
    edit_run_settings,
    swap_run_recipe,
    add_heldout_benchmark,
    extra_imported_candidate,
]


def test_a_certified_trial_is_compared_only_under_exactly_the_bound_keys() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    certified_chain(experiment, count=1)
    (stored,) = trial_rows_by_seq(experiment)
    good, *others = CertifiedResult.objects.get(experiment=experiment).payload["trials"]
    assert len(stored.rows) == 1 + len(others) and trial_rows_differing(stored.rows, [good, *others]) == 0
    renamed = {**{key: value for key, value in good.items() if key != "seed"}, "sead": good["seed"]}
    # A key renamed, an entry that is no object, a key too many or missing: none equals a stored row.
    for forged in (renamed, "trial", {**good, "extra": 1}, {key: good[key] for key in list(good)[1:]}):
        assert trial_rows_differing(stored.rows, [forged, *others]) == 1
    assert trial_rows_differing(stored.rows, [good]) == len(others)
    assert trial_rows_differing(stored.rows, {"trials": [good, *others]}) == len(stored.rows)


def test_forged_scores_and_fields_bound_in_records_are_named_by_verification() -> None:
    """Each forgery in a savepoint rolled back before the next (one run serves them all)."""
    run = reviewed_run()
    assert problems_of(run.experiment_id) == []
    label = f"experiment {run.experiment_id} {run.experiment.name!r}"
    for forge in DATABASE_FORGERIES:
        with transaction.atomic():
            expected = forge(run)
            problems = problems_of(run.experiment_id)
            assert any(p.startswith(label) and expected in p for p in problems), (forge.__name__, problems)
            transaction.set_rollback(True)
        assert problems_of(run.experiment_id) == [], forge.__name__


def _candidate(bundle: dict[str, Any], state: str) -> dict[str, Any]:
    return next(c for c in bundle["candidates"] if c["state"] == state)


def b_reparent(bundle: dict[str, Any]) -> str:
    evaluated = {r["payload"]["candidate"]["tree"] for r in bundle["records"]}
    candidate = next(c for c in bundle["candidates"] if c["state"] == "rejected_gate" and c["tree"] in evaluated)
    seed = bundle["experiment"]["seed_tree"]
    other = next(c["tree"] for c in bundle["candidates"] if c["tree"] not in (seed, candidate["tree"]))
    # Listed before it, as the shape check wants.
    bundle["candidates"].remove(candidate)
    bundle["candidates"].append(candidate)
    candidate["parent_tree"] = other
    return f"candidate {candidate['tree'][:12]}'s parent differs from the certified one"


def b_run_settings(bundle: dict[str, Any]) -> str:
    bundle["experiment"]["run_settings"] = {"seed": 12345}
    return "run settings differ from the certified ones"


def b_recipe(bundle: dict[str, Any]) -> str:
    bundle["experiment"]["recipe"] = None
    return "the experiment's recipe differs from the certified one"


def b_heldout(bundle: dict[str, Any]) -> str:
    bundle["benchmarks"].append({"name": "elsewhere", "title": "elsewhere", "description": ""})
    bundle["experiment"]["heldout_benchmarks"] = ["elsewhere"]
    return "experiment: held-out benchmarks differ from the tasks of the held-out split"


def _extra(bundle: dict[str, Any], state: str) -> str:
    seed = _candidate(bundle, "accepted")
    template = next(c for c in bundle["candidates"] if c["tree"] != seed["tree"] and c["tree"] in bundle["trees"])
    tree = next(t for t in bundle["trees"] if t not in {c["tree"] for c in bundle["candidates"]})
    bundle["candidates"].append(
        {**template, "tree": tree, "parent_tree": seed["tree"], "state": state, "origin": "imported", "flags": []}
    )
    return f"candidate {tree[:12]}: no record names it, and it is not the seed or an ancestor"


def b_extra_approved(bundle: dict[str, Any]) -> str:
    return _extra(bundle, "approved")


def b_extra_rejected_review(bundle: dict[str, Any]) -> str:
    return _extra(bundle, "rejected_review")


BUNDLE_FORGERIES: list[Callable[[dict[str, Any]], str]] = [
    b_reparent,
    b_run_settings,
    b_recipe,
    b_heldout,
    b_extra_approved,
    b_extra_rejected_review,
]


def test_a_bundle_with_fields_unlike_its_records_or_extra_candidates_is_refused() -> None:
    run = reviewed_run()
    clean = bundle_build(experiment=run.experiment)
    key = settings.RSI_RECORDS_KEY
    assert bundle_verify(copy.deepcopy(clean), key=key) == []
    before = (Experiment.objects.count(), Candidate.objects.count(), CertifiedDecision.objects.count())
    for forge in BUNDLE_FORGERIES:
        bundle = copy.deepcopy(clean)
        expected = forge(bundle)
        problems = bundle_verify(bundle, key=key)
        assert any(expected in p for p in problems), (forge.__name__, problems)
        with pytest.raises(BundleError, match="nothing was imported"):
            bundle_import(bundle=bundle, key=key, name="forged copy")
        assert (Experiment.objects.count(), Candidate.objects.count(), CertifiedDecision.objects.count()) == before


# --- Item 17: scope "all" under evaluation.sealed: never ----------------------------------------


def test_scope_all_is_refused_when_the_recipe_never_runs_sealed_tasks() -> None:
    experiment = make_tiny_experiment(tasks=12, k=1)
    run = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("rrsi", evaluation={"sealed": "never"})))
    accepted = Candidate.objects.filter(run=run, state=Candidate.State.ACCEPTED).order_by("pk").first()
    assert accepted is not None
    before = Evaluation.objects.count()
    api = APIClient()
    api.force_authenticate(user_in("operator"))
    answer = api.post(f"/api/v1/candidates/{accepted.pk}/evaluate/", {"scope": "all"}, format="json")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": f"run {run.pk}'s recipe says evaluation.sealed: never: its sealed and held-out tasks are not run "
        "(evaluate on the gate's splits)"
    }
    assert Evaluation.objects.count() == before
    assert not Trial.objects.filter(candidate=accepted, split="sealed").exists()


def test_the_totals_counted_while_the_trials_are_read_equal_the_sql_aggregates() -> None:
    """``trial_rows_by_seq`` totals each split as ``split_totals`` does in
    SQL: an error's score left out, a missing score or token count skipped,
    the first of two candidates; and ``scores_verify`` names the same forged
    totals whether they are compared with those counts or, for an evaluation
    no record of the chain binds, with the SQL aggregates."""
    experiment = make_tiny_experiment(tasks=4)
    seed, other = seed_of(experiment), seed_of(make_tiny_experiment(like=experiment))
    evaluation = Evaluation.objects.create(
        experiment=experiment, candidate=seed, splits=["train", "gate"], state=Evaluation.State.CERTIFIED
    )
    tasks = list(Task.objects.filter(benchmark__experiments=experiment).order_by("external_id"))
    outcome = Trial.Outcome
    for task, split, index, result, score, tokens, candidate in [
        (tasks[0], "train", 0, outcome.PASS, 1.0, 10, other),
        (tasks[0], "train", 1, outcome.FAIL, 0.25, None, seed),
        (tasks[1], "train", 0, outcome.ERROR, 0.5, 7, seed),
        (tasks[2], "gate", 0, outcome.PASS, None, 3, other),
        (tasks[3], "gate", 0, outcome.FAIL, 0.75, None, other),
    ]:
        Trial.objects.create(
            evaluation=evaluation,
            candidate=candidate,
            task=task,
            split=split,
            index=index,
            seed=index,
            state=Trial.State.DONE,
            outcome=result,
            score=score,
            tokens=tokens,
            environment="e" * 64 if split == "gate" else "",
        )
    CertifiedResult.objects.create(
        experiment=experiment,
        seq=experiment.chain_length + 1,
        evaluation=evaluation,
        candidate=seed,
        payload={},
        prev_digest=experiment.chain_head,
        record_digest="f" * 64,
        signature="0" * 64,
    )
    (stored,) = trial_rows_by_seq(experiment)
    first = min(seed.pk, other.pk)
    assert stored.totals == {"train": (first, 3, 1, 1, 1.25, 17, 2), "gate": (other.pk, 2, 1, 0, 0.75, 3, 1)}
    assert stored.totals == {split: totals for (_, split), totals in _split_totals_of([evaluation.pk]).items()}
    assert stored.environments == ["e" * 64]

    EvaluationSplitStats.objects.bulk_create(
        EvaluationSplitStats(
            evaluation=evaluation,
            split=split,
            candidate_id=candidate,
            trials=n,
            passed=passed,
            errors=errors,
            score_sum=score_sum,
            tokens_sum=tokens_sum,
            tokens_count=tokens_count,
        )
        for split, (candidate, n, passed, errors, score_sum, tokens_sum, tokens_count) in stored.totals.items()
    )
    streamed = {(evaluation.pk, split): totals for split, totals in stored.totals.items()}
    in_sql: dict[tuple[int, str], tuple[Any, ...]] = {}  # no evaluation counted: every total from SQL
    assert scores_verify(experiment, recomputed=streamed)[0] == scores_verify(experiment, recomputed=in_sql)[0] == []
    EvaluationSplitStats.objects.filter(evaluation=evaluation, split="gate").update(tokens_sum=4)
    forged = [f"evaluation {evaluation.pk}, split 'gate': stored totals differ from its certified trials"]
    assert (
        scores_verify(experiment, recomputed=streamed)[0] == scores_verify(experiment, recomputed=in_sql)[0] == forged
    )


def test_records_equal_to_the_payload_the_database_implies_are_compared_as_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the first record of a chain is checked field by field; the others,
    the bytes of the payload the database implies, pass as bytes. A trial row
    changed in the database sends its record back to the field-by-field check,
    which names it; stored rows are read as a record writes them; and a value
    orjson would not write faithfully (one read as infinity, written as null)
    is never compared as bytes."""
    experiment = make_tiny_experiment(tasks=4, k=1)
    certified_chain(experiment, count=3)
    field_by_field: list[int] = []
    checked = records_module._bound_differences

    def counted(*args: Any, **kwargs: Any) -> list[str]:
        field_by_field.append(1)
        return checked(*args, **kwargs)

    monkeypatch.setattr(records_module, "_bound_differences", counted)
    assert problems_of(experiment.pk) == []
    assert len(field_by_field) == 1

    last = CertifiedResult.objects.filter(experiment=experiment).order_by("-seq")[0]
    trial = Trial.objects.filter(evaluation_id=last.evaluation_id).order_by("pk")[0]
    Trial.objects.filter(pk=trial.pk).update(tokens=(trial.tokens or 0) + 1)
    field_by_field.clear()
    assert any(f"record #{last.seq}: 1 trial row(s) differ" in p for p in problems_of(experiment.pk))
    assert len(field_by_field) == 2

    # Read as a record writes them: an integral score as an integer, a boolean as a boolean (SQLite's 0 or 1).
    rows = [row for stored in trial_rows_by_seq(experiment) for row in stored.rows]
    assert rows and all(type(row["valid_output"]) is bool and type(row["score"]) is not float for row in rows)
    # A criteria value orjson does not write faithfully (1e400 reads as infinity, written as null): that record
    # is never compared as bytes.
    Trial.objects.filter(pk=trial.pk).update(tokens=trial.tokens)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Trial._meta.db_table} SET criteria_results = '[1e400]' WHERE id = %s", [trial.pk])
    assert [stored.faithful for stored in trial_rows_by_seq(experiment)] == [True, True, False]
    field_by_field.clear()
    assert any(f"record #{last.seq}: 1 trial row(s) differ" in p for p in problems_of(experiment.pk))
    assert len(field_by_field) == 2
