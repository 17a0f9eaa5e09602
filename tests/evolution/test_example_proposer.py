"""The offline example's proposer: pure checks on hand-built views, then real agent runs.

The pure tests build ``ProposerView`` objects from the seed harness files and a
few hand-written train trials (made-up customers, ids and answers). The last
tests run the example agent for real on a handful of train tasks to check that
the edits do what their family says.
"""

from __future__ import annotations

import builtins
import inspect
import io
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from evolution.example import bench, proposer, reference_edits
from evolution.example.proposer import (
    EDITS,
    EDITS_BY_NAME,
    SUBAGENT_PATH,
    SUBAGENT_TEXT,
    NothingToPropose,
    propose,
)
from evolution.operators import LedgerView, Proposal, ProposerView, TrialEvidence
from evolution.surfaces import check_diff, component_for, in_surface, parse_surface
from evolution.trees import FileEntry, diff_entries

SEED_FILES = {
    p.relative_to(bench.HARNESS_DIR).as_posix(): p.read_bytes()
    for p in sorted(bench.HARNESS_DIR.rglob("*"))
    if p.is_file()
}
SPEC = parse_surface((bench.EXAMPLE_DIR / "surface.yaml").read_text(encoding="utf-8"))
COMPONENTS = {path: kind for path in SEED_FILES if (kind := component_for(SPEC, path)) is not None}
HEADER = "Route this customer-support message to one tool and fill in the tool's arguments.\n\n> "
GENERIC = {e.hypothesis for e in EDITS if e.family in ("generic", "prune")}
# context-history-last and prune-context-history share their hypothesis: it counts as generic.
FAMILY_OF: dict[str, str] = {}
for _edit in EDITS:
    FAMILY_OF.setdefault(_edit.hypothesis, _edit.family)


def step(step_id: int, message: str, call: tuple[str, dict[str, str]] | None = None) -> dict[str, Any]:
    tool_calls = [{"tool_call_id": f"call_{step_id}", "function_name": call[0], "arguments": call[1]}] if call else []
    return {"step_id": step_id, "source": "agent" if call else "system", "message": message,
            "tool_calls": tool_calls, "observation": {}}  # fmt: skip


def trial(
    task_id: str, message: str, index: int, answer: tuple[str, dict[str, str]] | None, met: dict[str, bool]
) -> TrialEvidence:
    passed = bool(met) and all(met.values())
    steps = [step(1, "You are the routing agent."), step(2, message)]
    if answer is None:
        steps.append(step(3, "not submitted: missing " + ", ".join(k[4:] for k, v in met.items() if not v)))
    else:
        steps.append(step(3, f"Submitting {answer[0]}.", answer))
    return TrialEvidence(task_id=task_id, instruction=HEADER + message + "\n", index=index, passed=passed,
                         score=sum(met.values()) / len(met), criteria=[{"id": k, "met": v} for k, v in met.items()],
                         error="", trajectory=steps)  # fmt: skip


REFUND = "Please refund $18.40 for K-5521, the lamp arrived broken. Thanks, Wendeline Aldercott"
TRACK = "Where is my parcel TRK123987654? It has been a week. Odalys Varga"
EMAIL = "I cannot log in, please reset it for Jo.Quist@Example.org. Jorun Quist"
CALLBACK = "Could you ring me on 07700 900456 on 3rd of March 2026? Halvard Brisk"
EVIDENCE = [
    trial("t-refund", REFUND, 0, ("refund_order", {"order_id": "K-5521", "amount": "18.40"}),
          {"tool": True, "arg:order_id": True, "arg:amount": True}),
    trial("t-refund", REFUND, 1, None, {"tool": False, "arg:order_id": False, "arg:amount": False}),
    trial("t-track", TRACK, 0, ("track_shipment", {"tracking_number": "TRK123987654"}),
          {"tool": True, "arg:tracking_number": True}),
    trial("t-email", EMAIL, 0, ("reset_password", {"email": "Jo.Quist@Example.org"}),
          {"tool": True, "arg:email": False}),
    trial("t-callback", CALLBACK, 0, ("change_address", {"order_id": "K-0000"}),
          {"tool": False, "arg:phone": False, "arg:date": False}),
]  # fmt: skip
# Task-specific strings of the evidence: none may reach a generic edit.
EVIDENCE_STRINGS = ["Wendeline", "Aldercott", "K-5521", "18.40", "Odalys", "TRK123987654", "Jorun", "Quist",
                    "Halvard", "Brisk", "07700 900456", "the lamp arrived broken"]  # fmt: skip


def make_view(**overrides: Any) -> ProposerView:
    values: dict[str, Any] = {
        "round": 1,
        "slot": 0,
        "seed": 1234,
        "parent_files": SEED_FILES,
        "components": COMPONENTS,
        "evidence": EVIDENCE,
        "ledger": [],
        "edit_budget": 3,
        "stalled": False,
        "explore_components": [],
        "pruning_targets": [],
        "params": {},
    }
    values.update(overrides)
    return ProposerView(**values)


def changed_paths(parent: dict[str, bytes], proposal: Proposal) -> set[str]:
    return {p for p in parent.keys() | proposal.files.keys() if parent.get(p) != proposal.files.get(p)}


def added_text(parent: dict[str, bytes], proposal: Proposal) -> str:
    """Every line of the proposal that the parent's same file lacks."""
    added = []
    for path in changed_paths(parent, proposal):
        before = set(parent.get(path, b"").decode().splitlines())
        added += [line for line in proposal.files[path].decode().splitlines() if line not in before]
    return "\n".join(added)


def views(slots: Iterable[int] = range(6), seeds: Iterable[int] = range(8), **overrides: Any) -> list[ProposerView]:
    return [make_view(slot=slot, seed=seed, **overrides) for seed in seeds for slot in slots]


# --- Budget, declarations, determinism -----------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_never_more_edits_than_the_budget_and_slot_zero_uses_all_of_it(budget: int) -> None:
    for view in views(edit_budget=budget):
        proposal = propose(view)
        assert 1 <= len(proposal.edits) <= budget
        if view.slot == 0:
            assert len(proposal.edits) == budget


def test_no_budget_means_at_most_four_edits() -> None:
    sizes = {len(propose(view).edits) for view in views(edit_budget=None)}
    assert max(sizes) == 4
    assert min(sizes) >= 1


def test_every_changed_path_is_declared_once_with_its_surface_kind() -> None:
    for view in views(slots=range(10), edit_budget=4):
        proposal = propose(view)
        declared = [path for edit in proposal.edits for path in edit.paths]
        assert sorted(declared) == sorted(changed_paths(SEED_FILES, proposal))
        for edit in proposal.edits:
            assert {component_for(SPEC, path) for path in edit.paths} == {edit.component}
            assert all(in_surface(SPEC, path) for path in edit.paths)
            assert len(edit.hypothesis.split(". ")) == 1 and edit.hypothesis.endswith(".")
        assert set(proposal.files) == set(SEED_FILES)
        # The platform's own check: surface, kinds and protected keys (model, reasoning_effort).
        old = [FileEntry(p, "100644", d) for p, d in sorted(SEED_FILES.items())]
        new = [FileEntry(p, "100644", d) for p, d in sorted(proposal.files.items())]
        verdict = check_diff(SPEC, diff_entries(old, new), old_files=SEED_FILES, new_files=dict(proposal.files))
        assert verdict.violations == []
        assert sorted(verdict.components) == sorted({e.component for e in proposal.edits})


def test_same_view_gives_the_same_proposal_and_other_seeds_other_ones() -> None:
    first = propose(make_view(slot=2, seed=77))
    again = propose(make_view(slot=2, seed=77))
    assert first == again
    distinct = {tuple(sorted(propose(make_view(slot=2, seed=seed)).files.items())) for seed in range(10)}
    assert len(distinct) >= 5


def test_slot_zero_is_generic_and_later_slots_mix_generic_leaky_and_cost() -> None:
    first_family = {}
    # The loop gives every slot its own seed.
    for view in [make_view(slot=slot, seed=100 + slot) for slot in range(40)]:
        proposal = propose(view)
        families = [FAMILY_OF[edit.hypothesis] for edit in proposal.edits]
        if view.slot == 0:
            assert set(families) == {"generic"}
        # The drawn family goes first; the rest of a bundle is generic.
        assert set(families[1:]) <= {"generic"}
        first_family[view.slot] = families[0]
    counts = {family: list(first_family.values()).count(family) for family in ("generic", "leaky", "cost")}
    assert counts["generic"] > counts["leaky"] > 0
    assert counts["cost"] > 0
    assert sum(counts.values()) == 40


def test_note_names_the_edits_and_usage_is_empty() -> None:
    proposal = propose(make_view(edit_budget=1, params={"edits": ["config-temperature"]}))
    assert proposal.note == (
        "round 1 slot 0: generic draw, 1 edit(s) (budget 1): config-temperature [generic] (config)."
    )
    assert dict(proposal.usage) == {}
    assert proposal.files["config.toml"] == SEED_FILES["config.toml"].replace(
        b"temperature = 0.9", b"temperature = 0.2"
    )


# --- Exploration, ledger, pruning ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(set(COMPONENTS.values())))
def test_a_stalled_slot_touches_a_kind_to_explore(kind: str) -> None:
    for view in views(slots=range(4), seeds=range(4), explore_components=[kind, "subagent"], stalled=True):
        proposal = propose(view)
        assert kind in {edit.component for edit in proposal.edits}, proposal.note


def test_a_stalled_slot_asked_for_a_new_kind_adds_a_subagent() -> None:
    # The seed has no subagent: the structural edit adds one, declared with its surface kind.
    proposal = propose(make_view(explore_components=["subagent"], stalled=True, edit_budget=1))

    assert [(e.component, list(e.paths)) for e in proposal.edits] == [("subagent", [SUBAGENT_PATH])]
    assert component_for(SPEC, SUBAGENT_PATH) == "subagent"
    assert proposal.files[SUBAGENT_PATH].decode() == SUBAGENT_TEXT
    assert changed_paths(SEED_FILES, proposal) == {SUBAGENT_PATH}
    # Not stalled, the family is never drawn (weight 0): no slot of any seed adds it.
    assert all(SUBAGENT_PATH not in propose(v).files for v in views())


def test_a_stalled_slot_with_nothing_to_explore_is_dropped_with_a_reason() -> None:
    parent = {**SEED_FILES, SUBAGENT_PATH: SUBAGENT_TEXT.encode()}
    components = {**COMPONENTS, SUBAGENT_PATH: "subagent"}
    with pytest.raises(NothingToPropose, match=r"^no edit left that touches a kind to explore \(subagent\)$"):
        propose(make_view(parent_files=parent, components=components, explore_components=["subagent"], stalled=True))


def test_hypotheses_the_ledger_refutes_are_not_proposed_again() -> None:
    first = propose(make_view(edit_budget=4))
    # Refuted in other spacing and case: the same hypothesis all the same.
    ledger = [
        LedgerView(round=1, component=e.component, hypothesis="  " + e.hypothesis.upper(), delta_score=-0.01,
                   delta_cost=0.02, accepted=False)
        for e in first.edits
    ]  # fmt: skip
    refuted = {e.hypothesis for e in first.edits}
    for view in views(slots=range(8), edit_budget=4, ledger=ledger):
        proposal = propose(view)
        assert not refuted & {e.hypothesis for e in proposal.edits}


def test_an_admissible_hypothesis_that_was_not_chosen_is_not_refuted() -> None:
    """Rule B of docs/concepts.md: a candidate that passed every rule but lost to a sibling is admissible, not
    refuted, so its hypotheses may be proposed again (before, every ledger row not accepted counted as refuted)."""
    first = propose(make_view(edit_budget=4))
    ledger = [
        LedgerView(round=1, component=e.component, hypothesis=e.hypothesis, delta_score=0.05, delta_cost=0.0,
                   accepted=False, admissible=True)
        for e in first.edits
    ]  # fmt: skip
    assert not any(entry.refuted for entry in ledger)
    assert {entry.verdict for entry in ledger} == {"admissible, not chosen"}
    proposed = {
        e.hypothesis for view in views(slots=range(8), edit_budget=4, ledger=ledger) for e in propose(view).edits
    }
    assert {e.hypothesis for e in first.edits} & proposed


def test_an_accepted_edit_already_in_the_parent_is_not_proposed_again() -> None:
    first = propose(make_view(edit_budget=2))
    ledger = [
        LedgerView(round=1, component=e.component, hypothesis=e.hypothesis, delta_score=0.05, delta_cost=0.01,
                   accepted=True)
        for e in first.edits
    ]  # fmt: skip
    accepted = {e.hypothesis for e in first.edits}
    for view in views(slots=range(8), edit_budget=4, ledger=ledger, parent_files=first.files, round=2):
        proposal = propose(view)
        assert not accepted & {e.hypothesis for e in proposal.edits}
        already = proposal.note.split("already in the parent: ")[1].split(".")[0].split(", ")
        assert {EDITS_BY_NAME[name].hypothesis for name in already} >= accepted


def test_generic_edits_build_on_each_other_until_none_is_left() -> None:
    generic = [e.name for e in EDITS if e.family == "generic"]
    parent = dict(SEED_FILES)
    seen: list[str] = []
    for round_number in range(1, 20):
        try:
            proposal = propose(make_view(round=round_number, parent_files=parent, edit_budget=2,
                                         params={"edits": generic}))  # fmt: skip
        except NothingToPropose as exc:
            assert str(exc) == "every allowed edit is already in the parent or refuted by the ledger (refuted: none)"
            break
        hypotheses = [e.hypothesis for e in proposal.edits]
        assert not set(hypotheses) & set(seen)
        seen += hypotheses
        parent = dict(proposal.files)
    else:
        pytest.fail("the generic edits never ran out")
    assert sorted(seen) == sorted(EDITS_BY_NAME[name].hypothesis for name in generic)


def test_pruning_targets_get_their_padding_removed() -> None:
    padded = propose(make_view(edit_budget=1, params={"edits": ["prompt-padding"]}))
    assert b"## Service standards" in padded.files["prompts/system.md"]
    view = make_view(parent_files=padded.files, edit_budget=1, pruning_targets=["prompt"], params={"prune_share": 1.0})

    proposal = propose(view)

    assert [(e.component, e.hypothesis) for e in proposal.edits] == [
        ("prompt", EDITS_BY_NAME["prune-prompt"].hypothesis)
    ]
    prompt = proposal.files["prompts/system.md"].decode()
    assert "## Service standards" not in prompt
    assert "## About the shop" not in prompt
    assert "Request: Please track my parcel, the tracking number is TRK000111222.\nTool: track_shipment" in prompt
    assert "pruned prompt (pruning targets: prompt)." in proposal.note


# --- Leaky, generic and cost content -------------------------------------------------------------------


def test_leaky_memory_cases_copy_messages_and_answers_from_passing_trials() -> None:
    proposal = propose(make_view(edit_budget=1, params={"edits": ["memory-known-cases"]}))

    memory = proposal.files["memory/notes.md"].decode()
    assert memory.endswith(
        "## Known cases\n\n"
        '- "Please refund $18.40 for K-5521, the lamp arrived broken. Thanks, Wendeline Aldercott" => '
        '{"args": {"amount": "18.40", "order_id": "K-5521"}, "tool": "refund_order"}\n'
        '- "Where is my parcel TRK123987654? It has been a week. Odalys Varga" => '
        '{"args": {"tracking_number": "TRK123987654"}, "tool": "track_shipment"}\n'
    )
    assert [e.component for e in proposal.edits] == ["memory"]


def test_leaky_solved_cases_answer_the_failing_messages() -> None:
    proposal = propose(make_view(edit_budget=1, params={"edits": ["memory-solved-cases"]}))

    memory = proposal.files["memory/notes.md"].decode()
    assert '- "I cannot log in, please reset it for Jo.Quist@Example.org. Jorun Quist" => ' in memory
    assert '{"args": {"email": "jo.quist@example.org"}, "tool": "reset_password"}' in memory
    assert '{"args": {"date": "2026-03-03", "phone": "+447700900456"}, "tool": "book_callback"}' in memory
    assert "Wendeline" not in memory  # that task passed once: memory-known-cases' business


@pytest.mark.parametrize(
    ("edit", "path", "copied"),
    [
        ("prompt-train-examples", "prompts/system.md", "Request: " + TRACK + "\nTool: track_shipment"),
        ("tool-answer-keywords", "tools/refund_order.toml", '"k-5521", "18.40"'),
    ],
)
def test_other_leaky_edits_copy_evidence_strings(edit: str, path: str, copied: str) -> None:
    proposal = propose(make_view(edit_budget=1, params={"edits": [edit]}))
    assert copied in proposal.files[path].decode()


def test_leaky_draws_copy_evidence_and_generic_ones_never_do() -> None:
    leaky_seen = 0
    for view in views(slots=range(12), edit_budget=2):
        proposal = propose(view)
        text = added_text(SEED_FILES, proposal)
        copies = [s for s in EVIDENCE_STRINGS if s in text]
        if any(FAMILY_OF[e.hypothesis] == "leaky" for e in proposal.edits):
            leaky_seen += 1
            assert copies, proposal.note
        else:
            assert copies == [], proposal.note
    assert leaky_seen > 0


def test_cost_edit_only_appends_prose() -> None:
    proposal = propose(make_view(edit_budget=1, params={"edits": ["memory-padding"]}))
    before = SEED_FILES["memory/notes.md"].decode()
    after = proposal.files["memory/notes.md"].decode()
    assert after.startswith(before.rstrip("\n") + "\n\n## Session log\n\n")
    # No line the agent reads as a hint or a case.
    assert not [line for line in after[len(before) :].splitlines() if line.startswith("- ")]


def test_unknown_edit_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^unknown example edits \['no-such-edit'\]"):
        propose(make_view(params={"edits": ["no-such-edit"]}))


def test_an_edit_that_changes_nothing_raises_nothing_to_propose() -> None:
    trimmed = propose(make_view(edit_budget=1, params={"edits": ["prompt-trim"]}))
    with pytest.raises(NothingToPropose):
        propose(make_view(parent_files=trimmed.files, params={"edits": ["prompt-trim"]}))


def test_the_proposer_reads_the_view_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "tasks.jsonl" not in inspect.getsource(proposer)
    touched: list[str] = []

    def guard(original: Any) -> Any:
        def wrapper(target: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append(str(target))
            raise AssertionError(f"the proposer opened {target}")

        return wrapper

    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: guard(None)(self))
    monkeypatch.setattr(Path, "read_bytes", lambda self, *a, **k: guard(None)(self))
    for view in views(slots=range(6), seeds=range(3), edit_budget=4, pruning_targets=["prompt"]):
        propose(view)
    assert touched == []


# --- Real agent runs -----------------------------------------------------------------------------------

# A handful of train tasks (of the example's split, stratified by kind), seeds 0-3: under the seed harness
# route-006 always passes, route-048 passes 3 of 4 times, route-022 twice, route-030 once; the rest always
# fail (route-001, -014, -018, -021: the first train tasks that always fail).
REAL_TASK_IDS = ("route-001", "route-006", "route-014", "route-018", "route-021", "route-022", "route-030", "route-048")
REAL_SEEDS = (0, 1, 2, 3)


def run_trials(harness: Path, tasks: Sequence[dict[str, Any]], workdir: Path) -> list[tuple[TrialEvidence, int]]:
    """Each task with each seed through the real agent: (evidence, tokens) per trial."""
    grade = bench._grade_function()  # the verifier's own grade(), to get per-criterion results

    def one(job: tuple[dict[str, Any], int]) -> tuple[TrialEvidence, int]:
        task, seed = job
        folder = workdir / f"{task['id']}-{seed}"
        result = bench.run_trial(harness, task, seed, folder, grade_in_process=True)
        verdict = grade(folder / "output", json.loads((folder / "private" / "expected.json").read_text()))
        document = json.loads((folder / "output" / "trajectory.json").read_text())
        steps = [
            {key: s.get(key, default) for key, default in
             (("step_id", 0), ("source", ""), ("message", ""), ("tool_calls", []), ("observation", {}))}
            for s in document["steps"]
        ]  # fmt: skip
        evidence = TrialEvidence(task_id=task["id"], instruction=task["instruction"], index=seed,
                                 passed=result.passed, score=result.score, criteria=verdict["criteria"], error="",
                                 trajectory=steps)  # fmt: skip
        return evidence, result.prompt_tokens + result.completion_tokens

    jobs = [(task, seed) for task in tasks for seed in REAL_SEEDS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(one, jobs))


def write_harness(files: dict[str, bytes], root: Path) -> Path:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def pass_rate(trials: Sequence[tuple[TrialEvidence, int]], task_ids: Iterable[str] | None = None) -> float:
    wanted = set(task_ids) if task_ids is not None else {t.task_id for t, _ in trials}
    chosen = [t for t, _ in trials if t.task_id in wanted]
    return sum(t.passed for t in chosen) / len(chosen)


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    """Seed runs as evidence, then one generic, two leaky and one cost proposal measured on the same trials."""
    tasks_by_id = {t["id"]: t for t in bench.load_tasks()}
    train_ids = {t["id"] for t in reference_edits.split_tasks(list(tasks_by_id.values()))["train"]}
    assert set(REAL_TASK_IDS) <= train_ids
    tasks = [tasks_by_id[i] for i in REAL_TASK_IDS]
    with tempfile.TemporaryDirectory(prefix="example-proposer-") as tmp:
        root = Path(tmp)
        seed = run_trials(bench.HARNESS_DIR, tasks, root / "seed")
        view = make_view(evidence=[t for t, _ in seed], seed=5)
        proposals = {
            "generic": propose(replace(view, edit_budget=4)),
            "known": propose(replace(view, edit_budget=1, params={"edits": ["memory-known-cases"]})),
            "solved": propose(replace(view, edit_budget=1, params={"edits": ["memory-solved-cases"]})),
            "cost": propose(replace(view, edit_budget=1, params={"edits": ["prompt-padding"]})),
        }
        results = {
            name: run_trials(write_harness(dict(p.files), root / name / "harness"), tasks, root / name / "runs")
            for name, p in proposals.items()
        }
    return {"seed": seed, "proposals": proposals, **results}


def test_real_generic_proposal_raises_the_train_pass_rate(real: dict[str, Any]) -> None:
    assert {FAMILY_OF[e.hypothesis] for e in real["proposals"]["generic"].edits} == {"generic"}
    assert pass_rate(real["generic"]) > pass_rate(real["seed"])


def test_real_leaky_known_cases_make_every_copied_task_pass(real: dict[str, Any]) -> None:
    copied = {t.task_id for t, _ in real["seed"] if t.passed}
    assert copied == {"route-006", "route-022", "route-030", "route-048"}
    assert pass_rate(real["seed"], copied) == 10 / 16
    assert pass_rate(real["known"], copied) == 1.0


def test_real_leaky_solved_cases_raise_the_tasks_that_never_passed(real: dict[str, Any]) -> None:
    never = {t.task_id for t, _ in real["seed"]} - {t.task_id for t, _ in real["seed"] if t.passed}
    assert pass_rate(real["seed"], never) == 0.0
    assert pass_rate(real["solved"], never) > 0.5


def test_real_cost_proposal_changes_no_outcome_and_costs_more(real: dict[str, Any]) -> None:
    assert [t.passed for t, _ in real["cost"]] == [t.passed for t, _ in real["seed"]]
    for (_, padded), (_, plain) in zip(real["cost"], real["seed"], strict=True):
        assert padded > plain
