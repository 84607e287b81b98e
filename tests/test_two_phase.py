"""The two-phase path keeps its promise: a claim is acted on only while it is provably
this node's and on time. Driven by one fake clock (wall, monotonic and the memory
store's), so a slow broker, a frozen node or a skewed clock is simulated exactly."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from test_scheduler import T0, Clock, run_nodes

from beatless import Entry, Every, Firing, Schedule
from beatless.node.dispatch import TwoPhase
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import claim_request
from beatless.stores.base import ClaimRequest, Outcome
from beatless.stores.memory import MemoryStore


def fan_out(tenants: int, **kw: object) -> Schedule:
    """A fan-out every minute; the tests start a second before T0, so the occurrence of
    T0 - 60 s is still within max_late and caught up: they look at the occurrence T0."""
    kw.setdefault("trigger", Every(60))
    kw.setdefault("jitter", "20s")
    entry = Entry(name="fan", task="tasks.t", tenants=[f"t{i}" for i in range(tenants)], **kw)  # type: ignore[arg-type]
    return Schedule([entry])


class SlowBroker:
    """A broker whose every send takes ``ms`` of the shared fake clock; records each
    send with the instant it began (when the message left the node)."""

    def __init__(self, clock: Clock, ms: int) -> None:
        self.clock = clock
        self.ms = ms
        self.sent: list[tuple[int, Firing]] = []

    def __call__(self, firing: Firing) -> None:
        self.sent.append((self.clock.ms, firing))
        self.clock.ms += self.ms


def monotonic_of(clock: Clock) -> Callable[[], float]:
    return lambda: clock.ms / 1_000


def nodes_for(schedule: Schedule, clock: Clock, broker: SlowBroker, n: int = 3) -> list[Scheduler]:
    store = MemoryStore(clock=clock)
    return [
        Scheduler(
            schedule,
            store=store,
            clock=clock,
            node=f"n{i}",
            enqueue=broker,
            monotonic=monotonic_of(clock),
        )
        for i in range(n)
    ]


def test_slow_broker_fan_out_sends_every_firing_once_and_never_late() -> None:
    # 2,000 tenants, 20 ms per send, lease 30 s, max_late 60 s: the first row.
    clock = Clock(T0 - 1)
    broker = SlowBroker(clock, 20)
    nodes = nodes_for(fan_out(2_000, max_late="60s"), clock, broker)
    run_nodes(nodes, clock, 90)
    counts = Counter(f.id for _, f in broker.sent)
    assert max(counts.values()) == 1
    assert all(at - f.occurrence_ms <= 60_000 for at, f in broker.sent)
    assert all(at >= f.release_ms for at, f in broker.sent)
    this_minute = {f.id for _, f in broker.sent if f.occurrence_ms == T0 * 1_000}
    late = sum(n.stats["fan"].late_node for n in nodes)
    assert len(this_minute) + late >= 2_000


class ClaimLog(MemoryStore):
    """A memory store that notes the fake-clock instant of every claim call, and can run
    a hook right after one (a node frozen between its claim and its sends)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.clock = clock
        self.claimed: list[tuple[int, int]] = []
        self.after_claim: list[Callable[[], None]] = []

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self.claimed.append((self.clock.ms, len(requests)))
        outcomes = super().claim(requests, node=node, lease_ms=lease_ms)
        if self.after_claim:
            self.after_claim.pop()()
        return outcomes


def test_sub_batches_shrink_to_what_the_broker_can_send_within_a_third_of_the_lease() -> None:
    clock = Clock(T0 - 1)
    store = ClaimLog(clock)
    broker = SlowBroker(clock, 4_000)
    node = Scheduler(
        fan_out(10, jitter=0, max_late="50s"),
        store=store,
        clock=clock,
        enqueue=broker,
        monotonic=monotonic_of(clock),
        lease="30s",
    )
    run_nodes([node], clock, 50)
    sent = [f for _, f in broker.sent if f.occurrence_ms == T0 * 1_000]
    assert len({f.id for f in sent}) == len(sent) == 10
    # The first sub-batch is unmeasured; after one 4 s send, 10 s of sends is 2 firings.
    sizes = [n for _, n in store.claimed]
    assert sizes[0] == 10
    assert max(sizes[1:]) == 2


def test_no_send_once_the_claim_is_older_than_half_its_lease() -> None:
    # A broker that stalls after twelve quick sends: the claims of the first sub-batch
    # age, and none is sent once it is 15 s old (lease 30 s); they are claimed again.
    clock = Clock(T0 - 1)
    store = ClaimLog(clock)
    sends: list[tuple[int, int, Firing]] = []

    def stalling(firing: Firing) -> None:
        began = clock.ms
        clock.ms += 1 if len(sends) < 12 else 2_000
        sends.append((began, clock.ms, firing))

    node = Scheduler(
        fan_out(30, jitter=0, max_late="50s"),
        store=store,
        clock=clock,
        enqueue=stalling,
        monotonic=monotonic_of(clock),
        lease="30s",
    )
    decisions: list[Decision] = []
    for _ in range(200):
        clock.ms += 100
        decisions += [d for d in node.tick() if d.firing.occurrence_ms == T0 * 1_000]
    sends = [s for s in sends if s[2].occurrence_ms == T0 * 1_000]
    assert len({f.id for _, _, f in sends}) == len(sends) == 30
    for began, _, _ in sends:
        claim_at = max(at for at, _ in store.claimed if at <= began)
        assert began - claim_at < 15_000
    outcomes = Counter(d.outcome for d in decisions)
    assert outcomes["stale_claim"] > 0
    assert outcomes["won"] + outcomes["takeover"] == 30


def test_a_node_frozen_between_claim_and_send_never_sends_what_another_took_over() -> None:
    clock = Clock(T0 - 1)
    store = ClaimLog(clock)
    schedule = fan_out(3, jitter=0, max_late="50s")
    sent: list[tuple[str, int, Firing]] = []

    def sender(name: str) -> Callable[[Firing], None]:
        return lambda f: sent.append((name, clock.ms, f))

    nodes = {
        name: Scheduler(
            schedule,
            store=store,
            clock=clock,
            node=name,
            enqueue=sender(name),
            monotonic=monotonic_of(clock),
            lease="10s",
        )
        for name in ("a", "b")
    }

    def freeze() -> None:  # SIGSTOP for 35 s right after a's claim; b runs meanwhile
        for _ in range(35):
            clock.ms += 1_000
            nodes["b"].tick()

    clock.ms = round(T0 * 1_000)
    store.after_claim.append(freeze)
    nodes["a"].tick()
    run_nodes(list(nodes.values()), clock, 5)
    counts = Counter(f.id for _, _, f in sent)
    assert len(counts) == 3
    assert max(counts.values()) == 1
    assert {name for name, _, _ in sent} == {"b"}
    assert all(at - f.occurrence_ms <= 50_000 for _, at, f in sent)
    assert nodes["a"].stats["fan"].stale_claims == 3


def test_a_firing_that_turns_late_before_its_send_is_released_not_sent() -> None:
    clock = Clock(T0 - 1)
    broker = SlowBroker(clock, 700)  # 40 sends of 0.7 s: the later ones pass max_late
    node = Scheduler(
        fan_out(40, jitter=0, max_late="10s"),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=broker,
        monotonic=monotonic_of(clock),
    )
    decisions: list[Decision] = []
    for _ in range(40):
        clock.ms += 100
        decisions += node.tick()
    assert broker.sent
    assert all(at - f.occurrence_ms <= 10_000 for at, f in broker.sent)
    assert Counter(d.outcome for d in decisions)["late"] == 40 - len(broker.sent)


def test_a_firing_seen_held_that_comes_back_won_as_new_is_not_sent() -> None:
    # The store forgot (restart without persistence): the holder's record vanished.
    clock = Clock(T0)
    store = MemoryStore(clock=clock)
    schedule = fan_out(1, jitter=0, max_late="60s")
    firing = Firing.of(schedule.entries[0], "t0", "default/fan/t0", round(T0 * 1_000))
    assert store.claim([claim_request(firing)], node="winner", lease_ms=5_000) == [Outcome.WON]
    sent: list[Firing] = []
    node = Scheduler(schedule, store=store, clock=clock, node="n", enqueue=sent.append, lease="5s")
    assert [d.outcome for d in node.tick()] == ["held"]
    store._claims.clear()  # the memory is lost
    decisions: list[Decision] = []
    for _ in range(30):
        clock.ms += 250
        decisions += node.tick()
    assert sent == []
    assert [d.outcome for d in decisions] == ["forgotten"]
    assert node.stats["fan"].forgotten == 1
    assert store.claim([claim_request(firing)], node="third", lease_ms=5_000) == [Outcome.LOST]


def test_an_unexpected_error_retries_the_firings_of_the_wake_until_they_are_sent() -> None:
    clock = Clock(T0 - 1)
    sent: list[Firing] = []

    class Buggy(MemoryStore):
        calls = 0

        def claim(
            self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int
        ) -> list[Outcome]:
            Buggy.calls += 1
            if Buggy.calls == 1:
                raise KeyError("a bug in a store")
            return super().claim(requests, node=node, lease_ms=lease_ms)

    node = Scheduler(
        fan_out(4, jitter=0), store=Buggy(clock=clock), clock=clock, enqueue=sent.append
    )
    decisions: list[Decision] = []
    for _ in range(30):
        clock.ms += 100
        decisions += node.tick()
    # The first wake claims the catch-up of T0 - 60 s and fails: retried, all sent.
    assert len(sent) == len({f.id for f in sent}) == 8
    assert Counter(d.outcome for d in decisions) == {"error": 4, "won": 8}
    assert node.stats["fan"].errors == 4


def test_a_node_whose_clock_is_minutes_off_claims_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store_clock = Clock(T0 - 1)
    fast = Clock(T0 - 1 + 300)
    sent: list[Firing] = []
    node = Scheduler(
        fan_out(5, jitter=0, trigger=Every(10)),
        store=MemoryStore(clock=store_clock),
        clock=fast,
        enqueue=sent.append,
    )
    with caplog.at_level(logging.WARNING, logger="beatless"):
        decisions = []
        for _ in range(30):
            fast.ms += 100
            store_clock.ms += 100
            decisions += node.tick()
    assert sent == []
    assert decisions
    assert {d.outcome for d in decisions} == {"clock_skew"}
    assert node.clockwatch.offset_ms == -300_000
    assert "claims nothing until its clock is fixed" in caplog.text


def test_an_overloaded_node_drops_old_work_in_bulk_and_keeps_the_next_occurrence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Frozen for 70 s across a 1,000-tenant occurrence: the whole of it is dropped in one
    # wake with one WARNING, and the next occurrence is sent on time.
    clock = Clock(T0 - 1)
    sent: list[tuple[int, Firing]] = []
    node = Scheduler(
        fan_out(1_000, jitter=0, max_late="30s"),
        store=MemoryStore(clock=clock),
        clock=clock,
        enqueue=lambda f: sent.append((clock.ms, f)),
    )
    node.tick()
    sent.clear()
    clock.ms = round(T0 * 1_000) + 40_000
    with caplog.at_level(logging.WARNING, logger="beatless"):
        decisions = node.tick()
        assert decisions == []  # dropped whole, counted, not one decision per firing
        assert node.stats["fan"].late_node == 1_000
        run_nodes([node], clock, 25)
    warnings = [r.message for r in caplog.records if "skipped (node" in r.message]
    assert warnings == [
        "entry 'fan', occurrence 2026-11-29T02:00:00.000Z: 1000 firing(s) more than max_late "
        "behind this node's clock, skipped (node overloaded, frozen, or its clock jumped)"
    ]
    assert {f.occurrence_ms for _, f in sent} == {round(T0 * 1_000) + 60_000}
    assert len(sent) == 1_000
    assert all(at - f.release_ms < 2_000 for at, f in sent)


def test_two_phase_refuses_a_store_that_is_not_a_claim_store() -> None:
    with pytest.raises(ValueError, match="ClaimStore"):
        TwoPhase(object(), print)  # type: ignore[arg-type]
