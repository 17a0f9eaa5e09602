"""Accessibility of every review screen in real Chromium (issue 40 item 10):
axe-core, the npm package, is injected into each page by Playwright and must
report no violation of WCAG 2 A or AA (2.0 and 2.1 rules).

axe-core is not vendored: ``axe_script`` takes the pinned release from
``RSI_AXE_JS`` (a path to its ``axe.min.js``) or downloads the pinned tarball
from registry.npmjs.org once into a per-user cache, checking the registry's
published sha512 before use. Without it the test skips on a laptop and fails
where the browser tests are required (``RSI_REQUIRE_BROWSER=1``, as in CI).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from evolution.loop.review import review_correct, review_decide, review_submit
from evolution.models import CertifiedResult, Experiment, ReviewItem, Trial
from evolution.services.annotations import score_config_create
from tests.factories import seed_of
from tests.review.comparison_world import small_comparison
from tests.review.test_browser import browser, ensure_default_labels
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE_VERSION = "4.11.0"
AXE_TARBALL = f"https://registry.npmjs.org/axe-core/-/axe-core-{AXE_VERSION}.tgz"
# The registry's dist.integrity of that tarball (npm view axe-core@4.11.0 dist.integrity).
AXE_INTEGRITY = "sha512-ilYanEU8vxxBexpJd8cWM4ElSQq4QctCLKih0TSfjIfCQTeyH/6zVrmIJfLPrKTKJRbiG+cfnZbQIjAlJmF1jQ=="
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def _axe_unavailable(why: str) -> None:
    message = f"axe-core {AXE_VERSION} is not available: {why}"
    if os.environ.get("RSI_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{message}; RSI_REQUIRE_BROWSER=1: required here")
    pytest.skip(message)


def _axe_download(target: Path) -> None:
    with urllib.request.urlopen(AXE_TARBALL, timeout=60) as response:  # noqa: S310 (a fixed https URL)
        data = response.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != AXE_INTEGRITY:
        raise ValueError(f"{AXE_TARBALL} has {digest}, the registry publishes {AXE_INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        member = archive.extractfile("package/axe.min.js")
        if member is None:
            raise ValueError(f"{AXE_TARBALL} holds no package/axe.min.js")
        source = member.read()
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(source)
    partial.replace(target)


@pytest.fixture(scope="session")
def axe_script() -> str:
    """The source of axe.min.js, pinned to AXE_VERSION."""
    given = os.environ.get("RSI_AXE_JS")
    if given:
        path = Path(given)
        if not path.is_file():
            _axe_unavailable(f"RSI_AXE_JS={given} is not a file")
        return path.read_text(encoding="utf-8")
    cache = Path(os.environ.get("RSI_TEST_WORLD_CACHE") or Path(tempfile.gettempdir()) / f"rsiweb-world-{os.getuid()}")
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = cache / f"axe-core-{AXE_VERSION}.min.js"
    if not path.exists():
        try:
            _axe_download(path)
        except (OSError, ValueError, tarfile.TarError) as error:
            _axe_unavailable(f"{AXE_TARBALL}: {error}")
    return path.read_text(encoding="utf-8")


def axe_violations(page: Any, source: str) -> list[str]:
    """Run axe on the page as it is now; one line per violation and element.

    ``page.evaluate`` runs outside the page's Content-Security-Policy, so the
    screens keep theirs (no inline script is allowed in)."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(source)
    found = page.evaluate(
        "tags => axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})"
        ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' ') + ': '"
        " + (n.failureSummary || '').split('\\n').slice(1, 2).join(''))})))",
        WCAG_TAGS,
    )
    lines = []
    for violation in found:
        for node in violation["nodes"][:5]:
            lines.append(f"{page.url} {violation['id']} ({violation['impact']}, {violation['help']}): {node}")
    return lines


def test_every_review_screen_passes_axe_wcag_2_a_and_aa(
    screen: Screen, axe_script: str, example_world: Experiment, make_user: Any, settings: Any
) -> None:
    ensure_default_labels()
    rhea = make_user("reviewer", "annotator", "operator", username="rhea")
    items = list(ReviewItem.objects.filter(candidate__experiment=example_world, state="open").order_by("pk")[:3])
    assert len(items) == 3
    item, corrected, pending = items
    # The review states added since: a decision that took effect and was corrected (the correction form and
    # the corrections on the item and the candidate page), and one pending in its undo window (Undo).
    settings.RSI_REVIEW_UNDO_SECONDS = 0
    review_decide(item=corrected, user=rhea, approve=True, reason="generic enough")
    review_correct(item=corrected, user=rhea, approve=False, reason="it names a task's answer")
    settings.RSI_REVIEW_UNDO_SECONDS = 600
    review_submit(item=pending, user=rhea, verdict="reject", reason="copies a task id")
    gated = example_world.candidates.filter(parent__isnull=False, gate_decisions__isnull=False)
    candidate = gated.order_by("pk").first()
    trial = Trial.objects.filter(candidate=candidate, trajectory__isnull=False).exclude(split="sealed").first()
    record = CertifiedResult.objects.filter(experiment=example_world).order_by("seq").first()
    assert item is not None and candidate is not None and trial is not None and record is not None
    seed = seed_of(example_world)
    comparison, _ = small_comparison()
    # Scores next to the labels: their fields in a failed trial's annotation form, their rows on the statistics.
    score_config_create(experiment=example_world, name="Task solvable", kind="boolean")
    score_config_create(experiment=example_world, name="Severity", kind="numeric", minimum=1, maximum=5)
    failed = Trial.objects.filter(candidate=candidate, outcome="fail", trajectory__isnull=False).exclude(split="sealed")
    failed_trial = failed.first() or trial
    screens = {
        "home": reverse("review:home"),
        "dashboard": reverse("review:experiment", args=[example_world.pk]),
        "ledger": reverse("review:experiment_ledger", args=[example_world.pk]),
        "lineage": reverse("review:lineage", args=[example_world.pk]),
        "matrix": reverse("review:matrix", args=[example_world.pk]),
        "candidate": reverse("review:candidate", args=[candidate.pk]),
        "seed": reverse("review:candidate", args=[seed.pk]),
        "diff": reverse("review:candidate_diff", args=[candidate.pk]),
        "record": reverse("review:record", args=[record.pk]),
        "trial": reverse("review:trial", args=[trial.pk]),
        "compare": reverse("review:trial_compare", args=[trial.pk]),
        "failed-trial": reverse("review:trial", args=[failed_trial.pk]),
        "queue": reverse("review:queue"),
        "queue-decided": reverse("review:queue") + "?tab=decided",
        "review-item": reverse("review:review_item", args=[item.pk]),
        "annotation-queue": reverse("review:annotate_queue"),
        "annotation-stats": reverse("review:annotation_stats", args=[example_world.pk]),
        "comparison": reverse("review:comparison", args=[comparison.pk]),
        "review-item-pending": reverse("review:review_item", args=[pending.pk]),
        "candidate-corrected": reverse("review:candidate", args=[corrected.candidate_id]),
    }
    screen.login("rhea")
    page = screen.page
    violations: list[str] = []
    for path in screens.values():
        screen.go(path)
        page.wait_for_load_state("networkidle")
        violations += axe_violations(page, axe_script)
    # The claimed item with its decision form, and the "?" overlay open over it.
    screen.go(reverse("review:review_item", args=[item.pk]))
    page.locator("form[action$='/claim/'] button").click()  # the item's own Claim
    page.wait_for_selector("#decide-form")
    page.wait_for_load_state("networkidle")
    violations += axe_violations(page, axe_script)
    screen.key("?")
    page.wait_for_selector("#keys-overlay")
    violations += axe_violations(page, axe_script)
    screen.key("Escape")
    # A clicked checkbox keeps the focus: the "keys paused" hint shows.
    page.wait_for_selector("#diff section.diff-file")
    page.locator("#diff input.js-viewed").first.click()
    page.wait_for_selector("#keys-paused", state="visible")
    violations += axe_violations(page, axe_script)
    # A corrected item, with its correction form open.
    screen.go(reverse("review:review_item", args=[corrected.pk]))
    page.click("#correct summary")
    page.wait_for_selector("#correct-form")
    violations += axe_violations(page, axe_script)
    # The login page, signed out.
    page.context.clear_cookies()
    screen.go(reverse("login"))
    violations += axe_violations(page, axe_script)
    assert violations == [], "\n".join(violations)
