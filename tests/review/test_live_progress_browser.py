"""Live progress in real Chromium (issue 40, defect 7): the dashboard stays open while a run, driven by a real
worker, is paused, resumed and cancelled from elsewhere (as the API, the admin or a colleague's tab would); the
runs table and the run's card follow, with the same counts, without a reload by the person watching."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db.models import Sum
from django.urls import reverse
from playwright.sync_api import Error as PlaywrightError

from evolution.loop import lifecycle
from evolution.models import Evaluation, Experiment, ReviewItem, Run
from tests.review.test_browser import browser
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# The runs table's row and the card, as a person reads them: status badge and "done / total" trials.
READ = """(runId) => {
  const table = [...document.querySelectorAll('table')].find(t =>
    [...t.querySelectorAll('thead th')].some(th => th.innerText.trim() === 'ended because'));
  const card = document.querySelector('#run-progress');
  if (!table || !card) return null;
  const row = [...table.querySelectorAll('tbody tr')].find(tr => tr.querySelector(`a[href$='?run=${runId}']`));
  if (!row) return null;
  const heads = [...table.querySelectorAll('thead th')].map(th => th.innerText.trim());
  const cells = row.querySelectorAll('td');
  const cardTrials = card.querySelector("progress[aria-label='trials finished']");
  return {
    tableStatus: cells[heads.indexOf('state')].querySelector('.badge').innerText.trim(),
    tableTrials: Number(cells[heads.indexOf('trials')].querySelector('progress').value),
    cardStatus: card.querySelector('.badge').innerText.trim(),
    cardTrials: Number(cardTrials.value),
  };
}"""


def _until(page: Any, run_id: int, check: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
    """Read the page (table and card) until ``check`` holds; the page's own polling must bring it there."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = page.evaluate(READ, run_id)
        except PlaywrightError:  # the page reloads itself once the run has ended
            seen = None
        if seen is not None and check(seen):
            return seen
        time.sleep(0.25)
    raise AssertionError(f"{what}: the page still shows {seen}")


def _finished_trials(run: Run) -> int:
    return Evaluation.objects.filter(run=run).aggregate(n=Sum("trials_finished"))["n"] or 0


def _settled(run: Run, seconds: float = 4.0) -> int:
    """The run's finished-trial count once it has not changed for ``seconds`` (a paused run's in-flight trials
    finish first)."""
    last, since = _finished_trials(run), time.monotonic()
    deadline = since + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _finished_trials(run)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return now
    raise AssertionError("the paused run's trials never settled")


def test_the_runs_table_and_card_follow_a_run_paused_resumed_and_cancelled_elsewhere(
    screen: Screen, example_world: Experiment, make_user: Any, start_worker: Any
) -> None:
    operator = make_user("operator", "reviewer", username="olga")
    start_worker(concurrency=1)
    run = lifecycle.run_start(
        experiment=example_world,
        recipe="unregularized",
        rounds=6,
        k=1,
        candidates_per_round=2,
        proposer="example",
        user=operator,
    )
    screen.login("olga")
    screen.go(reverse("review:experiment", args=[example_world.pk]) + f"?run={run.pk}")
    page = screen.page
    first = page.evaluate(READ, run.pk)
    assert first is not None and first["cardStatus"] in {"Pending", "Running"}

    # While it runs, the table's trial count moves with the card's (it was left at the first count).
    _until(
        page,
        run.pk,
        lambda s: (
            s["cardTrials"] > first["tableTrials"]
            and s["tableTrials"] == s["cardTrials"]
            and s["tableStatus"] == "Running"
        ),
        "the table following the running card",
        timeout=120,
    )

    # Paused from elsewhere: both say so, and the card keeps counting the trials that were in flight.
    assert lifecycle.run_pause(run=run), "the run ended before it could be paused"
    _until(page, run.pk, lambda s: s["tableStatus"] == s["cardStatus"] == "Paused", "the pause shown")
    settled = _settled(run)
    _until(page, run.pk, lambda s: s["cardTrials"] == s["tableTrials"] == settled, f"{settled} trials when paused")
    assert page.locator("#run-progress button:has-text('Resume')").count() == 1

    # Resumed from elsewhere: the paused card notices and counts on.
    assert lifecycle.run_resume(run=run)
    _until(
        page,
        run.pk,
        lambda s: (
            s["tableStatus"] == s["cardStatus"] == "Running"
            and s["cardTrials"] > settled
            and s["tableTrials"] == s["cardTrials"]
        ),
        "the resumed run counting on",
        timeout=120,
    )

    # Cancelled from elsewhere: the page shows the run's end in both places.
    assert lifecycle.run_cancel(run=run)
    _until(page, run.pk, lambda s: s["tableStatus"] == s["cardStatus"] == "Cancelled", "the cancel shown")
    _settled(run, seconds=2.0)
    page.reload()
    final = page.evaluate(READ, run.pk)
    assert final is not None and final["tableTrials"] == final["cardTrials"] == _finished_trials(run)

    # The home page: the experiment stays Finished (its first run finished), and says what waits for review.
    screen.go(reverse("review:home"))
    waiting = ReviewItem.objects.filter(
        candidate__experiment=example_world, state__in=[ReviewItem.State.OPEN, ReviewItem.State.CLAIMED]
    ).count()
    row = page.locator(f"tr:has(a[href='/experiments/{example_world.pk}/'])").first
    status = row.locator("td").nth(2)
    assert status.locator(".badge").inner_text() == "Finished"
    assert waiting > 0
    link = status.locator(".waiting-review a")
    assert link.inner_text() == f"{waiting} flagged candidate{'s' if waiting > 1 else ''} waiting for review"
    link.click()
    page.wait_for_url(f"**/review/?experiment={example_world.pk}")
    screen.check()
