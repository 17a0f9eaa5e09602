"""Annotation for several people in real Chromium (issue 40, defect 5): the side panel fits its box at 1,280 and
1,440 px; label keys typed while the panel is still loading land; a second annotator finds a colleague's items
("labelled by others, not by me") with the queue's row keys, and both labels count in agreement."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Annotation, Experiment, Trial
from tests.review.test_browser import browser, ensure_default_labels
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every element of the panel whose right edge passes the panel's content box, by how many pixels.
OVERFLOW = """() => {
  const wrap = document.querySelector('aside.annotations-wrap');
  const box = wrap.getBoundingClientRect();
  const style = getComputedStyle(wrap);
  const right = box.right - parseFloat(style.paddingRight) - parseFloat(style.borderRightWidth);
  const out = [];
  for (const el of wrap.querySelectorAll('label, input, select, textarea, button, h2, h3, a, p')) {
    if (!el.getClientRects().length) continue;
    const r = el.getBoundingClientRect();
    const name = el.tagName.toLowerCase() + (el.name ? `[name=${el.name}]` : '');
    if (r.right > right + 0.5) out.push(`${name}: ${Math.round(r.right - right)} px`);
  }
  const sideways = wrap.scrollWidth - wrap.clientWidth;
  if (sideways > 0) out.push(`panel scrolls sideways by ${sideways} px`);
  return out;
}"""


def _failed_trial(experiment: Experiment, *, skip: int = 0) -> Trial:
    trial = (
        Trial.objects.filter(
            candidate__experiment=experiment,
            outcome__in=[Trial.Outcome.FAIL, Trial.Outcome.ERROR],
            trajectory__step_count__gte=3,
            evaluation__external=False,
        )
        .exclude(split="sealed")
        .order_by("pk")[skip]
    )
    return trial


def test_the_annotation_panel_fits_its_box_at_1280_and_1440_px(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    make_user("annotator", username="ann")
    trial = _failed_trial(example_world)
    screen.login("ann")
    page = screen.page
    for width in (1280, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        screen.go(reverse("review:trial", args=[trial.pk]))
        page.wait_for_selector("#annotations form.annotation-form textarea[name=note]")
        assert page.evaluate(OVERFLOW) == [], width
        # Every field of the form can be seen whole.
        for name in ("label", "step", "note"):
            field = page.locator(f"#annotations form.annotation-form [name={name}]")
            assert field.is_visible(), (width, name)


def test_label_keys_typed_while_the_panel_loads_all_land(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    make_user("annotator", username="ann")
    trial = _failed_trial(example_world)
    screen.login("ann")
    page = screen.page
    panel_url = reverse("review:trial_annotations", args=[trial.pk])

    # The panel's request is held until the person has typed: the keys come before the panel, as on a busy
    # server (0.1-0.3 s) with a fast annotator.
    held: list[Any] = []
    page.route(f"**{panel_url}", lambda route: held.append(route))
    page.goto(screen.base_url + reverse("review:trial", args=[trial.pk]))
    page.wait_for_function("() => document.readyState === 'complete'")
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the page never asked for its panel"
    assert page.locator("#annotations form.annotation-form").count() == 0  # still loading
    screen.key("3")
    screen.key("s")
    # The loading line says the keys are kept for the panel (checked last: first, that they land).
    loading = page.locator("#annotations").inner_text()
    held[0].continue_()
    page.unroute(f"**{panel_url}")  # before the save that the replayed "s" posts to the same address
    # The keys wait for the panel, then apply in order: label 3, then save.
    page.wait_for_selector("#annotations .annotation-list", timeout=15_000)
    annotation = Annotation.objects.get(trial=trial)
    assert annotation.author.username == "ann"
    # The third label key of the panel (the same labels on every trial of the experiment).
    screen.go(reverse("review:trial", args=[_failed_trial(example_world, skip=1).pk]))
    third = page.locator("#annotations .label-keys button").nth(2)
    assert str(annotation.label_id) == third.get_attribute("data-label-pick")
    assert "2 keys kept (3 s)" in loading
    screen.check()


def test_a_second_annotator_is_sent_to_a_colleagues_trial_and_both_labels_count_in_agreement(
    browser: Any, live_server: Any, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    make_user("annotator", username="ann")
    make_user("annotator", username="bob")
    trial = _failed_trial(example_world, skip=2)
    screens = []
    for name in ("ann", "bob"):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        made = Screen(context, live_server.url)
        made.login(name)
        screens.append((made, context))
    (ann, _), (bob, _) = screens

    # Ann labels one trial.
    ann.go(reverse("review:trial", args=[trial.pk]))
    ann.page.wait_for_selector("#annotations .label-keys button")
    ann.key("2")
    ann.key("s")
    ann.page.wait_for_selector("#annotations .annotation-list")
    first = Annotation.objects.get(trial=trial)
    assert first.author.username == "ann"

    # Bob asks the queue for trials labelled by others, not by him: the one trial Ann labelled, one of two.
    queue = bob.page
    bob.go(reverse("review:annotate_queue") + f"?experiment={example_world.pk}")
    queue.click("a:has-text('labelled by others, not by me')")
    queue.wait_for_url("**show=others**")
    rows = queue.locator("table.annotation-queue tbody tr[data-trial]")
    assert rows.count() == 1 and rows.first.get_attribute("data-trial") == str(trial.pk)
    assert "1 of 2" in rows.first.inner_text()
    # The row keys: j selects the row, Enter opens its trial.
    bob.key("j")
    assert "is-selected" in (rows.first.get_attribute("class") or "")
    bob.key("Enter")
    queue.wait_for_url(f"**/trials/{trial.pk}/**")
    queue.wait_for_selector("#annotations .label-keys button")
    bob.key("2")
    bob.key("s")
    queue.wait_for_selector("#annotations .annotation-list li:nth-child(2)")
    assert sorted(Annotation.objects.filter(trial=trial).values_list("author__username", flat=True)) == ["ann", "bob"]

    # Both labels count in agreement: the pair has one trial in common.
    bob.go(reverse("review:annotation_stats", args=[example_world.pk]))
    pair = queue.locator("tr[data-pair='ann|bob']")
    assert pair.locator("td").nth(1).inner_text() == "1"
    # The trial has its two annotators: nothing is left for Bob under "labelled by others".
    bob.go(reverse("review:annotate_queue") + f"?experiment={example_world.pk}&show=others")
    assert queue.locator("table.annotation-queue tbody tr[data-trial]").count() == 0
    for made, context in screens:
        made.check()
        context.close()
