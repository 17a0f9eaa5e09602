"""Benchmark ``pages``: the review screens at scale, on PostgreSQL.

In a throwaway database, an experiment is grown to ``candidates`` candidates
(each with an edit, a certified evaluation, a gate decision and a ledger
entry; a third of them flagged and waiting in the review queue), ``trials``
trials (one per task and trial index of every candidate), ``annotations``
annotations on failed trials and one trajectory of ``steps`` steps. Rows are
written in bulk: candidates and their rows with ``bulk_create``, trials with
one ``INSERT ... SELECT`` from the evaluations and the split memberships.

Then each screen is requested ``repeat`` times through the real URLs by an
admin-role user: experiments list, dashboard, lineage (every candidate),
results matrix, review queue and the trial page of the long trajectory. The
target is a median under ``TARGET_MS`` for each; the ratio printed beside
each is to a raw SQL query returning the rows the page lists. The query count
of each page is captured on a small world first (the same shapes, a few
candidates) and must be the same on the large one.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from evolution import digests, selectors
from evolution.access import roles_ensure
from evolution.loop import load
from evolution.loop.lifecycle import recipe_store
from evolution.models import (
    Annotation,
    AnnotationLabel,
    AtomicEdit,
    Blob,
    Candidate,
    Evaluation,
    Experiment,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    ReviewItem,
    Run,
    Trajectory,
    TrajectoryStep,
    Tree,
    TreeEntry,
    Trial,
)
from evolution.recipes import load_preset, parse_recipe
from evolution.services.records import split_stats_store
from evolution.services.snapshots import tree_entries, tree_store
from evolution.trees import FileEntry
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.scratch import bench_experiment, scratch_database, served_hosts

TARGET_MS = 300.0
BATCH = 2000
# One candidate in twenty is flagged and waits in the review queue (no trials);
# the others were measured and gated.
STATES = (Candidate.State.FLAGGED, *([Candidate.State.REJECTED_GATE] * 15), *([Candidate.State.ACCEPTED] * 4))


# The screens that show a candidate's dS against another harness (``load.candidate_delta``).
COMPARING = ("candidate page (flags)", "API candidate detail")


@dataclass
class World:
    experiment: Experiment
    run: Run
    trial_pk: int  # the trial holding the long trajectory
    candidate_pk: int = 0  # a decided candidate with leakage flags


def _world(*, name: str, tasks: int, k: int) -> World:
    seed_tree = tree_store(entries=[FileEntry("prompt.md", "100644", b"Answer carefully.\n")])
    experiment = bench_experiment(name=name, seed_tree=seed_tree, tasks=tasks)
    recipe = recipe_store(recipe=load_preset("rrsi"))
    now = timezone.now()
    run = Run.objects.create(
        experiment=experiment, recipe=recipe, status=Run.Status.FINISHED, started_at=now, finished_at=now
    )
    seed = selectors.experiment_seed(experiment)
    Candidate.objects.filter(pk=seed.pk).update(state=Candidate.State.ACCEPTED, certified_at=now, run=run, round=0)
    # The seed's baseline, which every candidate's dS is measured against.
    split_names = sorted(set(experiment.split_memberships.values_list("split", flat=True)))
    task_count = experiment.split_memberships.count()
    baseline = Evaluation.objects.create(
        experiment=experiment,
        candidate=seed,
        run=run,
        purpose=Evaluation.Purpose.BASELINE,
        splits=split_names,
        k=k,
        state=Evaluation.State.CERTIFIED,
        trials_total=task_count * k,
        trials_finished=task_count * k,
        finished_at=now,
    )
    _insert_trials(experiment.pk, first_label_pk=seed.pk, k=k, now=now)
    split_stats_store(evaluations=Evaluation.objects.filter(pk=baseline.pk))
    return World(experiment=experiment, run=run, trial_pk=0)


def _round(candidate: Candidate) -> int:
    assert candidate.round is not None  # every generated candidate is given a round
    return candidate.round


def grow(world: World, *, candidates: int, k: int, annotations: int, steps: int, author: User) -> None:
    """Add ``candidates`` candidates with their rows, ``k`` trials per task
    each, ``annotations`` annotations and a trajectory of ``steps`` steps."""
    experiment, run = world.experiment, world.run
    seed = Candidate.objects.get(seed_of=experiment)
    seed_files = tree_entries(tree=seed.tree)
    now = timezone.now()
    first = Candidate.objects.filter(experiment=experiment).count()
    numbers = range(first, first + candidates)
    # Real content-addressed trees: the seed's files plus one note each.
    notes = {n: FileEntry(f"notes/case-{n}.md", "100644", f"note {n}\n".encode()) for n in numbers}
    tree_digest = {
        n: digests.tree_digest(
            (e.path, e.mode, digests.blob_digest(e.data)) for e in sorted([*seed_files, notes[n]], key=lambda e: e.path)
        )
        for n in numbers
    }
    Blob.objects.bulk_create(
        [Blob(digest=digests.blob_digest(e.data), size=len(e.data), content=e.data) for e in notes.values()],
        batch_size=BATCH,
        ignore_conflicts=True,
    )
    Tree.objects.bulk_create(
        [
            Tree(digest=tree_digest[n], file_count=len(seed_files) + 1, total_size=sum(len(e.data) for e in seed_files))
            for n in numbers
        ],
        batch_size=BATCH,
    )
    TreeEntry.objects.bulk_create(
        [
            TreeEntry(tree_id=tree_digest[n], path=e.path, mode=e.mode, blob_id=digests.blob_digest(e.data))
            for n in numbers
            for e in [*seed_files, notes[n]]
        ],
        batch_size=BATCH,
    )
    rounds = max(1, candidates // 5)
    made = Candidate.objects.bulk_create(
        [
            Candidate(
                experiment=experiment,
                run=run,
                parent=seed,
                tree_id=tree_digest[n],
                origin=Candidate.Origin.PROPOSED,
                state=STATES[n % len(STATES)],
                certified_at=now if STATES[n % len(STATES)] != Candidate.State.FLAGGED else None,
                round=1 + (n - first) * rounds // candidates,
                label=f"case {n}",
            )
            for n in numbers
        ],
        batch_size=BATCH,
    )
    if made[0].pk is None:  # SQLite before 3.35 gives no ids back
        made = list(Candidate.objects.filter(experiment=experiment, label__startswith="case ").order_by("pk"))
    edits = AtomicEdit.objects.bulk_create(
        [
            AtomicEdit(
                candidate=c,
                index=0,
                component="memory",
                hypothesis=f"A note about {c.label} helps.",
                paths=[f"notes/{c.label.replace(' ', '-')}.md"],
                diff=f"+note {c.label}\n",
            )
            for c in made
        ],
        batch_size=BATCH,
    )
    measured = [(c, e) for c, e in zip(made, edits, strict=True) if c.state != Candidate.State.FLAGGED]
    split_names = sorted(set(experiment.split_memberships.values_list("split", flat=True)))
    task_count = experiment.split_memberships.count()
    Evaluation.objects.bulk_create(
        [
            Evaluation(
                experiment=experiment,
                candidate=c,
                run=run,
                splits=split_names,
                k=k,
                state=Evaluation.State.CERTIFIED,
                trials_total=task_count * k,
                trials_finished=task_count * k,
                finished_at=now,
            )
            for c, _ in measured
        ],
        batch_size=BATCH,
    )
    GateDecision.objects.bulk_create(
        [
            GateDecision(
                run=run,
                candidate=c,
                current=seed,
                round=_round(c),
                accepted=c.state == Candidate.State.ACCEPTED,
                rule="score",
                explanation="generated",
                numbers={"dS": 0.0, "dC": 0.01},
            )
            for c, _ in measured
        ],
        batch_size=BATCH,
    )
    LedgerEntry.objects.bulk_create(
        [
            LedgerEntry(
                run=run,
                edit=e,
                candidate=c,
                round=_round(c),
                component="memory",
                hypothesis=e.hypothesis,
                delta_score=0.0,
                delta_cost=0.01,
                accepted=c.state == Candidate.State.ACCEPTED,
            )
            for c, e in measured
        ],
        batch_size=BATCH,
    )
    flagged = [(c, e) for c, e in zip(made, edits, strict=True) if c.state == Candidate.State.FLAGGED]
    LeakageFlag.objects.bulk_create(
        [
            LeakageFlag(candidate=c, edit=e, rule="task-id", path=e.paths[0], line=c.label, matched=c.label)
            for c, e in flagged
        ],
        batch_size=BATCH,
    )
    ReviewItem.objects.bulk_create([ReviewItem(candidate=c) for c, _ in flagged], batch_size=BATCH)
    _insert_trials(experiment.pk, first_label_pk=made[0].pk, k=k, now=now)
    _annotate(experiment.pk, annotations=annotations, author=author, now=now)
    if steps:
        world.trial_pk = _long_trajectory(measured[-1][0] if measured else seed, steps=steps)
    if len(measured) > 1:
        # The candidate page measured: a gated candidate a reviewer looked at, with leakage flags, and its
        # decision's numbers kept as the gate keeps them (dS, dC and the interval of ``load.comparison``).
        shown, shown_edit = measured[-2]  # [-1] has the long trajectory's extra trial
        world.candidate_pk = shown.pk
        LeakageFlag.objects.bulk_create(
            [
                LeakageFlag(candidate=shown, edit=shown_edit, rule=rule, path=shown_edit.paths[0], line=shown.label)
                for rule in ("task-id", "expected-answer", "task-text")
            ]
        )
        _decide(shown, seed, run)
    # The per-split totals certification stores (result_certify does the same),
    # once the evaluations' trials are all written.
    split_stats_store(evaluations=Evaluation.objects.filter(experiment=experiment, candidate_id__gte=made[0].pk))


def _decide(candidate: Candidate, base: Candidate, run: Run) -> None:
    """Give ``candidate``'s gate decision the numbers the gate keeps (``steps._write_decision``)."""
    evaluation = parse_recipe(run.recipe.spec).evaluation
    found = load.comparison(base.pk, candidate.pk, evaluation.evolve_splits, evaluation.score_metric)
    assert found is not None  # both have certified trials on the evolve splits
    GateDecision.objects.filter(candidate=candidate, round=_round(candidate)).update(
        numbers={"dS": found.estimate.delta, "dC": found.delta_cost, **found.numbers()}
    )


def _insert_trials(experiment_id: int, *, first_label_pk: int, k: int, now: datetime) -> None:
    """One trial per task and index of every new certified evaluation, in
    one statement (portable SQL: PostgreSQL and SQLite)."""
    indexes = " UNION ALL ".join(f"SELECT {i} AS idx" for i in range(k))
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO evolution_trial (evaluation_id, candidate_id, task_id, split, "index", seed, state,
                lease_owner, attempt, outcome, score, criteria_results, tokens, steps, wall_time,
                valid_output, submitted, error_kind, error, sandbox_profile, environment, started_at, finished_at)
            SELECT ev.id, ev.candidate_id, sm.task_id, sm.split, ks.idx, 0, 'done',
                '', 1,
                CASE WHEN (sm.task_id + ev.candidate_id + ks.idx) %% 3 = 0 THEN 'fail' ELSE 'pass' END,
                CASE WHEN (sm.task_id + ev.candidate_id + ks.idx) %% 3 = 0 THEN 0.0 ELSE 1.0 END,
                '[]', 100 + ev.candidate_id %% 50, 3, 0.1, %s, %s, '', '', '', '', %s, %s
            FROM evolution_evaluation ev
            JOIN evolution_splitmembership sm ON sm.experiment_id = ev.experiment_id
            CROSS JOIN ({indexes}) ks
            WHERE ev.experiment_id = %s AND ev.candidate_id >= %s
            """,
            [True, True, now, now, experiment_id, first_label_pk],
        )


def _annotate(experiment_id: int, *, annotations: int, author: User, now: datetime) -> None:
    """``annotations`` annotations by ``author`` on failed trials (the
    default labels in turn)."""
    labels = list(AnnotationLabel.objects.filter(experiment__isnull=True).order_by("pk").values_list("pk", flat=True))
    trial_ids = list(
        Trial.objects.filter(candidate__experiment_id=experiment_id, outcome=Trial.Outcome.FAIL)
        .exclude(annotations__author=author)
        .order_by("-pk")
        .values_list("pk", flat=True)[:annotations]
    )

    Annotation.objects.bulk_create(
        [
            Annotation(trial_id=t, author=author, label_id=labels[i % len(labels)], note=f"note {i}")
            for i, t in enumerate(trial_ids)
        ],
        batch_size=BATCH,
    )


def _long_trajectory(candidate: Candidate, *, steps: int) -> int:
    evaluation = Evaluation.objects.filter(candidate=candidate).order_by("-pk").first()
    assert evaluation is not None
    member = candidate.experiment.split_memberships.filter(split="train").first()
    assert member is not None
    trial = Trial.objects.create(
        evaluation=evaluation,
        candidate=candidate,
        task_id=member.task_id,
        split=member.split,
        index=evaluation.k,
        state=Trial.State.DONE,
        outcome=Trial.Outcome.FAIL,
        score=0.0,
        tokens=steps * 10,
        steps=steps,
        finished_at=timezone.now(),
    )
    trajectory = Trajectory.objects.create(trial=trial, schema_version="ATIF-v1.4", step_count=steps)
    TrajectoryStep.objects.bulk_create(
        (
            TrajectoryStep(
                trajectory=trajectory,
                step_id=step_id,
                source="agent" if step_id % 2 else "user",
                message=f"step {step_id}: looked at the file and ran the tests",
                tool_calls=[{"tool_call_id": f"c{step_id}", "function_name": "bash", "arguments": {"cmd": "ls"}}]
                if step_id % 2
                else [],
                metrics={"prompt_tokens": 5, "completion_tokens": 5},
            )
            for step_id in range(1, steps + 1)
        ),
        batch_size=BATCH,
    )
    return trial.pk


# --- Measuring -------------------------------------------------------------------


def _screens(world: World) -> dict[str, str]:
    pk = world.experiment.pk
    return {
        "experiments list": reverse("review:home"),
        "dashboard": reverse("review:experiment", args=[pk]),
        "candidate list (lineage)": reverse("review:lineage", args=[pk]),
        "results matrix": reverse("review:matrix", args=[pk]),
        "review queue": reverse("review:queue"),
        "trajectory page": reverse("review:trial", args=[world.trial_pk]),
        "candidate page (flags)": reverse("review:candidate", args=[world.candidate_pk]),
        "diff page": reverse("review:candidate_diff", args=[world.candidate_pk]),
        "API candidate detail": reverse("api:candidate-detail", args=[world.candidate_pk]),
    }


def _raw_sql(world: World) -> dict[str, tuple[str, list[object]]]:
    """A hand-written query returning the rows each page lists (its first page)."""
    pk = world.experiment.pk
    return {
        "experiments list": (
            "SELECT e.id, e.name, (SELECT COUNT(*) FROM evolution_candidate c WHERE c.experiment_id = e.id) "
            "FROM evolution_experiment e ORDER BY e.id",
            [],
        ),
        "dashboard": (
            "SELECT c.round, COUNT(*), SUM(CASE WHEN c.state = 'accepted' THEN 1 ELSE 0 END) "
            "FROM evolution_candidate c WHERE c.experiment_id = %s GROUP BY c.round ORDER BY c.round",
            [pk],
        ),
        "candidate list (lineage)": (
            "SELECT id, parent_id, state, round, label FROM evolution_candidate WHERE experiment_id = %s ORDER BY id",
            [pk],
        ),
        "results matrix": (
            "SELECT t.candidate_id, t.task_id, t.outcome FROM evolution_trial t WHERE t.candidate_id IN "
            "(SELECT id FROM evolution_candidate WHERE experiment_id = %s ORDER BY round, id LIMIT 20) "
            "ORDER BY t.task_id LIMIT 2000",
            [pk],
        ),
        "review queue": (
            "SELECT r.id, r.candidate_id, c.label FROM evolution_reviewitem r "
            "JOIN evolution_candidate c ON c.id = r.candidate_id WHERE r.state = 'open' ORDER BY r.created_at LIMIT 25",
            [],
        ),
        "trajectory page": (
            "SELECT s.step_id, s.source, s.message, s.tool_calls FROM evolution_trajectorystep s "
            "JOIN evolution_trajectory j ON j.id = s.trajectory_id WHERE j.trial_id = %s ORDER BY s.step_id LIMIT 100",
            [world.trial_pk],
        ),
        "candidate page (flags)": (
            "SELECT t.task_id, t.split, t.outcome, t.score, t.tokens FROM evolution_trial t WHERE t.candidate_id = %s",
            [world.candidate_pk],
        ),
        "diff page": (
            "SELECT e.path, b.content FROM evolution_treeentry e JOIN evolution_blob b ON b.digest = e.blob_id "
            "WHERE e.tree_id = (SELECT tree_id FROM evolution_candidate WHERE id = %s) ORDER BY e.path",
            [world.candidate_pk],
        ),
        "API candidate detail": (
            "SELECT t.task_id, t.split, t.outcome, t.score, t.tokens FROM evolution_trial t WHERE t.candidate_id = %s",
            [world.candidate_pk],
        ),
    }


def _query_counts(client: Client, screens: dict[str, str]) -> dict[str, int]:
    counts = {}
    for name, url in screens.items():
        client.get(url)  # the first request warms the session and caches
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} ({name}) answered {response.status_code}")
        counts[name] = len(captured)
    return counts


def _median_ms(action: object, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        with stopwatch() as elapsed:
            action()  # type: ignore[operator]
        samples.append(elapsed[0] * 1000)
    return statistics.median(samples)


def _raw(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.fetchall()


def _signed_in_admin(*, create: bool) -> tuple[User, Client]:
    if create:
        roles_ensure()
        admin = User.objects.create_user(username="bench-pages-admin", password=None)
        admin.groups.add(Group.objects.get(name="admin"))
    else:
        admin = User.objects.get(username="bench-pages-admin")
    client = Client()
    client.force_login(admin)
    return admin, client


def _small_counts(*, k: int, tasks: int) -> dict[str, int]:
    """The query count of each page on the small world (a few candidates),
    built in the current database."""
    admin, client = _signed_in_admin(create=True)
    world = _world(name="bench-pages", tasks=tasks, k=k)
    with transaction.atomic():
        grow(world, candidates=40, k=k, annotations=10, steps=150, author=admin)
    return _query_counts(client, _screens(world))


def _found_world() -> World:
    """The large world a kept run generated."""
    experiment = Experiment.objects.get(name="bench-pages")
    longest = Trajectory.objects.filter(trial__candidate__experiment=experiment).order_by("-step_count", "-pk").first()
    assert longest is not None
    return World(
        experiment=experiment,
        run=Run.objects.filter(experiment=experiment).order_by("pk")[0],
        trial_pk=longest.trial_id,
        candidate_pk=Candidate.objects.filter(
            experiment=experiment, leakage_flags__isnull=False, gate_decisions__isnull=False
        )
        .order_by("-pk")
        .values_list("pk", flat=True)[0],
    )


@benchmark(
    "pages",
    "review screens with 10,000 candidates and 1,000,000 trials (PostgreSQL)",
    quick={"candidates": 300, "tasks": 20, "k": 2, "annotations": 100, "steps": 500, "repeat": 3},
    reusable=True,
    own_database=True,
)
def run(
    *,
    candidates: int = 10_000,
    tasks: int = 53,  # 9,500 measured candidates x 53 tasks x k=2: about 1,000,000 trials
    k: int = 2,
    annotations: int = 2_000,
    steps: int = 10_000,
    repeat: int = 7,
    scratch: bool = True,
    keep: bool = False,
    reuse: str = "",
) -> BenchResult:
    """``keep``: leave the generated database in place and print its name;
    ``reuse``: measure in such a database instead of generating one (the
    current migrations are applied to it first; the small world's query
    counts are then taken in a fresh throwaway database, as a normal run
    takes them before growing). Sizes are those of the reused data."""
    lines: list[str] = []
    with ExitStack() as stack:
        stack.enter_context(served_hosts())
        if reuse:
            with scratch_database():
                small = _small_counts(k=k, tasks=tasks)
        database = stack.enter_context(scratch_database(keep=keep, reuse=reuse)) if scratch or reuse else ""
        vendor = connection.vendor
        if vendor != "postgresql":
            lines.append(f"database is {vendor}: the target is defined on PostgreSQL (sizes run as given)")
        if reuse:
            admin, client = _signed_in_admin(create=False)
            world = _found_world()
            if vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")  # new migrations may have added indexes or rows
        else:
            small = _small_counts(k=k, tasks=tasks)
            admin, client = _signed_in_admin(create=False)
            world = _found_world()
            with stopwatch() as generating:
                with transaction.atomic():
                    grow(
                        world, candidates=candidates - 40, k=k, annotations=annotations - 10, steps=steps, author=admin
                    )
                if vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("ANALYZE")
        screens = _screens(world)
        large = _query_counts(client, screens)
        total_candidates = Candidate.objects.filter(experiment=world.experiment).count()
        total_trials = Trial.objects.filter(candidate__experiment=world.experiment).count()

        total_annotations = Annotation.objects.count()
        step_count = Trajectory.objects.get(trial_id=world.trial_pk).step_count
        rows = (
            f"{total_candidates:,} candidates, {total_trials:,} trials, {total_annotations:,} annotations "
            f"and a {step_count:,}-step trajectory"
        )
        if reuse:
            lines.append(f"reused database {reuse} (generated by an earlier run, migrated now): {rows}")
        else:
            lines.append(f"generated {rows} in {generating[0]:.1f} s")
        if keep:
            lines.append(f"kept database {database}: --reuse-data {database} measures it again (drop it when done)")
        raw = _raw_sql(world)
        # The pages that compare two sets of trials, once with nothing cached (the first request after the
        # trials changed, or in a fresh process): reported, the target is on the median.
        cold_lines = []
        for name in COMPARING:
            cache.clear()
            with stopwatch() as cold:
                client.get(screens[name])
            cold_lines.append(f"{name}, first request with an empty cache: {cold[0] * 1000:.1f} ms")
        worst = 0.0
        for name, url in screens.items():
            page_ms = _median_ms(lambda url=url: client.get(url), repeat)
            sql, params = raw[name]
            raw_ms = _median_ms(lambda sql=sql, params=params: _raw(sql, params), repeat)
            worst = max(worst, page_ms)
            lines.append(
                f"{name:<26} median {page_ms:7.1f} ms  raw SQL {raw_ms:6.1f} ms  ratio {page_ms / raw_ms:6.1f}  "
                f"queries {small[name]} small / {large[name]} large"
            )
    checks = {f"queries constant: {name}": small[name] == large[name] for name in small}
    if vendor != "postgresql" and total_candidates > 10_000:  # not a --quick smoke run
        checks["postgresql"] = False
    lines.append(f"median of {repeat} requests each; target < {TARGET_MS:g} ms per page")
    lines.extend(cold_lines)
    return BenchResult(
        ratio=worst / TARGET_MS,
        target=1.0,
        label="pages slowest median / 300 ms",
        lines=lines,
        checks=checks,
    )
