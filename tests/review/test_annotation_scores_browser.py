"""Numeric and yes/no annotation scores in real Chromium (issue 40, defect 5): two annotators score one trial
next to their labels, a value out of range is refused with its message and nothing typed is lost, and the
statistics page shows the agreement (Cohen's kappa for yes/no, Krippendorff's alpha and the mean absolute
difference for numbers)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Annotation, AnnotationLabel, Experiment
from evolution.services.annotations import annotation_create, score_config_create
from tests.review.test_annotation_team_browser import _failed_trial
from tests.review.test_browser import browser, ensure_default_labels
from tests.review.test_keys_browser import Screen

__all__ = ["browser"]  # the fixture, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_two_annotators_score_one_trial_a_bad_value_is_refused_and_agreement_is_shown(
    browser: Any, live_server: Any, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    ann, bob = make_user("annotator", username="ann"), make_user("annotator", username="bob")
    solvable = score_config_create(experiment=example_world, name="Task solvable", kind="boolean")
    severity = score_config_create(experiment=example_world, name="Severity", kind="numeric", minimum=1, maximum=5)
    # Two trials both already scored (yes 5 / yes 4, no 1 / no 2): the agreement has more than one trial.
    label = AnnotationLabel.objects.get(slug="tool-misuse", experiment=None)
    for skip, values in (
        (1, {"ann": ("yes", "5"), "bob": ("yes", "4")}),
        (2, {"ann": ("no", "1"), "bob": ("no", "2")}),
    ):
        earlier = _failed_trial(example_world, skip=skip)
        for author in (ann, bob):
            yes_no, number = values[author.username]
            annotation_create(
                trial=earlier, author=author, label=label, scores={solvable.pk: yes_no, severity.slug: number}
            )
    trial = _failed_trial(example_world, skip=0)

    screens: dict[str, Screen] = {}
    contexts = []
    for name in ("ann", "bob"):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        contexts.append(context)
        screens[name] = Screen(context, live_server.url)
        screens[name].login(name)

    def score(name: str, *, yes_no: str, number: str, note: str) -> Any:
        page = screens[name].page
        screens[name].go(reverse("review:trial", args=[trial.pk]))
        form = page.locator("#annotations form.annotation-form:not(.is-edit)")
        form.locator("[data-label-pick]").nth(1).click()
        form.locator(f"[data-score='{solvable.slug}'] input[value='{yes_no}']").check()
        form.locator(f"[data-score='{severity.slug}'] input").fill(number)
        form.locator("textarea[name=note]").fill(note)
        form.locator("button[type=submit]").click()
        return page

    page = score("ann", yes_no="yes", number="4", note="called the tool twice")
    page.wait_for_selector("#annotations .annotation-list [data-score]")
    assert "Task solvable: yes" in page.locator("#annotations .annotation-list").inner_text()

    # Bob types 7 on a 1-5 scale: refused with the reason, and his label, yes and note are still there.
    page = score("bob", yes_no="yes", number="7", note="wrong tool, then gave up")
    alert = page.locator("#annotations [role=alert]")
    alert.wait_for()
    assert alert.inner_text() == "Not saved: the score 'Severity' must be from 1 to 5, not 7"
    assert not Annotation.objects.filter(trial=trial, author=bob).exists()
    form = page.locator("#annotations form.annotation-form:not(.is-edit)")
    assert form.locator("textarea[name=note]").input_value() == "wrong tool, then gave up"
    assert form.locator(f"[data-score='{solvable.slug}'] input[value=yes]").is_checked()
    assert form.locator(f"[data-score='{severity.slug}'] input").input_value() == "7"
    assert form.locator("select[name=label]").input_value() != ""
    form.locator(f"[data-score='{severity.slug}'] input").fill("3")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#annotations .annotation-list li:nth-child(2) [data-score]")
    saved = {a.author.username: {s.config.slug: s.value for s in a.scores.all()} for a in trial.annotations.all()}
    assert saved == {"ann": {"task-solvable": 1.0, "severity": 4.0}, "bob": {"task-solvable": 1.0, "severity": 3.0}}

    # The statistics: yes/no agreed on all three trials (kappa 1); numbers 5/4, 1/2, 4/3 give Krippendorff's
    # interval alpha 1 - 1 / (26 / 6) = 0.769 and a mean absolute difference of 1.
    screens["bob"].go(reverse("review:annotation_stats", args=[example_world.pk]))
    row = page.locator(f"tr[data-score='{solvable.slug}']")
    assert row.locator("[data-testid=score-kappa]").inner_text() == "kappa 1.000"
    assert row.locator("td").nth(3).inner_text() == "3"
    row = page.locator(f"tr[data-score='{severity.slug}']")
    assert row.locator("[data-testid=score-alpha]").inner_text() == "alpha 0.769"
    assert row.locator("[data-testid=score-mad]").inner_text() == "mean absolute difference 1.00"
    for made in screens.values():
        made.check()
    for context in contexts:
        context.close()
