"""Scenarios 7-11 of the trust suite, run in this process on both benchmarks.

Each test builds the TrialContext the suite would (a fresh experiment of the
benchmark, an empty work folder), runs one scenario and expects it to pass;
the negative tests take one guard away and expect a TrustFailure, so the
scenarios can fail.
"""

from __future__ import annotations

import importlib
import itertools
import time
from pathlib import Path

import pytest

from evolution.agents.setup import EXAMPLE_DIR as HARBOR_DIR
from evolution.agents.setup import harbor_experiment_create
from evolution.example.setup import example_experiment_create
from lab.trust import BENCHMARKS, REGISTRY, Inapplicable, TrialContext, TrustFailure

pytestmark = pytest.mark.django_db(transaction=True)

_numbers = itertools.count(1)
MINE = ("7a", "7b", "7c", "7d", "8-", "9-", "10-", "10b", "11", "12-")


def fresh_context(benchmark: str, workdir: Path) -> TrialContext:
    number = next(_numbers)
    if benchmark == "example":
        experiment = example_experiment_create(name=f"trust-example-{number}")
    else:
        experiment = harbor_experiment_create(folder=HARBOR_DIR, name=f"trust-harbor-{number}")
    folder = workdir / f"trial-{number}"
    folder.mkdir()
    return TrialContext(benchmark=benchmark, trial=number, experiment=experiment, workdir=folder, suite=None)


def names() -> list[str]:
    # Only this file's modules: the others (crash.py) are written elsewhere.
    for module in ("tamper", "evidence", "sandbox_abuse", "hidden"):
        importlib.import_module(f"lab.trust.{module}")
    return sorted(name for name in REGISTRY if name.startswith(MINE))


def run(name: str, benchmark: str, tmp_path: Path) -> str:
    ctx = fresh_context(benchmark, tmp_path)
    started = time.monotonic()
    try:
        detail = REGISTRY[name].run(ctx)
    except Inapplicable as exc:
        pytest.skip(f"inapplicable here: {exc}")
    print(f"{name} on {benchmark}: {time.monotonic() - started:.1f} s: {detail}")
    return detail


@pytest.mark.parametrize("benchmark", BENCHMARKS)
@pytest.mark.parametrize("name", names())
def test_scenario_passes(name: str, benchmark: str, tmp_path: Path) -> None:
    assert run(name, benchmark, tmp_path)


def expect_failure(name: str, benchmark: str, tmp_path: Path, match: str) -> None:
    with pytest.raises(TrustFailure, match=match):
        REGISTRY[name].run(fresh_context(benchmark, tmp_path))


# --- The checks can fail: each takes one guard of the platform away. ------------------------------------


def test_out_of_surface_fails_without_the_surface_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from evolution.surfaces import SurfaceVerdict

    monkeypatch.setattr("evolution.services.proposals.check_diff", lambda *a, **k: SurfaceVerdict(True, [], []))
    expect_failure("8-out-of-surface", "harbor", tmp_path, "not refused")


def test_tampered_verifier_fails_without_the_blob_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.services.records.tree_verify", lambda **kwargs: [])
    expect_failure("7d-verifier-changed", "harbor", tmp_path, "certification accepted")


def test_forged_records_fail_without_verification(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from evolution.services.records import VerifyReport

    monkeypatch.setattr("lab.trust.tamper.records_verify", lambda **kwargs: VerifyReport())
    expect_failure("10-forged-records", "example", tmp_path, "records_verify did not name")


def test_forged_decisions_pass_without_the_state_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.records.candidate_state_problems", lambda *args, **kwargs: [])
    expect_failure("10b-forged-decisions", "harbor", tmp_path, "rejected shown accepted with a forged reason")


def test_evidence_fails_when_the_api_shows_sealed_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.access.hide_sealed", lambda queryset, user, **kwargs: queryset)
    expect_failure("9-protected-evidence", "harbor", tmp_path, "the API showed protected evidence")


def test_evidence_fails_when_the_proposer_inherits_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    monkeypatch.setattr("evolution.proposers._environment", lambda params: dict(os.environ))
    expect_failure("9-protected-evidence", "example", tmp_path, "found a canary in")


def test_network_abuse_fails_without_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    from django.conf import settings

    from evolution.sandbox import first_blocked, sandbox_profile

    if sandbox_profile("auto") != "bwrap":
        pytest.skip("bubblewrap is not usable here: the scenario is inapplicable anyway")
    python = Path(os.path.realpath(settings.RSI_PYTHON))
    if os.geteuid() == 0 and first_blocked(python) is not None:
        # Without bubblewrap a root worker runs the agent as a uid of its own,
        # which must reach the interpreter (a checkout in a 0700 folder: no).
        pytest.skip(f"{python} is unreachable for a run's uid without bubblewrap ({first_blocked(python)})")
    monkeypatch.setattr("evolution.trials.sandbox_profile", lambda mode: "none")
    expect_failure("11a-network", "harbor", tmp_path, "reached a listener")


def test_host_environment_fails_when_trials_inherit_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    from evolution import trials

    real = trials._trial_env
    monkeypatch.setattr(trials, "_trial_env", lambda spec, *, home: {**os.environ, **real(spec, home=home)})
    expect_failure("11e-host-environment", "example", tmp_path, "read the worker's secret")


def test_hidden_characters_fail_without_the_critic_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.critic.hidden_flags", lambda changes: [])
    expect_failure("12-hidden-characters", "harbor", tmp_path, "the critic let it through")


def test_hidden_characters_fail_when_the_screens_show_them_raw(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.hidden_chars.has_hidden", lambda text, **kwargs: False)
    expect_failure("12-hidden-characters", "harbor", tmp_path, "page shows .* raw")


def test_hidden_characters_fail_without_the_surface_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("evolution.surfaces._check_hidden", lambda change, collector: None)
    expect_failure("12-hidden-characters", "harbor", tmp_path, "strict surface, .*: not refused")
