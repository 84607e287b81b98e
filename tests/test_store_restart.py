"""A store that drops its connections, or a commit that fails for a while, keeps its claims.

A node whose commit failed keeps the sent firings uncommitted and commits them again at
every wake (at least every retry interval), whether anything is due or not: a store that
comes back within the lease costs nothing, however idle the node. A commit that comes
after the lease ran out, and finds the firing taken over, is told per firing and counted
(``two_phase_window``). A PostgreSQL store whose server cut a connection runs the call
again at once on a new one, so that a commit is not lost to the cut.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from service_check import require_service
from stores import POSTGRES_URL, drop_postgres_schema
from test_after_send import Broker, FailingStore, fan_out
from test_scheduler import T0, Clock
from test_two_phase import monotonic_of

from beatless import Firing, Schedule
from beatless.errors import StoreUnavailable
from beatless.node import dispatch
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import claim_request
from beatless.stores.base import Outcome


def node_of(
    name: str, schedule: Schedule, clock: Clock, store: FailingStore, broker: Broker
) -> Scheduler:
    return Scheduler(
        schedule,
        store=store,
        clock=clock,
        node=name,
        enqueue=broker,
        monotonic=monotonic_of(clock),
        lease="5s",
    )


def two_nodes_one_failing_commit(clock: Clock, fail_for_ms: int) -> tuple[list[Scheduler], Broker]:
    """Nodes a and b, one entry of one tenant every 60 s; the store refuses every commit
    from a's send of the occurrence at T0 for ``fail_for_ms``, then answers again. Runs
    30 s of wakes every 100 ms."""
    store = FailingStore(clock)
    broker = Broker(clock, store, ms=20)
    schedule = fan_out(1)
    nodes = [node_of(name, schedule, clock, store, broker) for name in ("a", "b")]
    for node in nodes:
        node.tick()  # the catch-up of T0 - 60 s
    clock.ms = round(T0 * 1_000)
    failed_until: list[int] = []

    def send_then_cut(firing: Firing) -> None:
        broker(firing)
        store.fail["commit"] = StoreUnavailable("server closed the connection unexpectedly")
        failed_until.append(clock.ms + fail_for_ms)

    nodes[0].dispatcher.enqueue = send_then_cut  # type: ignore[attr-defined]
    nodes[0].tick()  # a wins and sends the firing; its commit fails
    nodes[0].dispatcher.enqueue = broker  # type: ignore[attr-defined]
    nodes[1].tick()  # b finds it held
    assert len(broker.sent) == 1
    for _ in range(300):
        clock.ms += 100
        if failed_until and clock.ms >= failed_until[0]:
            store.fail.clear()
        for node in nodes:
            node.tick()
    return nodes, broker


def test_a_failed_commit_is_made_at_the_next_wake_of_a_node_with_nothing_due() -> None:
    # The store answers again 2 s into a 5 s lease; a has nothing due for a minute. Its
    # next wakes commit the firing, so b, which saw it held, finds it committed: lost.
    clock = Clock(T0 - 1)
    nodes, broker = two_nodes_one_failing_commit(clock, fail_for_ms=2_000)
    sends = Counter(f.id for f in broker.sent)
    assert len(sends) == 1
    assert max(sends.values()) == 1
    assert nodes[1].stats["fan"].lost == 1
    assert nodes[0].dispatcher.uncommitted == []  # type: ignore[attr-defined]
    assert nodes[0].stats["fan"].two_phase_window == 0


def test_a_commit_that_failed_past_the_lease_is_told_per_firing_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The store refuses commits for 8 s, past the 5 s lease: b takes the firing over and
    # sends it again. a says so once when the lease runs out, and counts the firing in
    # the two-phase window when its commit finds it taken over.
    clock = Clock(T0 - 1)
    with caplog.at_level(logging.WARNING, logger="beatless"):
        nodes, broker = two_nodes_one_failing_commit(clock, fail_for_ms=8_000)
    assert len(broker.sent) == 2  # the one second copy the store alone cannot rule out
    assert nodes[1].stats["fan"].takeovers == 1
    assert nodes[0].stats["fan"].two_phase_window == 1
    told = [r for r in caplog.records if r.msg is dispatch.NOT_COMMITTED_IN_TIME]
    assert len(told) == 1
    assert told[0].args[0] == broker.sent[0].id  # type: ignore[index]


def test_a_node_that_owes_a_commit_wakes_within_the_retry_interval() -> None:
    clock = Clock(T0 - 1)
    store = FailingStore(clock)
    node = node_of("a", fan_out(1), clock, store, Broker(clock, store))
    node.tick()
    assert not node.dispatcher.settling
    node.dispatcher.uncommitted.append(firings_of(node.schedule)[0])  # type: ignore[attr-defined]
    assert node.dispatcher.settling
    assert node.sleep_s() <= 0.5


def firings_of(schedule: Schedule, occurrence: int = round(T0 * 1_000)) -> list[Firing]:
    """The firings of the schedule's one entry at ``occurrence``, one per tenant."""
    entry = schedule.entries[0]
    return [
        Firing.of(entry, t, schedule.address(entry, t), occurrence) for t in entry.tenants or ()
    ]


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    pytest.importorskip("psycopg")
    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_postgres_schema(schema)


def _terminate(backend_pid: int) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))


def test_a_commit_on_a_connection_the_server_cut_is_made_on_a_new_one(
    postgres_schema: str,
) -> None:
    from beatless.stores.postgres.store import PostgresStore

    # The minute's occurrence nearest ahead of 9 s from now: at most 9 s ahead (not early
    # by the store's 10 s tolerance) and at most 51 s behind (not late by max_late 50 s
    # and that tolerance), however near a minute's end the test starts.
    firings = firings_of(fan_out(2), (int(time.time() + 9) // 60) * 60_000)
    requests = [claim_request(f) for f in firings]
    with (
        PostgresStore(POSTGRES_URL, schema=postgres_schema) as a,
        PostgresStore(POSTGRES_URL, schema=postgres_schema) as b,
    ):
        assert a.claim(requests, node="a", lease_ms=5_000) == [Outcome.WON] * 2
        (link,) = a._links.idle
        conn = link.conn
        assert conn is not None
        _terminate(conn.info.backend_pid)  # as a restart or a failover cuts every session
        assert a.commit([f.id for f in firings], node="a") == [True, True]
        assert b.claim(requests, node="b", lease_ms=5_000) == [Outcome.LOST] * 2
