"""The story across proposer seeds: rrsi against the unregularized loop on the offline example.

``compare_recipes`` (the command a team runs) drives each recipe from the same start with five proposer
seeds, every run in a twin of the experiment, and evaluates each final harness on the sealed split. The
published direction is that, in aggregate, the unregularized loop raises train at least as much as rrsi and
rrsi's mean sealed score is at least the unregularized one's; the test reports whether it held (an expected
failure, with the numbers, when it does not: measured, never tuned). What must hold: rrsi never evaluates a
candidate its critic flagged and accepts no leaky edit; the unregularized loop, which has no critic, accepts
some.

Sized for CI (the first 30 tasks of the example, two rounds of two candidates, k = 1); docs/loop.md shows
the command's table on the whole example.
"""

from __future__ import annotations

import pytest

from evolution.example.setup import example_experiment_create
from evolution.loop.compare import comparison_table, recipes_compare
from evolution.models import Candidate, Evaluation, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.story]

SEEDS = 5


def test_regularization_keeps_transfer_across_five_proposer_seeds() -> None:
    import evolution.proposers  # noqa: F401  (registers the example proposer)

    experiment = example_experiment_create(name="story", task_limit=30)
    comparison = recipes_compare(
        experiment=experiment,
        recipes=["rrsi", "unregularized"],
        seeds=SEEDS,
        rounds=2,
        candidates=2,
        k=1,
        proposer="example",
        transfer_seeds=1,
        inline=True,
    )
    print("", *comparison_table(comparison), sep="\n")
    rrsi, unregularized = comparison.summary("rrsi"), comparison.summary("unregularized")
    for name in ("rrsi", "unregularized"):
        runs = comparison.of(name)
        assert len(runs) == SEEDS and {r.status for r in runs} == {Run.Status.FINISHED}, runs
        assert len({r.experiment for r in runs}) == SEEDS  # each run from the same start, in its own twin

    def mean(summary: dict[str, dict[str, float | None]], column: str) -> float:
        value = summary[column]["mean"]
        assert value is not None, column
        return value

    # The mechanism: rrsi accepts no leaky edit and evaluates nothing its critic flagged; unregularized has
    # no critic and accepts some.
    assert sum(r.leaky_accepted for r in comparison.of("rrsi")) == 0
    assert sum(r.leaky_accepted for r in comparison.of("unregularized")) > 0
    rrsi_runs = [r.run for r in comparison.of("rrsi")]
    flagged = Candidate.objects.filter(run__in=rrsi_runs, leakage_flags__isnull=False).distinct()
    assert flagged.exists(), "rrsi flagged nothing"
    assert not Evaluation.objects.filter(candidate__in=flagged).exists()
    # The published direction, in aggregate over the seeds. At this size it did not hold when measured:
    # on 2026-12-02 (unstratified split) train 0.983 and 0.983, sealed 0.800 for rrsi and 0.822
    # unregularized; on 2026-12-05, with the example's split stratified by kind, train 0.917 for rrsi and
    # 0.967 unregularized (that half holds), sealed 0.750 and 0.825 (docs/loop.md). Reported as an expected
    # failure with the numbers, never tuned away. Should a change make it hold, the test passes and this
    # comment must go.
    train_ok = mean(unregularized, "train") >= mean(rrsi, "train")
    sealed_ok = mean(rrsi, "sealed") >= mean(unregularized, "sealed")
    if not (train_ok and sealed_ok):
        pytest.xfail(
            "the published direction does not hold on this slice of the example: "
            f"train rrsi {mean(rrsi, 'train'):.3f} vs unregularized {mean(unregularized, 'train'):.3f}, "
            f"sealed rrsi {mean(rrsi, 'sealed'):.3f} vs unregularized {mean(unregularized, 'sealed'):.3f}"
        )
