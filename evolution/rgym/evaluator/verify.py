"""Grade one trial of the reasoning-gym benchmark with the package's own verifier.

    verify.py --output DIR --expected FILE

FILE is JSON ``{"expected": {"family", "seed", "version", "entry"}, "criteria": [{"id": "answer"}]}``:
``entry`` is the generator's item (question, answer, metadata) that
``reasoning_gym.get_score_answer_fn(family)`` scores. Prints one JSON object
``{"passed", "score", "criteria": [{"id", "met"}], "valid_output", "submitted"}``:
score is reasoning-gym's score of ``answer.txt`` (0 to 1), passed means a
score of 1. Exit status 2, with ``{"error"}``, when the expected file is
unusable or the installed reasoning-gym is not the version the task was
drawn with (its answers could differ).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def grade(output_dir: Path, expected_doc: dict[str, Any]) -> dict[str, Any]:
    expected = expected_doc.get("expected")
    if not isinstance(expected, dict) or not isinstance(expected.get("entry"), dict):
        raise ValueError("expected file needs an object `expected` with an object `entry`")
    installed = metadata.version("reasoning-gym")
    if expected.get("version") != installed:
        raise ValueError(f"the task was drawn with reasoning-gym {expected.get('version')}, {installed} is installed")
    import reasoning_gym  # slow (about a second): it imports every generator of the package

    path = output_dir / "answer.txt"
    submitted = path.is_file()
    answer = path.read_text(encoding="utf-8", errors="replace") if submitted else None
    score = float(reasoning_gym.get_score_answer_fn(str(expected["family"]))(answer, expected["entry"]))
    return {
        "passed": score >= 1.0,
        "score": score,
        "criteria": [{"id": "answer", "met": score >= 1.0}],
        "valid_output": submitted,
        "submitted": submitted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade one trial of the reasoning-gym benchmark.")
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
