"""A trial worker's ramp (evolution/ramp.py): slots that fill at once start spread out, a busy worker never waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from django.test import override_settings

from evolution import ramp
from evolution.ramp import StartRamp
from rsiweb.celery import app


class Clock:
    """A clock the test moves; ``sleep`` records what was asked and moves nothing."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def _ramp(seconds: float, slots: int) -> tuple[StartRamp, Clock]:
    clock = Clock()
    return StartRamp(seconds=seconds, slots=slots, clock=clock, sleep=clock.sleep), clock


def test_slots_filling_at_once_start_one_share_of_the_ramp_apart_and_the_rest_at_once() -> None:
    schedule, clock = _ramp(2.0, 4)
    with ExitStack() as running:
        waits = [running.enter_context(schedule.start()) for _ in range(4)]
        assert waits == [0.0, 0.5, 1.0, 1.5]
        # The ramp is over while these four run: a fifth trial (a slot freed, another message) starts at once.
        clock.now += 0.1
        assert running.enter_context(schedule.start()) == 0.0
    assert clock.slept == [0.5, 1.0, 1.5]


def test_a_trial_arriving_after_its_place_passed_does_not_wait() -> None:
    schedule, clock = _ramp(2.0, 4)
    with schedule.start() as first:
        clock.now += 1.2  # the second's place (0.5 s) and the third's (1.0 s) have passed
        with schedule.start() as second, schedule.start() as third, schedule.start() as fourth:
            assert (first, second, third) == (0.0, 0.0, 0.0)
            assert fourth == pytest.approx(0.3)


def test_a_worker_whose_trials_all_ended_ramps_again_and_a_busy_one_never_does() -> None:
    schedule, clock = _ramp(1.0, 2)
    with schedule.start(), schedule.start() as second:
        assert second == 0.5
    clock.now += 60.0  # idle: the next evaluation's trials ramp again
    with schedule.start() as first:
        assert first == 0.0
        with schedule.start() as again:
            assert again == 0.5
        clock.now += 5.0
        # Still one trial running: a burst now is not spread (the ramp is for slots that were all free).
        with schedule.start() as late, schedule.start() as later:
            assert (late, later) == (0.0, 0.0)


def test_a_trial_that_fails_is_no_longer_counted_as_running() -> None:
    schedule, clock = _ramp(1.0, 2)
    with pytest.raises(RuntimeError), schedule.start():
        raise RuntimeError("the agent's sandbox could not be set up")
    clock.now += 0.1
    # Nothing runs: a new ramp, whose first trial starts at once and whose second waits its share.
    with schedule.start() as first, schedule.start() as second:
        assert (first, second) == (0.0, 0.5)


def test_threads_starting_together_are_spread_by_the_real_clock() -> None:
    """Four real threads (the slots) asking at once, a ramp of 0.6 s: the n-th starts no sooner than n x 0.15 s
    after the first (a sleep never ends early)."""
    schedule = StartRamp(seconds=0.6, slots=4)
    starts: list[float] = []
    lock = threading.Lock()
    hold = threading.Event()

    def slot() -> None:
        with schedule.start():
            with lock:
                starts.append(time.monotonic())
            hold.wait(10)  # running until every thread has started: the ramp is not begun again

    threads = [threading.Thread(target=slot) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(starts) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    hold.set()
    for thread in threads:
        thread.join(10)
    assert len(starts) == 4
    starts.sort()
    for n in range(1, 4):
        assert starts[n] - starts[0] >= n * 0.15 - 0.002, (n, [round(s - starts[0], 3) for s in starts])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        StartRamp(seconds=-1.0, slots=4)
    with pytest.raises(ValueError, match="at least one slot"):
        StartRamp(seconds=1.0, slots=0)


@pytest.fixture
def unramped() -> Iterator[None]:
    yield
    ramp.configure(seconds=0.0, slots=1)


def test_a_celery_worker_ramps_its_slots_by_the_setting_and_a_process_without_one_never_waits(
    unramped: None,
) -> None:
    """Celery's own worker, built as ``celery worker --pool=threads --concurrency=6`` builds it, gives this
    process's ramp its 6 slots and RSI_TRIAL_RAMP_SECONDS; at 0 there is none and a trial starts at once."""
    with ramp.started() as waited:
        assert waited == 0.0
    with override_settings(RSI_TRIAL_RAMP_SECONDS=3.0):
        app.WorkController(concurrency=6, pool_cls="threads", hostname="ramp-test@localhost")
    configured = ramp._ramp
    assert configured is not None
    assert (configured.seconds, configured.slots) == (3.0, 6)
    with override_settings(RSI_TRIAL_RAMP_SECONDS=0.0):
        app.WorkController(concurrency=6, pool_cls="threads", hostname="ramp-test@localhost")
    assert ramp._ramp is None
