"""The queue and the review item show an identical edit's earlier verdict, group identical waiting edits, and let
the reviewer apply the same verdict in one step (issue 40, item 4)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from evolution.loop.review import review_correct, review_decide
from evolution.models import Experiment, ReviewDecision, ReviewItem
from evolution.selectors import earlier_verdicts
from evolution.services.review import review_claim
from tests.review.same_edits import repeated_item


def test_an_identical_edit_decided_before_shows_its_verdict_who_and_when(
    example_world: Experiment, make_user: Any
) -> None:
    first, again = repeated_item(example_world)
    alice = make_user("reviewer", username="alice")
    edit = again.candidate.edits.order_by("index").first()
    assert edit is not None
    assert earlier_verdicts(edits=[edit]) == {}  # the first is not decided yet

    decision = review_decide(item=first, user=alice, approve=False, reason="hard-codes an answer")
    found = earlier_verdicts(edits=[edit])[edit.pk]
    assert (found.item_id, found.verdict, found.reviewer) == (first.pk, "reject", "alice")
    assert found.at == decision.created_at
    assert found.words == "rejected with its whole candidate" and not found.corrected

    bob = make_user("reviewer", username="bob")
    client = login(bob)
    page = client.get(reverse("review:review_item", args=[again.pk])).content.decode()
    hint = page[page.index(f'id="earlier-{edit.index}"') :]
    hint = hint[: hint.index("</p>")]
    assert "rejected with its whole candidate" in hint and "<strong>alice</strong>" in hint
    assert f"{decision.created_at:%Y-%m-%d %H:%M}" in hint and f"review #{first.pk}" in hint
    queue = client.get(reverse("review:queue")).content.decode()
    row = queue[queue.index(f'id="queue-item-{again.pk}"') :]
    row = row[: row.index("</tr>")]
    assert f"edit #{edit.index} decided before" in row and "by alice" in row and f"review #{first.pk}" in row

    # A correction is the verdict that stands.
    review_correct(item=first, user=bob, approve=True, reason="the answer file is generic after all")
    found = earlier_verdicts(edits=[edit])[edit.pk]
    assert (found.verdict, found.reviewer, found.corrected) == ("approve", "bob", True)


def test_identical_waiting_edits_are_grouped_in_the_queue(example_world: Experiment, make_user: Any) -> None:
    first, again = repeated_item(example_world)
    client = login(make_user("viewer", username="vic"))
    queue = client.get(reverse("review:queue")).content.decode()
    head = queue.rindex("<tr ", 0, queue.index(f'id="queue-item-{first.pk}"'))
    member = queue.rindex("<tr ", 0, queue.index(f'id="queue-item-{again.pk}"'))
    assert head < member
    # The later item follows the oldest holding the same edit: between them only rows of the same group.
    rows = queue[head:member].split("<tr ")[1:]
    assert "waiting items hold identical edits" in rows[0]
    assert all('class="group-member"' in row for row in rows[1:])
    row = queue[member : queue.index("</tr>", member)]
    assert 'class="group-member"' in row and "identical edits to the item above" in row


def test_the_same_verdict_is_offered_and_applied_in_one_step(example_world: Experiment, make_user: Any) -> None:
    first, again = repeated_item(example_world)
    alice = make_user("reviewer", username="alice")
    review_decide(item=first, user=alice, approve=False, reason="hard-codes an answer")
    review_claim(item=again, user=alice)
    client = login(alice)
    page = client.get(reverse("review:review_item", args=[again.pk])).content.decode()
    form = page[page.index('id="same-form"') :]
    form = form[: form.index("</form>")]
    assert 'name="verdict" value="reject"' in form and 'data-key="s"' in form
    reason = f"Same verdict as the identical edit decided before (review #{first.pk} by alice"
    assert reason in form
    response = client.post(
        reverse("review:review_decide", args=[again.pk]), {"verdict": "reject", "reason": reason + ")."}
    )
    assert response.status_code == 302
    decision = ReviewDecision.objects.get(item=again)
    assert (decision.verdict, decision.reviewer_id) == ("reject", alice.pk)
    again.refresh_from_db()
    assert again.state == ReviewItem.State.REJECTED


def login(user: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client
