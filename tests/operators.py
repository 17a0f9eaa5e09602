"""Operators used by tests; worker processes load them with
RSI_OPERATOR_MODULES=tests.operators."""

from __future__ import annotations

from evolution import operators


@operators.register("proposal", "tiny-test")
def tiny_proposer(view: operators.ProposerView) -> operators.Proposal:
    """Slot 0 hard-codes the answer of a failing train task (a leak the
    critic must catch); slot 1 adds generic, inert notes; slot 2 pads the
    prompt (cost without gain)."""
    files = dict(view.parent_files)
    failing = sorted({e.task_id for e in view.evidence if not e.passed})
    if view.slot == 0 and failing:
        task = failing[view.round % len(failing)]
        files[f"answers/{task}.txt"] = b"no\n"
        edit = operators.EditDeclaration("memory", f"Answering {task} with no fixes it.", [f"answers/{task}.txt"])
    elif view.slot == 1:
        files[f"notes/round{view.round}.md"] = f"Check the answer twice (round {view.round}).\n".encode()
        edit = operators.EditDeclaration(
            "memory", "A reminder to double-check answers helps.", [f"notes/round{view.round}.md"]
        )
    else:
        files["default.txt"] = files["default.txt"] + b" " + b"padding " * (10 * view.round)
        edit = operators.EditDeclaration(
            "prompt", f"More context in the prompt helps (round {view.round}).", ["default.txt"]
        )
    return operators.Proposal(files=files, edits=[edit])


@operators.register("proposal", "tiny-held")
def held_proposer(view: operators.ProposerView) -> operators.Proposal:
    """``tiny-test``, but each call first writes ``<folder>/entered`` and waits
    (up to 120 s) for ``<folder>/release``: a test can act while a proposal
    is in progress. ``folder`` comes from the recipe's params."""
    import time
    from pathlib import Path

    folder = Path(view.params["folder"])
    (folder / "entered").touch()
    deadline = time.monotonic() + 120
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return tiny_proposer(view)


GENERIC_NOTE = b"Read the whole question before you answer it.\n"


@operators.register("proposal", "review-test-mixed")
def mixed_proposer(view: operators.ProposerView) -> operators.Proposal:
    """Slot 0: one candidate with three atomic edits, two leaky (each
    hard-codes the answer of a failing train task) and one generic note;
    the other slots as tiny-test."""
    if view.slot != 0:
        return tiny_proposer(view)
    failing = sorted({e.task_id for e in view.evidence if not e.passed})
    first, second = failing[0], failing[1]
    files = dict(view.parent_files)
    files[f"answers/{first}.txt"] = b"no\n"
    files[f"answers/{second}.txt"] = b"no\n"
    files["notes/generic.md"] = GENERIC_NOTE
    return operators.Proposal(
        files=files,
        edits=[
            operators.EditDeclaration("memory", f"Answering {first} with no fixes it.", [f"answers/{first}.txt"]),
            operators.EditDeclaration("memory", f"Answering {second} with no fixes it.", [f"answers/{second}.txt"]),
            operators.EditDeclaration("memory", "Reading the whole question first helps.", ["notes/generic.md"]),
        ],
    )
