"""Grade one trial of the offline support-routing example.

    verify.py --output DIR --expected FILE

FILE is JSON ``{"expected": {"tool": ..., "args": {...}}, "criteria": [{"id": ...}, ...]}``.
Criterion ids: ``tool`` (the right tool was called) and ``arg:NAME`` (argument
NAME has exactly the expected canonical value). Prints one JSON object:
``{"passed", "score", "criteria": [{"id", "met"}], "valid_output", "submitted"}``.

submitted: ``answer.json`` exists; valid_output: it is a JSON object with a
string ``tool`` and an object ``args``; score: fraction of criteria met;
passed: every criterion met. Standard library only. Exit status 0 when a
grade was printed, 2 when the expected file is unusable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ANSWER_FILE = "answer.json"


def read_answer(output_dir: Path) -> tuple[bool, dict[str, Any] | None]:
    """Return (submitted, answer or None when the output is not valid)."""
    path = output_dir / ANSWER_FILE
    if not path.is_file():
        return False, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True, None
    if not isinstance(data, dict) or not isinstance(data.get("tool"), str) or not isinstance(data.get("args"), dict):
        return True, None
    return True, data


def criterion_met(criterion_id: str, expected: dict[str, Any], answer: dict[str, Any] | None) -> bool:
    if answer is None:
        return False
    if criterion_id == "tool":
        return answer["tool"] == expected.get("tool")
    if criterion_id.startswith("arg:"):
        name = criterion_id[len("arg:") :]
        wanted = expected.get("args", {})
        # Exact match on the canonical string: "12.5" or 12.5 is not "12.50".
        return name in wanted and answer["args"].get(name) == wanted[name]
    return False


def grade(output_dir: Path, expected_doc: dict[str, Any]) -> dict[str, Any]:
    expected = expected_doc.get("expected")
    criteria = expected_doc.get("criteria")
    if not isinstance(expected, dict) or not isinstance(criteria, list) or not criteria:
        raise ValueError("expected file needs an object `expected` and a non-empty list `criteria`")
    submitted, answer = read_answer(output_dir)
    results = [{"id": str(c["id"]), "met": criterion_met(str(c["id"]), expected, answer)} for c in criteria]
    met = sum(r["met"] for r in results)
    return {
        "passed": met == len(results),
        "score": met / len(results),
        "criteria": results,
        "valid_output": answer is not None,
        "submitted": submitted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade one trial of the offline support-routing example.")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--expected", required=True, type=Path)
    options = parser.parse_args(argv)
    try:
        expected_doc = json.loads(options.expected.read_text(encoding="utf-8"))
        if not isinstance(expected_doc, dict):
            raise ValueError("expected file must hold a JSON object")
        result = grade(options.output, expected_doc)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(json.dumps({"error": f"cannot grade: {exc}"}))
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
