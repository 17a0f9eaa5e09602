"""The trust suite's proposer program for the Harbor-style benchmark.

Run by the ``command`` proposer (evolution/proposers.py) in a fresh copy of
the parent's files: ``python proposer_program.py <workspace> <manifest>``. It
appends one generic sentence, chosen by the round and slot in ``.rsi/view.json``,
to ``prompts/system.md`` and declares that edit. Deterministic: the same
round and slot give the same file, so a resumed run proposes exactly what an
uninterrupted one did. Standard library only (it runs as an unprivileged user).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SENTENCES = (
    "Read the whole task before choosing a skill.",
    "Check that the answer file exists before you stop.",
    "Prefer the simplest skill that fits the task.",
    "Write the answer without extra spaces or lines.",
)
PROMPT = "prompts/system.md"


def main(workspace: str, manifest: str) -> int:
    root = Path(workspace)
    view = json.loads((root / ".rsi" / "view.json").read_text())
    sentence = SENTENCES[(int(view["round"]) * 2 + int(view["slot"])) % len(SENTENCES)]
    prompt = root / PROMPT
    text = prompt.read_text()
    if sentence in text:
        Path(manifest).write_text(json.dumps({"edits": [], "note": "nothing left to add"}))
        return 0
    prompt.write_text(text.rstrip("\n") + "\n" + sentence + "\n")
    edit = {
        "component": "prompt",
        "hypothesis": f"Telling the agent: {sentence!r} avoids careless answers.",
        "paths": [PROMPT],
    }
    Path(manifest).write_text(json.dumps({"edits": [edit], "note": f"round {view['round']} slot {view['slot']}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
