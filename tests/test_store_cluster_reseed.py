"""A Redis Cluster master restarted empty, under two nodes that re-seed the store.

The cluster is private to this module: three masters, no replica. Two nodes, ``a`` and
``b``, each with its own store object and :class:`~beatless.node._reseed.Reseeder`, send
firings; then one master is killed (SIGKILL) and started again on the same port with no
data. ``a`` meets the loss at a claim (its firings there are held off, ``reseeding``);
``b`` never claims in that master's buckets and learns of it only from ``a``'s note. Both
must name the same epoch (the digest of the 256 buckets' epochs) for the gate to open.
Then a second master is restarted the same way: a second epoch, re-seeded in turn. Every
firing a node sent stays sent once, and every firing nobody sent is sent once after the
gate opened: none sent twice, none missed.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from redis_cluster import LocalCluster

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import StoreUnavailable
from beatless.node._reseed import GRACE_MS, Reseeded, Reseeder, reseeded_kind
from beatless.schedule.firing import claim_request
from beatless.stores import Outcome
from beatless.stores.redis._buckets import BUCKETS, bucket_of
from beatless.stores.redis.cluster import RedisClusterStore

pytest.importorskip("redis", reason="the redis cluster store needs redis-py")
pytestmark = pytest.mark.slow  # starts a cluster of its own: a few seconds

LEASE_MS = 60_000
NAMESPACE = "reseed"
NODES = (("a", 1), ("b", 2))
T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    (tmp_path / "cluster").mkdir()
    made = LocalCluster(tmp_path / "cluster")
    made.start()
    try:
        yield made
    finally:
        made.stop()


class Node:
    """One node's store object, holding off, and its re-seeding; what it sent."""

    def __init__(self, store: RedisClusterStore, me: tuple[str, int], sent: Counter[str]) -> None:
        self.store, self.name, self.sent = store, me[0], sent
        self.reseeder = Reseeder(
            store,
            node=me,
            namespace=NAMESPACE,
            lease_ms=LEASE_MS,
            reach_ms=80_000,
            known_since=lambda _since: set(NODES),
            notes=lambda: store.read_notes([reseeded_kind(NAMESPACE)])[reseeded_kind(NAMESPACE)],
        )
        store.holds_off = self.reseeder.enabled

    def claim(self, firings: list[Firing]) -> list[Outcome]:
        return self.store.claim(
            [claim_request(f) for f in firings], node=self.name, lease_ms=LEASE_MS
        )

    def send(self, firings: list[Firing]) -> None:
        """Claim, send and commit each firing it wins, as a node loop does."""
        won = [f for f, o in zip(firings, self.claim(firings), strict=True) if o.is_won]
        for firing in won:
            self.sent[firing.id] += 1
            self.reseeder.sent(firing)
        assert self.store.commit([f.id for f in won], node=self.name) == [True] * len(won)


def answering(call: Callable[[], T]) -> T:
    """``call()``, again while the cluster client has not yet found the restarted master."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def noted(node: Node) -> dict[str, str]:
    """The epoch each node's note names."""
    notes = node.reseeder._notes().items()
    return {key: note.epoch for key, text in notes if (note := Reseeded.of(text)) is not None}


class Fleet:
    """Nodes ``a`` and ``b`` on one cluster, with a clock the test moves past the grace;
    firings made to land on the masters asked."""

    def __init__(self, cluster: LocalCluster, a: RedisClusterStore, b: RedisClusterStore) -> None:
        self.cluster, self.sent = cluster, Counter[str]()
        self.a, self.b = Node(a, NODES[0], self.sent), Node(b, NODES[1], self.sent)
        client = a._connected()
        self.master = {b: client.get_node_from_key(a._key(b, "epoch")).port for b in BUCKETS}
        self.entry = Entry(name="fan", task="tasks.t", trigger=Every(60), max_late="60s")
        self.schedule = Schedule([self.entry])
        self.ahead_ms = 0
        """How far the nodes' clock is ahead of the store's: the grace, passed."""
        self._tenants = itertools.count()

    def now(self) -> int:
        return self.a.store.time_ms() + self.ahead_ms

    def step(self) -> tuple[bool, bool]:
        return self.a.reseeder.step(self.now()), self.b.reseeder.step(self.now())

    def firings(self, n: int, on: Callable[[int], bool]) -> list[Firing]:
        """``n`` firings released now, each in a bucket of a master whose port ``on`` takes."""
        occurrence, found = self.a.store.time_ms(), []
        while len(found) < n:
            tenant = f"t{next(self._tenants)}"
            address = self.schedule.address(self.entry, tenant)
            firing = Firing.of(self.entry, tenant, address, occurrence)
            if on(self.master[bucket_of(firing.id)]):
                found.append(firing)
        return found

    def lose(self, port: int) -> set[str]:
        """Both nodes send; the master at ``port`` restarts empty; a meets it, b learns of
        it from a's note; both re-seed and settle, then send what nobody had sent. The ids
        of every firing of the round."""
        a, b = self.a, self.b
        by_a = self.firings(40, lambda _: True)
        by_b = self.firings(30, lambda p: p != port)  # never in that master's buckets
        nobody = self.firings(30, lambda p: p == port)
        a.send(by_a)
        b.send(by_b)
        assert self.step() == (False, False)
        before = a.store.epoch

        self.cluster.restart_empty(port)
        for store in (a.store, b.store):
            answering(store.probe)
        # a meets the loss: what it finds absent there is held off, nothing written.
        assert a.claim(nobody) == [Outcome.RESEEDING] * len(nobody)
        assert a.store.epoch not in (None, before)
        assert self.step() == (False, False)  # both write back what they sent
        assert b.store.epoch == a.store.epoch
        assert noted(a) == {"a": a.store.epoch.token, "b": a.store.epoch.token}
        assert b.claim(nobody) == [Outcome.RESEEDING] * len(nobody)
        assert b.claim(by_a) == [Outcome.LOST] * len(by_a)

        self.ahead_ms += GRACE_MS
        assert self.step() == (True, True)  # every node wrote back: settled
        assert (a.store.forgot_before_ms, b.store.forgot_before_ms) == (None, None)
        b.send(by_a + nobody)
        a.send(by_a + by_b + nobody)
        return {f.id for f in by_a + by_b + nobody}


def test_masters_restarted_empty_at_two_times_are_re_seeded_on_one_epoch_each(
    cluster: LocalCluster,
) -> None:
    prefix = f"reseed:{time.time_ns()}:"
    with (
        RedisClusterStore(cluster.url, prefix=prefix) as a,
        RedisClusterStore(cluster.url, prefix=prefix) as b,
    ):
        fleet = Fleet(cluster, a, b)
        epochs, expected = [], set()
        for port in cluster.ports[:2]:
            expected |= fleet.lose(port)
            epochs.append(a.epoch)
            assert fleet.sent == Counter(dict.fromkeys(expected, 1))  # none twice, none missed
    assert len({e.token for e in epochs if e is not None}) == 2
