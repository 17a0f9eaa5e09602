"""A Debian environment built from scratch and one trial run in it through a real worker.

Minutes long (debootstrap of a minbase root, then ``apt-get install jq`` replayed
in it): marker ``environment``, run by CI in the trust suite's stream. It
fails, not skips, when debootstrap is missing under RSI_REQUIRE_SERVICES=1.
The Debian base comes from RSI_ENVIRONMENT_BASES_DIR: CI points it at a cache
outside its clone, so only a machine's first run pays for debootstrap (the
test prints which it was); the task's own steps are replayed from scratch.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from evolution import environments
from evolution.models import CertifiedResult, Evaluation, Experiment, Trial
from evolution.services import evaluation as evaluation_services
from tests.conftest import require_service, wait_until
from tests.evolution.test_worker_e2e import verify_records_in_a_subprocess
from tests.factories import seed_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow, pytest.mark.environment]

# The file a step writes is on no host: a pass proves the verifier ran in the built root.
DOCKERFILE = """\
FROM debian:bookworm-slim
# The official image's apt sources: the suite, bookworm-updates and bookworm-security.
RUN apt-get update && apt-cache policy | grep -q ' bookworm-updates/main ' \\
    && apt-cache policy | grep -q ' bookworm-security/main ' \\
    && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/* \\
    && echo replayed > /etc/rsi-test-step
# apt drops to its own user to fetch; its files go to /tmp, which must be writable to it.
RUN setpriv --reuid=_apt --regid=nogroup --clear-groups touch /tmp/apt-writes-here
ENV GREETING_FILE=hello.txt
WORKDIR /app
COPY data.json /app/data.json
"""
TEST_SH = """\
#!/bin/bash
# Reward 1 when hello.txt holds the greeting of data.json, read with jq (the environment's, not the host's).
want=$(jq -r .greeting /app/data.json) || { echo "no jq here"; echo 0 > /logs/verifier/reward.txt; exit 0; }
if [ "$(cat /app/hello.txt 2>/dev/null)" = "$want" ] && [ "$(cat /etc/rsi-test-step)" = replayed ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _task(folder: Path) -> None:
    files = {
        "instruction.md": "Write a file `hello.txt` containing exactly: hello from debian\n",
        "task.toml": '[environment]\ndocker_image = "example/not-pulled:1"\n[verifier]\ntimeout_sec = 60.0\n',
        "tests/test.sh": TEST_SH,
        "environment/Dockerfile": DOCKERFILE,
        "environment/data.json": '{"greeting": "hello from debian"}\n',
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_an_environment_built_from_scratch_runs_a_trial_through_a_worker(
    tmp_path: Path, settings, start_worker, admin_client
) -> None:
    require_service("debootstrap", shutil.which("debootstrap") is not None or os.path.exists("/usr/sbin/debootstrap"))
    require_service("root (debootstrap builds as root)", os.geteuid() == 0)
    require_service("bubblewrap", shutil.which("bwrap") is not None)
    dataset = tmp_path / "dataset"
    _task(dataset / "hello-debian")
    # Refused with its reason, the rest imported: a task on a base Debian cannot build.
    _task(dataset / "hello-ubuntu")
    (dataset / "hello-ubuntu" / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    out = io.StringIO()
    call_command("import_harbor_tasks", str(dataset), "--name", "debian-built", stdout=out)
    assert "refused hello-ubuntu: Dockerfile line 1: base image 'ubuntu:24.04' cannot be built" in out.getvalue()
    experiment = Experiment.objects.get(name="debian-built")
    task = experiment.benchmark.tasks.get()
    digest = task.metadata["environment"]["digest"]
    assert f"task hello-debian: Debian-built environment {digest[:12]}" in out.getvalue()

    # The task's environment from scratch: a fresh environments folder (the base may be cached).
    settings.RSI_ENVIRONMENTS_DIR = tmp_path / "environments"
    bases = settings.RSI_ENVIRONMENT_BASES_DIR
    stale = bases / ".base-bookworm-stopped-half-way"  # what a killed build leaves in the cache
    cached = environments.base_valid(environments.base_path("bookworm", bases=bases), "bookworm")
    if not cached:
        stale.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    built = io.StringIO()
    call_command("environment_build", "debian-built", stdout=built)
    seconds = time.monotonic() - started
    base = "reused from the cache" if cached else "built from scratch"
    print(f"\nenvironment {digest[:12]} built in {seconds:.1f} s, its base {base}:\n{built.getvalue()}")
    root = environments.environment_path(settings.RSI_ENVIRONMENTS_DIR, digest)
    assert (root / "usr" / "bin" / "jq").is_file()
    if cached:
        assert "base bookworm reused from" in built.getvalue()
        assert "debootstrap" not in built.getvalue()
    else:
        assert "debootstrap --variant=minbase bookworm" in built.getvalue()
        assert not stale.exists()
    assert environments.base_valid(environments.base_path("bookworm", bases=bases), "bookworm")
    assert "step 1/2: RUN apt-get update && apt-cache policy | grep -q ' bookworm-updates/main '" in built.getvalue()
    again = io.StringIO()
    call_command("environment_build", "debian-built", stdout=again)
    assert f"environment {digest[:12]} already built" in again.getvalue()

    worker = start_worker(
        extra_env={
            "RSI_ENVIRONMENTS_DIR": str(settings.RSI_ENVIRONMENTS_DIR),
            "RSI_ENVIRONMENT_BASES_DIR": str(bases),
        }
    )
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train"], purpose=Evaluation.Purpose.BASELINE
    )
    wait_until(
        lambda: Evaluation.objects.get(pk=evaluation.pk).state in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED},
        timeout=300,
        what=f"certification (worker log: {worker.log_path})",
    )
    trial = Trial.objects.get(evaluation=evaluation)
    assert (trial.outcome, trial.error) == ("pass", ""), worker.log()[-3000:]
    assert trial.environment == digest
    # No allow_internet in its task.toml: Harbor's default lets both phases use the network, and the record says so.
    assert trial.sandbox_profile == "bwrap+agent-network+verifier-network"
    record = CertifiedResult.objects.get(evaluation=evaluation)
    assert record.payload["evaluator"]["environments"] == [digest]
    verified = verify_records_in_a_subprocess(experiment)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # The screens say where the trial ran, so nobody reads it as a run in the upstream image.
    for page in (reverse("review:trial", args=[trial.pk]), reverse("review:record", args=[record.pk])):
        html = admin_client.get(page).content.decode()
        assert f'<span class="badge">Debian-built environment</span> <span class="digest">{digest}</span>' in html
