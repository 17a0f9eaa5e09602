"""A trial worker's ramp: the starts of slots that fill at once, spread out.

When an evaluation starts, its trial messages reach a worker whose slots are
all free, and every slot starts a trial within a fraction of a second. Trials
of one evaluation are alike, so slots that start together stay together: they
set up their sandboxes, call their tools and run their verifiers at the same
moments, round after round, and queue for the CPU and the database each time
(``bench concurrency``: 640 trials of a 2-second agent in 64 slots took 23.0
to 24.6 s started together against 22.3 to 23.2 s with the starts spread
over 2 s, the same commands alone in both, 21 runs). Started ``ramp / slots``
seconds apart, they stay apart.

A worker with none of its trials running starts its next ``slots`` trials on
that schedule: the n-th (from 0) no sooner than ``n * ramp / slots`` seconds
after the first. After them, and while any of its trials runs, nothing waits,
so a busy worker is never slowed. ``RSI_TRIAL_RAMP_SECONDS`` sets the ramp (0,
the default, turns it off); about one trial's usual duration spreads them over
a whole round. Only a Celery worker's trial slots ramp (``configure``, from the
``worker_init`` signal); a process that runs trials one at a time never waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["StartRamp", "configure", "started"]


class StartRamp:
    """The schedule of one worker process's trial starts (thread-safe)."""

    def __init__(
        self,
        *,
        seconds: float,
        slots: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if seconds < 0:
            raise ValueError(f"a ramp cannot be negative, got {seconds!r}")
        if slots < 1:
            raise ValueError(f"a worker has at least one slot, got {slots!r}")
        self.seconds = seconds
        self.slots = slots
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._running = 0  # trials between their start and their end, waiting ones included
        self._began = 0.0  # when the current ramp's first trial started
        self._ramped = slots  # starts given a place in the current ramp (slots: none is under way)

    def _place(self) -> float:
        """When the next trial may start; counts it as running."""
        with self._lock:
            now = self._clock()
            if self._running == 0:
                self._began, self._ramped = now, 0
            self._running += 1
            if self._ramped >= self.slots:
                return now
            at = self._began + self._ramped * self.seconds / self.slots
            self._ramped += 1
            return at

    def _end(self) -> None:
        with self._lock:
            self._running -= 1

    @contextmanager
    def start(self) -> Iterator[float]:
        """Wait for this trial's place, then run the body as one running trial; yields the seconds waited."""
        waited = 0.0
        if self.seconds > 0:
            at = self._place()
            waited = max(0.0, at - self._clock())
        else:
            with self._lock:
                self._running += 1
        try:
            if waited > 0:
                self._sleep(waited)
            yield waited
        finally:
            self._end()


# This process's ramp; None outside a Celery worker (a driver, a test, the web).
_ramp: StartRamp | None = None


def configure(*, seconds: float, slots: int) -> None:
    """Set this process's ramp (``worker_init``: the worker's slots and ``RSI_TRIAL_RAMP_SECONDS``)."""
    global _ramp
    _ramp = StartRamp(seconds=seconds, slots=slots) if seconds > 0 else None


@contextmanager
def started() -> Iterator[float]:
    """Around a trial's run: waits for its place when this process ramps, else at once."""
    ramp = _ramp
    if ramp is None:
        yield 0.0
        return
    with ramp.start() as waited:
        yield waited
