"""The LLM proposer, critic and failure analyst against a stub server (no network)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from evolution import operators
from evolution.critic import CriticTask, build_index
from evolution.llm import LLMResponseError
from evolution.llm_operators import (
    LLMProposalError,
    PatchError,
    analyse_failure,
    apply_unified_diff,
    llm_critique,
    llm_proposer,
)
from evolution.loop import lifecycle
from evolution.models import Candidate, Run, Trial
from evolution.operators import LedgerView, ProposerView, TrialEvidence
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from evolution.trees import FileEntry, diff_entries
from tests.evolution.test_llm import Reply, Stub, completion, serving
from tests.factories import evaluate_seed_inline, make_tiny_experiment
from tests.loop_driver import drive


@pytest.fixture
def stub() -> Iterator[Stub]:
    with serving() as server:
        yield server


PARENT = {
    "prompts/system.md": b"# Agent\n\nBe brief.\nAnswer in English.\n",
    "config.toml": b'model = "m"\ntemperature = 0.9\n',
}
COMPONENTS = {"prompts/system.md": "prompt", "config.toml": "config"}
PROMPT_DIFF = """--- a/prompts/system.md
+++ b/prompts/system.md
@@ -2,3 +2,4 @@

 Be brief.
+Check every argument before calling a tool.
 Answer in English.
"""


def view(stub: Stub, **params: Any) -> ProposerView:
    return ProposerView(
        round=2,
        slot=1,
        seed=5,
        parent_files=PARENT,
        components=COMPONENTS,
        evidence=[
            TrialEvidence(
                task_id="ticket-17",
                instruction="Refund order Q-4411.",
                index=0,
                passed=False,
                score=0.0,
                criteria=[{"id": "tool", "met": False}],
                error="",
                trajectory=[{"step_id": 1, "source": "agent", "message": "I will refund.", "tool_calls": []}],
                expected={"answer": "EXPECTED-SECRET-ANSWER"},
            )
        ],
        ledger=[LedgerView(1, "prompt", "Shouting helps.", -0.02, 0.1, False)],
        edit_budget=2,
        stalled=False,
        explore_components=[],
        pruning_targets=["config"],
        params=stub.params(**params),
    )


def answer(*edits: Mapping[str, Any], note: str = "n") -> Reply:
    return completion(json.dumps({"edits": list(edits), "note": note}), prompt_tokens=100, completion_tokens=20)


# --- Patch applier ------------------------------------------------------------------------------------


def test_a_unified_diff_applies_even_with_wrong_line_numbers() -> None:
    shifted = PROMPT_DIFF.replace("@@ -2,3 +2,4 @@", "@@ -40,3 +40,4 @@")
    for diff in (PROMPT_DIFF, shifted):
        files, touched = apply_unified_diff(PARENT, diff)
        assert files["prompts/system.md"] == (
            b"# Agent\n\nBe brief.\nCheck every argument before calling a tool.\nAnswer in English.\n"
        )
        assert files["config.toml"] == PARENT["config.toml"]
        assert touched == ["prompts/system.md"]


def test_a_diff_can_add_and_delete_files() -> None:
    diff = (
        "--- /dev/null\n+++ b/skills/verify.md\n@@ -0,0 +1,2 @@\n+# Verify\n+Re-read the task.\n"
        '--- a/config.toml\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-model = "m"\n-temperature = 0.9\n'
    )
    files, touched = apply_unified_diff(PARENT, diff)
    assert files["skills/verify.md"] == b"# Verify\nRe-read the task.\n"
    assert "config.toml" not in files
    assert touched == ["config.toml", "skills/verify.md"]


def test_a_hunk_whose_context_is_not_in_the_file_names_file_and_hunk() -> None:
    bad = PROMPT_DIFF.replace(" Be brief.", " Be verbose.")
    with pytest.raises(PatchError, match=r"prompts/system.md: hunk 1 \(@@ -2,3 @@\) does not apply"):
        apply_unified_diff(PARENT, bad)
    with pytest.raises(PatchError, match="nothing.md: no such file"):
        apply_unified_diff(PARENT, PROMPT_DIFF.replace("prompts/system.md", "nothing.md"))
    with pytest.raises(PatchError, match="no ---/\\+\\+\\+ headers"):
        apply_unified_diff(PARENT, "just some prose\n")


# --- Proposer -------------------------------------------------------------------------------------------


def test_the_proposer_applies_diffs_and_whole_files_and_records_its_usage(stub: Stub) -> None:
    stub.replies = [
        answer(
            {"component": "prompt", "hypothesis": "Checking arguments avoids invalid calls.", "diff": PROMPT_DIFF},
            {"component": "config", "hypothesis": "Lower temperature is steadier.",
             "files": {"config.toml": 'model = "m"\ntemperature = 0.2\n'}},
            note="two edits",
        )
    ]  # fmt: skip
    proposal = llm_proposer(view(stub))
    assert proposal.files["prompts/system.md"].count(b"Check every argument") == 1
    assert proposal.files["config.toml"] == b'model = "m"\ntemperature = 0.2\n'
    assert [(e.component, list(e.paths)) for e in proposal.edits] == [
        ("prompt", ["prompts/system.md"]),
        ("config", ["config.toml"]),
    ]
    assert proposal.note == "two edits"
    assert proposal.usage == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120, "requests": 1}
    assert operators.get("proposal", "llm") is llm_proposer
    prompt = stub.everything_sent()
    # The view's train evidence, ledger, budget and pruning targets reach the model; expected answers do not.
    for seen in ("Refund order Q-4411.", "Shouting helps.", "at most 2 atomic edit(s)", "config", "Be brief."):
        assert seen in prompt
    assert "EXPECTED-SECRET-ANSWER" not in prompt


def test_malformed_json_is_retried_once_then_the_proposer_fails_clearly(stub: Stub) -> None:
    stub.replies = [completion("{edits: [}"), completion("{edits: [}")]
    with pytest.raises(LLMProposalError, match="LLM proposer: no usable answer after 2 attempt.*not valid JSON") as e:
        llm_proposer(view(stub))
    assert len(stub.requests) == 2
    assert e.value.usage["requests"] == 2


def test_an_edit_that_does_not_apply_is_rejected_with_the_reason(stub: Stub) -> None:
    bad = PROMPT_DIFF.replace(" Be brief.", " Be verbose.")
    stub.replies = [answer({"component": "prompt", "hypothesis": "h", "diff": bad})]
    with pytest.raises(LLMProposalError, match=r"edit 0: prompts/system.md: hunk 1 .* does not apply"):
        llm_proposer(view(stub))
    # The reason went back to the model once before giving up.
    assert len(stub.requests) == 2
    assert "does not apply" in stub.requests[1]["messages"][-1]["content"]


def test_an_answer_repaired_after_feedback_is_used(stub: Stub) -> None:
    good = answer({"component": "prompt", "hypothesis": "h", "diff": PROMPT_DIFF})
    stub.replies = [answer({"component": "wizardry", "hypothesis": "h", "diff": PROMPT_DIFF}), good]
    proposal = llm_proposer(view(stub))
    assert proposal.edits[0].component == "prompt"
    assert "wizardry" in stub.requests[1]["messages"][-1]["content"]
    assert proposal.usage["requests"] == 2


def test_a_missing_endpoint_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, stub: Stub) -> None:
    monkeypatch.delenv("RSI_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("RSI_LLM_MODEL", raising=False)
    broken = ProposerView(**{**view(stub).__dict__, "params": {}})
    with pytest.raises(LLMProposalError, match="configuration: no endpoint"):
        llm_proposer(broken)
    assert stub.requests == []


def test_a_rate_limited_proposer_waits_and_succeeds(stub: Stub) -> None:
    stub.replies = [Reply(429, "", {"Retry-After": "0"}), Reply(503, "busy"),
                    answer({"component": "prompt", "hypothesis": "h", "diff": PROMPT_DIFF})]  # fmt: skip
    proposal = llm_proposer(view(stub))
    assert len(stub.requests) == 3
    assert proposal.usage["requests"] == 1  # only the answered request has usage


# --- Proposer in the loop -----------------------------------------------------------------------------------

CANARY = "CANARY-SEALED-LLM-91c2"


def tiny_llm_recipe(stub: Stub) -> Any:
    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=1, candidates_per_round=2)
    data["proposal"] = {"operator": "llm", "params": stub.params()}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 1}
    return parse_recipe(data, known_operators=operators.known_operators())


@pytest.mark.django_db
def test_in_the_loop_surface_is_checked_and_sealed_text_never_reaches_the_model(stub: Stub) -> None:
    experiment = make_tiny_experiment(tasks=8, k=1)
    for membership in experiment.split_memberships.filter(split="sealed").select_related("task"):
        membership.task.instruction += f" {CANARY}"
        membership.task.save(update_fields=["instruction"])
    gate_texts = [m.task.instruction for m in experiment.split_memberships.filter(split="gate").select_related("task")]
    generic = "--- a/default.txt\n+++ b/default.txt\n@@ -1 +1 @@\n-yes\n+yes, checked twice\n"

    def respond(request: dict[str, Any]) -> Reply:
        if "slot 0" in request["messages"][-1]["content"]:
            return answer({"component": "prompt", "hypothesis": "Say it was checked.", "diff": generic})
        # Slot 1 writes the evaluator's place: not on the tiny surface.
        return answer({"component": "prompt", "hypothesis": "h", "files": {"verify.py": "print('pass')\n"}})

    stub.responder = respond
    run = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_llm_recipe(stub)))
    assert run.status == Run.Status.FINISHED
    assert len(stub.requests) == 2
    by_label = {c.label: c for c in Candidate.objects.filter(run=run)}
    assert by_label["r1s0"].state not in (Candidate.State.REJECTED_SURFACE, Candidate.State.REJECTED_BUDGET)
    assert by_label["r1s0"].edits.get().hypothesis == "Say it was checked."
    assert by_label["r1s0"].evaluations.exists()
    rejected = by_label["r1s1"]
    assert rejected.state == Candidate.State.REJECTED_SURFACE
    assert "verify.py" in rejected.state_reason
    assert not rejected.evaluations.exists()
    sent = stub.everything_sent()
    train_texts = [
        m.task.instruction for m in experiment.split_memberships.filter(split="train").select_related("task")
    ]
    assert any(json.dumps(text)[1:-1] in sent for text in train_texts)  # the evidence did reach the model
    assert CANARY not in sent
    assert gate_texts and not any(json.dumps(text)[1:-1] in sent for text in gate_texts)


# --- Critic ----------------------------------------------------------------------------------------------

TASKS = [
    CriticTask(id="ticket-17", instruction="Refund order Q-4411 for Wenceslas.", expected={"answer": "SECRET-42"}),
    CriticTask(id="ticket-18", instruction="Cancel the subscription.", files={"account.txt": "plan: gold\n"}),
]


def leak_diff() -> str:
    old = [FileEntry("prompts/system.md", "100644", b"Be brief.\n")]
    new = [FileEntry("prompts/system.md", "100644", b"Be brief.\nIf the order is Q-4411, refund it.\n")]
    return diff_entries(old, new)


def test_the_llm_critic_keeps_only_flags_that_point_at_added_text(stub: Stub) -> None:
    flags = [
        {"rule": "rare_literal", "path": "prompts/system.md", "line": "...", "matched": "Q-4411",
         "task": "ticket-17", "evidence": "order id of a task"},
        {"rule": "task_id", "path": "prompts/system.md", "matched": "ticket-99", "task": "ticket-99"},
        {"rule": "made_up", "path": "other.md", "matched": "Q-4411", "task": None},
    ]  # fmt: skip
    stub.replies = [completion(json.dumps({"flags": flags}))]
    result = llm_critique(leak_diff(), TASKS, params=stub.params())
    assert [f.to_json() for f in result] == [
        {
            "rule": "rare_literal",
            "path": "prompts/system.md",
            "line_number": 2,
            "line": "If the order is Q-4411, refund it.",
            "matched": "Q-4411",
            "task_id": "ticket-17",
            "evidence": "llm: order id of a task",
        }
    ]
    sent = stub.everything_sent()
    assert "Refund order Q-4411 for Wenceslas." in sent and "plan: gold" in sent
    assert "SECRET-42" not in sent
    assert operators.get("critique", "llm") is llm_critique


def test_the_llm_critic_accepts_an_index_and_a_clean_answer(stub: Stub) -> None:
    stub.replies = [completion('{"flags": []}')]
    assert llm_critique(leak_diff(), build_index(TASKS), params=stub.params()) == []
    assert "ticket-18" in stub.everything_sent()


def test_the_llm_critic_fails_loudly_on_a_wrong_shape(stub: Stub) -> None:
    stub.replies = [completion('{"verdict": "fine"}')]
    with pytest.raises(LLMResponseError, match='list "flags"'):
        llm_critique(leak_diff(), TASKS, params=stub.params())


# --- Failure analyst -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_failure_analyst_suggests_a_known_label_and_refuses_sealed_trials(stub: Stub) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(experiment, splits=("train", "sealed"))
    failed = Trial.objects.filter(candidate=experiment.seed_candidate, split="train", outcome="fail").first()
    assert failed is not None
    stub.replies = [
        completion('{"label": "made-up", "note": "x"}'),
        completion('{"label": "judgment-error", "step": null, "note": "Answered yes where no was right."}'),
    ]
    analysis = analyse_failure(failed, params=stub.params())
    assert (analysis.label, analysis.note, analysis.step_id) == (
        "judgment-error",
        "Answered yes where no was right.",
        None,
    )
    assert analysis.usage["requests"] == 2
    assert failed.task.instruction in stub.everything_sent()
    assert "tool-misuse" in stub.requests[0]["messages"][0]["content"]

    sealed = Trial.objects.filter(candidate=experiment.seed_candidate, split="sealed").first()
    assert sealed is not None
    before = len(stub.requests)
    with pytest.raises(ValueError, match="sealed split"):
        analyse_failure(sealed, params=stub.params())
    assert len(stub.requests) == before


# --- The LLM critic and the proposer's usage inside the loop ---------------------------------------------


def llm_critic_recipe(stub: Stub, **critic_params: Any) -> Any:
    data = recipe_to_dict(tiny_llm_recipe(stub))
    data.update(candidates_per_round=1)
    data["critique"] = {
        **data["critique"],
        "operator": "llm",
        "leakage_policy": "review",
        "params": stub.params(**critic_params),
    }
    return parse_recipe(data, known_operators=operators.known_operators())


def critic_or_proposer(critic: Reply) -> Any:
    edit = "--- a/default.txt\n+++ b/default.txt\n@@ -1 +1 @@\n-yes\n+yes, about t03\n"

    def respond(request: dict[str, Any]) -> Reply:
        if "benchmark leakage" in request["messages"][0]["content"]:
            return critic
        return answer({"component": "prompt", "hypothesis": "Name the task.", "diff": edit})

    return respond


@pytest.mark.django_db
def test_the_loop_runs_the_recipes_llm_critic_and_records_the_proposers_usage(stub: Stub) -> None:
    flag = {"rule": "task_id", "path": "default.txt", "matched": "t03", "task": "t03", "evidence": "a task id"}
    stub.responder = critic_or_proposer(completion(json.dumps({"flags": [flag]})))
    run = drive(lifecycle.run_create(experiment=make_tiny_experiment(tasks=8, k=1), recipe=llm_critic_recipe(stub)))
    candidate = Candidate.objects.get(run=run, label="r1s0")
    assert candidate.state == Candidate.State.FLAGGED
    flags = list(candidate.leakage_flags.values_list("rule", "matched", "evidence"))
    assert [(rule, matched, evidence["evidence"]) for rule, matched, evidence in flags] == [
        ("task_id", "t03", "llm: a task id")
    ]
    assert run.state["proposer_usage"]["1"]["0"]["prompt_tokens"] == 100
    assert run.tokens_spent > 0 and run.tokens_spent != 100  # the policy's tokens, counted apart


@pytest.mark.django_db
def test_a_critic_that_cannot_answer_holds_the_candidate_for_a_person(stub: Stub) -> None:
    stub.responder = critic_or_proposer(Reply(status=503, body={"error": "down"}))
    recipe = llm_critic_recipe(stub, max_retries=1)
    run = drive(lifecycle.run_create(experiment=make_tiny_experiment(tasks=8, k=1), recipe=recipe))
    candidate = Candidate.objects.get(run=run, label="r1s0")
    assert candidate.state == Candidate.State.FLAGGED
    flag = candidate.leakage_flags.get()
    assert flag.rule == "critic_unavailable" and "llm critic failed" in flag.evidence["evidence"]
    assert not candidate.evaluations.exists()
