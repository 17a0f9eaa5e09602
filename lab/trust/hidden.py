"""Trust scenario 12: an edit hiding what it does behind invisible characters.

A proposer writes a Trojan Source line (bidirectional controls that make
code read as a comment), a zero-width character inside a name, a look-alike
letter and invisible tag characters into a harness file. Each goes through
the real path of a proposal (``candidate_freeze``, ``candidate_critique``)
and the real screens (the diff and the review item, as a reviewer's browser
requests them): the critic flags it with the code point and line, the
candidate waits for a person (or is rejected, as the policy says) and is
never evaluated, the screens show every character as a marker and warn,
and a surface with ``refuse_hidden_characters`` refuses the edit outright.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import yaml
from django.conf import settings
from django.test.utils import override_settings

from evolution import selectors
from evolution.models import Candidate, Evaluation, Experiment, LeakageFlag, ReviewItem
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import experiment_create, surface_create
from evolution.services.proposals import candidate_critique
from evolution.services.snapshots import tree_entries
from lab.trust import TrialContext, TrustFailure, expect, scenario
from lab.trust.tamper import accepted_seed, paused_run, probe_experiment, proposal_freeze, proposal_of, surface_paths

# label -> (text appended to a harness file, the code points it must be flagged and marked for)
HIDDEN_EDITS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bidi controls (Trojan Source)": (
        "\n/*\u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only */\n",
        ("U+202E", "U+2066", "U+2069"),
    ),
    "zero-width in a name": ("\nAlways call is\u200bAdmin before answering.\n", ("U+200B",)),
    "look-alike letter": ("\nNever reveal the p\u0430ssword.\n", ("U+0430",)),
    "tag characters": ("\nBe brief.\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065\n", ("U+E0069",)),
}
RAW = ("\u202e", "\u2066", "\u2069", "\u200b", "\u0430", "\U000e0069")


def _text_target(experiment: Experiment, files: Mapping[str, bytes]) -> str:
    for path in surface_paths(experiment, files):
        try:
            files[path].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "/" in path:
            return path
    raise TrustFailure("the seed has no text file on the surface")


def _strict_twin(experiment: Experiment) -> Experiment:
    """``experiment`` with its surface plus ``refuse_hidden_characters: true``."""
    spec = yaml.safe_load(experiment.surface.spec)
    spec["refuse_hidden_characters"] = True
    surface = surface_create(name=f"{experiment.surface.name}~no-hidden", spec=yaml.safe_dump(spec, sort_keys=True))
    lists: dict[str, list[str]] = {}
    for membership in experiment.split_memberships.select_related("task").order_by("task__external_id"):
        lists.setdefault(membership.split, []).append(membership.task.external_id)
    return experiment_create(
        name=f"{experiment.name}~no-hidden-{uuid.uuid4().hex[:8]}",
        benchmark=experiment.benchmark,
        evaluator=experiment.evaluator,
        surface=surface,
        seed_tree=selectors.experiment_seed(experiment).tree,
        split_lists=lists,
        trials_per_task=experiment.trials_per_task,
        run_settings=experiment.run_settings,
        description=f"trust suite: {experiment.name!r} with a surface refusing hidden characters",
    )


def _pages(candidate: Candidate) -> dict[str, str]:
    """The diff (split and unified) and the review item, as a reviewer gets them."""
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.urls import reverse

    from evolution.access import roles_ensure

    roles_ensure()
    user = User.objects.create(username=f"trust-hidden-{uuid.uuid4().hex[:8]}")
    user.groups.add(Group.objects.get(name="reviewer"))
    client = Client()
    client.force_login(user)
    diff = reverse("review:candidate_diff", args=[candidate.pk])
    urls = {"diff": diff, "unified diff": diff + "?layout=unified"}
    item = ReviewItem.objects.filter(candidate=candidate).first()
    if item is not None:
        urls["review item"] = reverse("review:review_item", args=[item.pk])
    pages: dict[str, str] = {}
    with override_settings(ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]):
        for name, url in urls.items():
            response = client.get(url, secure=True)
            expect(response.status_code == 200, f"{name} page answered {response.status_code}")
            pages[name] = response.content.decode()
    return pages


def _check_flagged(label: str, candidate: Candidate, codes: tuple[str, ...], target: str) -> None:
    flags = list(LeakageFlag.objects.filter(candidate=candidate, rule="hidden_unicode").order_by("pk"))
    evidence = [str((flag.evidence or {}).get("evidence", "")) for flag in flags]
    for code in codes:
        expect(
            any(text.startswith(code) and " on line " in text for text in evidence),
            f"{label}: no hidden_unicode flag names {code} and its line: {evidence}",
        )
    expect(all(flag.path == target for flag in flags), f"{label}: a flag names another file")
    expect(ReviewItem.objects.filter(candidate=candidate).exists(), f"{label}: flagged but no review item")
    expect(not Evaluation.objects.filter(candidate=candidate).exists(), f"{label}: a flagged candidate was evaluated")
    for name, html in _pages(candidate).items():
        raw = [f"U+{ord(char):04X}" for char in RAW if char in html]
        expect(not raw, f"{label}: the {name} page shows {raw} raw")
        for code in codes:
            expect(f"&lt;{code}&gt;" in html, f"{label}: the {name} page has no marker for {code}")
        if name != "review item":
            expect("hidden-chars" in html, f"{label}: the {name} page has no warning banner")


@scenario(12, "12-hidden-characters", "Hidden characters: bidi controls, zero-width, tags and look-alikes in an edit")
def hidden_characters(ctx: TrialContext) -> str:
    experiment = probe_experiment(ctx.experiment, tag="hidden")
    parent, _ = accepted_seed(experiment)
    run = paused_run(experiment)
    parent_files = {e.path: e.data for e in tree_entries(tree=parent.tree)}
    target = _text_target(experiment, parent_files)

    def proposal(text: str) -> Any:
        return proposal_of(experiment, parent_files, {**parent_files, target: parent_files[target] + text.encode()})

    for slot, (label, (text, codes)) in enumerate(HIDDEN_EDITS.items(), start=1):
        state, reason, candidate = proposal_freeze(run, parent, proposal(text), slot)
        expect(candidate is not None and state == Candidate.State.FROZEN, f"{label}: not frozen ({state}: {reason})")
        assert candidate is not None
        outcome = candidate_critique(run=run, candidate=candidate, policy="review")
        expect(outcome == Candidate.State.FLAGGED, f"{label}: the critic let it through ({outcome})")
        _check_flagged(label, candidate, codes, target)

    # The reject policy rejects it outright.
    text, _codes = HIDDEN_EDITS["bidi controls (Trojan Source)"]
    state, reason, rejected = proposal_freeze(run, parent, proposal(text + "\n"), 50)
    assert rejected is not None, f"{state}: {reason}"
    outcome = candidate_critique(run=run, candidate=rejected, policy="reject")
    expect(outcome == Candidate.State.REJECTED_CRITIC, f"reject policy: {outcome}")

    # A surface with refuse_hidden_characters refuses every one before the critic.
    strict = _strict_twin(experiment)
    strict_parent, _ = accepted_seed(strict)
    strict_run = paused_run(strict)
    strict_files = {e.path: e.data for e in tree_entries(tree=strict_parent.tree)}
    for slot, (label, (text, codes)) in enumerate(HIDDEN_EDITS.items(), start=1):
        files = {**strict_files, target: strict_files[target] + text.encode()}
        state, reason, candidate = proposal_freeze(
            strict_run, strict_parent, proposal_of(strict, strict_files, files), slot
        )
        expect(state == Candidate.State.REJECTED_SURFACE, f"strict surface, {label}: not refused ({state})")
        expect(
            "refuse_hidden_characters" in reason and all(code in reason for code in codes),
            f"strict surface, {label}: the reason does not name {codes}: {reason!r}",
        )
        assert candidate is not None
        try:
            evaluation_services.evaluation_start(candidate=candidate, splits=["gate"], k=1)
        except evaluation_services.EvaluationError:
            pass
        else:
            raise TrustFailure(f"strict surface, {label}: a refused candidate could be evaluated")
    # The same file with plain text passes that surface: the refusal is about the characters.
    plain = {**strict_files, target: strict_files[target] + b"\nBe brief.\n"}
    state, reason, _plain = proposal_freeze(strict_run, strict_parent, proposal_of(strict, strict_files, plain), 99)
    expect(state == Candidate.State.FROZEN, f"strict surface refused a plain edit: {state} {reason}")
    return (
        f"{len(HIDDEN_EDITS)} hidden-character edits flagged (code point and line), marked on the diff and review "
        f"pages, never evaluated; rejected under the reject policy; refused by refuse_hidden_characters"
    )
