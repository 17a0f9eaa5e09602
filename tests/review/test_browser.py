"""The main journey through the review application in real Chromium.

Playwright drives Debian's Chromium (``apt-get install chromium``; CI's
``.ci/run`` installs it) against a live server on the test database, with a
real Celery worker for the run started from the dashboard. Every screen is
saved as a screenshot under ``test-artifacts/screenshots/`` (or
``RSI_SCREENSHOT_DIR``). The browser reports any Content-Security-Policy
violation or script error as a console error, and the journey fails on one.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.urls import reverse

from evolution.models import (
    Annotation,
    Candidate,
    Experiment,
    GateDecision,
    LedgerEntry,
    ReviewDecision,
    ReviewItem,
    Run,
    Trial,
)
from review import diffs
from review.models import ViewedFile
from tests.conftest import REPO_ROOT, wait_until
from tests.factories import seed_of
from tests.review.test_candidates import child

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("RSI_SCREENSHOT_DIR") or REPO_ROOT / "test-artifacts" / "screenshots")
TIMEOUT_MS = 30_000


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        message = "Chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("RSI_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{message}; RSI_REQUIRE_BROWSER=1: required here")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls
    # the test makes between browser steps are plain synchronous ones.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Journey:
    """A logged-in page that records console errors and takes screenshots."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url.rstrip("/")
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        page.set_default_timeout(TIMEOUT_MS)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"{self.page.url}: {message.text}")

    def go(self, path: str) -> None:
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.status == 200, f"{path}: {response and response.status}"

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        target = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(target), full_page=True)
        return target


def ensure_default_labels() -> None:
    """Transactional tests empty every table afterwards, data-migration rows
    included; put the default annotation labels back as the migration does."""
    migration = importlib.import_module("evolution.migrations.0004_default_annotation_labels")
    migration.create_default_labels(django_apps, None)


def test_the_main_journey_through_the_review_application(
    browser: Any, live_server: Any, example_world: Experiment, make_user: Any, start_worker: Any
) -> None:
    ensure_default_labels()
    make_user("reviewer", "annotator", "operator", username="rhea")
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    journey = Journey(context.new_page(), live_server.url)
    page = journey.page

    # Log in through the form.
    page.goto(live_server.url + "/")
    assert "/login/" in page.url
    journey.shot("01-login")
    page.fill("#id_username", "rhea")
    page.fill("#id_password", "pw-rhea")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")
    journey.shot("02-experiments")

    # The dashboard of the finished example run.
    page.click(f"a[href='{reverse('review:experiment', args=[example_world.pk])}']")
    page.wait_for_selector("svg")
    assert page.locator("#run-progress").count() == 1
    assert "finished" in page.locator("#runs").inner_text().lower()
    journey.shot("03-dashboard")
    journey.go(reverse("review:lineage", args=[example_world.pk]))
    lineage_links = page.locator("svg a").count()
    assert lineage_links == example_world.candidates.count()
    journey.shot("04-lineage")

    # A candidate the gate accepted, and its diff against the parent.
    accepted = (
        example_world.candidates.filter(state=Candidate.State.ACCEPTED, parent__isnull=False).order_by("pk").first()
    )
    assert accepted is not None
    journey.go(reverse("review:candidate", args=[accepted.pk]))
    body = page.locator("main").inner_text()
    assert accepted.tree_id[:12] in body
    assert "rate" in body and "contribution" in body
    page.wait_for_selector("section.diff-file")  # the embedded diff, loaded by htmx
    journey.shot("05-candidate")
    journey.go(reverse("review:candidate_diff", args=[accepted.pk]))
    first_viewed = page.locator("input.js-viewed").first
    assert not first_viewed.is_checked()
    with page.expect_response(lambda r: r.url.endswith(reverse("review:diff_viewed")) and r.status == 200):
        first_viewed.check()
    journey.shot("06-diff")
    page.reload()
    assert page.locator("input.js-viewed").first.is_checked()
    assert ViewedFile.objects.filter(user__username="rhea").count() == 1

    # The review queue: approve one flagged candidate, reject another.
    journey.go(reverse("review:queue"))
    items = list(
        ReviewItem.objects.filter(candidate__experiment=example_world, state=ReviewItem.State.OPEN).order_by("pk")
    )
    assert len(items) >= 2, "the example world should hold at least two flagged candidates"
    assert page.locator(f"a[href='{reverse('review:review_item', args=[items[0].pk])}']").count() >= 1
    journey.shot("07-review-queue")
    for item, verdict, reason in (
        (items[0], "approve", "The marked words are general routing vocabulary, not a task's answer."),
        (items[1], "reject", "It copies a customer's order id from a train task."),
    ):
        journey.go(reverse("review:review_item", args=[item.pk]))
        page.click("button:has-text('Claim to review')")
        page.wait_for_selector("#decide-form")
        page.wait_for_selector(".diff-file, .diff-empty, .diff-files", state="attached")
        if verdict == "approve":
            journey.shot("08-review-item")
        page.fill("#reason", reason)
        page.click(f"#decide-form button[value={verdict}]")
        page.wait_for_load_state()
        decision = ReviewDecision.objects.get(item=item)
        assert (decision.verdict, decision.reason, decision.reviewer.username) == (verdict, reason, "rhea")
        assert reason in page.locator("main").inner_text()

    # Annotate a failed trial from the annotation queue.
    journey.go(reverse("review:annotate_queue") + f"?experiment={example_world.pk}")
    journey.shot("09-annotation-queue")
    first_trial_link = page.locator("a[href^='/trials/']").first
    found = re.search(r"/trials/(\d+)/", first_trial_link.get_attribute("href"))
    assert found is not None
    trial_pk = int(found.group(1))
    assert Trial.objects.get(pk=trial_pk).outcome in {Trial.Outcome.FAIL, Trial.Outcome.ERROR}
    first_trial_link.click()
    page.wait_for_selector("#annotations form.annotation-form")
    journey.shot("10-trial")
    page.select_option("#annotations select[name=label]", index=1)
    page.fill("#annotations textarea[name=note]", "Picked the refund tool for an address change.")
    page.click("#annotations form.annotation-form button[type=submit]")
    page.wait_for_selector("#annotations :text('Picked the refund tool for an address change.')")
    annotation = Annotation.objects.get(trial_id=trial_pk)
    assert annotation.author.username == "rhea"
    journey.shot("11-annotation")

    # The results matrix and a trajectory compared with the parent's.
    journey.go(reverse("review:matrix", args=[example_world.pk]))
    journey.shot("12-matrix")
    trials = Trial.objects.filter(candidate=accepted, trajectory__isnull=False).exclude(split="sealed")
    child_trial = trials.order_by("pk").first()
    assert child_trial is not None
    journey.go(reverse("review:trial_compare", args=[child_trial.pk]))
    journey.shot("13-compare")

    # Start a run from the dashboard and watch its progress bar reach the end.
    start_worker(concurrency=2)
    journey.go(reverse("review:experiment", args=[example_world.pk]))
    form = page.locator(f"form[action='{reverse('review:run_start', args=[example_world.pk])}']")
    form.locator("select[name=recipe]").select_option("unregularized")
    form.locator("[name=rounds]").fill("1")
    form.locator("[name=k]").fill("1")
    form.locator("[name=candidates]").fill("2")
    proposer = form.locator("[name=proposer]")
    if proposer.evaluate("el => el.tagName") == "SELECT":
        proposer.select_option("example")
    else:
        proposer.fill("example")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    run = Run.objects.filter(experiment=example_world).order_by("-pk").first()
    assert run is not None
    assert run.rounds == 1 and run.status in {Run.Status.PENDING, Run.Status.RUNNING}
    journey.shot("14-run-started")
    rounds_bar = page.locator("#run-progress progress[aria-label='rounds gated']")
    assert "live" in (page.locator("#run-progress").get_attribute("class") or "")
    # The section polls while the run moves and stops (no longer "live") when it has ended.
    page.wait_for_function(
        "() => { const s = document.querySelector('#run-progress');"
        " const p = s && s.querySelector(\"progress[aria-label='rounds gated']\");"
        " return p && !s.classList.contains('live') && p.max > 0 && p.value >= p.max; }",
        timeout=300_000,
    )
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED, (run.status, run.error)
    assert rounds_bar.get_attribute("value") == rounds_bar.get_attribute("max") == "1"
    journey.shot("15-run-finished")

    # The candidate approved in the queue after its run had ended was evaluated and gated against its parent
    # by the worker, with the loop's own gate (issue 19): its page shows the decision, the ledger has it.
    approved = items[0].candidate

    def gated() -> bool:
        return GateDecision.objects.filter(candidate=approved).exists()

    def where() -> str:
        approved.refresh_from_db()
        evaluations = list(approved.evaluations.values_list("state", flat=True))
        return f"candidate {approved.pk} is {approved.state}; evaluations {evaluations}"

    wait_until(gated, timeout=300, interval=1, what="the late gate of the approved candidate", diagnose=where)
    late = GateDecision.objects.get(candidate=approved)
    assert LedgerEntry.objects.filter(candidate=approved).count() == approved.edits.count()
    journey.go(reverse("review:candidate", args=[approved.pk]))
    page.wait_for_selector("span.rule")
    assert late.rule in page.locator("main").inner_text()
    journey.shot("16-late-decision")

    assert journey.errors == []
    context.close()


def test_a_large_diff_fills_in_the_counts_of_its_collapsed_files(
    browser: Any, live_server: Any, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    # Eight files of 150 changed pairs (301 diff lines): six fit the 2,000-line budget.
    old = {f"big/f{n}.txt": "".join(f"old {n} {i}\n" for i in range(150)) for n in range(8)}
    parent = child(seed, old, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    cand = child(parent, {path: text.replace("old", "new") for path, text in old.items()})
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    journey = Journey(context.new_page(), live_server.url)
    page = journey.page
    page.goto(live_server.url + "/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")

    journey.go(reverse("review:candidate_diff", args=[cand.pk]))
    # The page asks for the collapsed files' counts once loaded, and shows them in place.
    page.wait_for_selector("#diff-totals:not([hx-get])")
    assert page.locator("#diff-totals").inner_text().replace("\n", "") == "+1200−1200"
    assert page.locator(".pending").count() == 0
    assert page.locator("table.diff").count() == 6
    last = page.locator(f"#{diffs.file_anchor('big/f7.txt')}")
    assert "300 changed lines hidden" in last.inner_text()
    assert last.locator(".diff-file-head .plus").inner_text() == "+150"
    journey.shot("16-large-diff")

    # "Load diff" swaps in the file's rows; its counts stay.
    last.locator("a:has-text('Load diff')").click()
    last.locator("table.diff").wait_for()
    assert last.locator("td.code.add").count() == 150 and last.locator("td.code.del").count() == 150
    assert last.locator(".diff-file-head .plus").inner_text() == "+150"
    assert journey.errors == []
    context.close()
