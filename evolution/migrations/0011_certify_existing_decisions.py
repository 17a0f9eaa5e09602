"""Certify the gate and review decisions made before decisions were certified.

Each experiment's existing decisions are appended to its record chain, in
the order they were made, as the certifier would have written them then,
plus ``"certified": "at upgrade"``: such a record vouches for what the
database held at the upgrade, not for the moment of the decision. The
candidate's state and reason are its current ones.

An experiment whose chain head does not check out (its signature, or the
last record it names) is left alone: signing a new head over it would hide
the damage. Its decisions stay uncertified and ``verify_records`` reports
them with the broken chain. Going back leaves the records (append-only).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import migrations

from evolution import records


def _sound_head(experiment, CertifiedResult, key: str) -> bool:
    """The signed head names the stored last record (or an empty chain)."""
    uid = str(experiment.uid)
    if experiment.chain_length == 0:
        return not experiment.chain_head and not CertifiedResult.objects.filter(experiment=experiment).exists()
    expected = records.head_signature(
        key, experiment_uid=uid, length=experiment.chain_length, head=experiment.chain_head
    )
    if not hmac.compare_digest(expected, experiment.chain_head_signature):
        return False
    last = CertifiedResult.objects.filter(experiment=experiment).order_by("-seq").values_list("seq", "record_digest")
    return tuple(last.first() or ()) == (experiment.chain_length, experiment.chain_head)


def certify_existing(apps, schema_editor) -> None:
    Experiment = apps.get_model("evolution", "Experiment")
    CertifiedResult = apps.get_model("evolution", "CertifiedResult")
    CertifiedDecision = apps.get_model("evolution", "CertifiedDecision")
    GateDecision = apps.get_model("evolution", "GateDecision")
    ReviewDecision = apps.get_model("evolution", "ReviewDecision")
    key = settings.RSI_RECORDS_KEY
    for experiment in Experiment.objects.select_related("surface", "recipe").order_by("pk"):
        gates = GateDecision.objects.filter(candidate__experiment=experiment, record__isnull=True)
        reviews = ReviewDecision.objects.filter(item__candidate__experiment=experiment, record__isnull=True)
        made = [("gate", row) for row in gates.select_related("candidate", "run__recipe", "current")]
        made += [("review", row) for row in reviews.select_related("item__candidate__run__recipe", "reviewer")]
        if not made or not _sound_head(experiment, CertifiedResult, key):
            continue
        made.sort(key=lambda item: (item[1].created_at, item[0], item[1].pk))
        uid = str(experiment.uid)
        surface = experiment.surface.digest
        length, head = experiment.chain_length, experiment.chain_head or records.GENESIS
        for kind, decision in made:
            seq = length + 1
            if kind == "gate":
                candidate = decision.candidate
                payload = records.gate_payload(
                    experiment_uid=uid,
                    seq=seq,
                    prev=head,
                    candidate_tree=candidate.tree_id,
                    current_tree=decision.current.tree_id if decision.current_id else None,
                    round=decision.round,
                    accepted=decision.accepted,
                    chosen=decision.chosen,
                    rule=decision.rule,
                    explanation=decision.explanation,
                    numbers=decision.numbers,
                    state=candidate.state,
                    reason=candidate.state_reason,
                    recipe=decision.run.recipe.digest,
                    surface=surface,
                    certified=records.AT_UPGRADE,
                )
            else:
                candidate = decision.item.candidate
                run_recipe = candidate.run.recipe.digest if candidate.run_id else None
                payload = records.review_payload(
                    experiment_uid=uid,
                    seq=seq,
                    prev=head,
                    candidate_tree=candidate.tree_id,
                    verdict=decision.verdict,
                    reason=decision.reason,
                    reviewer=decision.reviewer.username,
                    rejected_edits=list(decision.rejected_edits.values_list("index", flat=True)),
                    derived_tree=decision.derived_candidate.tree_id if decision.derived_candidate_id else None,
                    state=candidate.state,
                    state_reason=candidate.state_reason,
                    recipe=run_recipe or (experiment.recipe.digest if experiment.recipe_id else None),
                    surface=surface,
                    certified=records.AT_UPGRADE,
                )
            digest = records.record_digest(payload)
            record = CertifiedDecision.objects.create(
                experiment=experiment,
                seq=seq,
                kind=kind,
                candidate=candidate,
                payload=payload,
                prev_digest=head,
                record_digest=digest,
                signature=records.record_signature(key, experiment_uid=uid, seq=seq, digest=digest),
            )
            type(decision).objects.filter(pk=decision.pk).update(record=record)
            length, head = seq, digest
        Experiment.objects.filter(pk=experiment.pk).update(
            chain_length=length,
            chain_head=head,
            chain_head_signature=records.head_signature(key, experiment_uid=uid, length=length, head=head),
        )


class Migration(migrations.Migration):
    dependencies = [("evolution", "0010_certified_decisions")]

    operations = [migrations.RunPython(certify_existing, migrations.RunPython.noop)]
