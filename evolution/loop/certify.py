"""Certification as the loop sees it: certify an evaluation, then act for its run.

``services.records.evaluation_certify`` certifies (or refuses) and says what it did; the loop decides what that
means for the run: a candidate evaluation refused for infrastructure errors pauses the run (a team fixes its
sandbox or grader, then resumes: the round goes on without that candidate), and any change sends ``run_advance``
after commit so the run's next step sees it. Both happen in the certification's transaction.
"""

from __future__ import annotations

from django.db import transaction

from evolution.loop.enqueue import advance_after_commit
from evolution.loop.lifecycle import run_pause
from evolution.models import CertifiedResult, Evaluation, Run
from evolution.services import records as record_services

__all__ = ["result_certify"]


def result_certify(*, evaluation_id: int) -> CertifiedResult | None:
    """Certify a complete evaluation (``records.evaluation_certify``) and act for its run, in one transaction.

    Returns the record, new or existing, or None (not complete, or refused: the evaluation is FAILED with the
    reason). Safe to repeat: a second call finds the evaluation certified or failed and changes nothing.
    """
    with transaction.atomic():
        outcome = record_services.evaluation_certify(evaluation_id=evaluation_id)
        if outcome.run_id is not None:
            if outcome.infra_errors and outcome.purpose == Evaluation.Purpose.CANDIDATE:
                run_pause(
                    run=Run.objects.get(pk=outcome.run_id),
                    reason=f"candidate {outcome.candidate_id}: {outcome.infra_errors}",
                )
            advance_after_commit(outcome.run_id)
    return outcome.record
