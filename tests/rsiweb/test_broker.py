"""The embedded broker survives half-written and corrupt message files."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kombu import Connection

from rsiweb.broker import Transport


def connection(folder: Path) -> Connection:
    folder.mkdir(parents=True, exist_ok=True)
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder.parent / "control"),
        },
    )


def test_filesystem_urls_use_the_safe_transport(tmp_path: Path) -> None:
    import rsiweb.celery  # noqa: F401  (registers the alias)

    with connection(tmp_path / "queue") as conn:
        assert isinstance(conn.transport, Transport)


def test_messages_round_trip_in_order(tmp_path: Path) -> None:
    import rsiweb.celery  # noqa: F401

    name = f"jobs-{uuid.uuid4().hex[:8]}"
    with connection(tmp_path / "queue") as conn:
        queue = conn.SimpleQueue(name)
        # Many puts fall in the same millisecond, which Kombu's own names could not order.
        for number in range(200):
            queue.put({"n": number})
        received = []
        for _ in range(200):
            message = queue.get(timeout=1)
            message.ack()
            received.append(message.payload["n"])
        assert received == list(range(200))
        queue.close()
    assert [p.name for p in (tmp_path / "queue").iterdir() if p.name.endswith(".msg")] == []


def test_a_truncated_message_is_moved_aside_and_the_next_one_is_delivered(tmp_path: Path) -> None:
    import rsiweb.celery  # noqa: F401

    folder = tmp_path / "queue"
    # kombu keeps exchange bindings per process: a fresh queue name per test.
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    with connection(folder) as conn:
        queue = conn.SimpleQueue(name)
        # What a publisher killed mid-write leaves behind, sorted before the good one.
        dead = f"{0:020d}_dead.{name}.msg"
        (folder / dead).write_bytes(b'{"body": "eyJ')
        queue.put({"n": 1})
        message = queue.get(timeout=1)
        message.ack()
        assert message.payload == {"n": 1}
        queue.close()
    assert (tmp_path / "corrupt" / dead).read_bytes() == b'{"body": "eyJ'


def test_a_message_being_written_is_invisible(tmp_path: Path) -> None:
    import rsiweb.celery  # noqa: F401

    folder = tmp_path / "queue"
    # kombu keeps exchange bindings per process: a fresh queue name per test.
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    with connection(folder) as conn:
        queue = conn.SimpleQueue(name)
        (folder / f".1_x.{name}.msg.tmp").write_bytes(b"{partial")
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)
        queue.close()
    assert (folder / f".1_x.{name}.msg.tmp").exists()
