"""Gate and review decisions as certified records in the experiment's chain.

A run of the tiny experiment with one flagged candidate rejected by a
reviewer; then each forgery a database owner or a bundle editor could make
(a decision's verdict, reason or numbers, a candidate's state or reason, the
surface or recipe spec) is named by ``verify_records`` or by ``verify_records
--bundle``, and ``import_bundle`` refuses the bundle with one line, exit 2,
writing nothing.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from evolution import digests, records
from evolution.loop.review import review_decide
from evolution.models import (
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    Experiment,
    GateDecision,
    Recipe,
    ReviewDecision,
    ReviewItem,
    Run,
    Surface,
    Tree,
)
from evolution.services.bundles import bundle_build, bundle_verify, bundle_write
from evolution.services.records import records_verify
from tests.evolution.test_loop import start
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db

WIDE_SURFACE = "include:\n  - '**'\ncomponents:\n  '**': prompt\n"


def reviewed_run() -> Run:
    """A finished rrsi run whose first flagged candidate a reviewer rejected."""
    run = drive(start("rrsi"), until=lambda r: ReviewItem.objects.filter(candidate__run=r).exists())
    item = ReviewItem.objects.filter(candidate__run=run).order_by("pk")[0]
    review_decide(item=item, user=User.objects.create_user("alice"), approve=False, reason="copies a task id")
    run = drive(run)
    assert run.status == Run.Status.FINISHED, run.error
    return run


@pytest.fixture
def run() -> Run:
    return reviewed_run()


def problems_of(run: Run) -> list[str]:
    return records_verify(experiment=run.experiment).problems


def test_every_decision_is_a_certified_record_in_the_chain(run: Run) -> None:
    experiment = Experiment.objects.get(pk=run.experiment_id)
    gates = list(GateDecision.objects.filter(run=run).select_related("record", "candidate").order_by("pk"))
    reviews = list(ReviewDecision.objects.filter(item__candidate__run=run).select_related("record"))
    assert len(gates) >= 3 and len(reviews) == 1
    assert {g.accepted for g in gates} == {True, False}
    for gate in gates:
        assert gate.record is not None
        payload = gate.record.payload
        assert gate.record is not None
        assert gate.record.kind == "gate" and payload["schema"] == records.GATE_SCHEMA
        assert payload["candidate"] == {"tree": gate.candidate.tree_id}
        assert payload["gate"]["accepted"] == gate.accepted and payload["gate"]["rule"] == gate.rule
        assert payload["gate"]["explanation"] == gate.explanation and payload["gate"]["numbers"] == gate.numbers
        assert payload["state"] == {"name": gate.candidate.state, "reason": gate.candidate.state_reason}
        assert payload["recipe"] == run.recipe.digest and payload["surface"] == experiment.surface.digest
    record = reviews[0].record
    assert record is not None
    review = record.payload
    assert review["review"]["verdict"] == "reject" and review["review"]["reviewer"] == "alice"
    assert review["state"]["name"] == Candidate.State.REJECTED_REVIEW
    # One chain: evaluations and decisions share the seq numbers and the signed head.
    evaluation_seqs = set(CertifiedResult.objects.filter(experiment=experiment).values_list("seq", flat=True))
    decision_seqs = set(CertifiedDecision.objects.filter(experiment=experiment).values_list("seq", flat=True))
    assert not evaluation_seqs & decision_seqs
    assert evaluation_seqs | decision_seqs == set(range(1, experiment.chain_length + 1))
    assert len(decision_seqs) == len(gates) + 1
    report = records_verify(experiment=experiment)
    assert report.ok, report.problems
    assert any(f"{len(decision_seqs)} decision record(s)" in line for line in report.checked)


def _gate(run: Run, *, accepted: bool) -> GateDecision:
    return GateDecision.objects.filter(run=run, accepted=accepted).exclude(rule="seed").order_by("pk")[0]


def flip_verdict(run: Run) -> str:
    gate = _gate(run, accepted=False)
    GateDecision.objects.filter(pk=gate.pk).update(accepted=True, chosen=True)
    assert gate.record is not None
    return f"record #{gate.record.seq}: gate decision differs from its record in accepted, chosen"


def edit_explanation(run: Run) -> str:
    gate = _gate(run, accepted=False)
    GateDecision.objects.filter(pk=gate.pk).update(explanation="dS above the noise band: accepted")
    assert gate.record is not None
    return f"record #{gate.record.seq}: gate decision differs from its record in explanation"


def edit_numbers(run: Run) -> str:
    gate = _gate(run, accepted=True)
    GateDecision.objects.filter(pk=gate.pk).update(numbers={**gate.numbers, "dS": 0.5})
    assert gate.record is not None
    return f"record #{gate.record.seq}: gate decision differs from its record in numbers"


def accept_rejected(run: Run) -> str:
    gate = _gate(run, accepted=False)
    Candidate.objects.filter(pk=gate.candidate_id).update(state=Candidate.State.ACCEPTED, state_reason="forged")
    assert gate.record is not None
    return (
        f"candidate {gate.candidate.tree_id[:12]}: state 'accepted', but the certified gate decision "
        f"(record #{gate.record.seq}) made it 'rejected_gate'"
    )


def edit_reason(run: Run) -> str:
    gate = _gate(run, accepted=True)
    Candidate.objects.filter(pk=gate.candidate_id).update(state_reason="accepted by the board")
    assert gate.record is not None
    return (
        f"candidate {gate.candidate.tree_id[:12]}: state reason differs from the certified gate decision "
        f"(record #{gate.record.seq})"
    )


def unknown_state(run: Run) -> str:
    gate = _gate(run, accepted=False)
    Candidate.objects.filter(pk=gate.candidate_id).update(state="promoted")
    return f"candidate {gate.candidate.tree_id[:12]}: unknown state 'promoted'"


def unreject_reviewed(run: Run) -> str:
    decision = ReviewDecision.objects.select_related("item__candidate", "record").get(item__candidate__run=run)
    Candidate.objects.filter(pk=decision.item.candidate_id).update(state=Candidate.State.APPROVED)
    assert decision.record is not None
    return (
        f"candidate {decision.item.candidate.tree_id[:12]}: state 'approved', but the certified review decision "
        f"(record #{decision.record.seq}) made it 'rejected_review'"
    )


def accept_undecided(run: Run) -> str:
    flagged = Candidate.objects.filter(run=run, state=Candidate.State.FLAGGED).order_by("pk").first()
    assert flagged is not None
    seed = run.experiment.seed_candidate
    assert seed is not None
    Candidate.objects.filter(pk=flagged.pk).update(state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    return f"candidate {flagged.tree_id[:12]}: state 'accepted' with no certified gate decision"


def uncertify(run: Run) -> str:
    gate = _gate(run, accepted=True)
    GateDecision.objects.filter(pk=gate.pk).update(record=None)
    return f"gate decision {gate.pk} (candidate {gate.candidate.tree_id[:12]}, round {gate.round}) is not certified"


def blame_another(run: Run) -> str:
    decision = ReviewDecision.objects.select_related("record").get(item__candidate__run=run)
    ReviewDecision.objects.filter(pk=decision.pk).update(reviewer=User.objects.create_user("mallory"))
    assert decision.record is not None
    return f"record #{decision.record.seq}: review decision differs from its record in reviewer"


def widen_surface(run: Run) -> str:
    Surface.objects.filter(pk=run.experiment.surface_id).update(
        spec=WIDE_SURFACE, digest=digests.sha256_hex(WIDE_SURFACE.encode())
    )
    first = CertifiedDecision.objects.filter(experiment=run.experiment).order_by("seq").first()
    assert first is not None
    return f"record #{first.seq}: surface changed since this decision (its digest differs)"


def edit_surface_spec(run: Run) -> str:
    Surface.objects.filter(pk=run.experiment.surface_id).update(spec=WIDE_SURFACE)
    return f"surface {run.experiment.surface.name!r}: spec does not match its digest"


def edit_recipe(run: Run) -> str:
    spec = {**run.recipe.spec, "seed": 99}
    Recipe.objects.filter(pk=run.recipe_id).update(spec=spec)
    return f"recipe {run.recipe.digest[:12]}: spec does not match its digest"


DATABASE_FORGERIES = [
    flip_verdict,
    edit_explanation,
    edit_numbers,
    accept_rejected,
    edit_reason,
    unknown_state,
    unreject_reviewed,
    accept_undecided,
    uncertify,
    blame_another,
    widen_surface,
    edit_surface_spec,
    edit_recipe,
]


def test_a_forged_decision_state_or_spec_fails_verification(run: Run) -> None:
    """Each forgery in a savepoint rolled back before the next (one run serves them all)."""
    assert problems_of(run) == []
    label = f"experiment {run.experiment_id} {run.experiment.name!r}: "
    for forge in DATABASE_FORGERIES:
        with transaction.atomic():
            expected = forge(run)
            problems = problems_of(run)
            assert label + expected in problems, (forge.__name__, problems)
            out = io.StringIO()
            with pytest.raises(SystemExit) as exited:
                call_command("verify_records", "--experiment", str(run.experiment_id), stdout=out)
            assert exited.value.code == 1
            assert f"MISMATCH {label}{expected}\n" in out.getvalue()
            transaction.set_rollback(True)
        assert problems_of(run) == [], forge.__name__


# --- Bundles ----------------------------------------------------------------------------------


def _candidate(bundle: dict[str, Any], state: str) -> dict[str, Any]:
    return next(c for c in bundle["candidates"] if c["state"] == state and c["origin"] != "seed")


def b_accept_rejected(bundle: dict[str, Any]) -> str:
    candidate = _candidate(bundle, "rejected_gate")
    candidate.update(state="accepted", state_reason="dS above the noise band: accepted")
    return f"candidate {candidate['tree'][:12]}: state 'accepted', but the certified gate decision"


def b_edit_reason(bundle: dict[str, Any]) -> str:
    candidate = _candidate(bundle, "rejected_gate")
    candidate["state_reason"] = "rejected by the board"
    return f"candidate {candidate['tree'][:12]}: state reason differs from the certified gate decision"


def b_unknown_state(bundle: dict[str, Any]) -> str:
    candidate = _candidate(bundle, "rejected_gate")
    candidate["state"] = "promoted"
    return f"candidate {candidate['tree'][:12]}: unknown state 'promoted'"


def b_unreject_reviewed(bundle: dict[str, Any]) -> str:
    candidate = _candidate(bundle, "rejected_review")
    candidate["state"] = "approved"
    return f"candidate {candidate['tree'][:12]}: state 'approved', but the certified review decision"


def b_widen_surface(bundle: dict[str, Any]) -> str:
    bundle["surface"].update(spec=WIDE_SURFACE, digest=digests.sha256_hex(WIDE_SURFACE.encode()))
    return "surface differs from the certified one"


def b_edit_decision(bundle: dict[str, Any]) -> str:
    decision = next(d for d in bundle["decisions"] if d["kind"] == "gate" and not d["payload"]["gate"]["accepted"])
    decision["payload"]["gate"]["explanation"] = "accepted after all"
    return f"record #{decision['seq']}: payload digest"


def b_drop_decisions(bundle: dict[str, Any]) -> str:
    bundle["decisions"] = []
    return "chain truncated or extended"


BUNDLE_FORGERIES = [
    b_accept_rejected,
    b_edit_reason,
    b_unknown_state,
    b_unreject_reviewed,
    b_widen_surface,
    b_edit_decision,
    b_drop_decisions,
]


def test_a_bundle_with_forged_decisions_does_not_verify_and_is_not_imported(run: Run, tmp_path: Path) -> None:
    clean = bundle_build(experiment=run.experiment)
    assert bundle_verify(copy.deepcopy(clean), key=settings.RSI_RECORDS_KEY) == []
    before = (Experiment.objects.count(), Candidate.objects.count(), CertifiedDecision.objects.count())
    for forge in BUNDLE_FORGERIES:
        bundle = copy.deepcopy(clean)
        expected = forge(bundle)
        path = tmp_path / f"{forge.__name__}.json"
        bundle_write(bundle=bundle, path=path)

        out = io.StringIO()
        with pytest.raises(SystemExit) as exited:
            call_command("verify_records", "--bundle", str(path), stdout=out)
        assert exited.value.code == 1
        lines = out.getvalue().splitlines()
        assert any(line.startswith("MISMATCH ") and expected in line for line in lines), (forge.__name__, lines)

        with pytest.raises(CommandError) as refused:
            call_command("import_bundle", str(path), "--name", "forged copy")
        assert refused.value.returncode == 2, forge.__name__
        message = str(refused.value)
        assert "\n" not in message and "does not verify" in message and "nothing was imported" in message
        assert (Experiment.objects.count(), Candidate.objects.count(), CertifiedDecision.objects.count()) == before


@pytest.mark.django_db(transaction=True)
def test_an_intact_bundle_imports_its_decisions_and_verifies_there(tmp_path: Path) -> None:
    run = reviewed_run()
    experiment = Experiment.objects.get(pk=run.experiment_id)
    digests_before = list(
        CertifiedDecision.objects.filter(experiment=experiment).order_by("seq").values_list("record_digest", flat=True)
    )
    states_before = sorted(
        Candidate.objects.filter(certified_decisions__isnull=False)
        .distinct()
        .values_list("tree_id", "state", "state_reason")
    )
    path = tmp_path / "bundle.json"
    call_command("export_experiment", str(experiment.pk), str(path), stdout=io.StringIO())
    call_command("flush", interactive=False, verbosity=0)

    call_command("import_bundle", str(path), stdout=io.StringIO())
    imported = Experiment.objects.get(uid=experiment.uid)
    assert imported.chain_length == experiment.chain_length
    assert (
        list(
            CertifiedDecision.objects.filter(experiment=imported)
            .order_by("seq")
            .values_list("record_digest", flat=True)
        )
        == digests_before
    )
    states = sorted(
        Candidate.objects.filter(experiment=imported, certified_decisions__isnull=False)
        .distinct()
        .values_list("tree_id", "state", "state_reason")
    )
    assert states == states_before
    report = records_verify(experiment=imported)
    assert report.ok, report.problems


# --- verify_records --bundle and import_bundle: one check ---------------------------------------


def _hostile_tree(bundle: dict[str, Any], path: str, mode: str, content: bytes) -> str:
    """Add a tree holding one hostile entry, under its true digest (so every digest checks out)."""
    import base64

    blob = digests.blob_digest(content)
    bundle["blobs"][blob] = base64.b64encode(content).decode()
    tree = digests.tree_digest([(path, mode, blob)])
    bundle["trees"][tree] = [[path, mode, blob]]
    return tree


HOSTILE_ENTRIES = [
    (
        "prompts/../../escape.md",
        "100644",
        b"x\n",
        "prompts/../../escape.md: empty, '.' and '..' path segments are not allowed",
    ),
    ("link", "120000", b"/etc/passwd", "link: symlink target '/etc/passwd' is absolute"),
    ("bell\x07.md", "100644", b"x\n", "'bell\\x07.md': control characters are not allowed in paths"),
]


def test_what_import_refuses_verify_refuses_too(run: Run, tmp_path: Path) -> None:
    clean = bundle_build(experiment=run.experiment)
    trees_before = Tree.objects.count()
    for number, (path, mode, content, message) in enumerate(HOSTILE_ENTRIES):
        bundle = copy.deepcopy(clean)
        tree = _hostile_tree(bundle, path, mode, content)
        file = tmp_path / f"hostile-{number}.json"
        bundle_write(bundle=bundle, path=file)
        out = io.StringIO()
        with pytest.raises(SystemExit) as exited:
            call_command("verify_records", "--bundle", str(file), stdout=out)
        assert exited.value.code == 1
        mismatches = [line for line in out.getvalue().splitlines() if line.startswith("MISMATCH")]
        assert mismatches == [f"MISMATCH tree {tree[:12]}: {message}"]
        with pytest.raises(CommandError) as refused:
            call_command("import_bundle", str(file), "--name", "hostile copy")
        assert refused.value.returncode == 2
        assert str(refused.value) == (
            f"{file}: the bundle does not verify (tree {tree[:12]}: {message}); nothing was imported"
        )
        assert Tree.objects.count() == trees_before and Experiment.objects.count() == 1

    # A child listed before its parent: import could not link it.
    bundle = copy.deepcopy(clean)
    first = next(i for i, c in enumerate(bundle["candidates"]) if c["parent_tree"])
    child = bundle["candidates"].pop(first)
    bundle["candidates"].insert(0, child)
    assert bundle_verify(bundle, key=settings.RSI_RECORDS_KEY) == [
        f"candidate {child['tree'][:12]}: parent not listed before it"
    ]


# --- Upgrade: decisions made before they were certified ------------------------------------


def test_the_upgrade_certifies_earlier_decisions_and_keeps_old_records_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    upgrade = importlib.import_module("evolution.migrations.0011_certify_existing_decisions")
    # The code before this change made decisions without certifying them.
    monkeypatch.setattr("evolution.loop.steps.gate_decision_certify", lambda **kwargs: None)
    monkeypatch.setattr("evolution.services.review.review_decision_certify", lambda **kwargs: None)
    run = reviewed_run()
    monkeypatch.undo()
    experiment = Experiment.objects.get(pk=run.experiment_id)
    evaluations = list(CertifiedResult.objects.filter(experiment=experiment).values_list("record_digest", flat=True))
    assert not CertifiedDecision.objects.exists()
    gates = GateDecision.objects.filter(run=run).count()
    before = problems_of(run)
    assert sum("is not certified" in p for p in before) == gates + 1
    assert any("state 'accepted' with no certified gate decision" in p for p in before)

    upgrade.certify_existing(apps, None)
    experiment.refresh_from_db()
    assert experiment.chain_length == len(evaluations) + gates + 1
    assert CertifiedDecision.objects.filter(experiment=experiment).count() == gates + 1
    assert all(
        p["certified"] == records.AT_UPGRADE for p in CertifiedDecision.objects.values_list("payload", flat=True)
    )
    assert problems_of(run) == []
    # The evaluation records are the same rows, untouched.
    assert (
        list(CertifiedResult.objects.filter(experiment=experiment).values_list("record_digest", flat=True))
        == evaluations
    )
    # Safe to run again: nothing left to certify.
    upgrade.certify_existing(apps, None)
    assert Experiment.objects.get(pk=experiment.pk).chain_length == experiment.chain_length


def test_the_upgrade_leaves_a_broken_chain_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    upgrade = importlib.import_module("evolution.migrations.0011_certify_existing_decisions")
    monkeypatch.setattr("evolution.loop.steps.gate_decision_certify", lambda **kwargs: None)
    monkeypatch.setattr("evolution.services.review.review_decision_certify", lambda **kwargs: None)
    run = reviewed_run()
    monkeypatch.undo()
    # The newest record dropped and the head moved back, unsigned: re-signing would hide it.
    experiment = Experiment.objects.get(pk=run.experiment_id)
    Experiment.objects.filter(pk=experiment.pk).update(chain_length=experiment.chain_length - 1)
    upgrade.certify_existing(apps, None)
    assert not CertifiedDecision.objects.exists()
    assert Experiment.objects.get(pk=experiment.pk).chain_length == experiment.chain_length - 1
    assert any("is not certified" in p for p in problems_of(run))
