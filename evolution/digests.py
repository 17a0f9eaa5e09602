"""Canonical serialization and the digests everything else binds to.

Pure functions, no ORM. Every digest is SHA-256 over RFC 8785 canonical JSON
(or raw bytes for blobs), hex-encoded, so a record can be re-verified by any
tool that implements RFC 8785.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON-compatible value."""
    return rfc8785.dumps(value)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_digest(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def hmac_hex(key: str, message: str) -> str:
    """HMAC-SHA-256 of ``message`` under ``key``, hex-encoded."""
    # A copy of the keyed state: the key is hashed once, not for every message
    # (a chain of 100,000 records checks 100,000 signatures under one key).
    mac = _keyed(key).copy()
    mac.update(message.encode())
    return mac.hexdigest()


@functools.lru_cache(maxsize=16)
def _keyed(key: str) -> hmac.HMAC:
    # Never updated: every use works on a copy, so threads may share it.
    return hmac.new(key.encode(), digestmod=hashlib.sha256)


def blob_digest(data: bytes) -> str:
    return sha256_hex(data)


def tree_digest(entries: Iterable[tuple[str, str, str]]) -> str:
    """Merkle digest of a tree from its (path, mode, blob digest) entries.

    Order-independent (entries are sorted by path), so the same files always
    give the same digest. An empty tree has a digest too.
    """
    rows = sorted((path, mode, digest) for path, mode, digest in entries)
    return json_digest({"kind": "tree/1", "entries": [list(row) for row in rows]})


def task_digest(
    *,
    benchmark: str,
    external_id: str,
    instruction: str,
    public_files: str | None,
    expected: Any,
    criteria: Any,
) -> str:
    """Digest of everything that defines a task, private data included."""
    return json_digest(
        {
            "kind": "task/1",
            "benchmark": benchmark,
            "id": external_id,
            "instruction": instruction,
            "public_files": public_files,
            "expected": expected,
            "criteria": criteria,
        }
    )


def task_set_digest(split: str, task_digests: Mapping[str, str]) -> str:
    """Digest of one split's task set: task ids mapped to their task digests."""
    return json_digest({"kind": "task-set/1", "split": split, "tasks": dict(sorted(task_digests.items()))})


def evaluator_digest(
    *,
    files_tree: str,
    runner_argv: Sequence[str],
    verifier_argv: Sequence[str],
    env_allowlist: Sequence[str],
    timeout_seconds: int,
    limits: Mapping[str, Any],
    sandbox_profile: str,
    agent_network: bool = False,
) -> str:
    """Digest of the evaluator as it ran: its files, commands, environment
    allow-list, limits, whether its agent kept the network and the sandbox
    profile actually used. ``agent_network`` enters only when true, so the
    digests of evaluators without it are what they were before it existed."""
    return json_digest(
        {
            **({"agent_network": True} if agent_network else {}),
            "kind": "evaluator/1",
            "files": files_tree,
            "runner": list(runner_argv),
            "verifier": list(verifier_argv),
            "env_allowlist": sorted(env_allowlist),
            "timeout_seconds": timeout_seconds,
            "limits": dict(limits),
            "sandbox_profile": sandbox_profile,
        }
    )
