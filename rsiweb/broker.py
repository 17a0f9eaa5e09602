"""Kombu's transports as rsiweb uses them.

The embedded (server-less) broker: Kombu's file-system transport, made safe.

Kombu's transport writes a message file in place, so a consumer can pick up
a file whose writer is still writing (or was killed mid-write), and one
unreadable file then crashes every worker that reads it. Here a message is
written under a hidden temporary name and renamed into place (atomic on one
file system), and a message that cannot be decoded is moved to a
``corrupt`` folder with a log line instead of taking the worker down.
Kombu names a message by the millisecond and a random uuid, so two messages
published in the same millisecond came out in random order; here the name
starts with a zero-padded nanosecond stamp that strictly increases within a
process, so one publisher's messages are consumed in the order it sent them.
Registered for ``filesystem://`` in rsiweb.celery.

Redis: Kombu's transport with one client a channel. Registered for
``redis://`` and ``rediss://`` in rsiweb.celery.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, redis
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)

_stamp_lock = threading.Lock()
_last_stamp = 0


def message_stamp() -> str:
    """Wall-clock nanoseconds, zero-padded to sort as text, strictly
    increasing within this process (wall clock, not monotonic: queue files
    outlive a reboot)."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        return f"{_last_stamp:020d}"


class Channel(filesystem.Channel):
    # kombu's own filesystem.Channel stub ignores these two overrides of AbstractChannel too.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # as kombu's filesystem
        name = f"{message_stamp()}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        # The leading dot keeps the temporary name out of every queue's listing.
        temporary = folder / f".{name}.tmp"
        try:
            with open(temporary, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, folder / name)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ChannelError(f"cannot add message {name!r} to {folder}") from exc

    def _get(self, queue: str) -> Any:  # type: ignore[override]  # as kombu's filesystem.Channel
        suffix = f"{queue}.msg"
        folder = Path(self.data_folder_in)
        for name in sorted(os.listdir(folder)):
            if name.startswith(".") or name.partition(".")[2] != suffix:
                continue
            claimed = folder / f".{name}.{uuid.uuid4().hex}.claimed"
            try:
                # Renaming claims the file: exactly one consumer wins it.
                os.replace(folder / name, claimed)
            except OSError:
                continue
            try:
                payload = claimed.read_bytes()
                message = loads(bytes_to_str(payload))
            except (OSError, ValueError) as exc:
                corrupt = folder.parent / "corrupt"
                corrupt.mkdir(exist_ok=True)
                os.replace(claimed, corrupt / name)
                logger.error("broker: unreadable message %s moved to %s: %s", name, corrupt, exc)
                continue
            claimed.unlink(missing_ok=True)
            return message
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel


class RedisChannel(redis.Channel):
    """Kombu's Redis channel, with one client for all its commands.

    Kombu builds a new redis-py client for every command it sends outside
    the event loop: each publish, each delivery's entry in the unacked
    index and each acknowledgement. An acknowledgement's pipeline took
    1.26 ms on a new client against 0.42 ms on one used again
    (in the git history of docs/performance.md), paid on the worker's consumer
    thread, where it delays every trial slot's next message. A redis-py
    client is safe to share between threads (each command takes a
    connection from the pool), so this channel keeps one for the life of
    its pool; after a fork Kombu drops the pool, and a new client is made
    for the new one.
    """

    _shared_client: Any = None
    # Kombu's own, which its type stubs leave out.
    pool: Any
    _create_client: Callable[..., Any]
    _after_fork: Callable[[], None]

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        pool = self.pool
        if shared is None or shared.connection_pool is not pool:
            shared = self._shared_client = self._create_client()
        yield shared


class RedisTransport(redis.Transport):
    Channel = RedisChannel
