"""ATIF v1.x: validation like Harbor's reference validator (required fields
and their types, ``step_id`` sequential from 1, ``source`` one of
system/user/agent, agent-only fields only on agent steps, ISO 8601
timestamps, each observation's ``source_call_id`` naming a tool call of the
same step), continuations joined, subagent trajectories named. Unknown
fields are kept (step-level ones end up in the stored step's ``extra``,
top-level ones in the trajectory's ``extra["document_fields"]``). ATIF v1.0
to v1.7 are read (``session_id`` is optional from v1.7, and
``trajectory_id`` may stand for it; v1.7's embedded
``subagent_trajectories`` are validated too)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from evolution.formats.common import (
    AGENT_ONLY,
    ROOT_FIELDS,
    SOURCES,
    TrajectoryFormatError,
    content_text,
    is_iso8601,
    type_name,
)

_VERSION_RE = re.compile(r"^ATIF-v1\.(\d+)$")
_STEP_INT_METRICS = ("prompt_tokens", "completion_tokens", "cached_tokens")
_FINAL_INT_METRICS = ("total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_steps")


def join_continuations(
    head: dict[str, Any], fetch: Callable[[str], Any], *, name: str = "the trajectory"
) -> tuple[dict[str, Any], list[str]]:
    """One ATIF document of ``head`` and the files its
    ``continued_trajectory_ref`` chain names, each got by ``fetch(ref)``
    (which raises KeyError when there is no such file), and the names read.

    A continuation restarts its step ids at 1 (Harbor's terminus-2 does):
    the joined steps are numbered on, each continuation step keeping its
    file and own id in ``extra["continuation"]``. The final metrics are the
    last file's (Harbor writes running totals). TrajectoryFormatError when a
    reference is not a plain file name, is missing, loops, or its file is
    not an ATIF object."""
    files: list[str] = []
    document = dict(head)
    steps = list(head.get("steps") or []) if isinstance(head.get("steps"), list) else []
    current, where = head, name
    while current.get("continued_trajectory_ref"):
        ref = current["continued_trajectory_ref"]
        if not isinstance(ref, str) or not ref or "/" in ref or "\\" in ref or ref in (".", ".."):
            raise TrajectoryFormatError(
                [f"{where}: continued_trajectory_ref must name a file in the same folder, got {ref!r}"]
            )
        if ref in files or len(files) >= 1000:
            raise TrajectoryFormatError([f"{where}: continued_trajectory_ref {ref!r} makes a loop"])
        try:
            following = fetch(ref)
        except KeyError:
            raise TrajectoryFormatError(
                [f"{where}: its continuation {ref!r} is missing (give the files of the trajectory together)"]
            ) from None
        if not isinstance(following, dict) or not isinstance(following.get("steps"), list):
            raise TrajectoryFormatError([f"{ref}: must be an ATIF object with steps, got {type_name(following)}"])
        files.append(ref)
        for step in following["steps"]:
            if isinstance(step, dict):
                marked = {**step, "step_id": len(steps) + 1}
                own_extra = step.get("extra")
                marked["extra"] = {
                    **(own_extra if isinstance(own_extra, dict) else {}),
                    "continuation": {"file": ref, "step_id": step.get("step_id")},
                }
                steps.append(marked)
            else:
                steps.append(step)
        if following.get("final_metrics") is not None:
            document["final_metrics"] = following["final_metrics"]
        current, where = following, ref
    if files:
        document.pop("continued_trajectory_ref", None)
        document["steps"] = steps
        document_extra = document.get("extra")
        extra = document_extra if isinstance(document_extra, dict) else {}
        document["extra"] = {**extra, "continuation_files": files}
    return document, files


def subagent_refs(document: Any) -> list[str]:
    """The ``trajectory_path`` of each subagent trajectory a document's
    observations name, in order, once each."""
    paths: list[str] = []
    steps = document.get("steps") if isinstance(document, dict) else None
    for step in steps if isinstance(steps, list) else []:
        observation = step.get("observation") if isinstance(step, dict) else None
        results = observation.get("results") if isinstance(observation, dict) else None
        for result in results if isinstance(results, list) else []:
            refs = result.get("subagent_trajectory_ref") if isinstance(result, dict) else None
            for ref in refs if isinstance(refs, list) else []:
                path = ref.get("trajectory_path") if isinstance(ref, dict) else None
                if isinstance(path, str) and path and path not in paths:
                    paths.append(path)
    return paths


_KIND_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "number": (int, float),
    "dict": dict,
    "list": list,
    "bool": bool,
}
_KIND_WANTED = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "dict": "an object",
    "list": "a list",
    "bool": "true or false",
}


class _Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def expect(self, container: dict[str, Any], key: str, path: str, kind: str, *, required: bool = False) -> bool:
        """True when ``container[key]`` is present (not null) and of ``kind``."""
        value = container.get(key)
        if value is None:
            if required:
                where = f"{path}.{key}" if path else key
                self.fail(where, "is required" if key not in container else "must not be null")
            return False
        # A boolean is an int to Python, not to JSON. Called some ten times a
        # step, so the path is only spelled out for an error.
        if isinstance(value, _KIND_TYPES[kind]) and (value.__class__ is not bool or kind == "bool"):
            return True
        where = f"{path}.{key}" if path else key
        self.fail(where, f"must be {_KIND_WANTED[kind]}, got {type_name(value)}")
        return False

    def counts(self, container: dict[str, Any], path: str, int_keys: tuple[str, ...], cost_key: str) -> None:
        for key in int_keys:
            if self.expect(container, key, path, "int") and container[key] < 0:
                self.fail(f"{path}.{key}", "must not be negative")
        if self.expect(container, cost_key, path, "number") and container[cost_key] < 0:
            self.fail(f"{path}.{cost_key}", "must not be negative")


def validate_atif(document: Any, *, deviations: list[str] | None = None, where: str = "") -> dict[str, Any]:
    """The normalized copy of an ATIF v1.x document; TrajectoryFormatError listing every problem.

    With ``deviations`` (a list, the lenient import) a step at fault is kept
    as a step with its text, the original in its ``extra["off_spec"]``, and
    each problem is appended to ``deviations`` instead of raised; problems
    outside the steps are still raised. ``where`` prefixes the paths (an
    embedded subagent trajectory's)."""
    check = _Checker()
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"{where or 'document'}: must be a JSON object, got {type_name(document)}"])
    if check.expect(document, "schema_version", "", "str", required=True) and not _VERSION_RE.match(
        document["schema_version"]
    ):
        check.fail("schema_version", f"must be ATIF-v1.x, got {document['schema_version']!r}")
    # ATIF v1.7 made session_id optional (trajectory_id may name the
    # trajectory instead); before it, trajectory_id may stand for it.
    optional_session = _minor_version(document.get("schema_version")) >= 7
    if optional_session:
        check.expect(document, "session_id", "", "str")
        check.expect(document, "trajectory_id", "", "str")
    elif document.get("trajectory_id") is None or document.get("session_id") is not None:
        check.expect(document, "session_id", "", "str", required=True)
    else:
        check.expect(document, "trajectory_id", "", "str", required=True)
    if check.expect(document, "agent", "", "dict", required=True):
        agent = document["agent"]
        check.expect(agent, "name", "agent", "str", required=True)
        check.expect(agent, "version", "agent", "str", required=True)
        check.expect(agent, "model_name", "agent", "str")
        check.expect(agent, "tool_definitions", "agent", "list")
        check.expect(agent, "extra", "agent", "dict")
    check.expect(document, "notes", "", "str")
    check.expect(document, "extra", "", "dict")
    check.expect(document, "continued_trajectory_ref", "", "str")
    if check.expect(document, "final_metrics", "", "dict"):
        check.counts(document["final_metrics"], "final_metrics", _FINAL_INT_METRICS, "total_cost_usd")
    steps: list[Any] = []
    if check.expect(document, "steps", "", "list", required=True):
        steps = list(document["steps"])
        if not steps:
            check.fail("steps", "must hold at least one step")
    for index, step in enumerate(steps):
        before = len(check.errors)
        _validate_step(check, step, index)
        if deviations is not None and len(check.errors) > before:
            deviations.extend(f"{where}{error}" for error in check.errors[before:])
            del check.errors[before:]
            steps[index] = _salvaged(step, index)
    subagents: list[dict[str, Any]] = []
    if check.expect(document, "subagent_trajectories", "", "list"):
        for number, embedded in enumerate(document["subagent_trajectories"]):
            try:
                subagents.append(
                    validate_atif(embedded, deviations=deviations, where=f"{where}subagent_trajectories[{number}].")
                )
            except TrajectoryFormatError as exc:
                check.errors.extend(exc.errors)
    if check.errors:
        raise TrajectoryFormatError([f"{where}{error}" for error in check.errors] if where else check.errors)

    normalized = {key: document[key] for key in ROOT_FIELDS if document.get(key) is not None}
    unknown = {
        key: value for key, value in document.items() if key not in ROOT_FIELDS and key != "subagent_trajectories"
    }
    if document.get("session_id") is None and isinstance(document.get("trajectory_id"), str):
        normalized["session_id"] = document["trajectory_id"]
    if unknown:
        normalized["extra"] = {**normalized.get("extra", {}), "document_fields": unknown}
    if subagents:
        normalized["extra"] = {**normalized.get("extra", {}), "subagent_trajectories": subagents}
    normalized["steps"] = [dict(step) for step in steps]
    return normalized


def _minor_version(version: Any) -> int:
    """The x of an ``ATIF-v1.x`` version, -1 for anything else."""
    match = _VERSION_RE.match(version) if isinstance(version, str) else None
    return int(match.group(1)) if match else -1


def _salvaged(step: Any, index: int) -> dict[str, Any]:
    """A valid step keeping what can be read of an off-spec ``step``: its
    source when it is one of SOURCES (else system), its message's text (else
    the step as JSON), and the whole original in ``extra["off_spec"]``."""
    if not isinstance(step, dict):
        return {"step_id": index + 1, "source": "system", "message": json.dumps(step), "extra": {"off_spec": step}}
    source = step.get("source") if step.get("source") in SOURCES else "system"
    message = step.get("message")
    text = message if isinstance(message, str) else content_text(message) if isinstance(message, list) else ""
    salvaged: dict[str, Any] = {
        "step_id": index + 1,
        "source": source,
        "message": text or json.dumps(step, default=str)[:100_000],
        "extra": {"off_spec": step},
    }
    if isinstance(step.get("timestamp"), str) and is_iso8601(step["timestamp"]):
        salvaged["timestamp"] = step["timestamp"]
    return salvaged


def _validate_step(check: _Checker, step: Any, index: int) -> None:
    path = f"steps[{index}]"
    if not isinstance(step, dict):
        check.fail(path, f"must be an object, got {type_name(step)}")
        return
    if check.expect(step, "step_id", path, "int", required=True) and step["step_id"] != index + 1:
        check.fail(f"{path}.step_id", f"expected {index + 1} (step ids are sequential from 1), got {step['step_id']}")
    if check.expect(step, "source", path, "str", required=True) and step["source"] not in SOURCES:
        check.fail(f"{path}.source", f"must be one of {', '.join(SOURCES)}, got {step['source']!r}")
    if check.expect(step, "timestamp", path, "str") and not is_iso8601(step["timestamp"]):
        check.fail(f"{path}.timestamp", f"is not an ISO 8601 date-time: {step['timestamp']!r}")
    message = step.get("message")
    if "message" not in step:
        check.fail(f"{path}.message", "is required")
    elif not isinstance(message, str | list):
        check.fail(f"{path}.message", f"must be a string or a list of content parts, got {type_name(message)}")
    check.expect(step, "model_name", path, "str")
    check.expect(step, "reasoning_content", path, "str")
    check.expect(step, "extra", path, "dict")
    if step.get("source") in SOURCES and step.get("source") != "agent":
        for key in AGENT_ONLY:
            if step.get(key) is not None:
                source = step["source"]
                check.fail(f"{path}.{key}", f"is only allowed on agent steps (this step's source is {source!r})")
    if check.expect(step, "metrics", path, "dict"):
        check.counts(step["metrics"], f"{path}.metrics", _STEP_INT_METRICS, "cost_usd")
    call_ids: set[str] = set()
    if check.expect(step, "tool_calls", path, "list"):
        for number, call in enumerate(step["tool_calls"]):
            where = f"{path}.tool_calls[{number}]"
            if not isinstance(call, dict):
                check.fail(where, f"must be an object, got {type_name(call)}")
                continue
            if check.expect(call, "tool_call_id", where, "str", required=True):
                if call["tool_call_id"] in call_ids:
                    check.fail(f"{where}.tool_call_id", f"{call['tool_call_id']!r} is used twice in this step")
                call_ids.add(call["tool_call_id"])
            check.expect(call, "function_name", where, "str", required=True)
            check.expect(call, "arguments", where, "dict", required=True)
    if check.expect(step, "observation", path, "dict"):
        observation = step["observation"]
        where = f"{path}.observation"
        if check.expect(observation, "results", where, "list", required=True):
            for number, result in enumerate(observation["results"]):
                at = f"{where}.results[{number}]"
                if not isinstance(result, dict):
                    check.fail(at, f"must be an object, got {type_name(result)}")
                    continue
                if check.expect(result, "source_call_id", at, "str") and result["source_call_id"] not in call_ids:
                    check.fail(
                        f"{at}.source_call_id",
                        f"{result['source_call_id']!r} does not name a tool call of step {step.get('step_id')}",
                    )
                content = result.get("content")
                if content is not None and not isinstance(content, str | list):
                    wanted = "a string or a list of content parts"
                    check.fail(f"{at}.content", f"must be {wanted}, got {type_name(content)}")
                check.expect(result, "subagent_trajectory_ref", at, "list")
