"""Trust scenario 9: reading protected evidence.

Canaries are planted in the gate and sealed tasks of a twin of the trial's
experiment (in the instruction, the private expected data, the rubric
criteria and a public input file), the seed is evaluated and certified on
every split, so gate and sealed trials with trajectories that echo the
canary exist, and then every way a proposer learns something is searched
for them: the proposer view and its JSON document, the command proposer's
prompt and workspace, the llm proposer's messages (built, never sent), the
example proposer's answer, and a real command proposer whose program greps
its workspace, its environment, every readable ``/proc/*/environ`` and the
database file. The API is searched too, as a viewer (no
``view_sealed_details``): no per-task sealed data may reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import connection
from django.test.utils import override_settings

from evolution import operators, selectors
from evolution.loop import lifecycle
from evolution.loop import propose as loop_propose
from evolution.models import Candidate, CertifiedResult, Evaluation, Experiment, Run, TrajectoryStep, Trial
from evolution.services.candidates import candidate_accept
from evolution.services.experiments import TaskInput
from lab.trust import TrialContext, expect, scenario
from lab.trust.context import proposer_python
from lab.trust.tamper import certified, evaluate_inline, paused_run, probe_experiment

CANARY_ENV = "RSI_TRUST_CANARY"

# The command proposer's program: looks everywhere it can for the canaries
# and reports where it found them in its manifest's note.
SNOOP_PROGRAM = r"""
import json, os, pathlib, sys
# Reversed on the command line, so the program's own argv holds no canary.
canaries = [c[::-1] for c in json.loads(sys.argv[1])]
extra = json.loads(sys.argv[2])
found, tried = [], []

def look(where, data):
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    for canary in canaries:
        if canary in text:
            found.append(where)

def read(where, path):
    try:
        with open(path, "rb") as stream:
            data = stream.read(64 << 20)
    except OSError as exc:
        tried.append("%s: %s" % (where, type(exc).__name__))
        return
    tried.append(where + ": read")
    look(where, data)

workspace = pathlib.Path.cwd()
for path in sorted(workspace.rglob("*")):
    if path.is_file():
        read("workspace:" + str(path.relative_to(workspace)), path)
look("environment", json.dumps(dict(os.environ)))
for pid in sorted(os.listdir("/proc")):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (pid, name), "rb") as stream:
                    look("/proc/%s/%s" % (pid, name), stream.read())
            except OSError:
                pass
for path in extra:
    read(path, path)
target = sorted(p for p in workspace.rglob("*") if p.is_file() and ".rsi" not in p.parts)[0]
target.write_bytes(target.read_bytes() + b"\n")
(workspace / ".rsi" / "edits.json").write_text(json.dumps({
    "edits": [{"component": "prompt", "hypothesis": "a blank line", "paths": [str(target.relative_to(workspace))]}],
    "note": json.dumps({"found": sorted(set(found)), "tried": tried}),
}))
"""


class Canaries:
    """One canary per (split, field), all unique to this trial."""

    FIELDS = ("instruction", "expected", "criteria", "file")

    def __init__(self) -> None:
        token = uuid.uuid4().hex[:16]
        self.values = {
            (split, field): f"CANARY{split.upper()}{field.upper()}{token}"
            for split in ("gate", "sealed")
            for field in self.FIELDS
        }

    def of(self, split: str | None = None, field: str | None = None) -> list[str]:
        return [v for (s, f), v in self.values.items() if split in (None, s) and field in (None, f)]

    def plant(self, split: str, task: TaskInput) -> TaskInput:
        if split not in ("gate", "sealed"):
            return task
        value = {f: self.values[(split, f)] for f in self.FIELDS}
        expected = task.expected if isinstance(task.expected, dict) else {"value": task.expected}
        return replace(
            task,
            instruction=f"{task.instruction.rstrip()}\n\nReference code: {value['instruction']}\n",
            expected={**expected, "trust_canary": value["expected"]},
            criteria=[*task.criteria, {"id": "trust-canary", "description": f"mentions {value['criteria']}"}],
            files={**task.files, "canary-notes.txt": f"internal note {value['file']}\n"},
        )

    def in_text(self, text: str, canaries: Iterable[str] | None = None) -> list[str]:
        return [c for c in (self.of() if canaries is None else canaries) if c in text]


def _dump(value: Any) -> str:
    return json.dumps(value, default=lambda o: o.decode("utf-8", "replace") if isinstance(o, bytes) else repr(o))


def _view(run: Run, parent: Candidate, slot: int) -> operators.ProposerView:
    return loop_propose.proposer_view(
        run=run,
        recipe=lifecycle.run_recipe(run),
        parent=parent,
        round_number=1,
        slot=slot,
        budget=4,
        stalled=True,
        explore=["prompt"],
    )


def _proposer_inputs(view: operators.ProposerView) -> dict[str, str]:
    """Everything each proposal operator is handed, as text."""
    from evolution.llm_operators import proposer_messages
    from evolution.proposers import prompt_text, view_document

    view_text = _dump(
        {
            "evidence": [vars(e) if hasattr(e, "__dict__") else repr(e) for e in view.evidence],
            "files": {path: data.decode("utf-8", "replace") for path, data in view.parent_files.items()},
            "ledger": [repr(entry) for entry in view.ledger],
            "rest": repr(replace(view, parent_files={}, evidence=[])),
        }
    )
    return {
        "proposer view": view_text,
        "command proposer view.json": json.dumps(view_document(view), default=str),
        "command proposer prompt.md": prompt_text(view),
        "llm proposer messages": json.dumps(proposer_messages(view)),
    }


def _snoop(view: operators.ProposerView, canaries: list[str]) -> dict[str, Any]:
    """Run a real command proposal whose program hunts for the canaries."""
    from evolution.proposers import command_proposer

    database = connection.settings_dict.get("NAME") if connection.vendor == "sqlite" else None
    extra = [str(p) for p in (database, settings.VAR_DIR / "records_key", "/proc/1/environ") if p]
    # A process of the worker's user whose environment holds a canary, like a worker started with a secret.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, CANARY_ENV: canaries[0]},
        stdin=subprocess.DEVNULL,
    )
    os.environ[CANARY_ENV] = canaries[0]
    reversed_canaries = [canary[::-1] for canary in canaries]
    try:
        params = {
            "argv": [proposer_python(), "-c", SNOOP_PROGRAM, json.dumps(reversed_canaries), json.dumps(extra)],
            "timeout_seconds": 60,
            # The default allow-list plus the canary's name: only listed variables may pass.
            "env_allowlist": ["PATH", "HOME", "LANG", "RSI_TRUST_CANARY_NOT_LISTED"],
        }
        proposal = command_proposer(replace(view, params=params))
    finally:
        os.environ.pop(CANARY_ENV, None)
        holder.kill()
        holder.wait()
    report: dict[str, Any] = json.loads(proposal.note)
    report["proposal"] = _dump({"files": dict(proposal.files), "edits": [repr(e) for e in proposal.edits]})
    return report


def _api_bodies(experiment: Experiment, user: Any) -> dict[str, str]:
    """GET every list and detail endpoint of /api/v1/ that concerns ``experiment``, as ``user``."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from api.v1 import router

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    ids: dict[str, list[int]] = {
        "benchmarks": [experiment.benchmark_id],
        "tasks": list(experiment.benchmark.tasks.values_list("pk", flat=True)),
        "experiments": [experiment.pk],
        "runs": list(Run.objects.filter(experiment=experiment).values_list("pk", flat=True)),
        "candidates": list(Candidate.objects.filter(experiment=experiment).values_list("pk", flat=True)),
        "results": list(CertifiedResult.objects.filter(experiment=experiment).values_list("pk", flat=True)),
        "trials": list(Trial.objects.filter(evaluation__experiment=experiment).values_list("pk", flat=True)),
    }
    bodies: dict[str, str] = {}

    def get(url: str) -> Any:
        response = client.get(url, HTTP_ACCEPT="application/json")
        bodies[url] = f"{response.status_code} {response.content.decode('utf-8', 'replace')}"
        return response

    with override_settings(ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]):
        _crawl(client, router, ids, experiment, get)
    statuses = {url: body.split(" ", 1)[0] for url, body in bodies.items() if "?" in url or url.endswith("s/")}
    failing = sorted(url for url, status in statuses.items() if status != "200")
    expect(not failing, f"API lists did not answer 200 (the search would prove nothing): {failing[:3]}")
    return bodies


def _crawl(client: Any, router: Any, ids: Mapping[str, list[int]], experiment: Experiment, get: Any) -> None:
    for prefix, viewset, _basename in router.registry:
        url: str | None = f"/api/v1/{prefix}/?experiment={experiment.pk}"
        for query in (f"/api/v1/{prefix}/", url):
            url = query
            for _page in range(50):
                response = get(url)
                data = response.json() if response.status_code == 200 else {}
                url = data.get("next") if isinstance(data, dict) else None
                if not url:
                    break
        actions = [a for a in viewset.get_extra_actions() if a.detail and "get" in a.mapping]
        for pk in ids.get(prefix, []):
            get(f"/api/v1/{prefix}/{pk}/")
            for action in actions:
                get(f"/api/v1/{prefix}/{pk}/{action.url_path}/")
    for pk in ids["candidates"]:
        for entry in Candidate.objects.get(pk=pk).tree.entries.values_list("path", flat=True):
            get(f"/api/v1/candidates/{pk}/files/{entry}")


def _user(role: str) -> Any:
    from django.contrib.auth.models import Group, User

    from evolution.access import roles_ensure

    roles_ensure()
    user = User.objects.create(username=f"trust-{role}-{uuid.uuid4().hex[:8]}")
    user.groups.add(Group.objects.get(name=role))
    return User.objects.get(pk=user.pk)


def _search(where: Mapping[str, str], canaries: list[str]) -> list[str]:
    return [f"{name}: {canary}" for name, text in where.items() for canary in canaries if canary in text]


@scenario(9, "9-protected-evidence", "Reading protected evidence: canaries in gate and sealed data")
def protected_evidence(ctx: TrialContext) -> str:
    canaries = Canaries()
    experiment = probe_experiment(ctx.experiment, tag="evidence", task_edit=canaries.plant)
    seed = selectors.experiment_seed(experiment)
    evaluation = evaluate_inline(seed, ["train", "gate", "sealed"], purpose=Evaluation.Purpose.BASELINE)
    certified(evaluation)
    seed.refresh_from_db()
    expect(candidate_accept(candidate=seed, reason="trust suite probe parent"), "seed not accepted")

    # The canaries really are in the database, and in the trajectories of gate and sealed trials.
    protected = Trial.objects.filter(evaluation=evaluation, split__in=["gate", "sealed"])
    echoed = TrajectoryStep.objects.filter(trajectory__trial__in=protected)
    steps_text = _dump(list(echoed.values_list("message", "observation")))
    planted = canaries.in_text(steps_text, canaries.of(field="instruction"))
    expect(bool(planted), "no gate or sealed trajectory echoes its instruction: the canary would prove nothing")
    train_trials = Trial.objects.filter(evaluation=evaluation, split="train").count()

    # Every proposer input, for every proposal operator.
    run = paused_run(experiment)
    view = _view(run, seed, slot=1)
    expect(len(view.evidence) == train_trials > 0, f"{len(view.evidence)} evidence trials, {train_trials} train")
    inputs = _proposer_inputs(view)
    from evolution.operators import get as operator

    example_proposal = operator("proposal", "example")(replace(view, params={}))
    inputs["example proposer answer"] = _dump(
        {"files": dict(example_proposal.files), "note": example_proposal.note, "edits": repr(example_proposal.edits)}
    )
    leaks = _search(inputs, canaries.of())
    expect(not leaks, f"protected evidence reached a proposer input: {leaks}")

    # A real command proposal that hunts for the canaries.
    report = _snoop(view, canaries.of())
    expect(not report["found"], f"the proposer program found a canary in: {report['found']}")
    expect(not canaries.in_text(report["proposal"]), "a canary came back in the command proposer's proposal")

    # The API as a viewer: no per-task sealed data (the sealed trajectory echoes the sealed instruction).
    viewer_bodies = _api_bodies(experiment, _user("viewer"))
    private = canaries.of(field="expected") + canaries.of(field="criteria") + canaries.of(field="file")
    # The task catalogue included: a task sealed in any experiment is withheld.
    leaks = _search(viewer_bodies, canaries.of("sealed")) + _search(viewer_bodies, private)
    expect(not leaks, f"the API showed protected evidence to a viewer: {leaks[:5]}")
    admin_bodies = _api_bodies(experiment, _user("admin"))
    expect(
        bool(_search({u: b for u, b in admin_bodies.items() if "trajectory" in u}, canaries.of("sealed"))),
        "an admin does not see the sealed trajectory either: the viewer check proves nothing",
    )
    return (
        f"{len(inputs)} proposer inputs ({len(view.evidence)} train trials) and a snooping command proposer "
        f"({len(report['tried'])} reads) saw no canary; {len(viewer_bodies)} API responses to a viewer hold no "
        f"sealed per-task data"
    )
