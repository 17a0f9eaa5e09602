"""XSS payloads planted in a diff (file name and content), task text, a
trajectory step (message, tool call arguments, observation) and an
annotation note, on the API world. Shared by the escaping and browser tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evolution.models import Annotation, AnnotationLabel, Candidate, Task, Trajectory, TrajectoryStep
from evolution.services.snapshots import tree_entries, tree_store
from evolution.trees import FileEntry
from tests.api.conftest import World
from tests.factories import seed_of

SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=1">'
LINK = "javascript:window.__xss=1"
PAYLOAD = f'{SCRIPT} {IMG} [click]({LINK}) <a href="{LINK}">click</a>'
# A file name may not hold '/' or quotes everywhere; this one holds tags.
FILE_NAME = "notes/<img src=x onerror=window.__xss=1>.md"


@dataclass
class XssWorld:
    candidate: int
    trial: int

    def pages(self) -> list[str]:
        return [
            f"/candidates/{self.candidate}/",
            f"/candidates/{self.candidate}/diff/",
            f"/trials/{self.trial}/",
            f"/trials/{self.trial}/steps/",
            f"/trials/{self.trial}/annotations/",
        ]


def plant_xss(world: World, author: Any) -> XssWorld:
    trial = world.train_trial
    seed = seed_of(world.experiment)
    tree = tree_store(
        entries=[
            *tree_entries(tree=seed.tree),
            FileEntry("notes/xss.md", "100644", f"{PAYLOAD}\n".encode()),
            FileEntry(FILE_NAME, "100644", b"named\n"),
        ]
    )
    candidate = Candidate.objects.create(
        experiment=world.experiment,
        parent=seed,
        tree=tree,
        origin=Candidate.Origin.PROPOSED,
        state=Candidate.State.REJECTED_GATE,
        round=1,
        label=f"label {SCRIPT}",
    )
    Task.objects.filter(pk=trial.task_id).update(instruction=f"Task text {PAYLOAD}")
    trajectory = Trajectory.objects.get(trial=trial)
    TrajectoryStep.objects.filter(trajectory=trajectory, step_id=1).update(
        message=f"message {PAYLOAD}",
        tool_calls=[{"tool_call_id": "c1", "function_name": f"fn{IMG}", "arguments": {"cmd": PAYLOAD}}],
        observation={"results": [{"source_call_id": "c1", "content": f"observation {PAYLOAD}"}]},
    )
    label = AnnotationLabel.objects.first() or AnnotationLabel.objects.create(slug="other", name="Other")
    Annotation.objects.create(trial=trial, author=author, label=label, note=f"note {PAYLOAD}")
    return XssWorld(candidate=candidate.pk, trial=trial.pk)
