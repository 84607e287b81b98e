"""The scheduler loop, driven by a fake clock: no sleeping, every decision checked."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from beatless import (
    ConfigError,
    Cron,
    Entry,
    Every,
    Firing,
    Schedule,
    ScheduleError,
    StoreUnavailable,
)
from beatless.errors import StoreFull
from beatless.node.dispatch import Dispatcher, Wake, decide_claimed
from beatless.node.scheduler import MAX_SLEEP_MS, Decision, Scheduler
from beatless.schedule.firing import claim_request, from_datetime, run_lease_id
from beatless.stores.base import ClaimRequest, Outcome
from beatless.stores.memory import MemoryStore

T0 = from_datetime(datetime(2026, 11, 29, 2, 0, tzinfo=UTC)) / 1_000


class Clock:
    """A wall clock that moves only when told to, in whole milliseconds.

    It starts five seconds before 02:00, so that hourly and daily entries have nothing
    to catch up at start unless a test says so.
    """

    def __init__(self, start: float = T0 - 5) -> None:
        self.ms = round(start * 1_000)

    @property
    def now(self) -> float:
        return self.ms / 1_000

    @now.setter
    def now(self, seconds: float) -> None:
        self.ms = round(seconds * 1_000)

    def __call__(self) -> float:
        return self.ms / 1_000


def run_nodes(nodes: Sequence[Scheduler], clock: Clock, seconds: float, step: float = 0.1) -> None:
    for _ in range(round(seconds / step)):
        clock.ms += round(step * 1_000)
        for node in nodes:
            node.tick()


def entry(name: str = "e", **kw: object) -> Entry:
    kw.setdefault("trigger", Every(1))
    return Entry(name=name, task="tasks.t", **kw)  # type: ignore[arg-type]


def test_one_node_enqueues_each_occurrence_once_at_its_release() -> None:
    clock = Clock()
    sent: list[tuple[float, Firing]] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(2))]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=lambda f: sent.append((clock.now, f)),
    )
    node.tick()
    sent.clear()  # the catch-up of the last minute is tested on its own
    run_nodes([node], clock, 10)
    occurrences = [f.occurrence_ms for _, f in sent]
    assert occurrences == [round(T0 * 1_000) + k * 2_000 for k in range(-2, 3)]
    assert all(0 <= at * 1_000 - f.release_ms < 100 for at, f in sent)


def test_three_nodes_on_one_store_enqueue_every_firing_exactly_once() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    schedule = Schedule(
        [
            entry("one", trigger=Every(1), catch_up="all"),
            entry(
                "fan",
                trigger=Every(5),
                jitter="2s",
                tenants=[f"t{i}" for i in range(30)],
                catch_up="all",
            ),
        ]
    )
    sent: list[Firing] = []
    nodes = [
        Scheduler(schedule, store=store, clock=clock, node=f"n{i}", enqueue=sent.append)
        for i in range(3)
    ]
    run_nodes(nodes, clock, 30)
    counts = Counter(f.id for f in sent)
    assert counts
    assert max(counts.values()) == 1
    expected_fan = {o for o in range(int(T0) - 60, int(T0) + 23) if o % 5 == 0}
    fan = {f.occurrence_ms // 1_000 for f in sent if f.entry.name == "fan"}
    assert fan >= expected_fan
    won = sum(n.stats["fan"].won for n in nodes)
    lost = sum(n.stats["fan"].lost for n in nodes)
    assert won == len([f for f in sent if f.entry.name == "fan"])
    assert lost == 2 * won


def test_jittered_firing_waits_for_its_release_and_keeps_the_unjittered_id() -> None:
    clock = Clock()
    sent: list[tuple[float, Firing]] = []
    jittered = Schedule([entry(trigger=Every(60), jitter="20s", max_late="90s")])
    node = Scheduler(
        jittered,
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=lambda f: sent.append((clock.now, f)),
    )
    run_nodes([node], clock, 30)
    at, firing = next((at, f) for at, f in sent if f.occurrence_ms == T0 * 1_000)
    assert firing.offset_ms > 0
    assert firing.release_ms <= at * 1_000 < firing.release_ms + 100
    plain = Schedule([entry(trigger=Every(60))])
    assert Firing.of(plain.entries[0], None, "default/e", firing.occurrence_ms).id == firing.id


def test_node_that_wakes_after_max_late_skips_and_counts_the_firing() -> None:
    clock = Clock()
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(600), max_late="30s")]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
    )
    node.tick()
    clock.now = T0 + 31  # frozen through the whole lateness budget
    decisions = node.tick()
    assert [d.outcome for d in decisions] == ["late"]
    assert sent == []
    assert node.stats["e"].late_node == 1


def test_node_starting_within_max_late_still_fires_the_occurrence_it_missed() -> None:
    clock = Clock(T0 + 30)
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Cron("0 2 * * *"))]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
    )
    node.tick()
    assert [f.occurrence_ms for f in sent] == [int(T0 * 1_000)]


def test_node_starting_after_max_late_does_not_fire_the_old_occurrence() -> None:
    clock = Clock(T0 + 61)
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Cron("0 2 * * *"))]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
    )
    decisions = node.tick()
    assert sent == []
    assert decisions == []


def test_failed_enqueue_releases_the_claim_and_is_retried_until_it_succeeds() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    attempts: list[Firing] = []

    def flaky(firing: Firing) -> None:
        attempts.append(firing)
        if len(attempts) < 3:
            raise ConnectionError("broker down")

    node = Scheduler(
        Schedule([entry(trigger=Every(3600))]), store=store, clock=clock, enqueue=flaky
    )
    clock.now = T0
    outcomes = []
    for _ in range(20):
        clock.now += 0.25
        outcomes += [d.outcome for d in node.tick()]
    # A released claim is kept with its lease ended: winning it again is a takeover.
    assert outcomes == ["enqueue_failed", "enqueue_failed", "takeover"]
    assert len({f.id for f in attempts}) == 1
    assert node.stats["e"].enqueue_failures == 2
    other = store.claim([claim_request(attempts[0])], node="other", lease_ms=1_000)
    assert other == [Outcome.LOST]


class FlakyStore(MemoryStore):
    """A real memory store that can be switched off, as a store behind a dead network."""

    down = False

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if self.down:
            raise StoreUnavailable("connection refused")
        return super().claim(requests, node=node, lease_ms=lease_ms)


def test_unreachable_store_means_no_enqueue_and_retries_until_the_firing_is_late() -> None:
    clock = Clock()
    store = FlakyStore(clock=clock)
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(3600), max_late="10s")]),
        store=store,
        clock=clock,
        enqueue=sent.append,
    )
    store.down = True
    clock.now = T0
    decisions: list[Decision] = []
    for _ in range(30):
        clock.now += 0.5
        decisions += node.tick()
    assert sent == []
    outcomes = [d.outcome for d in decisions]
    assert outcomes[-1] == "late"
    assert set(outcomes[:-1]) == {"unavailable"}
    assert node.stats["e"].store_unavailable == len(outcomes) - 1


def test_store_that_comes_back_in_time_gets_the_firing_claimed_and_enqueued() -> None:
    clock = Clock()
    store = FlakyStore(clock=clock)
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(3600))]), store=store, clock=clock, enqueue=sent.append
    )
    store.down = True
    clock.now = T0
    for _ in range(10):
        clock.now += 0.5
        node.tick()
    store.down = False
    clock.now += 0.5
    node.tick()
    assert len(sent) == 1


def test_losing_node_takes_over_a_firing_whose_winner_died_before_commit() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    schedule = Schedule([entry(trigger=Every(3600), max_late="60s")])
    node = Scheduler(
        schedule, store=store, clock=clock, enqueue=sent.append, lease="5s", node="survivor"
    )
    clock.now = T0
    firing = Firing.of(schedule.entries[0], None, "default/e", int(clock.now * 1_000))
    assert store.claim([claim_request(firing)], node="dead", lease_ms=5_000) == [Outcome.WON]
    outcomes = []
    for _ in range(80):
        clock.now += 0.25
        outcomes += [d.outcome for d in node.tick()]
    assert outcomes == ["held", "takeover"]
    assert [f.id for f in sent] == [firing.id]
    assert node.stats["e"].takeovers == 1
    assert node.stats["e"].lost == 1


class RefusingStore(FlakyStore):
    """A memory store that can be switched to refuse every claim as full, or be down."""

    full = False

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if self.full:
            raise StoreFull("maxmemory reached")
        return super().claim(requests, node=node, lease_ms=lease_ms)


def test_nothing_of_a_firing_is_kept_in_flight_once_it_is_decided() -> None:
    """Held then taken over, retried while the store is down, refused as full until
    missed (past its memory of 30 s: not judged), coalesced by the catch-up: each firing's
    record goes at its decision."""
    outcomes: dict[str, list[str]] = {}
    for case in ("held", "down", "full", "caught"):
        clock = Clock(T0 - 45)
        store = RefusingStore(clock=clock)
        trigger = Every(10) if case == "caught" else Every(3600)
        schedule = Schedule([entry(case, trigger=trigger, max_late="20s")])
        node = Scheduler(schedule, store=store, clock=clock, enqueue=lambda f: None, lease="5s")
        clock.now = T0 - 44.9 if case == "caught" else T0
        if case == "held":
            held = Firing.of(schedule.entries[0], None, f"default/{case}", round(T0 * 1_000))
            assert store.claim([claim_request(held)], node="dead", lease_ms=5_000) == [Outcome.WON]
        store.down, store.full = case == "down", case == "full"
        decided = [d.outcome for d in node.tick()]
        assert len(node.flights) == (case != "caught")  # held, retried or refused: not decided
        for _ in range(130):
            clock.now += 0.25
            decided += [d.outcome for d in node.tick()]
        outcomes[case] = decided
        assert len(node.flights) == 0, case
    assert outcomes["held"] == ["held", "takeover"]
    assert outcomes["down"][-1] == "late"
    assert outcomes["full"][-1] == "missed"
    assert outcomes["caught"][0] == "won"


def test_claims_due_at_one_wake_go_in_sub_batches_sized_from_the_send_rate() -> None:
    clock = Clock()

    class CountingStore(MemoryStore):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.calls: list[int] = []

        def claim(
            self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int
        ) -> list[Outcome]:
            self.calls.append(len(requests))
            return super().claim(requests, node=node, lease_ms=lease_ms)

    store = CountingStore(clock=clock)
    tenants = [f"t{i}" for i in range(500)]
    node = Scheduler(
        Schedule([entry(trigger=Every(3600), tenants=tenants)]), store=store, clock=clock
    )
    clock.now = T0
    node.tick()
    # Until ten sends are measured, a sub-batch holds 100; instant sends allow the rest.
    assert store.calls == [100, 400]


@dataclass(frozen=True)
class CountingTrigger:
    inner: Every
    log: list[int]

    def after(self, instant_ms: int) -> Iterator[int]:
        for occurrence in self.inner.after(instant_ms):
            self.log.append(occurrence)
            yield occurrence

    def min_gap_ms(self) -> int:
        return self.inner.min_gap_ms()

    def describe(self) -> str:
        return "counting"

    def __hash__(self) -> int:
        return hash(self.inner)


def test_occurrences_are_computed_once_per_trigger_shared_by_its_entries() -> None:
    clock = Clock()
    log: list[int] = []
    trigger = CountingTrigger(Every(10), log)
    schedule = Schedule([entry(f"e{i}", trigger=trigger, catch_up="all") for i in range(50)])
    node = Scheduler(schedule, store=MemoryStore(clock=clock), clock=clock)
    run_nodes([node], clock, 60, step=1)
    assert len(log) == len(set(log))
    assert sum(s.won for s in node.stats.values()) == 50 * 12


def test_a_dispatcher_claims_and_enqueues_in_one_step_without_the_enqueue_callable() -> None:
    clock = Clock()

    class AtomicMemory(Dispatcher):
        """Claim and commit in one step: a won firing is in ``queue``, nothing else is."""

        def __init__(self) -> None:
            self.queue: list[str] = []
            self.store = MemoryStore(clock=clock)

        def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
            requests = [claim_request(f) for f in firings]
            outcomes = self.store.claim(requests, node=wake.node, lease_ms=1)
            won = [f.id for f, o in zip(firings, outcomes, strict=True) if o.is_won]
            self.store.commit(won, node=wake.node)
            self.queue += won
            for firing, outcome in zip(firings, outcomes, strict=True):
                decide_claimed(wake, firing, Outcome.LOST if outcome is Outcome.HELD else outcome)

    atomic = AtomicMemory()

    def refuse(firing: Firing) -> None:
        raise AssertionError("the atomic path must not call enqueue")

    nodes = [
        Scheduler(Schedule([entry()]), store=atomic, clock=clock, node=f"n{i}", enqueue=refuse)
        for i in range(3)
    ]
    run_nodes(nodes, clock, 5)
    assert atomic.queue
    assert len(atomic.queue) == len(set(atomic.queue))


def test_a_failing_tenants_callable_keeps_the_last_list_and_the_loop_going() -> None:
    clock = Clock()
    calls = {"n": 0}

    def tenants() -> list[str]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("tenant database down")
        return ["a", "b"]

    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(10), tenants=tenants)]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
    )
    run_nodes([node], clock, 35, step=1)
    assert calls["n"] > 2
    assert {f.tenant for f in sent} == {"a", "b"}
    assert len(sent) == 2 * len({f.occurrence_ms for f in sent})


def test_a_failing_decision_hook_is_isolated() -> None:
    clock = Clock()
    sent: list[Firing] = []

    def hook(decision: Decision) -> None:
        raise RuntimeError("metrics exporter down")

    node = Scheduler(
        Schedule([entry()]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
        on_decision=hook,
    )
    run_nodes([node], clock, 3)
    assert len(sent) > 3


def test_store_that_forgets_too_soon_is_refused_at_start_naming_the_entry() -> None:
    class ShortMemory(MemoryStore):
        name = "nats"

        @property
        def remembers(self) -> timedelta:
            return timedelta(seconds=30)

    with pytest.raises(ScheduleError, match=r"entry 'e'.*1m10s.*nats remembers \(30s\)"):
        Scheduler(Schedule([entry()]), store=ShortMemory())


def test_the_loop_never_sleeps_past_the_next_release_nor_longer_than_a_second() -> None:
    clock = Clock()
    node = Scheduler(
        Schedule([entry(trigger=Every(3600), jitter="0s")]),
        store=MemoryStore(clock=clock),
        clock=clock,
    )
    node.tick()
    assert node.sleep_s() == MAX_SLEEP_MS / 1_000
    wake = node.next_wake_ms()
    assert wake is not None
    clock.now = wake / 1_000 - 0.25
    assert node.sleep_s() == pytest.approx(0.25, abs=0.002)
    assert node.sleep_s(cap_s=0.1) == pytest.approx(0.1)


def test_a_wake_sends_the_firings_due_before_it_expands_the_occurrences_it_reached() -> None:
    """Every second a firing is released and the occurrence a second on is reached for
    expanding (``EXPAND_AHEAD_MS``): it is expanded after the send, so the send does not
    wait for it."""
    clock = Clock()
    queued_at_send: list[set[int]] = []

    def enqueue(firing: Firing) -> None:
        queued = {f.occurrence_ms for _, f in node.timeline.items() if isinstance(f, Firing)}
        queued_at_send.append(queued)

    node = Scheduler(
        Schedule([entry(trigger=Every(1))]),
        store=MemoryStore(clock=clock),
        enqueue=enqueue,
        clock=clock,
    )
    for _ in range(5):
        node.tick()
        clock.ms += 1_000
    node.tick()
    sends = queued_at_send[2:]  # after the start's catch-up (two firings at the first wake)
    assert len(sends) >= 4
    for queued in sends:
        assert queued == set()  # the next second's firing: reached, expanded after the send
    assert len({f.occurrence_ms for _, f in node.timeline.items() if isinstance(f, Firing)}) == 1


def test_the_loop_sleeps_to_the_release_itself_not_to_the_next_whole_millisecond() -> None:
    now = [T0 - 5]
    node = Scheduler(
        Schedule([entry(trigger=Every(3600), jitter="0s")]),
        store=MemoryStore(clock=lambda: now[0]),
        clock=lambda: now[0],
    )
    node.tick()
    wake = node.next_wake_ms()
    assert wake is not None
    now[0] = (wake - 0.4) / 1_000  # 0.4 ms before the release
    assert node.sleep_s() == pytest.approx(0.0004, abs=0.00005)


def test_the_loop_rereads_the_wall_clock_and_notices_a_jump() -> None:
    clock = Clock()
    sent: list[Firing] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(60))]),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=sent.append,
    )
    node.tick()
    sent.clear()
    clock.now += 3 * 3600  # a suspended VM resumes hours later
    decisions = node.tick()
    assert [f.occurrence_ms for f in sent] == [round(T0 * 1_000) + 3 * 3_600_000 - 60_000]
    assert node.stats["e"].late_node == 3 * 60 - 1  # the last minute is still on time
    assert [d.outcome for d in decisions] == ["late", "won"]


@pytest.mark.serial
def test_run_in_a_thread_fires_on_the_real_clock_and_stops_promptly() -> None:
    sent: list[tuple[float, Firing]] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(0.2))]),
        store=MemoryStore(),
        enqueue=lambda f: sent.append((time.time(), f)),
    )
    thread = node.start()
    time.sleep(1.5)
    asked = time.monotonic()
    node.stop(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - asked < 1.5
    live = [(at, f) for at, f in sent if f.occurrence_ms > node.timeline.start_ms]
    assert len(live) >= 4, f"only {len(live)} firings in 1.5 s of a 200 ms entry"
    late = [at * 1_000 - f.release_ms for at, f in live]
    # The wall clock of a shared VM may be stepped back a little by time sync while the
    # test runs; a firing sent a whole step (200 ms) early would still fail this.
    assert min(late) > -100, f"a firing was enqueued {-min(late):.0f} ms before its release"


def test_start_warns_when_a_dead_winner_could_never_be_taken_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tight = Schedule([entry("tight", trigger=Every(600), jitter="40s", max_late="60s")])
    with caplog.at_level("WARNING", logger="beatless.node.scheduler"):
        Scheduler(tight, store=MemoryStore(), lease="30s")
    assert "entry 'tight'" in caplog.text
    assert "take over" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="beatless.node.scheduler"):
        Scheduler(tight, store=MemoryStore(), lease="10s")
    assert caplog.text == ""


def test_an_entry_name_with_a_slash_keeps_the_address_unambiguous() -> None:
    schedule = Schedule(
        [entry("reports/daily", trigger=Every(60)), entry("100%", trigger=Every(60))],
        namespace="app",
    )
    daily, percent = schedule.entries
    assert schedule.address(daily) == "app/reports%2Fdaily"
    assert schedule.address(daily, "acme") == "app/reports%2Fdaily/acme"
    assert schedule.address(percent) == "app/100%25"
    with pytest.raises(ConfigError, match="namespace 'a/b'"):
        Schedule([entry()], namespace="a/b")


# -- catch-up policy -------------------------------------------------------------------


def catch_up_run(policy: str) -> tuple[list[Firing], Scheduler]:
    """A fresh node, empty store, entries every 1 s and 2 s and a 5-tenant fan-out every
    5 s with jitter: what it sends of the occurrences before its start, with
    ``catch_up=policy``. The node starts
    half a second after a whole second, so that no occurrence falls on its start."""
    clock = Clock(T0 - 5 + 0.5)
    sent: list[Firing] = []
    tenants = [f"t{i}" for i in range(5)]
    schedule = Schedule(
        [
            entry("one", trigger=Every(1), catch_up=policy),
            entry("two", trigger=Every(2), catch_up=policy),
            entry("fan", trigger=Every(5), jitter="2s", tenants=tenants, catch_up=policy),
        ]
    )
    node = Scheduler(schedule, store=MemoryStore(clock=clock), clock=clock, enqueue=sent.append)
    start = node.now_ms()
    node.tick()
    run_nodes([node], clock, 3)  # the fan-out's tenants come at their offsets
    return [f for f in sent if f.occurrence_ms < start], node


def before_start(node: Scheduler, every_s: int) -> list[int]:
    """The occurrences within max_late (60 s) before the node's start."""
    start = node.now_ms() - 3_000
    return [o for o in range(start - 60_000, start) if o % (every_s * 1_000) == 0]


def test_catch_up_latest_claims_one_occurrence_per_address_and_counts_the_rest() -> None:
    sent, node = catch_up_run("latest")
    by_address = Counter(f.address for f in sent)
    assert len(by_address) == 2 + 5
    assert max(by_address.values()) == 1
    for name, every in (("one", 1), ("two", 2)):
        latest = [f.occurrence_ms for f in sent if f.entry.name == name]
        assert latest == before_start(node, every)[-1:]
        assert node.stats[name].catch_up_skipped == len(before_start(node, every)) - 1
    # The fan-out's latest occurrence: every tenant's firing, each at its offset.
    fan = [f for f in sent if f.entry.name == "fan"]
    assert {f.occurrence_ms for f in fan} == set(before_start(node, 5)[-1:])
    assert node.stats["fan"].catch_up_skipped == (len(before_start(node, 5)) - 1) * 5


def test_catch_up_all_claims_every_occurrence_within_max_late_and_none_claims_none() -> None:
    sent_all, node_all = catch_up_run("all")
    assert len([f for f in sent_all if f.entry.name == "one"]) == len(before_start(node_all, 1))
    assert sum(s.catch_up_skipped for s in node_all.stats.values()) == 0
    sent_none, node_none = catch_up_run("none")
    assert sent_none == []
    assert node_none.stats["one"].catch_up_skipped == len(before_start(node_none, 1))
    assert node_none.stats["fan"].catch_up_skipped == len(before_start(node_none, 5)) * 5


def test_catch_up_policy_leaves_the_occurrences_after_the_start_alone() -> None:
    for policy in ("latest", "none"):
        clock = Clock()
        sent: list[Firing] = []
        schedule = Schedule([entry("one", trigger=Every(1), catch_up=policy)])
        node = Scheduler(schedule, store=MemoryStore(clock=clock), clock=clock, enqueue=sent.append)
        start = node.now_ms()
        node.tick()
        sent.clear()
        run_nodes([node], clock, 10)
        after = [f.occurrence_ms for f in sent]
        assert after == list(range(start - start % 1_000 + 1_000, clock.ms + 1, 1_000))


def test_a_node_joining_a_running_fleet_makes_no_one_skip_anything() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    schedule = Schedule([entry("one", trigger=Every(1), catch_up="none")])
    first = Scheduler(schedule, store=store, clock=clock, node="a", enqueue=sent.append)
    first.tick()
    run_nodes([first], clock, 5)
    joining = Scheduler(schedule, store=store, clock=clock, node="b", enqueue=sent.append)
    run_nodes([first, joining], clock, 10)
    occurrences = sorted(f.occurrence_ms for f in sent)
    assert occurrences == list(range(occurrences[0], occurrences[-1] + 1, 1_000))


def test_catch_up_is_said_once_per_entry(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="beatless"):
        _, node = catch_up_run("latest")
        node.tick()
    said = [
        r.getMessage() for r in caplog.records if "left unclaimed by catch_up" in r.getMessage()
    ]
    assert len(said) == 3
    assert any(line.startswith("entry 'one': 59 occurrence(s)") for line in said)


def test_catch_up_must_be_one_of_the_policies() -> None:
    with pytest.raises(ConfigError, match="catch_up must be one of 'latest', 'all', 'none'"):
        entry("bad", catch_up="some")


def test_overlap_skip_sends_nothing_while_a_run_of_the_address_holds_its_lease() -> None:
    """A worker holds the address's run lease (as beatless.node.runs does): the node counts
    each firing due meanwhile ``skipped_overlap`` and sends it again once it is released."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    schedule = Schedule([entry(trigger=Every(1), overlap="skip")])
    sent: list[Firing] = []
    node = Scheduler(schedule, store=store, clock=clock, enqueue=sent.append, node="n1")
    node.tick()
    sent.clear()
    address = schedule.address(schedule.entries[0])
    lease = ClaimRequest(
        id=run_lease_id(address),
        address=address,
        occurrence_ms=clock.ms,
        max_late_ms=86_400_000,
        memory_ms=1_000,
        release_ms=clock.ms,
    )
    assert store.claim([lease], node="worker", lease_ms=3_500) == [Outcome.WON]
    run_nodes([node], clock, 3)
    assert sent == []
    assert node.stats["e"].skipped_overlap == 3
    store.release([lease.id], node="worker")
    run_nodes([node], clock, 2)
    assert len(sent) == 2
    assert node.stats["e"].skipped_overlap == 3


def test_overlap_skip_is_refused_at_start_on_a_store_that_cannot_hold_run_leases() -> None:
    """Rule: a run lease renewed with a gap (the RabbitMQ store) could let two runs overlap,
    so a schedule that asks for ``overlap = "skip"`` does not start on such a store."""

    class GappyStore(MemoryStore):
        holds_run_leases = False

    schedule = Schedule([entry("skips", overlap="skip"), entry("allows")])
    with pytest.raises(ScheduleError) as refused:
        Scheduler(schedule, store=GappyStore(), enqueue=lambda f: None)
    (error,) = refused.value.errors
    assert error.startswith("entry 'skips': overlap 'skip' needs a claim store that renews")
    assert "memory store cannot" in error
    assert Scheduler(schedule, store=MemoryStore(), enqueue=lambda f: None)


def _started(node: Scheduler) -> threading.Event:
    """Run ``node``'s loop in its thread; the event is set once its first wake is done and
    it goes to sleep for as long as its injected clock says."""
    asleep = threading.Event()
    sleep_s = node.sleep_s

    def sleeping(cap_s: float = MAX_SLEEP_MS / 1_000) -> float:
        seconds = sleep_s(cap_s)
        asleep.set()
        return seconds

    node.sleep_s = sleeping  # type: ignore[method-assign]
    node.start()
    return asleep


def test_stop_decides_a_firing_released_at_the_stop_instant() -> None:
    """The loop sleeps until the release; stop() comes at the release, before the loop
    woke for it: the firing is still claimed and sent before stop() returns."""
    clock = Clock(T0 - 5)  # the next release is 5 s away: the loop sleeps its whole cap
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    decisions: list[Decision] = []
    schedule = Schedule([entry(trigger=Every(3600))])
    node = Scheduler(
        schedule, store=store, clock=clock, enqueue=sent.append, on_decision=decisions.append
    )
    assert _started(node).wait(5)
    clock.now = T0
    node.stop(timeout=5)
    assert [f.occurrence_ms for f in sent] == [round(T0 * 1_000)]
    assert [d.outcome for d in decisions] == ["won"]
    record = store.claim_records([sent[0].id])[sent[0].id]
    assert (record.node, record.committed) == (node.node, True)  # committed, not pending


class SlowFirstClaim(MemoryStore):
    """A memory store whose first two claims by node ``a`` (the second is the one made
    again at once when the first was too old to send) return only after ``a``'s
    monotonic clock moved on by ``stall_s``, the first after node ``b`` saw it pending:
    a node starved of CPU between its claims and its sends."""

    def __init__(self, clock: Clock, mono: list[float], stall_s: float) -> None:
        super().__init__(clock=clock)
        self.mono, self.stall_s = mono, stall_s
        self.other: Scheduler | None = None
        self.stalls = 2

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        outcomes = super().claim(requests, node=node, lease_ms=lease_ms)
        if node == "a" and self.stalls:
            self.stalls -= 1
            other, self.other = self.other, None
            if other is not None:
                other.tick()  # b claims meanwhile: held, looked at again after a's lease
            self.mono[0] += self.stall_s
        return outcomes


class LateAnswer(MemoryStore):
    """A memory store whose first claim is answered ``stall_s`` after it was made, on both
    clocks: a claim a paused link delivered late, or a node starved of CPU."""

    def __init__(self, clock: Clock, mono: list[float], stall_s: float) -> None:
        super().__init__(clock=clock)
        self.clock, self.mono, self.stall_s = clock, mono, stall_s

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        outcomes = super().claim(requests, node=node, lease_ms=lease_ms)
        if self.stall_s:
            self.clock.now += self.stall_s
            self.mono[0] += self.stall_s
            self.stall_s = 0
        return outcomes


def test_a_claim_answered_too_late_to_send_is_claimed_again_at_once() -> None:
    """The claim is won but answered 1.6 s after it was made, past half the 3 s lease:
    too old to send. The store answered, so nothing is gained by waiting: it is claimed
    again at once, in the same wake, and sent 0.4 s before it would be late (a retry
    500 ms later finds it late; one at the next wake comes after the rest of this one)."""
    clock = Clock(T0 - 5)
    mono = [1_000.0]
    store = LateAnswer(clock, mono, stall_s=1.6)
    sent: list[Firing] = []
    decisions: list[Decision] = []
    node = Scheduler(
        Schedule([entry(trigger=Every(3600), max_late="2s")]),
        store=store,
        clock=clock,
        monotonic=lambda: mono[0],
        lease="3s",
        preferred=False,
        enqueue=sent.append,
        on_decision=decisions.append,
    )
    clock.now = T0
    node.tick()  # the claim is answered at T0 + 1.6 s: stale, claimed again, sent
    assert [d.outcome for d in decisions] == ["stale_claim", "takeover"]
    clock.now = T0 + 1.7
    node.tick()
    clock.now = T0 + 2.2
    node.tick()

    assert [d.outcome for d in decisions] == ["stale_claim", "takeover"]
    assert [f.occurrence_ms for f in sent] == [round(T0 * 1_000)]


def test_stop_tries_again_a_firing_whose_claim_went_stale_just_before_it() -> None:
    """Node a wins the claim but is starved past half its lease before the send, twice:
    the claim is stale, released, claimed again at once, stale again, and tried again at
    the next wake; node b saw it held, and looks
    again only after a's lease. Both stop before either look: the stop decides it, and
    exactly one node sends it."""
    clock = Clock(T0 - 5)
    mono = [1_000.0]
    store = SlowFirstClaim(clock, mono, stall_s=1.6)
    schedule = Schedule([entry(trigger=Every(3600), max_late="8s")])
    sent: list[Firing] = []
    decisions: list[Decision] = []
    shared: dict[str, Any] = {  # one store and clock; a lease that a starved node outlives
        "store": store,
        "clock": clock,
        "monotonic": lambda: mono[0],
        "lease": "3s",
        "preferred": False,
        "enqueue": sent.append,
        "on_decision": decisions.append,
    }
    nodes = {name: Scheduler(schedule, node=name, **shared) for name in ("a", "b")}

    def outcomes(name: str) -> list[str]:
        return [d.outcome for d in decisions if d.node == name]

    clock.now = T0
    store.other = nodes["b"]
    nodes["a"].tick()
    assert (outcomes("a"), outcomes("b")) == (["stale_claim", "stale_claim"], ["held"])
    clock.now = T0 + 0.1  # before b's look (T0 + 3.5 s)
    started = [_started(node) for node in nodes.values()]
    assert all(event.wait(5) for event in started)
    for node in nodes.values():
        node.stop(timeout=5)
    assert [f.occurrence_ms for f in sent] == [round(T0 * 1_000)]
    assert outcomes("a")[-1] in ("won", "takeover", "lost")
    assert outcomes("b")[-1] in ("won", "takeover", "lost", "held")
