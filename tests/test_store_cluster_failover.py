"""A Redis Cluster master killed (SIGKILL) and its replica promoted: the claim script sees
a new identity in that master's buckets (another ``master_replid``, continuing the old
master's history), so the firings of those buckets whose claims the replica may lack are
answered ``forgotten``, never claimed and sent again; the other buckets are unaffected.

The cluster is private to this module: three masters, a replica each. The replica is
made to lack the last claim of its master as a lagging replica would: its master drops
the replication link (``CLIENT KILL TYPE replica``) just before that claim, and the
replica cannot reconnect (it is given a ``masterauth`` its master refuses) before the
master is killed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_cluster import LocalCluster

from beatless.stores import ClaimRequest, Outcome
from beatless.stores.redis._buckets import bucket_of
from beatless.stores.redis.cluster import RedisClusterStore

pytest.importorskip("redis", reason="the redis cluster store needs redis-py")

LEASE_MS = 60_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    (tmp_path / "cluster").mkdir()
    made = LocalCluster(tmp_path / "cluster", replicas=1)
    made.start()
    try:
        yield made
    finally:
        made.stop()


def request(store: RedisClusterStore, bucket: str) -> ClaimRequest:
    """A firing released now whose id falls in ``bucket``."""
    now = store.time_ms()
    id_ = bucket + uuid.uuid4().hex[2:]
    assert bucket_of(id_) == bucket
    return ClaimRequest(id_, f"failover/{bucket}", now, 60_000, 80_000, now)


def roles(cluster: LocalCluster) -> dict[int, int]:
    """Each master's port, and the port of its replica."""
    by_id: dict[str, int] = {}
    replica_of: dict[int, str] = {}
    for port in cluster.procs:
        with cluster.node(port) as client:
            myself = client.execute_command("CLUSTER MYID")
            info = client.info("replication")
        by_id[myself] = port
        if info["role"] == "slave":
            with cluster.node(port) as client:
                nodes = client.execute_command("CLUSTER NODES")
            mine = next(line for line in _lines(nodes) if "myself" in line)
            replica_of[port] = mine.split()[3]
    return {by_id[master]: port for port, master in replica_of.items()}


def _lines(nodes: Any) -> list[str]:
    if isinstance(nodes, dict):  # redis-py may parse CLUSTER NODES into a dict
        return [f"{v['node_id']} {k} {v['flags']} {v['master_id']}" for k, v in nodes.items()]
    return str(nodes).splitlines()


def _wait_in_sync(master: Any) -> None:
    """Until the master's replica is online and has every write of the master."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = master.info("replication")
        replica = info.get("slave0")
        online = isinstance(replica, dict) and replica.get("state") == "online"
        if online and int(replica["offset"]) >= int(info["master_repl_offset"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"the replica did not catch up: {master.info('replication')}")


def promoted(cluster: LocalCluster, port: int) -> bool:
    with cluster.node(port) as client:
        return bool(client.info("replication")["role"] == "master")


@pytest.mark.slow
def test_a_promoted_replica_forgets_its_buckets_unsent_firings_and_no_other_bucket(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"failover:{uuid.uuid4().hex[:8]}:"
    pairs = roles(cluster)
    assert len(pairs) == 3, pairs
    with (
        RedisClusterStore(cluster.url, prefix=prefix) as old,
    ):
        # Find a bucket on one master and a bucket on another.
        client = old._connected()
        master_of = {
            b: client.get_node_from_key(f"{prefix}{{{b}}}:epoch").port
            for b in (
                "00",
                "01",
                "02",
                "03",
                "04",
                "05",
                "06",
                "07",
                "08",
                "09",
                "0a",
                "0b",
                "0c",
                "0d",
                "0e",
                "0f",
            )
        }
        dying = master_of["00"]
        other_bucket = next(b for b, p in master_of.items() if p != dying)
        replica = pairs[dying]

        sent = request(old, "00")  # won and committed, replicated
        pending = request(old, "00")  # won, never committed; replicated
        elsewhere = request(old, other_bucket)
        assert old.claim([sent, pending, elsewhere], node="n1", lease_ms=1_000) == [Outcome.WON] * 3
        assert old.commit([sent.id, elsewhere.id], node="n1") == [True, True]
        with cluster.node(dying) as master, cluster.node(replica) as follower:
            _wait_in_sync(master)
            # The replica cannot come back (its handshake's AUTH is refused): it lags.
            follower.config_set("masterauth", "not-the-password")
            master.execute_command("CLIENT", "KILL", "TYPE", "replica")
        lost = request(old, "00")  # its claim and commit never reach the replica
        assert old.claim([lost], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]
        assert old.commit([lost.id], node="n1") == [True]
        cluster.kill(dying)

        with cluster.node(replica) as node:
            node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        deadline = time.monotonic() + 20
        while not promoted(cluster, replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert promoted(cluster, replica)
        with cluster.node(replica) as node:
            assert node.exists(f"{prefix}{{00}}:claim:{sent.id}")
            assert not node.exists(f"{prefix}{{00}}:claim:{lost.id}"), "the replica had it"
        time.sleep(1.2)  # the pending claim's lease ran out

    fresh = RedisClusterStore(f"redis+cluster://127.0.0.1:{replica}", prefix=prefix)
    with caplog.at_level(logging.WARNING), fresh:
        asked = [lost, sent, pending, request(fresh, "00"), elsewhere, request(fresh, other_bucket)]
        outcomes = _claim_settled(fresh, asked)
    assert outcomes == [
        Outcome.FORGOTTEN,  # lost on the replica: never claimed again
        Outcome.LOST,  # committed, and the replica has it
        Outcome.FORGOTTEN,  # pending, lease ran out: its commit may be lost
        Outcome.FORGOTTEN,  # nobody holds it, released before the failover + 10 s
        Outcome.LOST,  # another master's bucket: as before
        Outcome.WON,
    ]
    told = [r.getMessage() for r in caplog.records if "failed over to a replica" in r.getMessage()]
    assert len(told) == 1, caplog.text
    assert f"on master 127.0.0.1:{replica}" in told[0]


def _claim_settled(store: RedisClusterStore, asked: list[ClaimRequest]) -> list[Outcome]:
    """Claim, retrying while the cluster is still settling its new slot owner."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return store.claim(asked, node="n2", lease_ms=LEASE_MS)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
