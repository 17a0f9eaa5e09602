"""Reviewer ergonomics in real Chromium (issue 21): the review item's styled
diff, the keyboard on every screen where people repeat an action, the diff's
context expansion, file tree and line permalinks.

Every page the tests open records console errors and Content-Security-Policy
reports (a ``securitypolicyviolation`` listener installed before any page
script runs); a test fails on either. The screens are saved at 1,440 and
1,280 px wide into ``docs/screenshots/`` when ``RSI_DOC_SCREENSHOTS=1``
(docs/review.md shows them), else into the test artifacts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Annotation, Candidate, Experiment, ReviewDecision, ReviewItem, Trial
from review import diffs
from review.models import ViewedFile
from tests.conftest import REPO_ROOT
from tests.factories import seed_of
from tests.review.test_browser import SHOTS, TIMEOUT_MS, browser, ensure_default_labels
from tests.review.test_candidates import child

__all__ = ["browser"]  # the fixture, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOC_SHOTS = REPO_ROOT / "docs" / "screenshots"
WIDTHS = (1440, 1280)

# Installed before any script of the page: CSP reports become entries of a list the test reads.
CSP_LISTENER = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " at " + e.sourceFile);
});
"""


class Screen:
    """A logged-in page that fails the test on a console error or a CSP report."""

    def __init__(self, context: Any, base_url: str) -> None:
        context.add_init_script(CSP_LISTENER)
        self.page = context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.base_url = base_url.rstrip("/")
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"{self.page.url}: {message.text}")

    def login(self, username: str) -> None:
        self.page.goto(self.base_url + "/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", "pw-" + username)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.base_url + "/")

    def go(self, path: str) -> None:
        self.check()
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.status == 200, f"{path}: {response and response.status}"

    def key(self, key: str) -> None:
        """One key press with the focus on the page itself (not in a field)."""
        self.page.keyboard.press(key)

    def check(self) -> None:
        """No console error and no CSP report so far on this page."""
        reports = self.page.evaluate("() => window.__csp || []") if self.page.url.startswith("http") else []
        assert reports == [], reports
        assert self.errors == [], self.errors

    def shots(self, name: str, *, full: bool = True) -> list[Path]:
        """The page at each documented width, full length unless ``full`` is False."""
        folder = DOC_SHOTS if os.environ.get("RSI_DOC_SCREENSHOTS") == "1" else SHOTS / "keys"
        folder.mkdir(parents=True, exist_ok=True)
        saved = []
        size = self.page.viewport_size
        for width in WIDTHS:
            self.page.set_viewport_size({"width": width, "height": 900})
            target = folder / f"{name}-{width}.png"
            self.page.screenshot(path=str(target), full_page=full)
            saved.append(target)
        self.page.set_viewport_size(size)
        return saved


@pytest.fixture
def screen(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    made = Screen(context, live_server.url)
    yield made
    made.check()
    context.close()


def test_the_review_item_page_styles_its_diff_and_folds_viewed_files(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("reviewer", username="rhea")
    item = ReviewItem.objects.filter(candidate__experiment=example_world).order_by("pk").first()
    assert item is not None
    screen.login("rhea")
    screen.go(reverse("review:review_item", args=[item.pk]))
    page = screen.page
    page.wait_for_selector("#diff section.diff-file")
    # The diff's own stylesheet applies: code font, red and green rows.
    code = page.locator("#diff table.diff td.code").first
    assert "mono" in code.evaluate("el => getComputedStyle(el).fontFamily").lower()
    added = page.locator("#diff table.diff td.code.add, #diff table.diff tr.add td.code").first
    assert added.evaluate("el => getComputedStyle(el).backgroundColor") == "rgb(230, 255, 236)"
    # "Viewed" folds the file (diff.js) and the counter follows.
    first = page.locator("#diff section.diff-file").first
    assert first.locator(".diff-file-body").is_visible()
    with page.expect_response(lambda r: r.url.endswith(reverse("review:diff_viewed")) and r.status == 200):
        first.locator("input.js-viewed").check()
    assert not first.locator(".diff-file-body").is_visible()
    assert page.locator("#diff .js-viewed-count").first.inner_text() == "1"
    assert ViewedFile.objects.filter(user__username="rhea").count() == 1


def test_the_queue_and_a_decision_by_keyboard_alone(screen: Screen, example_world: Experiment, make_user: Any) -> None:
    make_user("reviewer", username="rhea")
    items = list(ReviewItem.objects.filter(candidate__experiment=example_world, state="open").order_by("pk"))
    assert len(items) >= 2
    screen.login("rhea")
    screen.go(reverse("review:queue"))
    page = screen.page

    # "?" lists the screen's keys; Esc closes the list.
    screen.key("?")
    overlay = page.locator("#keys-overlay")
    assert overlay.is_visible()
    listed = overlay.inner_text()
    assert "Claim the selected item" in listed and "Select the next row" in listed
    screen.shots("keys-overlay-queue")
    screen.key("Escape")
    assert overlay.count() == 0

    # j selects the first row, j again the second, k back; c claims the selected row.
    screen.key("j")
    screen.key("j")
    screen.key("k")
    selected = page.locator("#waiting tr.is-selected")
    assert selected.count() == 1 and f"#{items[0].pk}" in selected.inner_text()
    screen.key("c")
    page.wait_for_url(f"**{reverse('review:review_item', args=[items[0].pk])}")
    claimer = ReviewItem.objects.get(pk=items[0].pk).claimed_by
    assert claimer is not None and claimer.username == "rhea"

    # "a" without a reason puts the cursor in the reason; keys typed there are text, not shortcuts.
    page.wait_for_selector("#decide-form")
    screen.key("a")
    assert page.evaluate("() => document.activeElement.id") == "reason"
    reason = "A general routing rule; nothing a task answers. (c, r, n, a typed here stay text.)"
    page.keyboard.type(reason)
    assert ReviewDecision.objects.filter(item=items[0]).count() == 0
    assert page.locator("#reason").input_value() == reason
    with page.expect_navigation():
        page.keyboard.press("Control+Enter")
    decision = ReviewDecision.objects.get(item=items[0])
    assert (decision.verdict, decision.reason) == ("approve", reason)

    # n opens the next waiting item, c claims it, r with a reason written rejects at once.
    screen.key("n")
    page.wait_for_url(f"**{reverse('review:review_item', args=[items[1].pk])}")
    screen.key("c")
    page.wait_for_selector("#decide-form")
    page.locator("#reason").fill("Copies an order id from a train task.")
    screen.key("Escape")  # leaves the field: keys work again
    with page.expect_navigation():
        screen.key("r")
    assert ReviewDecision.objects.get(item=items[1]).verdict == "reject"


def test_the_diff_by_keyboard_alone(screen: Screen, example_world: Experiment, make_user: Any) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    old = {f"src/f{n}.py": "".join(f"value_{n}_{i} = {i}\n" for i in range(60)) for n in range(3)}
    parent = child(seed, old, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    new = {path: text.replace("= 30\n", "= 31\n") for path, text in old.items()}
    cand = child(parent, new)
    screen.login("vera")
    screen.go(reverse("review:candidate_diff", args=[cand.pk]))
    page = screen.page
    anchors = [diffs.file_anchor(f"src/f{n}.py") for n in range(3)]

    def current() -> str:
        return page.evaluate("() => (document.querySelector('section.diff-file.is-current') || {}).id || ''")

    screen.key("j")
    assert current() == anchors[0]
    screen.key("j")
    assert current() == anchors[1]
    screen.key("n")
    assert current() == anchors[2]
    screen.key("k")
    assert current() == anchors[1]
    screen.key("p")
    assert current() == anchors[0]
    # v marks the current file viewed (it folds) and moves on.
    with page.expect_response(lambda r: r.url.endswith(reverse("review:diff_viewed")) and r.status == 200):
        screen.key("v")
    assert current() == anchors[1]
    assert ViewedFile.objects.filter(user__username="vera", path="src/f0.py").count() == 1
    assert not page.locator(f"#{anchors[0]} .diff-file-body").is_visible()
    # u goes to the next file not viewed, wrapping past the viewed one.
    screen.key("u")
    assert current() == anchors[2]
    screen.key("u")
    assert current() == anchors[1]
    screen.key("?")
    assert "Next file not yet viewed" in page.locator("#keys-overlay").inner_text()
    screen.key("Escape")


def test_annotation_by_keyboard_alone(screen: Screen, example_world: Experiment, make_user: Any) -> None:
    ensure_default_labels()
    make_user("annotator", username="ann")
    screen.login("ann")
    screen.go(reverse("review:annotate_queue") + f"?experiment={example_world.pk}")
    page = screen.page
    link = page.locator("a[href^='/trials/']").first
    first_pk = int((link.get_attribute("href") or "").split("/")[2])
    screen.go(reverse("review:trial", args=[first_pk]))
    page.wait_for_selector("#annotations .label-keys button")
    picks = page.locator("#annotations .label-keys button")
    second = picks.nth(1).get_attribute("data-label-pick")
    screen.key("2")
    assert page.locator("#annotations form.annotation-form select[name=label]").input_value() == second
    assert picks.nth(1).get_attribute("aria-pressed") == "true"
    screen.key("?")
    assert "Label: " in page.locator("#keys-overlay").inner_text()
    screen.key("Escape")
    with page.expect_response(lambda r: f"/trials/{first_pk}/annotations" in r.url and r.request.method == "POST"):
        screen.key("s")
    page.wait_for_selector("#annotations .annotation-list")
    annotation = Annotation.objects.get(trial_id=first_pk)
    assert str(annotation.label_id) == second and annotation.author.username == "ann"
    # n opens the next trial to label.
    next_link = page.locator("#annotations a.next-trial")
    assert next_link.count() == 1
    next_pk = int((next_link.get_attribute("href") or "").split("/")[2])
    screen.key("n")
    page.wait_for_url(f"**/trials/{next_pk}/**")
    assert Trial.objects.get(pk=next_pk).outcome in {Trial.Outcome.FAIL, Trial.Outcome.ERROR}


def test_a_diff_link_with_a_comparison_and_a_line_reproduces_the_view(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    lines = [f"setting_{i} = {i}\n" for i in range(1, 101)]
    base = child(seed, {"conf/a.py": "".join(lines)}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    lines[9] = "setting_10 = 'parent'\n"
    parent = child(base, {"conf/a.py": "".join(lines)}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    lines[89] = "setting_90 = 'child'\n"
    # One file of more than 400 changed lines: collapsed behind "Load diff".
    big = "".join(f"entry {i}\n" for i in range(450))
    cand = child(parent, {"conf/a.py": "".join(lines), "data/big.txt": big})
    anchor = diffs.file_anchor("conf/a.py")
    screen.login("vera")
    page = screen.page

    # Against the grandparent, unified, line 50 (hidden context between the two changes).
    link = reverse("review:candidate_diff", args=[cand.pk]) + f"?against={base.pk}&layout=unified#{anchor}-R50"
    screen.go(link)
    page.wait_for_selector(f"#{anchor}-R50")
    assert page.locator("select[name=against]").input_value() == str(base.pk)
    assert page.locator("table.layout-unified").count() == 1
    body = page.locator(f"#{anchor}").inner_text()
    assert "'parent'" in body and "'child'" in body  # both changes: the comparison is the grandparent
    row = page.locator(f"#{anchor}-R50")
    assert row.evaluate("el => el.matches(':target')")
    assert "setting_50 = 50" in row.locator("xpath=..").inner_text()
    assert row.is_visible()
    screen.shots("diff-permalink")

    # The same link opened again gives the same view; the parent's default view differs.
    screen.go(reverse("review:candidate_diff", args=[cand.pk]) + f"#{anchor}-R50")
    page.wait_for_selector(f"#{anchor}-R50")
    removed = page.locator(f"#{anchor} td.code.del").all_inner_texts()
    assert len(removed) == 1 and "setting_90 = 90" in removed[0]  # against the parent: only the child's change
    assert page.locator("table.layout-split").count() == 1

    # The file tree: each file once, a click jumps to it.
    tree = page.locator("nav.file-tree a")
    assert sorted(tree.all_inner_texts()) == ["a.py", "big.txt"]
    page.locator("nav.file-tree a", has_text="big.txt").click()
    assert page.evaluate("() => location.hash") == "#" + diffs.file_anchor("data/big.txt")
    big_file = page.locator(f"#{diffs.file_anchor('data/big.txt')}")
    assert "450 changed lines hidden" in big_file.inner_text()
    big_file.locator("a:has-text('Load diff')").click()
    big_file.locator("table.diff").wait_for()
    assert big_file.locator("td.code.add").count() == 450


def test_context_expands_by_keyboard_and_viewed_state_shows_in_the_tree(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    old = "".join(f"item_{i} = {i}\n" for i in range(1, 121))
    files = {"pkg/m.py": old, "pkg/n.py": "n = 1\n"}
    parent = child(seed, files, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    cand = child(parent, {"pkg/m.py": old.replace("item_60 = 60\n", "item_60 = 'sixty'\n"), "pkg/n.py": "n = 2\n"})
    anchor = diffs.file_anchor("pkg/m.py")
    screen.login("vera")
    screen.go(reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified")
    page = screen.page
    lines = page.locator(f"#{anchor} tr.ctx, #{anchor} tr.add, #{anchor} tr.del")
    assert lines.count() == 8  # 3 context lines either side, one removed, one added
    assert "56 unchanged lines above" in page.locator(f"#{anchor}").inner_text()

    screen.key("j")  # pkg/m.py
    assert page.evaluate("() => document.querySelector('section.diff-file.is-current').id") == anchor
    screen.key("e")  # 20 more lines above the change, 20 more below it
    page.wait_for_function(f"() => document.querySelectorAll('#{anchor} tr.ctx').length === 46")
    assert "36 unchanged lines above" in page.locator(f"#{anchor}").inner_text()
    assert page.locator(f"#{anchor}-R37").count() == 1 and page.locator(f"#{anchor}-R36").count() == 0
    screen.key("x")  # the whole file
    page.wait_for_function(f"() => document.querySelectorAll('#{anchor} tr.ctx').length === 119")
    numbers = page.evaluate(
        f"() => Array.from(document.querySelectorAll('#{anchor} td.no[id*=\"-R\"]')).map(td => +td.textContent)"
    )
    assert numbers == list(range(1, 121))  # every line once, in order
    assert "unchanged line" not in page.locator(f"#{anchor}").inner_text()
    screen.shots("diff-expanded")

    # v marks it viewed: the tree shows it, the file folds.
    with page.expect_response(lambda r: r.url.endswith(reverse("review:diff_viewed")) and r.status == 200):
        screen.key("v")
    leaf = page.locator(f"nav.file-tree a[href='#{anchor}']")
    assert "is-viewed" in (leaf.get_attribute("class") or "")
    assert not page.locator(f"#{anchor} .diff-file-body").is_visible()


def test_the_annotation_panel_stays_beside_the_transcript_and_takes_the_clicked_step(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    make_user("annotator", username="ann")
    trial = (
        Trial.objects.filter(
            candidate__experiment=example_world,
            outcome__in=[Trial.Outcome.FAIL, Trial.Outcome.ERROR],
            trajectory__step_count__gte=3,
            evaluation__external=False,
        )
        .exclude(split="sealed")
        .order_by("pk")
        .first()
    )
    assert trial is not None
    screen.login("ann")
    screen.go(reverse("review:trial", args=[trial.pk]) + "#annotations")
    page = screen.page
    page.wait_for_selector("#annotations form.annotation-form")
    steps = page.locator("ol.steps li.step[data-step]")
    panel = page.locator("aside.annotations-wrap")
    steps_box, panel_box = page.locator("section.steps-section").bounding_box(), panel.bounding_box()
    assert steps_box is not None and panel_box is not None
    assert panel_box["x"] >= steps_box["x"] + steps_box["width"]  # beside, not below
    # Scrolled to the end of the transcript, the panel is still in the window.
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    box = panel.bounding_box()
    assert box is not None and 0 <= box["y"] < 900
    screen.shots("trial-annotation-panel")

    third = steps.nth(2)
    step_id = third.get_attribute("data-step")
    third.locator(".step-head").click(position={"x": 300, "y": 5})
    assert page.locator("#annotations input[name=step]").input_value() == step_id
    assert "is-picked" in (third.get_attribute("class") or "")
    screen.key("1")
    with page.expect_response(lambda r: f"/trials/{trial.pk}/annotations" in r.url and r.request.method == "POST"):
        screen.key("s")
    page.wait_for_selector("#annotations .annotation-list")
    annotation = Annotation.objects.select_related("step").get(trial=trial)
    assert annotation.step is not None and str(annotation.step.step_id) == step_id


def test_every_screen_fits_its_window_and_keeps_the_csp_the_api_docs_included(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    ensure_default_labels()
    make_user("reviewer", "annotator", "operator", username="rhea")
    screen.login("rhea")
    page = screen.page
    item = ReviewItem.objects.filter(candidate__experiment=example_world).order_by("pk").first()
    candidate = example_world.candidates.filter(parent__isnull=False).order_by("pk").first()
    trial = Trial.objects.filter(candidate=candidate, trajectory__isnull=False).exclude(split="sealed").first()
    assert item is not None and candidate is not None and trial is not None

    def fits(width: int) -> None:
        page.set_viewport_size({"width": width, "height": 900})
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        wide = page.evaluate(
            "() => Array.from(document.querySelectorAll('main *')).filter(el =>"
            " el.getBoundingClientRect().right > window.innerWidth + 1).slice(0, 5)"
            ".map(el => el.tagName + '.' + el.className + ' ' + Math.round(el.getBoundingClientRect().right))"
        )
        assert overflow <= 0, f"{page.url} is {overflow} px wider than a {width} px window: {wide}"

    screens = {
        "home": reverse("review:home"),
        "dashboard": reverse("review:experiment", args=[example_world.pk]),
        "queue": reverse("review:queue"),
        "review-item": reverse("review:review_item", args=[item.pk]),
        "diff": reverse("review:candidate_diff", args=[candidate.pk]),
        "compare": reverse("review:trial_compare", args=[trial.pk]),
        "annotation-queue": reverse("review:annotate_queue"),
    }
    for name, path in screens.items():
        screen.go(path)
        page.wait_for_load_state("networkidle")
        for width in WIDTHS:
            fits(width)
        screen.check()
        screen.shots(name)
    page.set_viewport_size({"width": 1440, "height": 900})

    # The home table ends inside the window: its last column's links are on screen.
    screen.go(reverse("review:home"))
    right = page.evaluate("() => document.querySelector('table.experiments').getBoundingClientRect().right")
    assert right <= 1440
    # The queue's matched text reads as phrases, not one word a line.
    screen.go(reverse("review:queue"))
    widths = page.evaluate("() => Array.from(document.querySelectorAll('td.matched')).map(td => td.clientWidth)")
    assert widths and min(widths) >= 200
    for width in WIDTHS:  # every column, the Claim buttons included, without scrolling
        page.set_viewport_size({"width": width, "height": 900})
        claim = page.locator("#waiting button:has-text('Claim')").first.bounding_box()
        assert claim is not None and claim["x"] + claim["width"] <= width
    page.set_viewport_size({"width": 1440, "height": 900})

    # The API docs: linked from every screen, rendered by Swagger UI without a CSP report.
    page.click("header.topbar a:has-text('API')")
    page.wait_for_url("**/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    page.wait_for_selector(".opblock-tag")
    assert "drf_create_token" in page.locator("#api-banner").inner_text()
    screen.check()
    screen.shots("api-docs", full=False)
