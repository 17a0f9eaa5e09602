"""The screen benchmarks (``manage.py bench diff-render pages``) at smoke sizes.

No timing is asserted here (machines are shared and noisy): the tests check
that the benchmarks build what they say, drive the real pages, and that the
properties that do not depend on the clock hold: every page runs the same
number of queries on the small and the grown world, and the diff page's
first response does not grow with the number of files.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from evolution.measurements import COUNTED_PURPOSES
from evolution.models import Annotation, Candidate, Experiment, TrajectoryStep, Trial
from lab.bench import REGISTRY, BenchResult
from lab.bench import diffs as diff_bench
from lab.bench import pages as pages_bench
from review import diffs


def test_generated_diff_has_the_asked_size_and_languages() -> None:
    old, new = diff_bench.make_trees(50, 400)
    files = diffs.build_file_diffs(old, new)
    assert len(files) == 50
    assert sum(fd.changed or 0 for fd in files) == 20_000
    assert all(fd.added == fd.removed == 200 for fd in files)
    extensions = {fd.path.rsplit(".", 1)[1] for fd in files}
    assert extensions == {"py", "js", "ts", "go", "rs", "c", "yaml", "md", "toml", "json"}
    # Highlighted by a real lexer, not plain text.
    assert {diffs.lexer_for(fd.path).name for fd in files} >= {"Python", "JavaScript", "TypeScript", "Go", "Rust"}


@pytest.mark.django_db
def test_diff_benchmark_renders_every_file_and_bounds_the_first_response() -> None:
    assert REGISTRY["diff-render"].quick["files"] > REGISTRY["diff-render"].quick["small_files"]
    result = diff_bench.run(files=8, lines_per_file=400, small_files=5, repeat=1, scratch=False)
    assert isinstance(result, BenchResult)
    assert result.target == 2.0
    assert result.ratio > 0
    text = "\n".join(result.lines)
    assert "diff: 8 files, 3,200 changed lines" in text
    # The page budget (2,000 lines) holds three of these files; the other five are fetched one by one.
    assert "first response (3 files rendered, 5 collapsed)" in text
    assert "full render (first response + 1 counts request + 5 file partials)" in text
    assert result.checks["first_response_bytes_bounded"] is True
    assert set(result.checks) == {"first_response_time_bounded", "first_response_bytes_bounded"}


@pytest.mark.django_db
def test_pages_benchmark_keeps_query_counts_constant() -> None:
    sizes = {**REGISTRY["pages"].quick, "repeat": 1}
    result = pages_bench.run(**sizes, scratch=False)
    constancy = {name: ok for name, ok in result.checks.items() if name.startswith("queries constant")}
    assert len(constancy) == 9, result.lines
    assert all(constancy.values()), result.lines
    assert "postgresql" not in result.checks  # smoke sizes are not held to the PostgreSQL target
    # The generated rows are what the benchmark reports.
    candidates = sizes["candidates"]
    assert Candidate.objects.filter(experiment__name="bench-pages").count() == candidates + 1  # and the seed
    measured = Candidate.objects.filter(experiment__name="bench-pages", evaluations__isnull=False).count()
    trials = Trial.objects.filter(candidate__experiment__name="bench-pages").count()
    # The seed's baseline included (every candidate's dS is measured against it).
    assert trials == measured * sizes["tasks"] * sizes["k"] + 2  # and the two long-trajectory trials
    assert Candidate.objects.filter(
        experiment__name="bench-pages", seed_of__isnull=False, evaluations__isnull=False
    ).exists()
    assert Annotation.objects.count() == sizes["annotations"]
    assert TrajectoryStep.objects.filter(trajectory__trial__candidate__experiment__name="bench-pages").count() == (
        150 + sizes["steps"]
    )
    pages = [line for line in result.lines if re.search(r"median .* ms .* queries", line)]
    assert [line.split(" median")[0].strip() for line in pages] == [
        "experiments list",
        "dashboard",
        "candidate list (lineage)",
        "results matrix",
        "review queue",
        "trajectory page",
        "candidate page (flags)",
        "diff page",
        "API candidate detail",
    ]
    # The candidate measured has flags and a decision that kept its interval, as the gate keeps it.
    shown = Candidate.objects.filter(experiment__name="bench-pages", leakage_flags__isnull=False).exclude(
        evaluations__isnull=True
    )
    assert shown.distinct().count() == 2  # one in the small world, one in the grown
    for candidate in shown.distinct():
        assert {"dS", "dC", "dS_low", "dS_high", "paired_tasks", "trials_digest"} <= set(
            candidate.gate_decisions.get().numbers
        )
    assert sum("first request with an empty cache" in line for line in result.lines) == 2
    for line in pages:
        found = re.search(r"queries (\d+) small / (\d+) large", line)
        assert found is not None
        small, large = found.groups()
        assert small == large


def test_lineage_window_is_bounded_and_pages_both_ways() -> None:
    from review.lineage import round_window

    counts = {0: 1, **dict.fromkeys(range(1, 2001), 5)}
    assert round_window(counts, start=None, end=None, cap=400) == (1921, 2000)  # the latest 80 rounds
    assert round_window(counts, start=None, end=1920, cap=400) == (1841, 1920)
    assert round_window(counts, start=0, end=None, cap=400) == (0, 79)  # 1 + 79 x 5 = 396
    assert round_window({3: 900}, start=None, end=None, cap=400) == (3, 3)  # one round always shown
    assert round_window({}, start=None, end=None, cap=400) == (0, 0)


def test_cost_chart_sample_keeps_the_front_and_the_seed_and_stays_bounded() -> None:
    from review import charts

    points = [
        charts.CostPoint(
            candidate_id=n,
            cost=100.0 + (n * 37) % 500,
            score=((n * 53) % 100) / 100,
            category="seed" if n == 0 else ("accepted" if n % 5 == 0 else "rejected"),
            name=f"#{n}",
            href=f"/c/{n}/",
            label=n % 5 == 0,
            detail="",
        )
        for n in range(5000)
    ]
    drawn = charts.thin_cost_points(points, 400)
    ids = {p.candidate_id for p in drawn}
    front = {p.candidate_id for p in charts.pareto_front(points)}
    assert 0 in ids and front <= ids
    assert len(drawn) <= 400 + len(front) + 1
    assert len(drawn) >= 390
    assert sum(p.label for p in drawn) < len(drawn)  # not only the labelled ones
    assert charts.thin_cost_points(points[:50], 400) == points[:50]


def small_bench_world() -> tuple[int, dict[str, Any]]:
    """A small generated world in the test database: its experiment id, and
    the score selectors' arguments for the dashboard's evolve splits."""
    sizes = {**REGISTRY["pages"].quick, "candidates": 60, "annotations": 10, "steps": 10, "repeat": 1}
    pages_bench.run(**sizes, scratch=False)
    experiment_id = Experiment.objects.get(name="bench-pages").pk
    return experiment_id, {"experiment_id": experiment_id, "splits": ["train", "gate"]}


@pytest.mark.django_db
def test_stored_split_totals_give_the_scores_counted_from_the_trials() -> None:
    from evolution import selectors
    from evolution.models import Evaluation, EvaluationSplitStats
    from evolution.services.records import split_stats_store

    experiment_id, args = small_bench_world()
    stored = selectors.candidate_scores(**args, mean_score=False)
    stored_mean = selectors.candidate_scores(**args, mean_score=True)
    assert len(stored) == Evaluation.objects.filter(experiment_id=experiment_id).count()
    # Without stored totals the same figures come from the trials themselves.
    EvaluationSplitStats.objects.all().delete()
    assert selectors.candidate_scores(**args, mean_score=False) == stored
    assert selectors.candidate_scores(**args, mean_score=True) == stored_mean
    # Storing again is what certification does; repeating it changes nothing.
    written = split_stats_store(evaluations=Evaluation.objects.filter(experiment_id=experiment_id))
    assert written == split_stats_store(evaluations=Evaluation.objects.filter(experiment_id=experiment_id))
    assert EvaluationSplitStats.objects.count() == written
    assert selectors.candidate_scores(**args, mean_score=False) == stored


@pytest.mark.django_db
def test_measured_candidates_match_the_trials_with_or_without_stored_totals() -> None:
    from collections import defaultdict

    from evolution import selectors
    from evolution.models import Evaluation, EvaluationSplitStats

    experiment_id, args = small_bench_world()
    # Straight from the trials: passes, trials and tokens per candidate.
    counted: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for candidate_id, outcome, tokens in Trial.objects.filter(
        evaluation__experiment_id=experiment_id,
        evaluation__state=Evaluation.State.CERTIFIED,
        evaluation__purpose__in=COUNTED_PURPOSES,
        split__in=["train", "gate"],
    ).values_list("candidate_id", "outcome", "tokens"):
        counted[candidate_id][0] += outcome == Trial.Outcome.PASS
        counted[candidate_id][1] += 1
        counted[candidate_id][2] += tokens or 0
    facts = {
        pk: (state, origin, round_)
        for pk, state, origin, round_ in Candidate.objects.filter(experiment_id=experiment_id).values_list(
            "pk", "state", "origin", "round"
        )
    }

    def check() -> list[selectors.MeasuredCandidate]:
        measured = selectors.measured_candidates(**args, mean_score=False)
        assert [m.pk for m in measured] == sorted(counted)
        for m in measured:
            passed, n, tokens = counted[m.pk]
            assert m.score == pytest.approx(passed / n) and m.tokens == pytest.approx(tokens / n)
            assert (m.state, m.origin, m.round) == facts[m.pk]
        assert {m.pk: (m.score, m.tokens) for m in measured} == selectors.candidate_scores(**args, mean_score=False)
        return measured

    stored = check()
    assert len(stored) == Evaluation.objects.filter(experiment_id=experiment_id).count() > 50
    # Every other evaluation without its stored totals: its trials are counted instead.
    halved = Evaluation.objects.filter(experiment_id=experiment_id).order_by("pk").values_list("pk", flat=True)[::2]
    assert EvaluationSplitStats.objects.filter(evaluation_id__in=list(halved)).delete()[0] > 0
    assert check() == stored
    # Only some candidates, as the cost chart asks.
    some = Candidate.objects.filter(experiment_id=experiment_id, pk__in=sorted(counted)[:5]).values("pk")
    assert [m.pk for m in selectors.measured_candidates(**args, mean_score=False, candidate_ids=some)] == sorted(
        counted
    )[:5]


@pytest.mark.django_db
@pytest.mark.parametrize("mean_score", [False, True])
def test_measured_sample_is_the_front_the_seed_and_every_kth_with_the_same_numbers(mean_score: bool) -> None:
    from types import SimpleNamespace

    from evolution import selectors
    from evolution.models import Evaluation, EvaluationSplitStats
    from review import charts

    experiment_id, args = small_bench_world()
    limit = 5

    def expected() -> tuple[list[selectors.MeasuredCandidate], list[int]]:
        """Every measured candidate reporting tokens, and the ids the sample must hold."""
        every = [m for m in selectors.measured_candidates(**args, mean_score=mean_score) if m.tokens is not None]
        points = [SimpleNamespace(candidate_id=m.pk, cost=m.tokens, score=m.score) for m in every]
        keep = {p.candidate_id for p in charts.pareto_front(points)} | {m.pk for m in every if m.origin == "seed"}
        labelled = [m.pk for m in every if m.origin == "seed" or m.state == "accepted"]
        others = [m.pk for m in every if m.pk not in set(labelled)]
        for group in (labelled, others):
            keep |= set(group[:: -(-len(group) // limit)])  # every k-th, k = ceil(len / limit)
        return every, sorted(keep)

    def check() -> list[selectors.MeasuredCandidate]:
        every, ids = expected()
        assert len(every) > 4 * limit
        # All of them when the limit allows: the same candidates, scores and tokens, exactly.
        assert selectors.measured_candidates_sample(**args, mean_score=mean_score, limit=len(every)) == (
            every,
            len(every),
        )
        sample = selectors.measured_candidates_sample(**args, mean_score=mean_score, limit=limit)
        assert sample.measured == len(every)
        assert [m.pk for m in sample.candidates] == ids
        by_id = {m.pk: m for m in every}
        assert sample.candidates == [by_id[pk] for pk in ids]
        return sample.candidates

    stored = check()
    # Every other evaluation without its stored totals: its trials are counted instead, to the same sample.
    halved = Evaluation.objects.filter(experiment_id=experiment_id).order_by("pk").values_list("pk", flat=True)[::2]
    assert EvaluationSplitStats.objects.filter(evaluation_id__in=list(halved)).delete()[0] > 0
    assert check() == stored


def test_keep_and_reuse_take_one_benchmark_that_generates_data() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="one benchmark that generates data: pages"):
        call_command("bench", "pages", "records", "--keep-data")
    with pytest.raises(CommandError, match="one benchmark that generates data"):
        call_command("bench", "records", "--reuse-data", "rsiweb_bench_x")
    with pytest.raises(CommandError, match="--quick does not apply"):
        call_command("bench", "pages", "--quick", "--reuse-data", "rsiweb_bench_x")


@pytest.mark.django_db
def test_the_best_candidate_ranked_in_the_database_is_the_one_the_scores_rank_first() -> None:
    """``best_scored_candidate`` (one query, the dashboard's) against ``candidate_scores`` ranked in Python
    (highest S; on a tie the lower cost, a candidate without tokens last; then the latest accepting gate
    decision; then the higher id), with and without stored totals, by pass@1 and by mean score."""
    from evolution import selectors
    from evolution.models import EvaluationSplitStats, GateDecision

    experiment_id, args = small_bench_world()
    accepted = Candidate.objects.filter(experiment_id=experiment_id, state=Candidate.State.ACCEPTED)
    assert accepted.count() > 3
    last_accepted: dict[int, int] = {}
    for candidate_id, decision_id in GateDecision.objects.filter(accepted=True).values_list("candidate_id", "pk"):
        last_accepted[candidate_id] = max(decision_id, last_accepted.get(candidate_id, 0))

    def python_best(mean_score: bool) -> int:
        scores = selectors.candidate_scores(**args, mean_score=mean_score, candidate_ids=accepted.values("pk"))

        def rank(pk: int) -> tuple[float, float, int, int]:
            score, cost = scores[pk]
            return (score, -cost if cost is not None else float("-inf"), last_accepted.get(pk, 0), pk)

        return max(scores, key=rank)

    def ties(mean_score: bool) -> int:
        scores = selectors.candidate_scores(**args, mean_score=mean_score, candidate_ids=accepted.values("pk"))
        top = max(score for score, _ in scores.values())
        return sum(1 for score, _ in scores.values() if score == top)

    assert ties(False) > 1  # the tie rules are exercised
    for stored in (True, False):
        if not stored:
            EvaluationSplitStats.objects.all().delete()
        for mean_score in (False, True):
            found = selectors.best_scored_candidate(**args, mean_score=mean_score, candidate_ids=accepted.values("pk"))
            assert found == python_best(mean_score), (stored, mean_score)
    none = Candidate.objects.filter(pk=-1).values("pk")
    assert selectors.best_scored_candidate(**args, mean_score=False, candidate_ids=none) is None
