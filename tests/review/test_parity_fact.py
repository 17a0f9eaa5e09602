"""The experiment dashboard shows the latest parity check of the experiment's evaluator."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Evaluator, ParityCheck
from evolution.services.records import evaluator_config_digest
from tests.factories import make_tiny_experiment, seed_of

pytestmark = pytest.mark.django_db


def numbers(*, platform: float, direct: float) -> dict[str, Any]:
    return {
        "trials": {
            "platform_vs_direct": {"disagree": round(platform * 200), "of": 200, "rate": platform},
            "direct_vs_direct": {"disagree": round(direct * 100), "of": 100, "rate": direct},
        }
    }


def parity_line(html: str) -> str:
    found = re.search(r'<dt>parity</dt><dd class="parity">(.*?)</dd>', html, re.DOTALL)
    assert found is not None, "no parity line in the facts"
    return re.sub(r"<[^>]+>", "", found.group(1))


def test_the_facts_say_parity_was_never_checked_then_show_the_latest_check(client_as) -> None:
    experiment = make_tiny_experiment(tasks=2)
    twin = make_tiny_experiment(like=experiment)  # same evaluator: its checks count for both
    client = client_as("viewer")
    url = reverse("review:experiment", args=[experiment.pk])
    assert (
        parity_line(client.get(url).content.decode()) == f"not checked: manage.py parity --experiment {experiment.pk}"
    )

    digest = evaluator_config_digest(experiment.evaluator)
    for verdict, platform in (("pass", 0.1), ("fail", 0.25)):
        ParityCheck.objects.create(
            evaluator=experiment.evaluator,
            evaluator_digest=digest,
            experiment=twin,
            candidate=seed_of(twin),
            iterations=3,
            numbers=numbers(platform=platform, direct=0.115),
            verdict=verdict,
        )
    html = client.get(url).content.decode()
    line = parity_line(html)
    assert line.startswith("fail platform vs direct 25.0% of trials, direct vs direct 11.5%"), line
    assert "3 iterations on #" in line and "changed since" not in line
    assert reverse("review:candidate", args=[seed_of(twin).pk]) in html

    # The evaluator as checked is not the evaluator any more: the check is marked stale.
    Evaluator.objects.filter(pk=experiment.evaluator_id).update(timeout_seconds=31)
    assert "the evaluator changed since" in parity_line(client.get(url).content.decode())


def test_another_evaluators_check_is_not_shown(client_as) -> None:
    experiment = make_tiny_experiment(tasks=2)
    other = make_tiny_experiment(tasks=2)
    ParityCheck.objects.create(
        evaluator=other.evaluator,
        evaluator_digest=evaluator_config_digest(other.evaluator),
        experiment=other,
        candidate=seed_of(other),
        iterations=1,
        numbers=numbers(platform=0.0, direct=0.0),
        verdict="pass",
    )
    html = client_as("viewer").get(reverse("review:experiment", args=[experiment.pk])).content.decode()
    assert parity_line(html).startswith("not checked")
