"""A wake just before a release readies its claims and sends them at the release, never
before it (``READY_AHEAD_MS``); driven by a fake clock and a fake sleep that moves it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import Clock, entry

from beatless import Firing, Schedule
from beatless.node.dispatch import Dispatcher, Wake, decide_claimed
from beatless.node.scheduler import READY_AHEAD_MS, Decision, Scheduler
from beatless.schedule.firing import claim_request
from beatless.stores.base import Outcome
from beatless.stores.memory import MemoryStore


class Sleeper:
    """``time.sleep`` on a :class:`Clock`: moves it by the time asked, rounded up."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.slept_ms = 0

    def __call__(self, seconds: float) -> None:
        ms = math.ceil(seconds * 1_000)
        self.clock.ms += ms
        self.slept_ms += ms


class Atomic(Dispatcher):
    """A dispatcher that claims and sends in one step and waits for the release itself,
    as the atomic Redis path does: it notes the clock when handed the firings and when it
    sends them."""

    waits_for_release = True

    def __init__(self, store: MemoryStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.handed_ms: list[int] = []
        self.sent: list[tuple[int, Firing]] = []

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        self.handed_ms.append(self.clock.ms)
        wake.until_release()
        requests = [claim_request(f, wake.live_revision) for f in firings]
        outcomes = self.store.claim(requests, node=wake.node, lease_ms=1_000)
        for firing, outcome in zip(firings, outcomes, strict=True):
            if outcome is Outcome.WON:
                self.sent.append((self.clock.ms, firing))
                wake.sent(firing, "won")
            decide_claimed(wake, firing, outcome)


def started(clock: Clock, **kw: object) -> tuple[Scheduler, list[tuple[int, Firing]]]:
    """A node of one entry every second, past its start-up catch-up; what it sends, with
    the clock at the send."""
    sent: list[tuple[int, Firing]] = []
    node = Scheduler(
        Schedule([entry()]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=lambda f: sent.append((clock.ms, f)),
        **kw,  # type: ignore[arg-type]
    )
    node.tick()
    sent.clear()
    return node, sent


def next_release_ms(node: Scheduler, clock: Clock) -> int:
    """The next release, once the node has woken for what comes before it: the expansion
    of the following occurrence, a quarter of a second before the whole second
    (``EXPAND_AHEAD_MS``), as its loop would."""
    while True:
        releases = [at for at, item in node.timeline.items() if isinstance(item, Firing)]
        wake = node.next_wake_ms()
        assert wake is not None
        if releases and wake == min(releases):
            return wake
        clock.ms = max(clock.ms, wake)
        node.tick()


@given(before_ms=st.integers(min_value=0, max_value=3 * READY_AHEAD_MS))
def test_a_wake_before_a_release_sends_at_it_only_within_ready_ahead_and_never_early(
    before_ms: int,
) -> None:
    clock = Clock()
    sleep = Sleeper(clock)
    decisions: list[Decision] = []
    node, sent = started(clock, sleep=sleep, on_decision=decisions.append)
    release = next_release_ms(node, clock)
    clock.ms = release - before_ms
    decisions.clear()  # the start-up's catch-up
    node.tick()
    if before_ms > READY_AHEAD_MS:
        assert sent == []
        assert sleep.slept_ms == 0
        return
    assert [(at, f.release_ms) for at, f in sent] == [(release, release)]
    assert sleep.slept_ms == before_ms
    assert [(d.outcome, d.lateness_ms) for d in decisions] == [("won", 0)]
    assert next_release_ms(node, clock) > release  # the wake was the release's: nothing left


def test_a_dispatcher_that_waits_itself_is_handed_the_firings_before_the_release() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    dispatcher = Atomic(store, clock)
    node = Scheduler(Schedule([entry()]), store=dispatcher, clock=clock, sleep=Sleeper(clock))
    node.tick()
    dispatcher.handed_ms.clear()
    dispatcher.sent.clear()
    release = next_release_ms(node, clock)
    clock.ms = release - 4
    node.tick()
    assert dispatcher.handed_ms == [release - 4]
    assert [(at, f.release_ms) for at, f in dispatcher.sent] == [(release, release)]


def test_the_loop_sleeps_until_ready_ahead_before_the_next_release() -> None:
    clock = Clock()
    node, _sent = started(clock, sleep=Sleeper(clock))
    clock.ms = next_release_ms(node, clock) - 200
    assert node.sleep_s() == (200 - READY_AHEAD_MS) / 1_000
    clock.ms += 200 - READY_AHEAD_MS // 2
    assert node.sleep_s() == 0


def test_a_simulated_clock_without_a_sleep_wakes_at_each_release_and_sends_nothing_before() -> None:
    clock = Clock()
    node, sent = started(clock)
    release = next_release_ms(node, clock)
    clock.ms = release - 200
    assert node.sleep_s() == 0.2
    clock.ms = release - 1
    node.tick()
    assert sent == []
    clock.ms = release
    node.tick()
    assert [(at, f.release_ms) for at, f in sent] == [(release, release)]
