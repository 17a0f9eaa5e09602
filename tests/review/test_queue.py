"""Screen 7: the leakage review queue, a review item, and decisions through the web."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evolution.loop.review import review_decide, review_decide_partial
from evolution.models import (
    AtomicEdit,
    Candidate,
    Experiment,
    LeakageFlag,
    ReviewDecision,
    ReviewItem,
    SplitMembership,
    SplitName,
    Task,
)
from evolution.services.review import review_claim
from evolution.services.snapshots import tree_entries
from review.views.queue import mark_matches, track_record
from tests.review.world import grow

pytestmark = pytest.mark.django_db

XSS = "</script><img src=x onerror=alert(1)>"


def open_items(experiment: Experiment) -> list[ReviewItem]:
    return list(ReviewItem.objects.filter(candidate__experiment=experiment, state=ReviewItem.State.OPEN).order_by("pk"))


def multi_edit_item(experiment: Experiment) -> ReviewItem:
    """An open item whose candidate has a flagged edit and at least one other edit."""
    for item in open_items(experiment):
        edits = list(item.candidate.edits.all())
        if len(edits) > 1 and any(edit.flags.exists() for edit in edits):
            return item
    pytest.fail("the example world has no flagged candidate with several edits")


def csrf(client: Client) -> str:
    client.get(reverse("review:queue"))
    return client.cookies["csrftoken"].value


def post(client: Client, name: str, pk: int, data: dict[str, Any] | None = None) -> Any:
    return client.post(reverse(name, args=[pk]), data or {}, HTTP_X_CSRFTOKEN=csrf(client))


def login(make_user: Callable[..., User], user: User) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


# --- The queue ------------------------------------------------------------------------


def test_the_queue_lists_waiting_items_oldest_first_with_flag_counts_and_rules(example_world, client_as) -> None:
    items = open_items(example_world)
    assert items
    page = client_as("viewer").get(reverse("review:queue")).content.decode()
    positions = []
    for item in items:
        url = reverse("review:review_item", args=[item.pk])
        assert f'href="{url}"' in page
        positions.append(page.index(f'href="{url}"'))
        flags = LeakageFlag.objects.filter(candidate=item.candidate)
        assert f'title="leakage flags on this candidate">{flags.count()}</span>' in page
        for rule in set(flags.values_list("rule", flat=True)):
            count = flags.filter(rule=rule).count()
            assert f"{rule}&nbsp;×{count}" in page
        assert reverse("review:candidate", args=[item.candidate_id]) in page
    assert positions == sorted(positions)  # oldest first
    assert f'Waiting for a decision <span class="count">{len(items)}</span>' in page


def test_the_queue_filters_by_experiment_and_shows_claims(example_world, client_as, make_user) -> None:
    item = open_items(example_world)[0]
    alice = make_user("reviewer", username="alice")
    review_claim(item=item, user=alice)
    client = client_as("viewer")
    page = client.get(reverse("review:queue"), {"experiment": example_world.pk}).content.decode()
    assert reverse("review:review_item", args=[item.pk]) in page
    assert "alice" in page
    other = Experiment.objects.exclude(pk=example_world.pk).first()
    if other is not None:
        empty = client.get(reverse("review:queue"), {"experiment": other.pk}).content.decode()
        assert reverse("review:review_item", args=[item.pk]) not in empty
    assert client.get(reverse("review:queue"), {"experiment": "x"}).status_code == 400
    assert client.get(reverse("review:queue"), {"experiment": 999999}).status_code == 400
    assert client.get(reverse("review:queue"), {"tab": "nope"}).status_code == 400


def test_the_decided_tab_lists_decisions_with_reviewer_verdict_and_reason(example_world, client_as, make_user) -> None:
    item = open_items(example_world)[0]
    alice = make_user("reviewer", username="alice")
    review_decide(item=item, user=alice, approve=False, reason="copies order ids from the tasks")
    client = client_as("viewer")
    waiting = client.get(reverse("review:queue")).content.decode()
    assert reverse("review:review_item", args=[item.pk]) not in waiting
    page = client.get(reverse("review:queue"), {"tab": "decided"}).content.decode()
    assert reverse("review:review_item", args=[item.pk]) in page
    assert "copies order ids from the tasks" in page
    assert ">rejected</span>" in page
    assert "alice" in page


# --- The item page ---------------------------------------------------------------------


def test_the_item_page_shows_edits_evidence_marked_and_the_task_to_a_reviewer(example_world, client_as) -> None:
    item = multi_edit_item(example_world)
    candidate = item.candidate
    page = client_as("reviewer").get(reverse("review:review_item", args=[item.pk])).content.decode()
    for edit in candidate.edits.all():
        assert html.escape(edit.hypothesis) in page
        assert f"<code>{html.escape(edit.paths[0])}</code>" in page
    assert reverse("review:candidate", args=[candidate.parent_id]) in page
    flag = LeakageFlag.objects.filter(candidate=candidate, task__isnull=False).first()
    assert flag is not None
    assert f"<mark>{html.escape(flag.matched)}</mark>" in page or f"<mark>{flag.matched}</mark>" in page
    assert flag.task is not None
    assert f"<code>{flag.task.external_id}</code>" in page
    assert flag.task is not None
    assert html.escape(flag.task.instruction[:60]) in page
    assert html.escape(flag.evidence["evidence"]) in page
    diff = reverse("review:candidate_diff", args=[candidate.pk])
    assert f'hx-get="{diff}?partial=1" hx-trigger="load"' in page
    assert f'href="{diff}"' in page
    assert 'action="' + reverse("review:review_claim", args=[item.pk]) + '"' in page


def seal_a_flag_task(item: ReviewItem) -> tuple[LeakageFlag, Any]:
    """Point one flag at a sealed task of the experiment (as a critic reading sealed text would)."""
    membership = (
        SplitMembership.objects.filter(experiment_id=item.candidate.experiment_id, split=SplitName.SEALED)
        .select_related("task")
        .first()
    )
    assert membership is not None, "the experiment has a sealed task"
    sealed = membership.task
    sealed.instruction = "SEALED-INSTRUCTION-TEXT " + sealed.instruction
    sealed.save(update_fields=["instruction"])
    flag = LeakageFlag.objects.filter(candidate=item.candidate).order_by("pk").first()
    assert flag is not None
    LeakageFlag.objects.filter(pk=flag.pk).update(
        task=sealed,
        evidence={
            "line_number": 5,
            "evidence": f"literal from the instruction of task {sealed.external_id}",
            "task": sealed.external_id,
        },
    )
    return flag, sealed


def test_a_sealed_task_is_hidden_without_the_sealed_permission(example_world, client_as) -> None:
    item = open_items(example_world)[0]
    flag, sealed = seal_a_flag_task(item)
    url = reverse("review:review_item", args=[item.pk])
    for role in ("reviewer", "viewer"):
        page = client_as(role).get(url).content.decode()
        assert "SEALED-INSTRUCTION-TEXT" not in page
        assert f"task {sealed.external_id}" not in page
        assert f"<code>{sealed.external_id}</code>" not in page
        assert "from a sealed task" in page
        # The matched text itself is part of the candidate's diff: still shown.
        assert html.escape(flag.matched) in page
    sealed_page = client_as("reviewer", username="sealed-reviewer", extra_perms=("evolution.view_sealed_details",))
    page = sealed_page.get(url).content.decode()
    assert "SEALED-INSTRUCTION-TEXT" in page
    assert f"<code>{sealed.external_id}</code>" in page
    assert "from a sealed task" not in page


def flag_a_task_in(item: ReviewItem, split: str | None) -> tuple[LeakageFlag, Task]:
    """Point one flag at a new task of the experiment's benchmark that is in ``split`` (None: in no split)."""
    experiment = item.candidate.experiment
    task = Task.objects.create(
        benchmark_id=experiment.benchmark_id,
        external_id=f"{split or 'unsplit'}-task-x",
        instruction=f"INSTRUCTION-OF-{split or 'unsplit'}",
    )
    if split is not None:
        SplitMembership.objects.create(experiment=experiment, task=task, split=split)
    flag = LeakageFlag.objects.filter(candidate=item.candidate).order_by("pk").first()
    assert flag is not None
    LeakageFlag.objects.filter(pk=flag.pk).update(
        task=task,
        evidence={"line_number": 5, "evidence": f"NOTE-ABOUT-{task.external_id}", "task": task.external_id},
    )
    return flag, task


@pytest.mark.parametrize(("split", "shown"), [(SplitName.HELDOUT, True), (None, False)])
def test_both_pages_show_held_out_tasks_and_hide_tasks_in_no_split(
    example_world, client_as, split: str | None, shown: bool
) -> None:
    """Only sealed per-task data needs sealed access; a task the experiment
    does not split is treated as sealed. The item page and the candidate
    page decide alike."""
    item = open_items(example_world)[0]
    flag, task = flag_a_task_in(item, split)
    item_url = reverse("review:review_item", args=[item.pk])
    candidate_url = reverse("review:candidate", args=[item.candidate_id])

    viewer = client_as("viewer")
    item_page = viewer.get(item_url).content.decode()
    candidate_page = viewer.get(candidate_url).content.decode()
    assert (f"<code>{task.external_id}</code>" in item_page) is shown
    assert ("INSTRUCTION-OF-" in item_page) is shown
    assert ("from a sealed task" in item_page) is not shown
    for page in (item_page, candidate_page):
        assert (task.external_id in page) is shown
        assert (f"NOTE-ABOUT-{task.external_id}" in page) is shown
    # The diff's own line is always shown; which words of it matched the task only with the task.
    assert flag.line and html.escape(flag.line) in re.sub(r"</?mark>", "", item_page)
    assert (f"<mark>{html.escape(flag.matched)}</mark>" in item_page) is shown
    assert (f'<mark class="leak">{html.escape(flag.matched)}</mark>' in candidate_page) is shown
    assert ("sealed task (hidden)" in candidate_page) is not shown

    sealed_viewer = client_as("viewer", username="sealed-viewer", extra_perms=("evolution.view_sealed_details",))
    for url in (item_url, candidate_url):
        page = sealed_viewer.get(url).content.decode()
        assert task.external_id in page and f"NOTE-ABOUT-{task.external_id}" in page


def test_untrusted_text_is_escaped_on_both_pages(example_world, client_as, make_user) -> None:
    item = multi_edit_item(example_world)
    edit = item.candidate.edits.order_by("index").first()
    assert edit is not None
    AtomicEdit.objects.filter(pk=edit.pk).update(hypothesis=f"hyp {XSS}", diff=f"+++ b/x\n+line {XSS}\n")
    flag = LeakageFlag.objects.filter(candidate=item.candidate).order_by("pk").first()
    assert flag is not None
    LeakageFlag.objects.filter(pk=flag.pk).update(
        matched=XSS, line=f"keywords = [{XSS}]", evidence={"evidence": f"why {XSS}", "note": XSS}
    )
    other = open_items(example_world)[-1]
    review_decide(item=other, user=make_user("reviewer", username="alice"), approve=True, reason=f"ok {XSS}")
    client = client_as("viewer")
    pages = [
        client.get(reverse("review:review_item", args=[item.pk])).content.decode(),
        client.get(reverse("review:review_item", args=[other.pk])).content.decode(),
        client.get(reverse("review:queue")).content.decode(),
        client.get(reverse("review:queue"), {"tab": "decided"}).content.decode(),
    ]
    for page in pages:
        assert XSS not in page
        assert "<img" not in page
    escaped = html.escape(XSS, quote=False)
    assert f"hyp {escaped}" in pages[0].replace("&#x27;", "'").replace("&quot;", '"')
    assert "<mark>&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;</mark>" in pages[0]
    assert "&lt;/script&gt;" in pages[1] and "&lt;/script&gt;" in pages[2] and "&lt;/script&gt;" in pages[3]


def test_mark_matches_escapes_everything_and_marks_each_occurrence() -> None:
    assert str(mark_matches("a <b> A x", ["a"])) == "<mark>a</mark> &lt;b&gt; <mark>A</mark> x"
    assert str(mark_matches("abcdef", ["bcd", "cde"])) == "a<mark>bcde</mark>f"
    assert str(mark_matches(XSS, [])) == html.escape(XSS)


# --- Claims and decisions --------------------------------------------------------------


def test_claim_then_approve_with_a_reason(example_world, make_user) -> None:
    item = open_items(example_world)[0]
    alice = make_user("reviewer", username="alice")
    client = login(make_user, alice)
    response = post(client, "review:review_claim", item.pk)
    assert response.status_code == 302
    page = client.get(reverse("review:review_item", args=[item.pk])).content.decode()
    assert "Claimed by you" in page
    assert 'action="' + reverse("review:review_decide", args=[item.pk]) + '"' in page
    response = post(client, "review:review_decide", item.pk, {"verdict": "approve", "reason": "generic routing hints"})
    assert response.status_code == 302
    item.refresh_from_db()
    decision = ReviewDecision.objects.get(item=item)
    assert (item.state, decision.verdict, decision.reviewer, decision.reason) == (
        ReviewItem.State.APPROVED,
        ReviewDecision.Verdict.APPROVE,
        alice,
        "generic routing hints",
    )
    # The example's run is over: the approved candidate is evaluated at once for a late gate.
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.EVALUATING
    page = client.get(reverse("review:review_item", args=[item.pk])).content.decode()
    assert 'id="decision-reviewer">alice<' in page
    assert "generic routing hints" in page
    assert "Recorded: approved (the edits are generic)." in page  # the message after the redirect
    assert ">approved</span> the edits are generic" in page
    assert 'action="' + reverse("review:review_decide", args=[item.pk]) + '"' not in page


def test_claim_then_reject_and_a_missing_reason_changes_nothing(example_world, make_user) -> None:
    item = open_items(example_world)[0]
    client = login(make_user, make_user("reviewer", username="alice"))
    post(client, "review:review_claim", item.pk)
    response = post(client, "review:review_decide", item.pk, {"verdict": "reject", "reason": "   "})
    assert response.status_code == 400
    assert "Nothing changed: a reason is required." in response.content.decode()
    item.refresh_from_db()
    assert item.state == ReviewItem.State.CLAIMED
    assert not ReviewDecision.objects.filter(item=item).exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED
    response = post(client, "review:review_decide", item.pk, {"verdict": "reject", "reason": "hard-codes order ids"})
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.state == ReviewItem.State.REJECTED
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.REJECTED_REVIEW
    assert ReviewDecision.objects.get(item=item).verdict == ReviewDecision.Verdict.REJECT


def test_an_unknown_verdict_is_a_clear_400(example_world, make_user) -> None:
    item = open_items(example_world)[0]
    client = login(make_user, make_user("reviewer", username="alice"))
    response = post(client, "review:review_decide", item.pk, {"verdict": "maybe", "reason": "x"})
    assert response.status_code == 400
    assert "choose approve, reject, or reject the selected edits" in response.content.decode()
    assert not ReviewDecision.objects.exists()


def test_two_reviewers_one_decision_and_the_second_is_told(example_world, make_user) -> None:
    item = open_items(example_world)[0]
    alice = login(make_user, make_user("reviewer", username="alice"))
    bob = login(make_user, make_user("reviewer", username="bob"))
    assert post(alice, "review:review_claim", item.pk).status_code == 302
    response = post(bob, "review:review_claim", item.pk)
    assert response.status_code == 409
    assert "Not claimed: this item is already claimed by alice." in response.content.decode()
    response = post(bob, "review:review_decide", item.pk, {"verdict": "approve", "reason": "fine by me"})
    assert response.status_code == 409
    assert "Nothing changed: this item is claimed by alice." in response.content.decode()
    assert post(alice, "review:review_decide", item.pk, {"verdict": "reject", "reason": "leaks"}).status_code == 302
    response = post(bob, "review:review_decide", item.pk, {"verdict": "approve", "reason": "fine by me"})
    assert response.status_code == 409
    assert "Nothing changed: this item was already decided (rejected)." in response.content.decode()
    assert ReviewDecision.objects.filter(item=item).count() == 1
    assert ReviewDecision.objects.get(item=item).reviewer.username == "alice"
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.REJECTED_REVIEW


def test_a_claim_can_be_released_for_another_reviewer(example_world, make_user) -> None:
    item = open_items(example_world)[0]
    alice = login(make_user, make_user("reviewer", username="alice"))
    bob = login(make_user, make_user("reviewer", username="bob"))
    post(alice, "review:review_claim", item.pk)
    assert post(bob, "review:review_release", item.pk).status_code == 409
    assert post(alice, "review:review_release", item.pk).status_code == 302
    assert post(bob, "review:review_claim", item.pk).status_code == 302
    item.refresh_from_db()
    assert item.claimed_by is not None
    assert item.claimed_by.username == "bob"


def test_viewers_read_but_every_post_is_403_and_no_buttons_are_shown(example_world, client_as) -> None:
    item = open_items(example_world)[0]
    client = client_as("viewer")
    page = client.get(reverse("review:review_item", args=[item.pk])).content.decode()
    assert "deciding needs the reviewer role" in page
    assert reverse("review:review_claim", args=[item.pk]) not in page
    assert reverse("review:review_decide", args=[item.pk]) not in page
    queue = client.get(reverse("review:queue")).content.decode()
    assert reverse("review:review_claim", args=[item.pk]) not in queue
    edit = item.candidate.edits.first()
    assert edit is not None
    posts: list[tuple[str, dict[str, Any]]] = [
        ("review:review_claim", {}),
        ("review:review_release", {}),
        ("review:review_decide", {"verdict": "approve", "reason": "x"}),
        ("review:review_decide", {"verdict": "reject_edits", "reason": "x", "edits": [edit.pk]}),
    ]
    for name, data in posts:
        assert post(client, name, item.pk, data).status_code == 403
    item.refresh_from_db()
    assert item.state == ReviewItem.State.OPEN and not ReviewDecision.objects.exists()
    # GET on an action is refused, and anonymous users go to the login page.
    reviewer = client_as("reviewer")
    assert reviewer.get(reverse("review:review_decide", args=[item.pk])).status_code == 405
    assert Client().get(reverse("review:queue")).status_code == 302


# --- Rejecting some edits ---------------------------------------------------------------


def test_rejecting_the_flagged_edit_derives_a_candidate_without_its_files(example_world, make_user) -> None:
    item = multi_edit_item(example_world)
    flagged = item.candidate
    edits = list(flagged.edits.order_by("index"))
    leaky = [edit for edit in edits if edit.flags.exists()]
    kept = [edit for edit in edits if edit not in leaky]
    assert kept, "the item needs an unflagged edit to keep"
    client = login(make_user, make_user("reviewer", username="alice"))
    post(client, "review:review_claim", item.pk)
    response = post(
        client,
        "review:review_decide",
        item.pk,
        {"verdict": "reject_edits", "reason": "the keyword lists copy task ids", "edits": [e.pk for e in leaky]},
    )
    assert response.status_code == 302
    decision = ReviewDecision.objects.get(item=item)
    derived = decision.derived_candidate
    assert derived is not None
    assert decision.verdict == ReviewDecision.Verdict.REJECT_EDITS
    assert set(decision.rejected_edits.all()) == set(leaky)
    item.refresh_from_db()
    flagged.refresh_from_db()
    assert item.state == ReviewItem.State.PARTIAL
    assert flagged.state == Candidate.State.REJECTED_REVIEW
    assert derived.origin == Candidate.Origin.DERIVED and derived.parent_id == flagged.parent_id
    assert (derived.run_id, derived.round) == (flagged.run_id, flagged.round)
    assert flagged.parent is not None
    parent_files = {e.path: e.data for e in tree_entries(tree=flagged.parent.tree)}
    flagged_files = {e.path: e.data for e in tree_entries(tree=flagged.tree)}
    derived_files = {e.path: e.data for e in tree_entries(tree=derived.tree)}
    for edit in leaky:
        for path in edit.paths:
            assert derived_files.get(path) == parent_files.get(path)
            assert derived_files.get(path) != flagged_files.get(path)
    for edit in kept:
        for path in edit.paths:
            assert derived_files.get(path) == flagged_files.get(path)
    assert [(e.component, e.hypothesis) for e in derived.edits.order_by("index")] == [
        (e.component, e.hypothesis) for e in kept
    ]
    # The critic ran again on what is left; clean, it is evaluated although the run is over (a late gate).
    assert derived.state in {Candidate.State.EVALUATING, Candidate.State.FLAGGED}
    assert derived.evaluations.exists() == (derived.state == Candidate.State.EVALUATING)
    page = client.get(reverse("review:review_item", args=[item.pk])).content.decode()
    assert reverse("review:candidate", args=[derived.pk]) in page
    assert "partly rejected" in page and ">rejected</span>" in page and ">kept</span>" in page
    assert "the keyword lists copy task ids" in page
    # Held again (as when the critic flags what remains), the derived
    # candidate's own item says where it came from.
    Candidate.objects.filter(pk=derived.pk).update(state=Candidate.State.FLAGGED)
    again = ReviewItem.objects.create(candidate=derived)
    page = client.get(reverse("review:review_item", args=[again.pk])).content.decode()
    assert reverse("review:review_item", args=[item.pk]) in page
    assert "after alice rejected some of its edits" in page
    queue = client.get(reverse("review:queue")).content.decode()
    assert reverse("review:review_item", args=[again.pk]) in queue and ">derived</span>" in queue


def test_a_partial_decision_that_cannot_be_made_keeps_the_input_and_changes_nothing(example_world, make_user) -> None:
    item = multi_edit_item(example_world)
    edits = list(item.candidate.edits.order_by("index"))
    client = login(make_user, make_user("reviewer", username="alice"))
    post(client, "review:review_claim", item.pk)
    before = Candidate.objects.count()
    response = post(
        client,
        "review:review_decide",
        item.pk,
        {"verdict": "reject_edits", "reason": "all of them leak", "edits": [e.pk for e in edits]},
    )
    assert response.status_code == 400
    text = response.content.decode()
    assert "every atomic edit is selected: reject the whole candidate instead" in text
    assert "all of them leak</textarea>" in text
    assert text.count(" checked>") == len(edits)
    response = post(client, "review:review_decide", item.pk, {"verdict": "reject_edits", "reason": "leaks"})
    assert response.status_code == 400
    assert "select at least one atomic edit to reject" in response.content.decode()
    assert Candidate.objects.count() == before
    assert not ReviewDecision.objects.exists()
    item.refresh_from_db()
    assert item.state == ReviewItem.State.CLAIMED


# --- The critic's track record -----------------------------------------------------------


def test_the_track_record_counts_items_and_flags_per_rule(example_world, make_user, client_as) -> None:
    grow(example_world, candidates=9)  # three flagged candidates, one "task-id" flag each
    grown = list(
        ReviewItem.objects.filter(candidate__label__startswith="grown", state=ReviewItem.State.OPEN).order_by("pk")
    )
    assert len(grown) == 3
    alice = make_user("reviewer", username="alice")
    review_decide(item=grown[0], user=alice, approve=True, reason="generic")
    review_decide(item=grown[1], user=alice, approve=False, reason="leaks")
    partial = multi_edit_item(example_world)
    leaky = [edit for edit in partial.candidate.edits.all() if edit.flags.exists()]
    review_decide_partial(item=partial, user=alice, rejected_edits=[e.pk for e in leaky], reason="some leak")

    record = track_record(experiment_id=example_world.pk)
    assert (record.decided, record.approved, record.rejected, record.partial) == (3, 1, 1, 1)
    assert record.partial_share == pytest.approx(1 / 3)
    rules = {rule.rule: rule for rule in record.rules}
    assert (rules["task-id"].confirmed, rules["task-id"].overruled, rules["task-id"].pending) == (1, 1, 1)
    partial_flags = LeakageFlag.objects.filter(candidate=partial.candidate)
    for name in set(partial_flags.values_list("rule", flat=True)):
        on_rejected = partial_flags.filter(rule=name, edit__in=leaky).count()
        on_kept = partial_flags.filter(rule=name).exclude(edit__in=leaky).count()
        waiting = LeakageFlag.objects.filter(
            candidate__experiment=example_world, rule=name, candidate__review_item__state__in=["open", "claimed"]
        ).count()
        assert (rules[name].confirmed, rules[name].overruled, rules[name].pending) == (on_rejected, on_kept, waiting)

    page = client_as("viewer").get(reverse("review:queue")).content.decode()
    assert 'id="tr-decided">3<' in page
    assert 'id="tr-approved">1 <span class="muted">· 33%</span>' in page
    assert 'id="tr-rejected">1 <span class="muted">· 33%</span>' in page
    assert 'id="tr-partial">1 <span class="muted">· 33% of decisions</span>' in page
    row = page[page.index('data-rule="task-id"') :]
    row = row[: row.index("</tr>")]
    assert '<td class="num">1</td><td class="num">1</td>' in row and "50%" in row


def test_an_empty_track_record_is_all_zeros() -> None:
    record = track_record(experiment_id=None)
    assert (record.decided, record.partial_share, record.rules) == (0, None, [])


# --- Query counts ---------------------------------------------------------------------------

# 12 each before the undo window and the history of identical edits; these add, whatever the world: the due
# decisions settled (1), the pending decision and the corrections on an item (2), the identical edits decided
# before (up to 4: the edits, their decisions, rejected edits and corrections) and the waiting ones (1).
QUEUE_QUERIES = 18
ITEM_QUERIES = 18


def page_query_counts(client: Client, experiment: Experiment, item: ReviewItem, decided: ReviewItem) -> list[int]:
    urls: list[tuple[str, dict[str, Any]]] = [
        (reverse("review:queue"), {}),
        (reverse("review:queue"), {"tab": "decided"}),
        (reverse("review:queue"), {"experiment": experiment.pk}),
        (reverse("review:review_item", args=[item.pk]), {}),
        (reverse("review:review_item", args=[decided.pk]), {}),
    ]
    counts = []
    for url, params in urls:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, params).status_code == 200
        counts.append(len(queries))
    return counts


def test_query_counts_do_not_grow_with_the_world(example_world, make_user, django_assert_max_num_queries) -> None:
    reviewer = make_user("reviewer", username="alice")
    items = open_items(example_world)
    review_decide(item=items[0], user=reviewer, approve=False, reason="leaks")
    item = multi_edit_item(example_world)
    review_claim(item=item, user=reviewer)
    client = login(make_user, reviewer)
    small = page_query_counts(client, example_world, item, items[0])

    grow(example_world, candidates=40)
    for extra in ReviewItem.objects.filter(candidate__label__startswith="grown").order_by("pk")[:6]:
        review_decide(item=extra, user=reviewer, approve=extra.pk % 2 == 0, reason="grown")
    large = page_query_counts(client, example_world, item, items[0])
    assert ReviewItem.objects.filter(state=ReviewItem.State.OPEN).count() > 5
    assert small == large
    with django_assert_max_num_queries(QUEUE_QUERIES):
        client.get(reverse("review:queue"))
    with django_assert_max_num_queries(ITEM_QUERIES):
        client.get(reverse("review:review_item", args=[item.pk]))


def test_an_item_with_many_flags_groups_them_by_rule_with_counts_and_first_examples(
    example_world: Experiment, client_as: Any
) -> None:
    item = multi_edit_item(example_world)
    edit = next(edit for edit in item.candidate.edits.order_by("index") if edit.flags.exists())
    LeakageFlag.objects.filter(candidate=item.candidate).delete()
    LeakageFlag.objects.bulk_create(
        [
            LeakageFlag(
                candidate=item.candidate,
                edit=edit,
                rule="literal_overlap",
                path="a.md",
                line=f"order {n}",
                matched=f"order {n}",
                evidence={"line_number": n},
            )
            for n in range(1, 41)
        ]
        + [LeakageFlag(candidate=item.candidate, edit=edit, rule="task_id", path="b.md", line="id 7", matched="7")]
    )
    html_text = client_as("viewer").get(reverse("review:review_item", args=[item.pk])).content.decode()
    heads = re.findall(r'<h4 class="rule-group-head"><span class="rule">([^<]+)</span> ([^<]+)</h4>', html_text)
    assert heads == [("literal_overlap", "40 flags on 40 lines"), ("task_id", "1 flag on 1 line")]
    assert "37 more lines flagged by <code>literal_overlap</code>" in html_text
    # The first examples are shown open, in order; every flag is still on the page (folded).
    section = html_text.split('aria-label="flags of rule literal_overlap"')[1].split("<details")[0]
    assert re.findall(r"a\.md</code>:(\d+)", section) == ["1", "2", "3"]
    assert html_text.count('class="evidence-line"') == 41
