"""Record verification: ``records_verify`` over a long chain of certified
records versus reading the rows it must read with a raw cursor and hashing
their payloads with hashlib.

The baseline reads what no verification can skip: every record's row (seq,
links, digest, signature, its evaluation's experiment and candidate tree,
the stored canonical payload text) and every trial row a record binds (the
twelve facts of ``TRIAL_ROW_FIELDS``), in seq order as a streamed check
reads them, through the database driver's own cursor with no ORM, and
hashes each payload with SHA-256, and the per-split totals stored beside
each record (``EvaluationSplitStats``, which verification recomputes from
the trials). Everything ``records_verify`` does beyond that (parsing,
comparing, signatures, recomputing the totals, the ORM) is what the ratio
measures.

The records are made in bulk with the certification code itself
(``payload_build``, ``trial_row``, ``record_digest``, ``record_signature``,
``head_signature``, ``split_stats_store``) over real evaluation and trial
rows, so they verify exactly as records written one at a time by
``result_certify`` would.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

from evolution import digests, records
from evolution.models import (
    Candidate,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Experiment,
    SplitMembership,
    Task,
    Trial,
)
from evolution.services.evaluation import trial_seed
from evolution.services.experiments import split_digests_compute
from evolution.services.records import (
    TRIAL_ORDER,
    VERIFY_BATCH,
    payload_build,
    records_verify,
    split_stats_store,
    trial_row,
)
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.orchestration import SPLITS, vacuum_churned, with_bench_experiment

BATCH = 2000


def raw_read_and_hash(experiment: Experiment) -> tuple[int, int, int]:
    """Read with the driver's cursor the rows ``records_verify`` must read
    for ``experiment`` (its records with their evaluation's experiment and
    candidate tree; the trial rows they bind; the per-split totals stored
    beside them), in seq order, and SHA-256 each payload. Returns (records,
    trial rows, stored totals).

    On PostgreSQL both are read through server-side cursors, ``VERIFY_BATCH``
    records (and four times as many trial rows) a round trip, as
    ``records_verify`` streams them: a client-side cursor would hold the whole
    chain in memory.
    """
    results, evaluations = CertifiedResult._meta.db_table, Evaluation._meta.db_table
    candidates, trials, tasks = Candidate._meta.db_table, Trial._meta.db_table, Task._meta.db_table
    record_sql = (
        f"SELECT r.seq, r.prev_digest, r.record_digest, r.signature, r.evaluation_id, e.experiment_id, c.tree_id, "
        f"r.payload FROM {results} r JOIN {evaluations} e ON e.id = r.evaluation_id "
        f"JOIN {candidates} c ON c.id = e.candidate_id WHERE r.experiment_id = %s ORDER BY r.seq"
    )
    criteria = "t.criteria_results::text" if connection.vendor == "postgresql" else "t.criteria_results"
    trial_sql = (
        f'SELECT r.seq, k.external_id, t.split, t."index", t.seed, t.outcome, t.score, {criteria}, t.tokens, '
        f"t.steps, t.valid_output, t.submitted, t.error_kind FROM {trials} t "
        f"JOIN {results} r ON r.evaluation_id = t.evaluation_id JOIN {tasks} k ON k.id = t.task_id "
        f'WHERE r.experiment_id = %s ORDER BY r.seq, t.split, k.external_id, t."index"'
    )
    stats_sql = (
        f"SELECT s.evaluation_id, s.split, s.candidate_id, s.trials, s.passed, s.errors, s.score_sum, "
        f"s.tokens_sum, s.tokens_count FROM {EvaluationSplitStats._meta.db_table} s "
        f"JOIN {evaluations} e ON e.id = s.evaluation_id WHERE e.experiment_id = %s"
    )
    connection.ensure_connection()
    raw = connection.connection
    counts = {"records": 0, "trials": 0, "totals": 0}
    queries = (("records", record_sql, VERIFY_BATCH), ("trials", trial_sql, 4 * VERIFY_BATCH))
    with transaction.atomic():  # a server-side cursor lives in a transaction
        for name, sql, size in (*queries, ("totals", stats_sql, 4 * VERIFY_BATCH)):
            hashed = name == "records"
            if connection.vendor == "postgresql":
                cursor = raw.cursor(name=f"bench_{name}")
                cursor.itersize = size
            else:
                cursor = raw.cursor()
            sql = sql.replace("%s", "%s" if connection.vendor == "postgresql" else "?")
            cursor.execute(sql, [experiment.pk])
            while rows := cursor.fetchmany(size):
                if hashed:
                    for row in rows:
                        hashlib.sha256(row[7].encode()).hexdigest()
                counts[name] += len(rows)
            cursor.close()
    return counts["records"], counts["trials"], counts["totals"]


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
            # The per-split totals result_certify stores beside each record (what the screens read).
            split_stats_store(evaluations=Evaluation.objects.filter(pk__in=[e.pk for e in evaluations]))
            Experiment.objects.filter(pk=experiment.pk).update(
                chain_length=seq,
                chain_head=prev,
                chain_head_signature=records.head_signature(key, experiment_uid=uid, length=seq, head=prev),
            )
    return canonical


@benchmark(
    "records",
    "records_verify over 100,000 certified records vs a raw cursor reading the same rows plus hashlib",
    quick={"count": 500},
)
def records_benchmark(*, count: int = 100_000, tasks: int = 4) -> BenchResult:
    def body(experiment: Experiment, _scratch: Path) -> BenchResult:
        with stopwatch() as made:
            canonical = certified_chain(experiment, count=count)
        # The chain was written in one burst: without statistics PostgreSQL
        # estimated 300 records where there are 100,000, chose hash joins that
        # spilled to disk, and sorted the records on disk. A database whose
        # chain grew over days has been analyzed (autovacuum, on by default;
        # off on our benchmark server): both sides are measured after it.
        vacuum_churned()
        with stopwatch() as hashed:
            for data in canonical:
                hashlib.sha256(data).hexdigest()
        # Baseline and measured side run twice, alternated, so neither is
        # alone in a cold cache or a burst of another tenant's load.
        baseline_times, verify_times = [], []
        for _ in range(2):
            with stopwatch() as raw:
                raw_records, raw_trials, raw_totals = raw_read_and_hash(experiment)
            baseline_times.append(raw[0])
            with stopwatch() as verified:
                report = records_verify(experiment=experiment)
            verify_times.append(verified[0])
        size = sum(len(data) for data in canonical)
        return BenchResult(
            ratio=min(verify_times) / min(baseline_times),
            target=2.0,
            label="records: records_verify / (raw cursor read + hashlib)",
            lines=[
                f"records: {count} ({tasks} trials each), {size / 1e6:.1f} MB of canonical payload; "
                f"made in {made[0]:.1f} s",
                f"hashlib sha256 over the canonical bytes alone: {hashed[0]:8.3f} s",
                f"raw cursor read + hashlib ({raw_records} records, {raw_trials} trial rows, {raw_totals} stored "
                "per-split totals): " + ", ".join(f"{t:.3f} s" for t in baseline_times),
                "records_verify: "
                + ", ".join(f"{t:.3f} s ({1e6 * t / count:.0f} us per record)" for t in verify_times),
                "the ratio takes the faster of each",
                f"verified: {'ok' if report.ok else 'PROBLEMS: ' + '; '.join(report.problems[:3])}",
            ],
            checks={
                "records verify ok": report.ok,
                "baseline read every row": raw_records == count and raw_trials == count * tasks and raw_totals > 0,
            },
        )

    return with_bench_experiment("records", tasks, 1, body)
