"""The ``command`` proposer: an external program edits a copy of the parent.

The external program is a small Python script. When the tests run as root the
sandbox runs it as an unprivileged uid, so the script lives in a folder that user can
read (pytest's ``tmp_path`` is 0700 under root) and runs with an interpreter
outside ``/root``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolution import operators
from evolution.operators import EditDeclaration, LedgerView, ProposerView, TrialEvidence
from evolution.proposers import ProposerError, command_proposer, prompt_text
from evolution.sandbox import first_blocked

PARENT = {
    "prompts/system.md": b"# Agent\n\nBe brief.\n",
    "config.toml": b'model = "m"\ntemperature = 0.9\n',
    "tools/lookup.toml": b'name = "lookup"\n',
}
COMPONENTS = {"prompts/system.md": "prompt", "config.toml": "config", "tools/lookup.toml": "client_tool"}
EVIDENCE = [
    TrialEvidence(
        task_id="ticket-17",
        instruction="Refund order Q-4411 for Wenceslas Oyelaran.",
        index=0,
        passed=False,
        score=0.5,
        criteria=[{"id": "tool", "met": True}, {"id": "arg:order_id", "met": False}],
        error="",
        trajectory=[
            {"step_id": 1, "source": "user", "message": "Refund order Q-4411", "tool_calls": [], "observation": {}},
            {
                "step_id": 2,
                "source": "agent",
                "message": "Submitting refund_order.",
                "tool_calls": [
                    {"tool_call_id": "call_1", "function_name": "refund_order", "arguments": {"order_id": "Q4411"}}
                ],
                "observation": {"results": [{"source_call_id": "call_1", "content": "answer written"}]},
            },
        ],
    )
]
LEDGER = [LedgerView(round=1, component="prompt", hypothesis="Shouting helps.", delta_score=-0.02, delta_cost=0.1,
                     accepted=False)]  # fmt: skip

EDIT_SCRIPT = """
import json, os, pathlib, sys
prompt = pathlib.Path(".rsi/prompt.md").read_text()
pathlib.Path("prompts/system.md").write_text(pathlib.Path("prompts/system.md").read_text() + "Check every argument.\\n")
manifest = pathlib.Path(sys.argv[1])
manifest.write_text(json.dumps({
    "edits": [{"component": "prompt", "hypothesis": "A reminder to check arguments reduces invalid calls.",
               "paths": ["prompts/system.md"]}],
    "note": "workspace " + os.getcwd(),
    "usage": {"input_tokens": 120, "output_tokens": 30},
}))
"""


def run_python() -> str:
    """An interpreter the sandbox user can execute (a pyenv under /root is out of its reach)."""
    if os.geteuid() != 0:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(candidate) and first_blocked(Path(os.path.realpath(candidate))) is None:
            return candidate
    pytest.fail("no Python interpreter on this machine is executable by an unprivileged uid")


@pytest.fixture
def scripts() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rsi-proposer-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def script(folder: Path, body: str, name: str = "propose.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    path.chmod(0o644)
    return path


def view(params: dict[str, Any], *, budget: int | None = 2, explore: list[str] | None = None) -> ProposerView:
    return ProposerView(
        round=3,
        slot=1,
        seed=11,
        parent_files=PARENT,
        components=COMPONENTS,
        evidence=EVIDENCE,
        ledger=LEDGER,
        edit_budget=budget,
        stalled=bool(explore),
        explore_components=explore or [],
        pruning_targets=["config"],
        params=params,
    )


def run(folder: Path, body: str, **params: Any) -> operators.Proposal:
    path = script(folder, body)
    argv = params.pop("argv", [run_python(), str(path), "{manifest}"])
    return command_proposer(view({"argv": argv, "timeout_seconds": 20, **params}))


def test_importing_proposers_registers_command_and_example() -> None:
    assert operators.get("proposal", "command") is command_proposer
    assert operators.get("proposal", "example").__module__ == "evolution.example.proposer"


def test_command_proposer_returns_the_edited_files_and_the_manifest(scripts: Path) -> None:
    proposal = run(scripts, EDIT_SCRIPT)

    assert proposal.files == {**PARENT, "prompts/system.md": b"# Agent\n\nBe brief.\nCheck every argument.\n"}
    assert list(proposal.edits) == [
        EditDeclaration(
            component="prompt",
            hypothesis="A reminder to check arguments reduces invalid calls.",
            paths=["prompts/system.md"],
        )
    ]
    assert dict(proposal.usage) == {"input_tokens": 120, "output_tokens": 30}
    workspace = Path(proposal.note.removeprefix("workspace "))
    assert workspace.name.startswith("rsi-proposer-")
    # The temporary copy is gone once the proposal is read back.
    assert not workspace.exists()


def test_command_proposer_fills_the_placeholders_and_passes_only_the_allowed_environment(scripts: Path) -> None:
    body = """
    import json, os, pathlib, sys
    workspace, prompt, manifest = sys.argv[1:4]
    pathlib.Path("env.json").write_text(json.dumps(
        {"env": sorted(os.environ), "token": os.environ.get("AGENT_TOKEN"), "cwd": os.getcwd(),
         "workspace": workspace, "prompt_exists": pathlib.Path(prompt).is_file(),
         "in_rsi": pathlib.Path(manifest).parent.name}))
    pathlib.Path(manifest).write_text(json.dumps({"edits": []}))
    """
    path = script(scripts, body)
    os.environ["RSI_TEST_SECRET"] = "must not leak"
    try:
        proposal = command_proposer(
            view({
                "argv": [run_python(), str(path), "{workspace}", "{prompt}", "{manifest}"],
                "env_allowlist": ["LANG"],
                "env": {"AGENT_TOKEN": "t-123"},
            })
        )  # fmt: skip
    finally:
        del os.environ["RSI_TEST_SECRET"]

    seen = json.loads(proposal.files["env.json"])
    assert set(seen["env"]) <= {"LANG", "AGENT_TOKEN", "PWD", "LC_CTYPE"}
    assert "RSI_TEST_SECRET" not in seen["env"]
    assert seen["token"] == "t-123"
    assert seen["workspace"] == seen["cwd"]
    assert seen["prompt_exists"] is True
    assert seen["in_rsi"] == ".rsi"
    assert list(proposal.edits) == []
    assert set(proposal.files) == {*PARENT, "env.json"}


def test_prompt_file_holds_the_train_evidence_budget_ledger_and_targets(scripts: Path) -> None:
    body = """
    import json, pathlib, shutil, sys
    shutil.copy(".rsi/prompt.md", "prompt-copy.md")
    shutil.copy(".rsi/view.json", "view-copy.json")
    pathlib.Path(sys.argv[1]).write_text(json.dumps({"edits": []}))
    """
    proposal = run(scripts, body)

    prompt = proposal.files["prompt-copy.md"].decode()
    assert "Budget: at most 2 atomic edit(s) in this round." in prompt
    assert "### ticket-17 #0: failed, score 0.5" in prompt
    assert "Refund order Q-4411 for Wenceslas Oyelaran." in prompt
    assert '- call refund_order {"order_id": "Q4411"}' in prompt
    assert '{"id": "arg:order_id", "met": false}' in prompt
    # The verdict column: rejected by a rule (refuted), apart from admissible but not chosen.
    assert "| 1 | prompt | rejected | -0.0200 | +0.1000 | Shouting helps. |" in prompt
    assert "an admissible one that was not chosen is not refuted" in prompt
    assert "consider removing what they add: config." in prompt
    assert "| `tools/lookup.toml` | client_tool |" in prompt
    assert ".rsi/edits.json" in prompt
    assert prompt == prompt_text(view({}))
    document = json.loads(proposal.files["view-copy.json"])
    assert document["edit_budget"] == 2
    assert document["evidence"][0]["trajectory"][1]["tool_calls"][0]["arguments"] == {"order_id": "Q4411"}
    assert document["components"] == COMPONENTS
    # Params can hold credentials for the program's environment: never written to disk.
    assert "params" not in document


def test_prompt_names_the_kinds_to_explore_and_an_unlimited_budget() -> None:
    prompt = prompt_text(view({}, budget=None, explore=["memory", "skill"]))

    assert "Budget: no limit on the number of atomic edits in this round." in prompt
    assert "at least one edit must touch one of these component kinds: memory, skill." in prompt


def test_nonzero_exit_is_a_proposer_error_with_the_programs_stderr(scripts: Path) -> None:
    body = """
    import pathlib, sys
    pathlib.Path("prompts/system.md").write_text("half-done")
    print("model quota exhausted", file=sys.stderr)
    sys.exit(3)
    """
    with pytest.raises(ProposerError, match=r"^the proposer command exited with status 3: model quota exhausted$"):
        run(scripts, body)


def test_timeout_is_a_proposer_error(scripts: Path) -> None:
    body = """
    import time
    time.sleep(30)
    """
    with pytest.raises(ProposerError, match=r"^the proposer command timed out after 1 s"):
        run(scripts, body, timeout_seconds=1)


def test_missing_manifest_is_a_proposer_error(scripts: Path) -> None:
    body = """
    import pathlib
    pathlib.Path("prompts/system.md").write_text("edited, but nothing declared")
    """
    with pytest.raises(ProposerError, match=r"^the program wrote no manifest \.rsi/edits\.json$"):
        run(scripts, body)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("{not json", r"^manifest \.rsi/edits\.json is not valid JSON: "),
        ('{"edits": {"component": "prompt"}}', r'^manifest \.rsi/edits\.json must be an object with a list "edits"$'),
        ('{"edits": [{"component": "prompt", "paths": ["prompts/system.md"]}]}',
         r'^manifest edit 0: "hypothesis" must be a non-empty string$'),
        ('{"edits": [{"component": "prompt", "hypothesis": "h", "paths": "prompts/system.md"}]}',
         r'^manifest edit 0: "paths" must be a non-empty list of strings$'),
        ('{"edits": [], "note": 5}', r'^manifest \.rsi/edits\.json: "note" must be a string$'),
        ('{"edits": ' + "[" * 100_000 + "]" * 100_000 + "}",
         r"^manifest \.rsi/edits\.json is nested more than 100 levels deep \(RSI_MAX_INPUT_DEPTH\)$"),
    ],
)  # fmt: skip
def test_malformed_manifest_is_a_proposer_error(scripts: Path, manifest: str, message: str) -> None:
    body = f"""
    import pathlib, sys
    pathlib.Path(sys.argv[1]).write_text({manifest!r})
    """
    with pytest.raises(ProposerError, match=message):
        run(scripts, body)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/etc/passwd", r"symlink target '/etc/passwd' is absolute"),
        ("../../../../etc/passwd", r"points outside the tree"),
    ],
)
def test_symlink_leaving_the_workspace_is_a_proposer_error(scripts: Path, target: str, message: str) -> None:
    body = f"""
    import json, os, pathlib, sys
    os.symlink({target!r}, "prompts/extra.md")
    pathlib.Path(sys.argv[1]).write_text(json.dumps({{"edits": [
        {{"component": "prompt", "hypothesis": "More context helps.", "paths": ["prompts/extra.md"]}}]}}))
    """
    with pytest.raises(ProposerError, match=r"^the workspace cannot be read back: prompts/extra\.md: .*" + message):
        run(scripts, body)


def test_symlink_inside_the_workspace_is_refused_too(scripts: Path) -> None:
    body = """
    import json, os, pathlib, sys
    os.symlink("system.md", "prompts/alias.md")
    pathlib.Path(sys.argv[1]).write_text(json.dumps({"edits": []}))
    """
    with pytest.raises(ProposerError, match=r"^prompts/alias\.md: symlinks are not allowed in a proposal$"):
        run(scripts, body)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"argv": []}, r'^params "argv" must be a non-empty list of strings$'),
        ({"argv": "python propose.py"}, r'^params "argv" must be a non-empty list of strings$'),
        ({"argv": ["true"], "timeout_seconds": 0}, r'^params "timeout_seconds" must be a positive number, not 0$'),
        ({"argv": ["true"], "limits": {"cpu": 1}}, r"^params \"limits\": unknown limit 'cpu'"),
    ],
)
def test_bad_params_are_a_proposer_error(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ProposerError, match=message):
        command_proposer(view(params))


def test_a_program_that_cannot_start_is_a_proposer_error() -> None:
    with pytest.raises(ProposerError, match=r"^the proposer command exited with status 127: "):
        command_proposer(view({"argv": ["/nonexistent/agent-cli", "{prompt}"], "timeout_seconds": 5}))
