"""A reviewer undoes a decision, decides again, corrects it later, and applies an identical edit's earlier verdict
with one key, in real Chromium (issue 40, items 3 and 4). The live server runs no worker: a decision takes effect
when the page, polling, reads it after its window."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Candidate, Evaluation, Experiment, ReviewCorrection, ReviewDecision, ReviewPending
from tests.review.same_edits import repeated_item
from tests.review.test_browser import browser
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WINDOW = 3  # seconds: long enough to click Undo, short enough to wait out


def test_undo_decide_again_correct_later_and_repeat_an_identical_edit_s_verdict_by_key(
    screen: Screen, example_world: Experiment, make_user: Any, settings: Any
) -> None:
    settings.RSI_REVIEW_UNDO_SECONDS = WINDOW
    first, again = repeated_item(example_world)
    make_user("reviewer", username="rhea")
    screen.login("rhea")
    page = screen.page

    # Decide, then Undo inside the window: nothing was recorded and the item is still hers.
    screen.go(reverse("review:review_item", args=[first.pk]))
    page.click("button:has-text('Claim to review')")
    page.wait_for_selector("#decide-form")
    page.fill("#reason", "It hard-codes a task's answer.")
    page.click("#decide-form button[value=reject]")
    page.wait_for_selector("#pending-status")
    assert "takes effect at" in page.locator("#pending-status").inner_text()
    page.click("#undo")
    page.wait_for_selector("#decide-form")
    assert not ReviewPending.objects.exists() and not ReviewDecision.objects.filter(item=first).exists()
    assert Candidate.objects.get(pk=first.candidate_id).state == Candidate.State.FLAGGED

    # Decide again; the page shows the decision once its window has passed.
    page.fill("#reason", "The answer file reads as a generic note.")
    page.click("#decide-form button[value=approve]")
    page.wait_for_selector("#pending-status")
    page.wait_for_selector("#decision-verdict", timeout=(WINDOW + 15) * 1000)
    decision = ReviewDecision.objects.get(item=first)
    assert (decision.verdict, decision.reviewer.username) == ("approve", "rhea")
    evaluation = Evaluation.objects.get(candidate_id=first.candidate_id, state=Evaluation.State.RUNNING)

    # Later: correct it, with a reason; the candidate page shows the correction and what followed.
    page.click("#correct summary")
    why = "On a second look it names a task's expected output."
    page.fill("#correct-reason", why)
    page.click("#correct-form button[value=reject]")
    page.wait_for_selector("#corrections")
    correction = ReviewCorrection.objects.get(item=first)
    assert decision.record is not None
    assert correction.record is not None and correction.corrects_id == decision.record_id
    screen.go(reverse("review:candidate", args=[first.candidate_id]))
    history = page.locator("#review-history").inner_text()
    assert "corrected to rejected" in history and "rhea" in history and why in history
    assert f"evaluation {evaluation.pk} withdrawn before it started" in history
    assert f"decision record #{decision.record.seq}" in history

    # The same edit in another candidate: its earlier verdict (the correction), who and when, and one key.
    screen.go(reverse("review:review_item", args=[again.pk]))
    page.click("button:has-text('Claim to review')")
    page.wait_for_selector("#same-form")
    edit = again.candidate.edits.order_by("index").first()
    assert edit is not None
    hint = page.locator(f"#earlier-{edit.index}").inner_text()
    assert "rejected with its whole candidate" in hint and "rhea" in hint and "(on correction)" in hint
    # Typing in the reason does not apply it.
    page.click("#reason")
    page.keyboard.type("s")
    page.wait_for_timeout(300)
    assert not ReviewPending.objects.filter(item=again).exists()
    page.keyboard.press("Escape")
    page.fill("#reason", "")
    page.keyboard.press("Escape")
    screen.key("s")
    page.wait_for_selector("#pending-status")
    page.wait_for_selector("#decision-verdict", timeout=(WINDOW + 15) * 1000)
    repeated = ReviewDecision.objects.get(item=again)
    assert repeated.verdict == "reject" and repeated.reason.startswith("Same verdict as the identical edit")
    assert f"review #{first.pk} by rhea" in repeated.reason
    assert Candidate.objects.get(pk=again.candidate_id).state == Candidate.State.REJECTED_REVIEW
    screen.check()
