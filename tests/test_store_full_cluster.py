"""A Redis Cluster that fills up, as ``test_store_full.py`` has it for one Redis: a write
refused as full is ``StoreFull`` saying how full each master is, and a commit refused
as full is committed all the same (the commit script flagged ``allow-oom``), so that no
node takes a sent firing's claim over. On a cluster of the test's own (three masters on
free loopback ports), stopped by pid: the shared test cluster is never filled."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis cluster store needs redis-py")
sys.path.insert(0, str(Path(__file__).parent))
from redis_cluster import LocalCluster

from beatless.errors import StoreFull
from beatless.stores import ClaimRequest, Outcome
from beatless.stores.redis._buckets import BUCKETS, bucket_of
from beatless.stores.redis.cluster import RedisClusterStore

pytestmark = pytest.mark.slow  # starts a cluster of its own: a few seconds

UNDER = 64 * 1024
"""A full master's maxmemory is set this far under what it uses: every write is refused,
whatever a few kilobytes of client buffers do."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("full-cluster"))
    started.start()
    try:
        yield started
    finally:
        started.stop()


def fill(cluster: LocalCluster) -> None:
    """Every master full under ``noeviction``: its limit under what it uses."""
    for port in cluster.ports:
        with cluster.node(port) as client:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", str(used - UNDER))


def drain(cluster: LocalCluster) -> None:
    for port in cluster.ports:
        with cluster.node(port) as client:
            client.config_set("maxmemory", "0")


def requests(store: RedisClusterStore, count: int) -> list[ClaimRequest]:
    now = store.time_ms()
    return [
        ClaimRequest(
            id=uuid.uuid4().hex,
            address=f"full/{i}",
            occurrence_ms=now,
            max_late_ms=60_000,
            memory_ms=60_000,
            release_ms=now,
        )
        for i in range(count)
    ]


def test_a_claim_refused_as_full_is_store_full_and_says_how_full_each_master_is(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisClusterStore(cluster.url, prefix=f"full-{uuid.uuid4().hex}:") as store:
        claims = requests(store, 1)
        fill(cluster)
        try:
            with caplog.at_level(logging.WARNING), pytest.raises(StoreFull) as raised:
                store.claim(claims, node="n1", lease_ms=5_000)
            with pytest.raises(StoreFull):
                store.claim(claims, node="n1", lease_ms=5_000)
        finally:
            drain(cluster)
        assert store.claim(claims, node="n1", lease_ms=5_000) == [Outcome.WON]

    usage = raised.value.usage or ""
    assert all(f"127.0.0.1:{port} used_memory " in usage for port in cluster.ports), usage
    told = [r.getMessage() for r in caplog.records if "Redis is full" in r.getMessage()]
    assert len(told) == 1, told
    assert "redis cluster store redis+cluster://" in told[0]
    assert "cannot claim" in told[0]


def test_a_commit_refused_as_full_still_commits_so_no_node_takes_the_claims_over(
    cluster: LocalCluster,
) -> None:
    prefix = f"full-{uuid.uuid4().hex}:"
    with (
        RedisClusterStore(cluster.url, prefix=prefix) as winner,
        RedisClusterStore(cluster.url, prefix=prefix) as other,
    ):
        claims = requests(winner, 30)  # spread over the buckets of every master
        ids = [c.id for c in claims]
        assert winner.claim(claims, node="n1", lease_ms=300) == [Outcome.WON] * 30
        fill(cluster)  # the messages are sent; then the cluster fills before the commit
        try:
            with pytest.raises(StoreFull) as raised:
                winner.commit(ids, node="n1")
        finally:
            drain(cluster)
        assert raised.value.kept == [True] * 30

        time.sleep(0.4)  # the lease the claims were won with has run out
        assert other.claim(claims, node="n2", lease_ms=300) == [Outcome.LOST] * 30


def test_an_evicting_policy_on_one_master_is_seen_by_the_quick_read(
    cluster: LocalCluster,
) -> None:
    with RedisClusterStore(cluster.url, prefix=f"facts-{uuid.uuid4().hex}:") as store:
        assert store.watch().refusal() is None
        port = cluster.ports[1]
        with cluster.node(port) as client:
            client.config_set("maxmemory", "100mb")
            client.config_set("maxmemory-policy", "allkeys-lru")
        try:
            facts = store.watch(quick=True)
        finally:
            with cluster.node(port) as client:
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", "0")
        assert store.watch(quick=True).refusal() is None

    assert facts.summary() == f"refuse: maxmemory-policy @127.0.0.1:{port} allkeys-lru"
    assert facts.fact(f"appendonly @127.0.0.1:{port}") is not None  # from the full read


def test_a_claim_evicted_before_the_claims_stopped_is_forgotten_once_they_resume(
    cluster: LocalCluster,
) -> None:
    """Fault: a won claim evicted (deleted here, as Redis evicts a key with a TTL) while
    one master has an evicting policy, under two running store objects, one of which
    claimed nothing yet. Every bucket's epoch is begun again (cause ``evicted``); once the
    policy is fixed, the firing is forgotten, not won again by the other store object."""
    from redis.cluster import RedisCluster

    prefix = f"evicted-{uuid.uuid4().hex}:"
    port = cluster.ports[1]
    with (
        RedisClusterStore(cluster.url, prefix=prefix) as first,
        RedisClusterStore(cluster.url, prefix=prefix) as second,
        RedisCluster(host="127.0.0.1", port=cluster.ports[0]) as admin,
    ):
        first.watch()
        second.watch()
        (request,) = requests(first, 1)
        assert first.claim([request], node="n1", lease_ms=30_000)[0].is_won
        epochs = admin.keys(f"{prefix}*:epoch", target_nodes=RedisCluster.ALL_NODES)
        assert len(epochs) == len(BUCKETS), "every bucket's epoch, read at the first claim"
        with cluster.node(port) as client:
            client.config_set("maxmemory", "100mb")
            client.config_set("maxmemory-policy", "volatile-ttl")
        try:
            assert admin.delete(f"{prefix}{{{bucket_of(request.id)}}}:claim:{request.id}") == 1
            for store in (first, second):
                assert store.watch(quick=True).refusal() is not None
            records = [admin.get(key) for key in epochs]
            assert all(record.endswith(b"|evicted") for record in records), records[:3]
        finally:
            with cluster.node(port) as client:
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", "0")
        assert second.watch(quick=True).refusal() is None
        (outcome,) = second.claim([request], node="n2", lease_ms=30_000)
        assert outcome is Outcome.FORGOTTEN, outcome
        admin.delete(*admin.keys(f"{prefix}*", target_nodes=RedisCluster.ALL_NODES))
