"""Keys that never record the wrong decision, in real Chromium (issue 40
items 1, 2 and 9): a sentence typed with the focus on a control is no
command, Ctrl+Enter with edits ticked rejects only those edits, a focused
control's own key wins over the page's, and the candidate page's diff
choices survive a reload."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Candidate, Experiment, ReviewDecision, ReviewItem
from evolution.services.review import review_claim
from review.models import ViewedFile
from tests.factories import seed_of
from tests.review.test_browser import browser
from tests.review.test_candidates import child
from tests.review.test_keys_browser import Screen, screen
from tests.review.test_queue import multi_edit_item

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every diff key (j k n p v u e x), both verdict keys (a r), claim (c), the reason key (d), a label digit.
SENTENCE = "Please reuse the expected answer; next, approve it? Check 2 diffs by Jack, Kim and Vex."


def test_a_sentence_typed_on_a_diff_control_decides_nothing_and_ctrl_enter_rejects_the_ticked_edit(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    rhea = make_user("reviewer", username="rhea")
    item = multi_edit_item(example_world)
    review_claim(item=item, user=rhea)
    edits = list(item.candidate.edits.order_by("index"))
    leaky = next(edit for edit in edits if edit.flags.exists())
    screen.login("rhea")
    url = reverse("review:review_item", args=[item.pk])
    screen.go(url)
    page = screen.page
    page.wait_for_selector("#diff section.diff-file")

    # One edit ticked with the mouse, then the focus on a control of the diff (a file's "raw" link).
    page.locator(f"#edit-{leaky.index} input[name=edits]").check()
    control = page.locator("#diff section.diff-file .diff-file-head a.small").first
    control.focus()
    focused = control.inner_text().strip()
    page.keyboard.type(SENTENCE)
    page.keyboard.press("Control+Enter")

    # Nothing was decided, and the text landed nowhere: no reason, no viewed file, no expanded context,
    # the same page, the same tick, the focus where it was.
    page.wait_for_timeout(500)  # what a stray key would have sent has had time to arrive
    assert ReviewDecision.objects.filter(item=item).count() == 0
    assert ReviewItem.objects.get(pk=item.pk).state == ReviewItem.State.CLAIMED
    assert page.url.endswith(url)
    assert page.locator("#reason").input_value() == ""
    assert page.locator("#decide-form").get_attribute("data-verdict") is None
    assert ViewedFile.objects.count() == 0
    assert page.locator("section.diff-file.is-current").count() == 0
    ticked = page.locator("input[name=edits]:checked")
    assert ticked.count() == 1 and ticked.get_attribute("value") == str(leaky.pk)
    assert page.evaluate("() => document.activeElement.textContent.trim()") == focused
    # The hint is shown just after the focus moves (a timer of 0): wait for it, then it must be there.
    page.locator("#keys-paused").wait_for(state="visible", timeout=5000)

    # Esc leaves the control; d puts the cursor in the reason, where every key is text.
    screen.key("Escape")
    screen.key("d")
    assert page.evaluate("() => document.activeElement.id") == "reason"
    reason = f"Edit #{leaky.index} copies expected answers (a, r, c typed here stay text)."
    page.keyboard.type(reason)
    assert ReviewDecision.objects.filter(item=item).count() == 0
    with page.expect_navigation():
        page.keyboard.press("Control+Enter")
    decision = ReviewDecision.objects.get(item=item)
    assert decision.verdict == ReviewDecision.Verdict.REJECT_EDITS
    assert decision.reason == reason
    assert list(decision.rejected_edits.all()) == [leaky]
    assert ReviewItem.objects.get(pk=item.pk).state == ReviewItem.State.PARTIAL


def test_r_with_edits_ticked_names_them_and_rejects_only_those(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    rhea = make_user("reviewer", username="rhea")
    item = multi_edit_item(example_world)
    review_claim(item=item, user=rhea)
    leaky = next(edit for edit in item.candidate.edits.order_by("index") if edit.flags.exists())
    screen.login("rhea")
    screen.go(reverse("review:review_item", args=[item.pk]))
    page = screen.page
    page.locator(f"#edit-{leaky.index} input[name=edits]").check()
    # The click left the focus on the checkbox, where keys rest: a hint says so, and r does nothing.
    hint = page.locator("#keys-paused")
    hint.wait_for(state="visible", timeout=5000)  # shown just after the focus moves (a timer of 0)
    assert hint.is_visible() and "Keys paused while a control has the focus: press Esc" in hint.inner_text()
    screen.key("r")
    assert page.locator("#decide-form").get_attribute("data-verdict") is None
    assert page.evaluate("() => document.activeElement.name") == "edits"
    screen.key("Escape")  # off the checkbox: the focus goes back to the page, the hint goes away
    hint.wait_for(state="hidden", timeout=5000)
    assert not hint.is_visible()
    assert page.evaluate("() => document.activeElement === document.body")
    screen.key("r")
    assert page.evaluate("() => document.activeElement.id") == "reason"
    assert f"reject edit #{leaky.index} and keep the rest" in page.locator(".verdict-hint").inner_text()
    page.keyboard.type("The keyword list copies task ids.")
    with page.expect_navigation():
        page.keyboard.press("Control+Enter")
    decision = ReviewDecision.objects.get(item=item)
    assert decision.verdict == ReviewDecision.Verdict.REJECT_EDITS
    assert list(decision.rejected_edits.all()) == [leaky]


def test_enter_on_a_focused_claim_button_claims_that_item(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("reviewer", username="rhea")
    items = list(ReviewItem.objects.filter(candidate__experiment=example_world, state="open").order_by("pk"))
    assert len(items) >= 2
    screen.login("rhea")
    screen.go(reverse("review:queue"))
    page = screen.page
    # j selects the first row; Tab walks along it to its Claim button.
    screen.key("j")
    for _ in range(12):
        if page.evaluate("() => document.activeElement.textContent.trim()") == "Claim":
            break
        page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.closest('tr').classList.contains('is-selected')")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    claimed = ReviewItem.objects.get(pk=items[0].pk)
    assert claimed.state == ReviewItem.State.CLAIMED
    assert claimed.claimed_by is not None and claimed.claimed_by.username == "rhea"
    assert page.url.endswith(reverse("review:review_item", args=[items[0].pk]))

    # The second row's Claim, focused while the first row is selected: Enter claims the second.
    screen.go(reverse("review:queue"))
    screen.key("j")
    second = page.locator(f"form[action='{reverse('review:review_claim', args=[items[1].pk])}'] button")
    second.focus()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert ReviewItem.objects.get(pk=items[1].pk).claimed_by == claimed.claimed_by


def test_a_reload_keeps_the_candidate_pages_compare_and_layout_choice(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    lines = [f"setting_{i} = {i}\n" for i in range(1, 41)]
    base = child(seed, {"conf/a.py": "".join(lines)}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    lines[9] = "setting_10 = 'parent'\n"
    parent = child(base, {"conf/a.py": "".join(lines)}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    lines[29] = "setting_30 = 'child'\n"
    cand = child(parent, {"conf/a.py": "".join(lines)})
    screen.login("vera")
    page = screen.page
    url = reverse("review:candidate", args=[cand.pk])
    screen.go(url)
    page.wait_for_selector("#diff-embed table.layout-split")

    with page.expect_response(lambda r: "/diff/" in r.url and "layout=unified" in r.url):
        page.locator("select[name=layout]").select_option("unified")
    page.wait_for_selector("#diff-embed table.layout-unified")
    with page.expect_response(lambda r: "/diff/" in r.url and f"against={base.pk}" in r.url):
        page.locator("select[name=against]").select_option(str(base.pk))
    page.wait_for_selector("#diff-embed table.layout-unified")
    assert "'parent'" in page.locator("#diff-embed").inner_text()  # against the grandparent: both changes
    assert f"against={base.pk}" in page.url and "layout=unified" in page.url

    page.reload()
    page.wait_for_selector("#diff-embed table.layout-unified")
    assert page.locator("select[name=layout]").input_value() == "unified"
    assert page.locator("select[name=against]").input_value() == str(base.pk)
    body = page.locator("#diff-embed").inner_text()
    assert "'parent'" in body and "'child'" in body


def test_the_keys_overlay_takes_the_focus_keeps_it_and_gives_it_back(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("reviewer", username="rhea")
    screen.login("rhea")
    screen.go(reverse("review:queue"))
    page = screen.page
    screen.key("j")
    row_link = page.evaluate("() => document.activeElement.getAttribute('href')")
    assert row_link and row_link.startswith("/review/")
    screen.key("?")
    inside = "() => !!document.activeElement.closest('#keys-overlay')"
    assert page.evaluate(inside)
    for _ in range(3):
        page.keyboard.press("Tab")
        assert page.evaluate(inside)
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(inside)
    screen.key("Escape")
    assert page.locator("#keys-overlay").count() == 0
    assert page.evaluate("() => document.activeElement.getAttribute('href')") == row_link
    screen.key("j")  # keys work again where they were
    assert page.locator("#waiting tr.is-selected").count() == 1
