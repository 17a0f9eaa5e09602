"""Record verification: ``records_verify`` over a long chain of certified
records versus hashing the same canonical bytes with hashlib alone.

The records are made in bulk with the certification code itself
(``payload_build``, ``trial_row``, ``record_digest``, ``record_signature``,
``head_signature``) over real evaluation and trial rows, so they verify
exactly as records written one at a time by ``result_certify`` would.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import TextField
from django.db.models.functions import Cast

from evolution import digests, records
from evolution.models import CertifiedResult, Evaluation, Experiment, SplitMembership, Trial
from evolution.services.evaluation import trial_seed
from evolution.services.experiments import split_digests_compute
from evolution.services.records import (
    TRIAL_ORDER,
    VERIFY_BATCH,
    payload_build,
    records_verify,
    trial_row,
    trial_rows_by_seq,
)
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.orchestration import SPLITS, with_bench_experiment

BATCH = 2000


def certified_chain(experiment: Experiment, *, count: int) -> list[bytes]:
    """Append ``count`` certified evaluations of the seed (one trial per task)
    to ``experiment``'s chain; returns each record's canonical payload bytes."""
    experiment = Experiment.objects.select_related("evaluator", "recipe").get(pk=experiment.pk)
    seed = experiment.seed_candidate
    memberships = list(
        SplitMembership.objects.filter(experiment=experiment).select_related("task").order_by(*TRIAL_ORDER[:2])
    )
    task_sets = split_digests_compute(experiment=experiment)
    key, uid = settings.RSI_RECORDS_KEY, str(experiment.uid)
    prev, seq = experiment.chain_head or records.GENESIS, experiment.chain_length
    canonical: list[bytes] = []
    for start in range(0, count, BATCH):
        with transaction.atomic():
            evaluations = Evaluation.objects.bulk_create(
                Evaluation(
                    experiment=experiment,
                    candidate=seed,
                    purpose=Evaluation.Purpose.NOISE,
                    # A small integer column: wrap (30,000 keeps the pass pattern below).
                    repeat=number % 30_000,
                    splits=SPLITS,
                    k=1,
                    seed=11 + number,
                    state=Evaluation.State.CERTIFIED,
                    trials_total=len(memberships),
                    trials_finished=len(memberships),
                    sandbox_profile="none",
                )
                for number in range(start, min(count, start + BATCH))
            )
            trials = []
            for evaluation in evaluations:
                for position, membership in enumerate(memberships):
                    passed = (position + evaluation.repeat) % 3 != 0
                    trials.append(
                        Trial(
                            evaluation=evaluation,
                            candidate=seed,
                            task=membership.task,
                            split=membership.split,
                            index=0,
                            seed=trial_seed(evaluation.seed, membership.task.external_id, 0),
                            state=Trial.State.DONE,
                            outcome=Trial.Outcome.PASS if passed else Trial.Outcome.FAIL,
                            score=1.0 if passed else 0.0,
                            criteria_results=[{"id": "answer", "met": passed}],
                            tokens=20 + position,
                            steps=1,
                            wall_time=0.1,
                            valid_output=True,
                            submitted=True,
                            sandbox_profile="none",
                        )
                    )
            Trial.objects.bulk_create(trials, batch_size=BATCH)
            rows = []
            for number, evaluation in enumerate(evaluations):
                evaluation.experiment = experiment
                own = trials[number * len(memberships) : (number + 1) * len(memberships)]
                seq += 1
                payload = payload_build(
                    evaluation,
                    seq=seq,
                    prev=prev,
                    task_sets=task_sets,
                    profile="none",
                    trials=[trial_row(trial, trial.task.external_id) for trial in own],
                )
                data = records.canonical_payload(payload)
                canonical.append(data)
                digest = digests.sha256_hex(data)
                rows.append(
                    CertifiedResult(
                        experiment=experiment,
                        seq=seq,
                        evaluation=evaluation,
                        candidate=seed,
                        payload=payload,
                        prev_digest=prev,
                        record_digest=digest,
                        signature=records.record_signature(key, experiment_uid=uid, seq=seq, digest=digest),
                    )
                )
                prev = digest
            CertifiedResult.objects.bulk_create(rows, batch_size=500)
            Experiment.objects.filter(pk=experiment.pk).update(
                chain_length=seq,
                chain_head=prev,
                chain_head_signature=records.head_signature(key, experiment_uid=uid, length=seq, head=prev),
            )
    return canonical


@benchmark(
    "records",
    "records_verify over 100,000 certified records vs hashlib over their canonical bytes",
    quick={"count": 500},
)
def records_benchmark(*, count: int = 100_000, tasks: int = 4) -> BenchResult:
    def body(experiment: Experiment, _scratch: Path) -> BenchResult:
        with stopwatch() as made:
            canonical = certified_chain(experiment, count=count)
        with stopwatch() as hashed:
            for data in canonical:
                hashlib.sha256(data).hexdigest()
        with stopwatch() as verified:
            report = records_verify(experiment=experiment)
        # What records_verify reads, read alone: the database's share of its time.
        with stopwatch() as read_records:
            texts = (
                CertifiedResult.objects.filter(experiment=experiment)
                .order_by("seq")
                .annotate(payload_text=Cast("payload", output_field=TextField()))
                .values_list("payload_text", flat=True)
                .iterator(chunk_size=VERIFY_BATCH)
            )
            read_count = sum(1 for _ in texts)
        with stopwatch() as read_trials:
            trial_count = sum(len(rows) for _, rows in trial_rows_by_seq(experiment))
        size = sum(len(data) for data in canonical)
        return BenchResult(
            ratio=verified[0] / hashed[0],
            target=3.0,
            label="records: records_verify / hashlib",
            lines=[
                f"records: {count} ({tasks} trials each), {size / 1e6:.1f} MB of canonical payload; "
                f"made in {made[0]:.1f} s",
                f"hashlib sha256 over the canonical bytes: {hashed[0]:8.3f} s",
                f"records_verify:                          {verified[0]:8.3f} s  "
                f"({1e6 * verified[0] / count:.0f} us per record)",
                f"of which reading alone: the payloads {read_records[0]:.3f} s ({read_count} records), "
                f"the trial rows {read_trials[0]:.3f} s ({trial_count} rows)",
                f"verified: {'ok' if report.ok else 'PROBLEMS: ' + '; '.join(report.problems[:3])}",
            ],
            checks={"records verify ok": report.ok},
        )

    return with_bench_experiment("records", tasks, 1, body)
