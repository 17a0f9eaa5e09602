"""Export bundles: verified without a database, tampering detected, imported elsewhere."""

from __future__ import annotations

import base64
import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from evolution.models import Candidate, CertifiedResult, EvaluationSplitStats, Experiment, Trial
from evolution.services.bundles import BundleError, bundle_import, bundle_read, bundle_verify, bundle_write
from evolution.services.records import records_verify
from tests.factories import evaluate_seed_inline, make_tiny_experiment, seed_of


def certified_experiment(*, agent_network: bool = False) -> Experiment:
    experiment = make_tiny_experiment(
        tasks=4,
        k=1,
        split_lists={"train": ["t00", "t01"], "gate": ["t02"], "sealed": ["t03"]},
        agent_network=agent_network,
    )
    evaluate_seed_inline(experiment, ("train",))
    evaluate_seed_inline(experiment, ("gate", "sealed"))
    experiment.refresh_from_db()
    assert experiment.chain_length == 2
    return experiment


def export(experiment: Experiment, path: Path) -> Path:
    out = io.StringIO()
    call_command("export_experiment", str(experiment.pk), str(path), stdout=out)
    assert "2 record(s)" in out.getvalue()
    return path


def split_stats(experiment: Experiment) -> list[tuple[Any, ...]]:
    return list(
        EvaluationSplitStats.objects.filter(evaluation__experiment=experiment)
        .order_by("evaluation__certified_result__seq", "split")
        .values_list(
            "evaluation__certified_result__seq",
            "split",
            "trials",
            "passed",
            "errors",
            "score_sum",
            "tokens_sum",
            "tokens_count",
        )
    )


def verify_command(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_records", "--bundle", str(path), stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.mark.django_db
def test_bundle_verifies_without_database(tmp_path: Path, django_assert_num_queries: Any) -> None:
    path = export(certified_experiment(), tmp_path / "bundle.json.gz")
    with django_assert_num_queries(0):
        bundle = bundle_read(path)
        assert bundle_verify(bundle, key=settings.RSI_RECORDS_KEY) == []
        code, output = verify_command(path)
    assert code == 0, output
    assert "OK: bundle verifies" in output
    # Self-contained: expected data, task digests, evaluator files and candidate trees are inside.
    assert {t["id"]: t["expected"] for t in bundle["tasks"]}["t00"] == {"answer": "yes"}
    assert bundle["evaluator"]["files"] in bundle["trees"]
    assert all(c["tree"] in bundle["trees"] for c in bundle["candidates"])
    # Another key cannot vouch for the records.
    assert any("signature" in p for p in bundle_verify(bundle, key="another key"))


def _edit_score(bundle: dict[str, Any]) -> None:
    trial = bundle["records"][0]["payload"]["trials"][0]
    trial["score"] = 1.0 - trial["score"]


def _edit_blob(bundle: dict[str, Any]) -> None:
    digest = sorted(bundle["blobs"])[0]
    bundle["blobs"][digest] = base64.b64encode(b"tampered\n").decode()


def _drop_record(bundle: dict[str, Any]) -> None:
    bundle["records"].pop()


def _edit_expected(bundle: dict[str, Any]) -> None:
    bundle["tasks"][0]["expected"] = {"answer": "maybe"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_edit_score, "record #1: payload digest"),
        (_edit_blob, "content hashes to"),
        (_drop_record, "chain truncated or extended"),
        (_edit_expected, "content hashes to"),
    ],
)
def test_tampered_bundle_is_detected(
    tmp_path: Path, django_assert_num_queries: Any, tamper: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = export(certified_experiment(), tmp_path / "bundle.json")
    bundle = bundle_read(path)
    tampered = copy.deepcopy(bundle)
    tamper(tampered)
    bad = tmp_path / "tampered.json"
    bundle_write(bundle=tampered, path=bad)
    with django_assert_num_queries(0):
        problems = bundle_verify(tampered, key=settings.RSI_RECORDS_KEY)
        code, output = verify_command(bad)
    assert any(message in p for p in problems), problems
    assert code == 1
    assert "FAILED" in output and message in output


@pytest.mark.django_db
def test_unreadable_bundle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CommandError, match="not a rsiweb-bundle/1 bundle"):
        call_command("verify_records", "--bundle", str(path))


@pytest.mark.django_db(transaction=True)
def test_import_into_an_empty_database_verifies(tmp_path: Path) -> None:
    experiment = certified_experiment()
    uid, records_before = (
        experiment.uid,
        list(
            CertifiedResult.objects.filter(experiment=experiment)
            .order_by("seq")
            .values_list("record_digest", flat=True)
        ),
    )
    trials_before = Trial.objects.filter(evaluation__certified_result__isnull=False).count()
    stats_before = split_stats(experiment)
    assert len(stats_before) == 3  # train; gate and sealed
    path = export(experiment, tmp_path / "bundle.json.gz")
    bundle = bundle_read(path)

    # A tampered bundle is refused and writes nothing.
    tampered = copy.deepcopy(bundle)
    _edit_score(tampered)
    with pytest.raises(BundleError, match="does not verify"):
        bundle_import(bundle=tampered, key=settings.RSI_RECORDS_KEY)

    call_command("flush", interactive=False, verbosity=0)
    assert not Experiment.objects.exists()

    bad = tmp_path / "tampered.json"
    bundle_write(bundle=tampered, path=bad)
    with pytest.raises(CommandError, match="does not verify"):
        call_command("import_bundle", str(bad))
    assert not Experiment.objects.exists()

    out = io.StringIO()
    call_command("import_bundle", str(path), stdout=out)
    assert "2 certified record(s)" in out.getvalue()
    imported = Experiment.objects.get(uid=uid)
    assert (
        list(
            CertifiedResult.objects.filter(experiment=imported).order_by("seq").values_list("record_digest", flat=True)
        )
        == records_before
    )
    assert Trial.objects.filter(evaluation__experiment=imported).count() == trials_before
    # The per-split totals certification stores, written on import as well.
    assert split_stats(imported) == stats_before
    assert seed_of(imported).state == Candidate.State.CERTIFIED
    report = records_verify(experiment=imported)
    assert report.ok, report.problems
    out = io.StringIO()
    call_command("verify_records", stdout=out)
    assert "OK:" in out.getvalue()

    # Safe to repeat.
    call_command("import_bundle", str(path), stdout=io.StringIO())
    assert Experiment.objects.count() == 1


@pytest.mark.django_db
def test_a_bundle_written_before_agent_network_existed_still_verifies(tmp_path: Path) -> None:
    bundle = bundle_read(export(certified_experiment(), tmp_path / "bundle.json.gz"))
    assert bundle["evaluator"]["agent_network"] is False
    del bundle["evaluator"]["agent_network"]
    assert bundle_verify(bundle, key=settings.RSI_RECORDS_KEY) == []
    bundle["evaluator"]["agent_network"] = "no"
    assert "evaluator: 'agent_network' is not bool" in bundle_verify(bundle, key=settings.RSI_RECORDS_KEY)


@pytest.mark.django_db(transaction=True)
def test_an_agent_with_the_network_is_bound_into_the_bundle_and_imported(tmp_path: Path) -> None:
    experiment = certified_experiment(agent_network=True)
    path = export(experiment, tmp_path / "bundle.json.gz")
    bundle = bundle_read(path)
    assert bundle["evaluator"]["agent_network"] is True
    assert bundle_verify(bundle, key=settings.RSI_RECORDS_KEY) == []
    # Saying the agent had no network is an edit the records catch.
    edited = copy.deepcopy(bundle)
    edited["evaluator"]["agent_network"] = False
    assert any(
        "evaluator (commands, files" in problem for problem in bundle_verify(edited, key=settings.RSI_RECORDS_KEY)
    )

    call_command("flush", interactive=False, verbosity=0)
    call_command("import_bundle", str(path), stdout=io.StringIO())
    imported = Experiment.objects.get(uid=experiment.uid)
    assert imported.evaluator.agent_network is True
    report = records_verify(experiment=imported)
    assert report.ok, report.problems


def test_structurally_broken_bundle_is_reported_not_raised() -> None:
    problems = bundle_verify(
        {
            "experiment": {"uid": "x"},
            "blobs": {},
            "trees": {"t": [["only-a-path"]]},
            "records": [],
            "chain": {},
            "evaluator": {},
        },
        key="k",
    )
    # Each missing section named on its own line, nothing raised.
    assert problems == [
        f"bundle: {name!r} is missing or not {kind}"
        for name, kind in [
            ("benchmarks", "list"),
            ("tasks", "list"),
            ("splits", "list"),
            ("surface", "dict"),
            ("recipes", "list"),
            ("candidates", "list"),
        ]
    ]
