"""Nothing after a send sends again, and a node that cannot commit stops sending.

Driven by one fake clock (wall, monotonic and the memory store's). Each test counts the
sends per firing: a step after a send that fails (the history note, the commit, a
counter) is counted and logged, never a second send of that firing; and after a failed
commit the node sends nothing until a commit succeeds again."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from test_scheduler import T0, Clock, run_nodes
from test_two_phase import monotonic_of

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import ConfigError, StoreUnavailable
from beatless.node.scheduler import Decision, Scheduler
from beatless.node.stats import EntryStats
from beatless.schedule.firing import claim_request
from beatless.stores.base import ClaimRequest, Note, Outcome
from beatless.stores.memory import MemoryStore


class FailingStore(MemoryStore):
    """The memory store, whole, that fails on command: ``fail["commit"]`` (or ``claim``,
    ``release``) holds the error its next calls raise, until it is cleared. Every call
    that reaches the store, and what it answered, is logged in ``calls``."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.fail: dict[str, Exception] = {}
        self.calls: list[tuple[str, int, bool]] = []
        """``(method, firings, succeeded)`` in order."""

    def _failing(self, method: str, count: int) -> None:
        error = self.fail.get(method)
        self.calls.append((method, count, error is None))
        if error is not None:
            raise error

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self._failing("claim", len(requests))
        return super().claim(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        self._failing("commit", len(ids))
        return super().commit(ids, node=node, notes=notes)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        self._failing("release", len(ids))
        super().release(ids, node=node)


@dataclass
class Broker:
    """Records each send with the store calls made before it; each send takes ``ms``."""

    clock: Clock
    store: FailingStore
    ms: int = 20
    sent: list[Firing] = field(default_factory=list)

    def __call__(self, firing: Firing) -> None:
        self.sent.append(firing)
        self.store.calls.append(("send", 1, True))
        self.clock.ms += self.ms


def fan_out(tenants: int | Callable[[], list[str]], **kw: object) -> Schedule:
    kw.setdefault("trigger", Every(60))
    kw.setdefault("max_late", "50s")
    names = tenants if callable(tenants) else [f"t{i}" for i in range(tenants)]
    return Schedule([Entry(name="fan", task="tasks.t", tenants=names, jitter=0, **kw)])  # type: ignore[arg-type]


def node_of(schedule: Schedule, clock: Clock, store: FailingStore, broker: Broker) -> Scheduler:
    return Scheduler(
        schedule,
        store=store,
        clock=clock,
        node="n",
        enqueue=broker,
        monotonic=monotonic_of(clock),
        lease="10s",
    )


def sends_per_firing(broker: Broker) -> Counter[str]:
    return Counter(f.id for f in broker.sent)


class Faulty(EntryStats):
    """Counters whose every count raises: a bug in what is counted after a send."""

    def count(self, outcome: str) -> None:
        raise ValueError(f"counter {outcome} broken")


def _history_refused(clock: Clock, store: FailingStore) -> Schedule:
    # A tenant of 1,200 characters, from a callable (not checked before it is called):
    # its history note's name is over the 1,000 a note may have, so building it raises.
    return fan_out(lambda: ["t0", "x" * 1_200, "t2"])


def _note_too_big(clock: Clock, store: FailingStore) -> Schedule:
    store.fail["commit"] = ConfigError(
        "note beatless/history/x: value of 20000 bytes is over 16384"
    )
    return fan_out(3)


def _commit_raises(clock: Clock, store: FailingStore) -> Schedule:
    store.fail["commit"] = KeyError("a bug in a store")
    return fan_out(3)


def _commit_unavailable(clock: Clock, store: FailingStore) -> Schedule:
    store.fail["commit"] = StoreUnavailable("connection reset")
    return fan_out(3)


@pytest.mark.parametrize(
    "fault",
    [_history_refused, _note_too_big, _commit_raises, _commit_unavailable, "counters"],
    ids=["history-note-refused", "note-too-big", "commit-raises", "commit-unavailable", "metrics"],
)
def test_a_step_after_a_send_that_fails_never_sends_the_firing_again(
    fault: object, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(T0 - 1)
    store = FailingStore(clock)
    broker = Broker(clock, store)
    schedule = fan_out(3) if fault == "counters" else fault(clock, store)  # type: ignore[operator]
    node = node_of(schedule, clock, store, broker)
    if fault == "counters":
        node.stats["fan"] = Faulty()
    with caplog.at_level(logging.WARNING, logger="beatless"):
        run_nodes([node], clock, 40)
    sends = sends_per_firing(broker)
    # The occurrence of T0, three tenants (that of T0 - 60 s is past max_late at start).
    assert len(sends) == 3
    assert max(sends.values()) == 1
    if fault != "counters":
        assert node.stats["fan"].post_send_errors + node.stats["fan"].commit_failures > 0
    assert "tried again" in caplog.text or "sends nothing more" in caplog.text


def test_a_failed_commit_stops_the_sends_until_a_commit_succeeds() -> None:
    clock = Clock(T0 - 1)
    store = FailingStore(clock)
    broker = Broker(clock, store, ms=20)  # 20 ms a send: a commit every third send
    node = node_of(fan_out(40), clock, store, broker)
    node.tick()  # the catch-up of T0 - 60 s
    clock.ms = round(T0 * 1_000)
    store.calls.clear()
    commits = 0

    def commit_then_fail(firing: Firing) -> None:
        nonlocal commits
        broker(firing)
        commits = sum(1 for c in store.calls if c[0] == "commit")
        if commits == 2 and "commit" not in store.fail:
            store.fail["commit"] = StoreUnavailable("connection reset")
            store.fail["release"] = StoreUnavailable("connection reset")

    node.dispatcher.enqueue = commit_then_fail  # type: ignore[attr-defined]
    decisions: list[Decision] = []
    for _ in range(20):  # 2 s of a store that refuses commits
        clock.ms += 100
        decisions += node.tick()
    failed_at = next(i for i, c in enumerate(store.calls) if c[0] == "commit" and not c[2])
    assert [c for c in store.calls[failed_at + 1 :] if c[0] == "send"] == []
    held = Counter(d.outcome for d in decisions)["commit_failed"]
    assert held > 0
    assert node.stats["fan"].commit_failures == held
    uncommitted = store.calls[failed_at][1]
    store.fail.clear()
    for _ in range(100):
        clock.ms += 100
        node.tick()
    sends = sends_per_firing(broker)
    this_minute = {f.id for f in broker.sent if f.occurrence_ms == round(T0 * 1_000)}
    assert len(this_minute) == 40
    assert max(sends.values()) == 1
    # The firings whose commit failed were committed again before the next send.
    again = next(i for i, c in enumerate(store.calls) if i > failed_at and c[2])
    assert store.calls[again] == ("commit", uncommitted, True)
    other = [claim_request(f) for f in broker.sent]
    assert set(store.claim(other, node="other", lease_ms=1_000)) == {Outcome.LOST}


def test_the_sends_in_flight_at_a_commit_failure_are_all_that_another_node_may_repeat() -> None:
    # Two nodes; the store refuses the commits of node a for longer than the lease. Only
    # what a sent before its first failed commit may be taken over and sent again by b.
    clock = Clock(T0 - 1)
    store = FailingStore(clock)
    broker = Broker(clock, store, ms=20)
    schedule = fan_out(40)
    a = node_of(schedule, clock, store, broker)
    b_sent: list[Firing] = []
    b = Scheduler(
        schedule,
        store=store,
        clock=clock,
        node="b",
        enqueue=b_sent.append,
        monotonic=monotonic_of(clock),
        lease="10s",
    )
    for node in (a, b):
        node.tick()
    clock.ms = round(T0 * 1_000)
    store.calls.clear()
    store.fail["commit"] = StoreUnavailable("node a's link to the store is cut")
    a.tick()  # a claims every firing of T0, sends until its first commit fails
    in_flight = [f for f in broker.sent if f.occurrence_ms == round(T0 * 1_000)]
    assert 0 < len(in_flight) <= 3
    store.fail.clear()
    for _ in range(300):  # b runs alone for 30 s: a is cut off from the store
        clock.ms += 100
        b.tick()
    repeated = {f.id for f in b_sent} & {f.id for f in in_flight}
    assert repeated == {f.id for f in in_flight}
    sent_by_a = {f.id for f in broker.sent if f.occurrence_ms == round(T0 * 1_000)}
    sent_by_b = {f.id for f in b_sent if f.occurrence_ms == round(T0 * 1_000)}
    assert sent_by_a | sent_by_b == {f.id for f in (*in_flight, *b_sent)}
    assert len(sent_by_a | sent_by_b) == 40
    assert sent_by_a & sent_by_b == repeated
