"""The Redis Cluster store against a local cluster of three masters: what the contract
suite (which runs on it too, as ``redis-cluster``) cannot see.

The cluster is the test process's own (``tests/redis_cluster.py``): three
``redis-server`` masters on free loopback ports, started at first use and stopped by pid
at exit. Each test works under a key prefix of its own; a test that empties a master
empties one of this cluster's, never another Redis.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

pytest.importorskip("redis", reason="the redis cluster store needs redis-py")

from redis_cluster import ClusterTestStore, LocalCluster, new_prefix, shared_cluster
from stores import free_port

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import ConfigError, StoreUnavailable
from beatless.node.dispatch import TwoPhase
from beatless.node.runs import NEVER_LATE_MS, RUN_RECORD_MEMORY_MS
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import TOLERANCE_MS, Note
from beatless.stores.redis._wire import READ_KINDS, READ_PAGE, parse_epoch
from beatless.stores.redis.cluster import BUCKETS, RedisClusterStore

MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
LEASE_MS = 10_000
TAG = "c1a55e7d"


@pytest.fixture(scope="session")
def cluster() -> LocalCluster:
    """The test process's cluster (the contract suite's backend shares it)."""
    return shared_cluster()


@pytest.fixture
def prefix() -> str:
    return new_prefix()


@pytest.fixture
def opened(cluster: LocalCluster, prefix: str) -> Iterator[list[RedisClusterStore]]:
    """Stores the test opens under its prefix; all closed, and the prefix's keys deleted,
    at the end."""
    stores: list[RedisClusterStore] = []
    yield stores
    for store in stores:
        store.close()
    ClusterTestStore(cluster.url, prefix=prefix).close()


def open_node(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> RedisClusterStore:
    store = RedisClusterStore(cluster.url, prefix=prefix)
    opened.append(store)
    return store


def firing(now_ms: int, *, address: str | None = None) -> ClaimRequest:
    id_ = str(uuid.uuid4())
    address = f"cluster/{id_[:8]}" if address is None else address
    return ClaimRequest(id_, address, now_ms, MAX_LATE_MS, MEMORY_MS, now_ms, TAG)


def claim_keys(cluster: LocalCluster, prefix: str) -> dict[int, set[str]]:
    """The firing ids whose claim records each master holds."""
    return {
        port: {key.rsplit(":", 1)[1] for key in cluster.keys_on(port, f"{prefix}*:claim:*")}
        for port in cluster.ports
    }


# -- spread over the masters, one winner per firing -------------------------------------


def test_a_batch_of_a_thousand_claims_spreads_over_every_master_and_each_is_won_once(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    a, b = open_node(cluster, prefix, opened), open_node(cluster, prefix, opened)
    batch = [firing(a.time_ms()) for _ in range(1_000)]

    assert a.claim(batch, node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 1_000

    held = claim_keys(cluster, prefix)
    assert set().union(*held.values()) == {r.id for r in batch}
    assert all(held.values()), f"claims per master: { {p: len(i) for p, i in held.items()} }"
    assert b.claim(batch, node="b", lease_ms=LEASE_MS) == [Outcome.HELD] * 1_000
    assert a.commit([r.id for r in batch], node="a") == [True] * 1_000
    assert b.claim(batch, node="b", lease_ms=LEASE_MS) == [Outcome.LOST] * 1_000


def test_three_clients_racing_on_the_same_ids_leave_exactly_one_winner_per_firing(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    stores = [open_node(cluster, prefix, opened) for _ in range(3)]
    batch = [firing(stores[0].time_ms()) for _ in range(600)]
    results: dict[str, list[Outcome]] = {}
    barrier = threading.Barrier(len(stores))

    def race(store: RedisClusterStore, node: str) -> None:
        mine = random.sample(batch, len(batch))  # each client in an order of its own
        barrier.wait()
        outcomes = store.claim(mine, node=node, lease_ms=LEASE_MS)
        by_id = dict(zip((r.id for r in mine), outcomes, strict=True))
        results[node] = [by_id[r.id] for r in batch]

    threads = [threading.Thread(target=race, args=(s, f"n{i}")) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(results) == 3
    for i, request in enumerate(batch):
        said = Counter(results[node][i] for node in results)
        assert said == Counter({Outcome.WON: 1, Outcome.HELD: 2}), request.id


def test_a_run_lease_in_another_bucket_is_read_before_the_claim_and_gives_overlap(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    worker, a = open_node(cluster, prefix, opened), open_node(cluster, prefix, opened)
    now = a.time_ms()
    address = f"cluster/{uuid.uuid4().hex[:8]}"
    run_id = run_lease_id(address)
    # Firings of the address in buckets other than its run lease's.
    batch = [r for r in (firing(now, address=address) for _ in range(40)) if r.id[:2] != run_id[:2]]
    skipping = [dataclasses.replace(r, run_id=run_id) for r in batch]
    lease = ClaimRequest(run_id, address, now, NEVER_LATE_MS, RUN_RECORD_MEMORY_MS, now)
    assert worker.claim([lease], node="worker", lease_ms=60_000) == [Outcome.WON]

    assert a.claim(skipping, node="a", lease_ms=LEASE_MS) == [Outcome.OVERLAP] * len(batch)

    worker.release([run_id], node="worker")
    fresh = dataclasses.replace(firing(now, address=address), run_id=run_id)
    assert a.claim([fresh], node="a", lease_ms=LEASE_MS) == [Outcome.WON]


# -- the epoch of each bucket ---------------------------------------------------------------


def test_a_master_that_lost_its_memory_gives_forgotten_in_its_buckets_only(
    cluster: LocalCluster,
    prefix: str,
    opened: list[RedisClusterStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beatless")
    a = open_node(cluster, prefix, opened)
    now = a.time_ms()
    sent = [firing(now) for _ in range(300)]
    assert a.claim(sent, node="a", lease_ms=LEASE_MS) == [Outcome.WON] * len(sent)
    assert a.commit([r.id for r in sent], node="a") == [True] * len(sent)
    seen = a.epoch
    lost_port = cluster.ports[1]
    on_lost = claim_keys(cluster, prefix)[lost_port]
    assert on_lost
    assert len(cluster.keys_on(lost_port, f"{prefix}*:epoch")) < len(BUCKETS)

    cluster.flush(lost_port)

    new = [firing(a.time_ms()) for _ in range(300)]
    outcomes = a.claim(sent + new, node="a", lease_ms=LEASE_MS)
    for request, outcome in zip(sent, outcomes[: len(sent)], strict=True):
        assert outcome is (Outcome.FORGOTTEN if request.id in on_lost else Outcome.LOST)
    # A firing nobody claimed yet: forgotten where the master lost its memory (it is
    # released before the bucket's new epoch + 10 s), won everywhere else.
    new_on_lost = claim_keys(cluster, prefix)[lost_port] - on_lost
    assert new_on_lost
    for request, outcome in zip(new, outcomes[len(sent) :], strict=True):
        assert outcome is (Outcome.FORGOTTEN if request.id in new_on_lost else Outcome.WON)
    assert a.epoch is not None
    assert a.epoch != seen
    assert "lost its memory" in caplog.text
    assert f"127.0.0.1:{lost_port}" in caplog.text
    # Written committed: no other node sends them either.
    b = open_node(cluster, prefix, opened)
    forgotten = [r for r in sent if r.id in on_lost]
    assert b.claim(forgotten, node="b", lease_ms=LEASE_MS) == [Outcome.LOST] * len(forgotten)


def test_after_a_loss_a_bucket_forgets_only_firings_released_before_its_horizon(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    a = open_node(cluster, prefix, opened)
    assert a.claim([firing(a.time_ms())], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    for port in cluster.ports:
        cluster.flush(port)
    first = firing(a.time_ms())
    assert a.claim([first], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    # The epoch the claim wrote in the first firing's bucket (the re-read after it wrote
    # the other buckets' a little later).
    record = a._connected().get(f"{prefix}{{{first.id[:2]}}}:epoch")
    epoch = parse_epoch(record.decode())
    assert epoch is not None
    horizon = epoch.started_ms + TOLERANCE_MS

    def in_its_bucket(release_ms: int) -> ClaimRequest:
        id_ = first.id[:2] + str(uuid.uuid4())[2:]
        return ClaimRequest(
            id_, f"cluster/{id_[:8]}", release_ms - 5_000, MAX_LATE_MS, MEMORY_MS, release_ms, TAG
        )

    before, at = in_its_bucket(horizon - 1), in_its_bucket(horizon)
    assert a.claim([before, at], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN, Outcome.WON]


def test_every_store_object_of_a_namespace_sees_one_epoch_of_all_its_buckets(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    a, b = open_node(cluster, prefix, opened), open_node(cluster, prefix, opened)
    assert a.claim([firing(a.time_ms())], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    epochs = sum(len(cluster.keys_on(port, f"{prefix}*:epoch")) for port in cluster.ports)
    assert epochs == len(BUCKETS)
    assert b.commit([str(uuid.uuid4())], node="b") == [False]
    assert b.epoch == a.epoch


# -- a fleet on the cluster -------------------------------------------------------------


def test_three_schedulers_on_the_cluster_enqueue_every_firing_exactly_once(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    schedule = Schedule(
        [
            Entry(name="tick", task="t.tick", trigger=Every(0.5)),
            Entry(
                name="fan",
                task="t.fan",
                trigger=Every(1),
                jitter="0.4s",
                tenants=[f"t{i}" for i in range(40)],
            ),
        ],
        namespace=f"cluster-{uuid.uuid4().hex[:8]}",
    )
    sent: list[tuple[str, Firing]] = []
    nodes = [
        Scheduler(
            schedule,
            store=open_node(cluster, prefix, opened),
            node=f"n{i}",
            enqueue=lambda f, i=i: sent.append((f"n{i}", f)),
        )
        for i in range(3)
    ]
    started_ms = int(time.time() * 1_000)
    threads = [node.start() for node in nodes]
    time.sleep(4.5)
    for node in nodes:
        node.stop(timeout=10)
    assert not any(thread.is_alive() for thread in threads)

    counts = Counter(f.id for _, f in sent)
    assert counts
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]
    # Every occurrence well inside the run was sent: nothing lost between the nodes.
    middle = range(started_ms // 1_000 + 1, started_ms // 1_000 + 3)
    fan = {(f.address, f.occurrence_ms // 1_000) for _, f in sent if f.entry.name == "fan"}
    for second in middle:
        assert {a for a, s in fan if s == second} == {
            f"{schedule.namespace}/fan/t{i}" for i in range(40)
        }
    won = sum(stats.won for node in nodes for stats in node.stats.values())
    assert won == len(sent)


# -- opening, errors, and the atomic path it does not offer ----------------------------------


def test_open_store_opens_a_cluster_url_under_the_namespace(cluster: LocalCluster) -> None:
    store = open_store(cluster.url, namespace="cluster-ns")
    try:
        assert isinstance(store, RedisClusterStore)
        assert store.prefix == "beatless:cluster-ns:"
        store.probe()
        assert abs(store.time_ms() - time.time() * 1_000) < 1_000
    finally:
        store.close()


def test_a_cluster_client_passed_in_is_used_and_left_open(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        store = RedisClusterStore(client, prefix=prefix)
        request = firing(store.time_ms())
        assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
        assert f"127.0.0.1:{cluster.ports[0]}" in repr(store)
        store.close()
        assert client.ping()
        other = open_node(cluster, prefix, opened)
        assert other.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.HELD]
    finally:
        client.close()


def test_probe_writes_and_deletes_a_key_on_every_master(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    store = open_node(cluster, prefix, opened)

    store.probe()

    assert all(cluster.keys_on(port, f"{prefix}*") == [] for port in cluster.ports)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis+cluster://", "no node"),
        ("redis+cluster://127.0.0.1:notaport", "bad node"),
        ("redis+cluster://127.0.0.1:7000/3", "database 0"),
        ("http://127.0.0.1:7000", "scheme"),
    ],
)
def test_bad_cluster_urls_are_config_errors(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RedisClusterStore(url)


def test_a_prefix_with_a_brace_is_refused_since_it_would_change_the_hash_tags() -> None:
    with pytest.raises(ConfigError, match="hash tags"):
        RedisClusterStore("redis+cluster://127.0.0.1:7000", prefix="app:{x}:")


def test_the_password_is_masked_and_an_unreachable_cluster_is_unavailable() -> None:
    port = free_port()
    store = RedisClusterStore(f"redis+cluster://:s3cret@127.0.0.1:{port}", socket_timeout=1)
    assert "s3cret" not in repr(store)
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)
    assert time.monotonic() - began < 10
    assert "s3cret" not in str(caught.value)
    assert f"127.0.0.1:{port}" in str(caught.value)
    store.close()


def test_the_store_offers_no_claim_and_push_so_integrations_go_two_phase(
    cluster: LocalCluster,
) -> None:
    from beatless.stores.redis.store import RedisStore

    store = open_store(cluster.url, namespace="cluster-ns")
    try:
        assert not isinstance(store, RedisStore)
        assert not hasattr(store, "claim_and_push")
        assert store.commits_notes is False
        schedule = Schedule([Entry(name="e", task="t.e", trigger=Every(1))])
        scheduler = Scheduler(schedule, store=store, enqueue=lambda f: None)
        assert isinstance(scheduler.dispatcher, TwoPhase)
    finally:
        store.close()


def test_celery_with_a_redis_broker_and_a_cluster_store_goes_two_phase(
    cluster: LocalCluster,
) -> None:
    pytest.importorskip("celery.app", reason="the celery integration needs celery")
    from celery import Celery

    from beatless.celery import build_scheduler

    app = Celery("cluster-proj", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.update(
        beatless_store_url=cluster.url,
        beatless_namespace=f"cluster-{uuid.uuid4().hex[:8]}",
        beat_schedule={"tick": {"task": "proj.tick", "schedule": 1.0}},
    )
    scheduler = build_scheduler(app, node="n1")
    try:
        assert scheduler.atomic is None
        assert isinstance(scheduler.store, RedisClusterStore)
        assert scheduler.paths["tick"] == (False, "the claim store is not the broker's Redis")
    finally:
        scheduler.close()


def test_dramatiq_with_a_redis_broker_and_a_cluster_store_goes_two_phase(
    cluster: LocalCluster,
) -> None:
    pytest.importorskip("dramatiq.brokers.redis", reason="the dramatiq integration needs dramatiq")
    from dramatiq.brokers.redis import RedisBroker

    import beatless.dramatiq as bd

    namespace = f"cluster-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url="redis://127.0.0.1:6379/12", namespace=namespace)
    middleware = bd.Beatless(store=cluster.url, namespace=namespace)
    broker.add_middleware(middleware)
    try:
        scheduler = middleware.scheduler(broker)
        assert isinstance(scheduler.dispatcher, TwoPhase)
        assert isinstance(scheduler.store, RedisClusterStore)
    finally:
        middleware.close()
        broker.close()


def test_a_read_of_more_kinds_than_a_round_trip_carries_reads_every_note(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    """Reads go ``READ_KINDS`` kinds a round trip: 600 kinds, in three, read whole."""
    store = open_node(cluster, prefix, opened)
    kinds = [f"history/{i}" for i in range(600)]
    store.post(
        [
            Note(kind, f"{kind}-{n}", f'{{"n":{n}}}', 60_000, 5, True)
            for kind in kinds
            for n in range(3)
        ]
    )
    store.post([Note(f"plain/{i}", "k", str(i), 60_000) for i in range(600)])

    logs = store.read_logs(kinds)
    notes = store.read_notes([f"plain/{i}" for i in range(600)])

    assert READ_KINDS < 600
    assert {kind: sorted(read) for kind, read in logs.items()} == {
        kind: [f"{kind}-{n}" for n in range(3)] for kind in kinds
    }
    assert notes == {f"plain/{i}": {"k": str(i)} for i in range(600)}


def test_a_big_kind_is_read_whole_a_page_of_fields_at_a_time(
    cluster: LocalCluster, prefix: str, opened: list[RedisClusterStore]
) -> None:
    """5,000 notes of one kind: the script reads the first page of its hash, ``HSCAN``
    calls the rest, and no ``HGETALL`` holds a master for all of them; read whole, as notes
    and as a logged kind (whose log is empty)."""
    import redis

    store = open_node(cluster, prefix, opened)
    big = [
        Note("entries/big", f"e{i:05d}", f'{{"pad":"{"x" * 100}"}}', 60_000) for i in range(5_000)
    ]
    for start in range(0, len(big), 1_000):
        store.post(big[start : start + 1_000])
    masters = [redis.Redis(port=port, decode_responses=True) for port in cluster.ports]

    def calls(command: str) -> int:
        return sum(
            int(m.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))
            for m in masters
        )

    hscans, hgetalls = calls("hscan"), calls("hgetall")
    notes = store.read_notes(["entries/big"])
    logs = store.read_logs(["entries/big"])

    expected = {note.key: note.value for note in big}
    assert notes == {"entries/big": expected}
    assert logs == {"entries/big": expected}
    assert calls("hgetall") == hgetalls
    assert calls("hscan") - hscans >= 2 * 5_000 // READ_PAGE
    for master in masters:
        master.close()
