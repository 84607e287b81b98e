"""A Redis failover is a change of the store's identity, and ``wait`` makes it lose nothing.

Each test runs a private primary and a replica of its own (``tests/faults/redis_server``)
whose replication link goes through a TCP proxy (``tests/faults/proxy``): pausing the
proxy makes the replica lag, and cutting it before the primary is killed loses what it
held, as with a replica lagging behind a primary that dies. The replica is then promoted
(``REPLICAOF NO ONE``), as Sentinel or an operator does.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis store needs redis-py")
import redis

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from proxy import Proxy
from redis_server import RedisServer, redis_server_binary
from service_check import require_binary

from beatless.errors import ConfigError, StoreUnavailable
from beatless.stores.base import ClaimRequest, Note, Outcome, Verdict
from beatless.stores.redis._wire import epoch_cause
from beatless.stores.redis.store import RedisStore

NAMESPACE = "failover"
LEASE_MS = 10_000
TOKEN = "0123456789abcdef"  # noqa: S105 - an epoch token, no secret


@dataclass
class Pair:
    """A primary, and a replica that replicates it through ``link``."""

    primary: RedisServer
    replica: RedisServer
    link: Proxy

    def lose_the_lag_and_promote(self) -> None:
        """Kill the primary with what the paused link holds, then promote the replica."""
        self.primary.kill()
        self.link.drop()
        self.replica.promote()

    def rejoin_as_replica(self) -> None:
        """Start the old primary again, empty, as a replica of the promoted one."""
        self.primary.replica_of = self.replica.address
        self.primary.start()
        self.primary.wait_in_sync()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    if redis_server_binary() is None:
        require_binary("redis-server is not installed; these tests start private servers")
    primary = RedisServer(tmp_path / "primary", "primary").start()
    link = Proxy(primary.address)
    replica = RedisServer(tmp_path / "replica", "replica", replica_of=(link.host, link.port))
    try:
        replica.start()
        replica.wait_in_sync()
        yield Pair(primary, replica, link)
    finally:
        link.close()
        replica.kill()
        primary.kill()


def request(id_: str, now_ms: int, *, release_ms: int | None = None) -> ClaimRequest:
    return ClaimRequest(
        id=id_,
        address=f"{NAMESPACE}/{id_}",
        occurrence_ms=now_ms,
        max_late_ms=60_000,
        memory_ms=120_000,
        release_ms=now_ms if release_ms is None else release_ms,
    )


def replicated(store: RedisStore, replica: RedisServer) -> None:
    """Wait until the replica has everything ``store`` wrote."""
    assert store.client.wait(1, 5_000) == 1, f"{replica.name} did not catch up"


def test_an_atomic_claim_on_a_read_only_replica_is_unavailable_and_pushes_nothing(
    pair: Pair,
) -> None:
    """A node still connected to a primary demoted to a replica (before Sentinel moves
    its clients): the claim's ``SET NX GET``, the script's first write, is refused
    ``READONLY``. That is :class:`StoreUnavailable`, tried again, not a corrupt record,
    and nothing is pushed."""
    store = RedisStore(pair.primary.url, namespace=NAMESPACE)
    now = store.time_ms()
    push = [["LPUSH", "failover-queue", "message"]]
    assert store.claim_and_push([request("a", now)], [push], node="n0") == [Outcome.WON]
    replicated(store, pair.replica)

    on_replica = RedisStore(pair.replica.url, namespace=NAMESPACE)
    on_replica.epoch = store.epoch  # the epoch record is there and names this history
    with pytest.raises(StoreUnavailable, match="read only replica"):
        on_replica.claim_and_push([request("b", now)], [push], node="n0")
    assert on_replica.client.llen("failover-queue") == 1
    assert on_replica.client.get(f"beatless:{NAMESPACE}:claim:b") is None


def test_promoted_replica_changes_the_identity_the_store_reports(pair: Pair) -> None:
    store = RedisStore(pair.primary.url, namespace=NAMESPACE)
    now = store.time_ms()
    assert store.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    before = store.epoch
    replicated(store, pair.replica)
    pair.lose_the_lag_and_promote()

    moved = RedisStore(pair.replica.url, namespace=NAMESPACE)
    moved.epoch = before  # the same node, now reaching the promoted replica
    assert moved.claim([request("b", now)], node="n0", lease_ms=LEASE_MS)
    assert before is not None
    assert moved.epoch is not None
    assert moved.epoch.token != before.token
    assert moved.epoch.started_ms >= now
    record = moved.client.get(f"beatless:{NAMESPACE}:epoch")
    assert epoch_cause(record.decode()) == "failover"


def test_claims_the_lagging_replica_lacks_are_not_sent_again(pair: Pair) -> None:
    """Claimed and committed on the primary while the replica lagged: after the
    failover, neither the node that saw the old primary nor a node started on the new
    one wins them again; a firing released after the failover is won as usual."""
    node = RedisStore(pair.primary.url, namespace=NAMESPACE)
    now = node.time_ms()
    assert node.claim([request("kept", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert node.commit(["kept"], node="n0") == [True]
    replicated(node, pair.replica)
    pair.link.pause()
    lagging = [request(f"lagged{i}", now) for i in range(3)]
    assert node.claim(lagging, node="n0", lease_ms=LEASE_MS) == [Outcome.WON] * 3
    assert node.commit([r.id for r in lagging], node="n0") == [True] * 3
    seen = node.epoch
    pair.lose_the_lag_and_promote()

    moved = RedisStore(pair.replica.url, namespace=NAMESPACE)
    moved.epoch = seen
    fresh = RedisStore(pair.replica.url, namespace=NAMESPACE)
    later = request("later", now, release_ms=now + 9_000)
    assert fresh.claim([lagging[0], request("kept", now)], node="n1", lease_ms=LEASE_MS) == [
        Outcome.FORGOTTEN,
        Outcome.LOST,
    ]
    assert moved.claim(lagging[1:], node="n2", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN] * 2
    # Written committed: a third node, fresh too, loses them.
    third = RedisStore(pair.replica.url, namespace=NAMESPACE)
    assert third.claim(lagging, node="n3", lease_ms=LEASE_MS) == [Outcome.LOST] * 3
    # Released before the failover's start plus 10 s: forgotten too (it could have been
    # claimed early on the old primary); one released at that instant is won.
    assert fresh.claim([later], node="n1", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    assert fresh.epoch is not None
    after = request("after", now, release_ms=fresh.epoch.started_ms + 10_000)
    assert fresh.claim([after], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]


def test_pending_claim_whose_commit_was_lost_is_not_taken_over(pair: Pair) -> None:
    """Claimed pending (replicated), sent and committed on the primary while the replica
    lagged: on the promoted replica the claim is pending; once its lease runs out, it is
    forgotten, not taken over (its message was sent)."""
    node = RedisStore(pair.primary.url, namespace=NAMESPACE)
    now = node.time_ms()
    assert node.claim([request("sent", now)], node="n0", lease_ms=300) == [Outcome.WON]
    replicated(node, pair.replica)
    pair.link.pause()
    assert node.commit(["sent"], node="n0") == [True]
    pair.lose_the_lag_and_promote()
    time.sleep(0.4)  # the lease runs out on the new primary
    other = RedisStore(pair.replica.url, namespace=NAMESPACE)
    assert other.claim([request("sent", now)], node="n1", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]


def test_restarted_primary_has_the_same_identity(pair: Pair) -> None:
    """A new replication id without a history it continued (a primary restarted, its
    data kept or not) is no failover: the epoch record keeps its token."""
    store = RedisStore(pair.primary.url, namespace=NAMESPACE)
    now = store.time_ms()
    store.claim([request("a", now)], node="n0", lease_ms=LEASE_MS)
    key = f"beatless:{NAMESPACE}:epoch"
    record = store.client.get(key).decode()
    version, started, token, _replid, cause = record.split("|")
    # As if the server had restarted with its data: another history's id in the record.
    store.client.set(key, f"{version}|{started}|{token}|{'0' * 39}1|{cause}")
    seen = store.epoch
    assert store.claim([request("b", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.epoch == seen
    assert store.client.get(key).decode() == record


def test_epoch_record_of_an_earlier_version_is_kept(pair: Pair) -> None:
    """A ``v=1`` record (no replication id) is rewritten as ``v=2`` with its token kept:
    no node sees a change of identity."""
    store = RedisStore(pair.primary.url, namespace=NAMESPACE)
    key = f"beatless:{NAMESPACE}:epoch"
    store.client.set(key, f"v=1|1700000000000|{TOKEN}")
    now = store.time_ms()
    assert store.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.epoch is not None
    assert store.epoch.token == TOKEN
    record = store.client.get(key).decode()
    assert record.startswith(f"v=2|1700000000000|{TOKEN}|")
    assert record.endswith("|new")


# -- wait -------------------------------------------------------------------------------


def test_with_wait_a_claim_counts_only_once_a_replica_has_it(pair: Pair) -> None:
    # The same node's claims through two store objects: one that waits long enough for a
    # replica however loaded the machine, one that gives up after 300 ms.
    patient = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=2s", namespace=NAMESPACE)
    hasty = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=300ms", namespace=NAMESPACE)
    now = patient.time_ms()
    assert patient.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    pair.link.pause()
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"0 of 1 replica\(s\) acknowledged it within 300"):
        hasty.claim([request("b", now)], node="n0", lease_ms=LEASE_MS)
    assert time.monotonic() - began > 0.25
    # Another node sees it held, not won; the node that claimed it wins it once a
    # replica has it.
    other = RedisStore(pair.primary.url, namespace=NAMESPACE)
    assert other.claim([request("b", now)], node="n1", lease_ms=LEASE_MS) == [Outcome.HELD]
    pair.link.resume()
    assert patient.claim([request("b", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]


def test_with_wait_an_atomic_claims_notes_are_in_its_pipeline_before_the_wait(
    pair: Pair,
) -> None:
    store = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=2s", namespace=NAMESPACE)
    now = store.time_ms()
    kind = "history/waited"
    note = Note(kind, "a", '{"outcome":"{{outcome}}"}', 60_000)
    push = [["LPUSH", "waited-queue", "message"]]

    assert store.claim_and_push([request("a", now)], [push], node="n0", notes=[note]) == [
        Outcome.WON
    ]

    # The one WAIT came after the notes script: the replica has the note as well.
    assert store.read_notes([kind]) == {kind: {"a": '{"outcome":"won"}'}}
    on_replica = RedisStore(pair.replica.url, namespace=NAMESPACE)
    assert on_replica.read_notes([kind]) == {kind: {"a": '{"outcome":"won"}'}}
    assert on_replica.client.llen("waited-queue") == 1


def test_with_wait_a_commit_not_acknowledged_is_a_failed_commit(pair: Pair) -> None:
    store = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=300ms", namespace=NAMESPACE)
    now = store.time_ms()
    assert store.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    pair.link.pause()
    with pytest.raises(StoreUnavailable, match="sent firings stay uncommitted"):
        store.commit(["a"], node="n0")
    pair.link.resume()
    assert store.commit(["a"], node="n0") == [True]


def test_with_wait_a_failover_forgets_nothing_a_replica_acknowledged(pair: Pair) -> None:
    """Every node waits: what the old primary granted was acknowledged by the replica,
    so a firing absent from it was never sent, and is won (once) on the new primary."""
    # A replica acknowledges in time, however loaded the machine; once its link is
    # paused, a store object that waits 300 ms gives up on a claim.
    node = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=2s", namespace=NAMESPACE)
    now = node.time_ms()
    assert node.claim([request("sent", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert node.commit(["sent"], node="n0") == [True]
    pair.link.pause()
    hasty = RedisStore(f"{pair.primary.url}?wait=1&wait_timeout=300ms", namespace=NAMESPACE)
    with pytest.raises(StoreUnavailable):
        hasty.claim([request("unacknowledged", now)], node="n0", lease_ms=LEASE_MS)
    hasty.close()
    seen = node.epoch
    pair.lose_the_lag_and_promote()
    pair.rejoin_as_replica()

    waiting = f"{pair.replica.url}?wait=1&wait_timeout=2s"
    moved = RedisStore(waiting, namespace=NAMESPACE)
    moved.epoch = seen
    fresh = RedisStore(waiting, namespace=NAMESPACE)
    both = [request("sent", now), request("unacknowledged", now)]
    assert fresh.claim(both, node="n1", lease_ms=LEASE_MS) == [Outcome.LOST, Outcome.WON]
    assert moved.claim([request("new", now)], node="n2", lease_ms=LEASE_MS) == [Outcome.WON]
    # A node without wait judges the failover as it would without: forgotten.
    alone = RedisStore(pair.replica.url, namespace=NAMESPACE)
    assert alone.claim([request("other", now)], node="n3", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]


def test_with_wait_too_few_replicas_are_refused(pair: Pair) -> None:
    with_replica = RedisStore(f"{pair.primary.url}?wait=1", namespace=NAMESPACE)
    facts = with_replica.facts()
    assert facts.fact("connected replicas").verdict is Verdict.OK  # type: ignore[union-attr]
    assert facts.fact("wait").value == "1 replica(s) within 1000 ms"  # type: ignore[union-attr]
    two = RedisStore(pair.primary.url, namespace=NAMESPACE, wait=2)
    refused = two.facts().refusal()
    assert refused is not None
    assert "wait=2 asks 2 replica(s) to acknowledge each claim and 1 is connected" in refused


def test_wait_options_in_the_url() -> None:
    store = RedisStore("redis://127.0.0.1:6379/0?wait=2&wait_timeout=250ms", namespace="x")
    assert (store.wait, store.wait_timeout_ms) == (2, 250)
    assert store.client.connection_pool.connection_kwargs.get("wait") is None
    with pytest.raises(ConfigError, match="wait='one' must be a number of replicas"):
        RedisStore("redis://127.0.0.1:6379/0?wait=one", namespace="x")
    with pytest.raises(ConfigError, match="must be under the socket timeout"):
        RedisStore("redis://127.0.0.1:6379/0?wait=1&wait_timeout=5s", namespace="x")
    with pytest.raises(ConfigError, match="wait must be 0 or more"):
        RedisStore(redis.Redis(), namespace="x", wait=-1)


# -- PostgreSQL -------------------------------------------------------------------------


def test_postgres_store_that_finds_a_new_timeline_forgets_the_firings_nobody_holds() -> None:
    """A promoted standby starts a new timeline: a store object that read the old one (at
    start or at a sync) and reads another answers the firings released before then plus
    10 s that nobody holds ``forgotten``. (The promotion is played by telling the store
    object it saw another timeline: a standby of the test's own would take minutes.)"""
    pytest.importorskip("psycopg", reason="the postgres store needs psycopg")
    sys.path.insert(0, str(Path(__file__).parent))
    from service_check import require_service
    from stores import POSTGRES, POSTGRES_URL, drop_postgres_schema

    from beatless.stores.postgres.store import PostgresStore, timeline_of

    require_service(*POSTGRES)
    assert timeline_of("000000020000000000000003") == 2
    assert timeline_of(None) is None
    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(f"{POSTGRES_URL}?schema={schema}", namespace=NAMESPACE)
    try:
        store.facts()
        now = store.time_ms()
        assert store.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
        assert store.facts().verdict is not Verdict.REFUSE
        assert store.claim([request("b", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
        store._timeline = 999  # as if it had last read the old primary's timeline
        store.facts()
        assert store.claim(
            [request("c", now), request("a", now)], node="n1", lease_ms=LEASE_MS
        ) == [
            Outcome.FORGOTTEN,
            Outcome.HELD,
        ]
    finally:
        store.close()
        drop_postgres_schema(schema)


def test_postgres_store_started_on_a_promoted_standby_finds_the_fleets_older_timeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node that starts on a promoted standby never read the old primary's timeline
    itself, but the store holds the latest timeline any node of the namespace saw (the
    standby replicated it): a store object whose first read finds the server on a later
    timeline forgets the firings nobody holds, as a running one does. (The promotion is
    played by recording an older timeline than the server's.)"""
    pytest.importorskip("psycopg", reason="the postgres store needs psycopg")
    sys.path.insert(0, str(Path(__file__).parent))
    from service_check import require_service
    from stores import POSTGRES, POSTGRES_URL, drop_postgres_schema

    from beatless.stores.postgres.store import PostgresStore

    require_service(*POSTGRES)
    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"
    url = f"{POSTGRES_URL}?schema={schema}"
    first = PostgresStore(url, namespace=NAMESPACE)
    try:
        first.facts()  # the fleet's first node records the server's timeline
        current = first._timeline
        assert current is not None
        now = first.time_ms()
        assert first.claim([request("a", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
        fresh = PostgresStore(url, namespace=NAMESPACE)
        fresh.facts()  # same timeline as recorded: nothing forgotten
        assert fresh.claim([request("b", now)], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]
        fresh.close()
        # As if the fleet had last seen the old primary's timeline, one before the server's.
        _rewind(schema, current - 1)
        promoted = PostgresStore(url, namespace=NAMESPACE)
        with caplog.at_level(logging.WARNING):
            promoted.facts()
        assert f"timeline changed from {current - 1} to {current}" in caplog.text
        assert promoted.claim(
            [request("c", now), request("a", now)], node="n2", lease_ms=LEASE_MS
        ) == [Outcome.FORGOTTEN, Outcome.HELD]
        promoted.close()
        again = PostgresStore(url, namespace=NAMESPACE)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            again.facts()  # the record now holds the server's timeline
        assert "timeline changed" not in caplog.text
        again.close()
    finally:
        first.close()
        drop_postgres_schema(schema)


def _rewind(schema: str, timeline: int) -> None:
    """Set the timeline the fleet of ``schema`` last saw."""
    import psycopg

    sys.path.insert(0, str(Path(__file__).parent))
    from stores import POSTGRES_URL

    with psycopg.connect(POSTGRES_URL.split("?")[0], autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.timelines SET timeline = %s", (timeline,))  # noqa: S608
