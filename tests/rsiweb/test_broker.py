"""The embedded broker survives half-written and corrupt message files;
the Redis transport sends every command through one client."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from rsiweb.broker import RedisChannel, RedisTransport, Transport


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


def round_trip(queue: Any, count: int, *, timeout: float) -> list[int]:
    """Put ``count`` numbered messages on ``queue``, then get and ack them: their numbers, in order."""
    for number in range(count):
        queue.put({"n": number})
    received = []
    for _ in range(count):
        message = queue.get(timeout=timeout)
        message.ack()
        received.append(message.payload["n"])
    return received


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
        assert round_trip(queue, 200, timeout=1) == list(range(200))
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


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/15", "rediss://127.0.0.1:6380/15"])
def test_redis_urls_use_the_transport_with_one_client(url: str) -> None:
    import rsiweb.celery  # noqa: F401  (registers the aliases)

    # Resolving the transport connects to nothing.
    assert isinstance(Connection(url).transport, RedisTransport)


def _count_clients(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The clients the channels build, in order."""
    built: list[object] = []
    create = RedisChannel._create_client

    def counting(self: RedisChannel, asynchronous: bool = False) -> object:
        client = create(self, asynchronous)
        if not asynchronous:
            built.append(client)
        return client

    monkeypatch.setattr(RedisChannel, "_create_client", counting)
    return built


def test_redis_publishes_delivers_and_acks_through_one_client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    import rsiweb.celery  # noqa: F401

    built = _count_clients(monkeypatch)
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    with Connection(redis_url) as conn:
        queue = conn.SimpleQueue(name)
        received = round_trip(queue, 50, timeout=2)
        channel = queue.channel
        assert isinstance(channel, RedisChannel)
        # Kombu's own channel built 202 here: about one a command.
        assert len(built) == 1
        assert received == list(range(50))
        # The acks went through the shared client: nothing is left unacknowledged.
        server = redis.Redis.from_url(redis_url)
        assert server.zcard(channel.unacked_index_key) == 0
        assert server.hlen(channel.unacked_key) == 0
        assert server.llen(name) == 0
        queue.close()


def test_redis_builds_a_new_client_for_the_pool_made_after_a_fork(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rsiweb.celery  # noqa: F401

    built = _count_clients(monkeypatch)
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    with Connection(redis_url) as conn:
        queue = conn.SimpleQueue(name)
        queue.put({"n": 1})
        channel = queue.channel
        assert isinstance(channel, RedisChannel)
        old_pool = channel.pool
        # What Kombu does in a forked child: the parent's connections are dropped.
        channel._after_fork()
        queue.put({"n": 2})
        message = queue.get(timeout=2)
        message.ack()
        assert message.payload == {"n": 1}
        assert queue.get(timeout=2).payload == {"n": 2}
        assert len(built) == 2
        assert built[0].connection_pool is old_pool  # type: ignore[attr-defined]
        assert built[1].connection_pool is channel.pool  # type: ignore[attr-defined]
        assert channel.pool is not old_pool
        queue.close()
