"""A claim store that fills up: a write refused as full is its own outcome. Nothing is
sent that was not claimed, a claim whose message was sent is committed all the same (so
no node takes it over), and every firing the store kept this node from judging is
counted and reported missed. Against a private ``redis-server`` under ``noeviction`` with
a tiny ``maxmemory``, filled by another client."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis store needs redis-py")
import redis

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from redis_server import RedisServer, private_redis

from beatless import Entry, Every, Schedule
from beatless.errors import StoreFull
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import Firing
from beatless.stores.base import ClaimRequest, KeptNote, Note, Outcome, judging
from beatless.stores.redis.store import RedisStore

ROOM = 1_000_000
"""Bytes of maxmemory above what the server uses when a test starts."""
UNDER = 64 * 1024
"""Bytes of maxmemory under what a filled server uses, until it is drained."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from private_redis(tmp_path)


class Filler:
    """Another client of the same Redis that fills it to ``maxmemory`` and keeps it full
    (writing again whenever memory is freed) until :meth:`drain`, which deletes its keys."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(port=port)
        used = int(self.client.info("memory")["used_memory"])
        self.maxmemory = used + ROOM
        self.client.config_set("maxmemory", str(self.maxmemory))
        self.client.config_set("maxmemory-policy", "noeviction")
        self.keys = 0
        self._full = threading.Event()
        self._thread: threading.Thread | None = None

    def fill(self) -> None:
        """Fill Redis until it refuses writes, and keep it so in a thread. The limit is
        then set a little under what Redis uses: a full Redis sits at the edge of its
        limit, where a few kilobytes of client buffers decide whether a small write is
        refused, and a test must not depend on them."""
        self._write_until_refused()
        used = int(self.client.info("memory")["used_memory"])
        self.client.config_set("maxmemory", str(used - UNDER))
        self._full.set()
        self._thread = threading.Thread(target=self._keep_full, daemon=True)
        self._thread.start()

    def _write_until_refused(self) -> None:
        while True:
            try:
                self.client.set(f"fill:{self.keys}", b"x" * 4_096)
            except redis.exceptions.OutOfMemoryError:
                return
            self.keys += 1

    def _keep_full(self) -> None:
        while self._full.is_set():
            self._write_until_refused()
            time.sleep(0.005)

    def drain(self) -> None:
        self._stop_keeping()
        for start in range(0, self.keys + 1, 500):
            self.client.delete(*(f"fill:{i}" for i in range(start, start + 500)))
        self.client.config_set("maxmemory", str(self.maxmemory))

    def close(self) -> None:
        self._stop_keeping()  # before its client closes and its server stops under it
        self.client.close()

    def _stop_keeping(self) -> None:
        self._full.clear()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


@pytest.fixture
def filler(server: RedisServer) -> Iterator[Filler]:
    made = Filler(server.port)
    try:
        yield made
    finally:
        made.close()


def request(store: RedisStore, **kw: int) -> ClaimRequest:
    now = store.time_ms()
    return ClaimRequest(
        id=uuid.uuid4().hex,
        address="full/a",
        occurrence_ms=now,
        max_late_ms=kw.get("max_late_ms", 60_000),
        memory_ms=60_000,
        release_ms=now,
    )


def test_a_full_store_still_reads_notes_and_kept_notes(server: RedisServer, filler: Filler) -> None:
    # A node reads the live schedule's head while the store refuses writes: without it,
    # every firing would wait for the head until late, even once the store has room.
    with RedisStore(server.url, namespace="full") as store:
        store.post([Note("registry", "n1", "up", ttl_ms=60_000)])
        store.keep_notes([KeptNote("live", "head", "r7")])
        filler.fill()
        with pytest.raises(StoreFull):
            store.post([Note("registry", "n2", "up", ttl_ms=60_000)])
        assert store.read_notes(["registry"]) == {"registry": {"n1": "up"}}
        notes, kept = store.read_synced(["registry"], {"live": ["head"]})
        assert notes == {"registry": {"n1": "up"}}
        assert kept == {"live": {"head": "r7"}}


def test_a_claim_refused_as_full_is_store_full_and_says_how_full_once_a_minute(
    server: RedisServer, filler: Filler, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisStore(server.url, namespace="full") as store:
        filler.fill()
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                with pytest.raises(StoreFull) as raised:
                    store.claim([request(store)], node="n1", lease_ms=5_000)
        filler.drain()
        assert store.claim([request(store)], node="n1", lease_ms=5_000)[0] is Outcome.WON

    assert raised.value.usage is not None
    assert raised.value.usage.startswith("used_memory ")
    assert " of maxmemory " in raised.value.usage
    told = [r.getMessage() for r in caplog.records if "Redis is full" in r.getMessage()]
    assert len(told) == 1, told
    assert "cannot claim" in told[0]
    # How full, as Redis said it at the first refusal (the filler keeps writing since).
    assert re.search(r"\(used_memory [\d.]+ [KM]iB of maxmemory [\d.]+ [KM]iB \(\d+%\)\)", told[0])


def test_an_atomic_claim_refused_as_full_is_store_full_and_pushes_nothing(
    server: RedisServer, filler: Filler
) -> None:
    """Claim and enqueue in one script (a Redis broker): the claim's ``SET NX GET`` is
    the script's first write, which a full Redis refuses. That is :class:`StoreFull`, said
    with how full, not a corrupt record, and nothing is written or pushed."""
    with RedisStore(server.url, namespace="full") as store:
        push = [["LPUSH", "full-queue", "message"]]
        # The store's epoch record is written by its first claim: the claim's own SET is
        # then the first write of the script the full Redis refuses.
        assert store.claim_and_push([request(store)], [push], node="n1") == [Outcome.WON]
        claim = request(store)
        filler.fill()
        with pytest.raises(StoreFull) as raised:
            store.claim_and_push([claim], [push], node="n1")
        assert filler.client.llen("full-queue") == 1
        filler.drain()
        assert store.claim_and_push([claim], [push], node="n1") == [Outcome.WON]

    assert raised.value.usage is not None
    assert " of maxmemory " in raised.value.usage
    assert filler.client.llen("full-queue") == 2


def test_a_commit_refused_as_full_still_commits_so_no_node_takes_the_claim_over(
    server: RedisServer, filler: Filler
) -> None:
    with (
        RedisStore(server.url, namespace="full") as winner,
        RedisStore(server.url, namespace="full") as other,
    ):
        claim = request(winner)
        lease_s = 3.0  # longer than filling the store takes, on a loaded machine too
        claimed = time.monotonic()
        assert winner.claim([claim], node="n1", lease_ms=int(lease_s * 1_000)) == [Outcome.WON]
        filler.fill()  # the message is sent; then the store fills before the commit

        with pytest.raises(StoreFull) as raised:
            winner.commit([claim.id], node="n1")
        assert raised.value.kept == [True]

        filler.drain()
        time.sleep(max(claimed + lease_s + 0.1 - time.monotonic(), 0))  # the lease ran out
        assert other.claim([claim], node="n2", lease_ms=300) == [Outcome.LOST]


@dataclass(frozen=True)
class Timeline:
    """When a run began, and when its Redis was full (``time.time()``)."""

    began: float
    full_from: float
    full_until: float


def full_for_a_while(nodes: Sequence[Scheduler], filler: Filler) -> Timeline:
    """Start ``nodes``; 2 s later fill Redis and keep it full 3.5 s; drain it and run 3 s
    more. The caller stops the nodes."""
    began = time.time()
    for node in nodes:
        node.start()
    time.sleep(2.0)
    filler.fill()
    full_from = time.time()
    time.sleep(3.5)
    filler.drain()
    full_until = time.time()
    time.sleep(3.0)
    return Timeline(began, full_from, full_until)


def sent_once_or_missed(
    sends: Counter[str],
    decided: Sequence[Decision],
    timeline: Timeline,
    *,
    some_missed: bool = True,
) -> set[str]:
    """Assert that no firing was sent twice, that some were reported missed while Redis
    was full (none sent), and that every firing of a whole second in the run is sent once
    or reported missed; the ids reported missed."""
    assert sends, "nothing was sent"
    assert max(sends.values()) == 1, [i for i, n in sends.items() if n > 1]
    missed = {d.firing.id for d in decided if d.outcome == "missed"}
    outcomes = Counter(d.outcome for d in decided)
    assert missed or not some_missed, f"no firing was reported missed while full: {outcomes}"
    assert not missed & set(sends)
    window = {
        d.firing.id: d.firing.occurrence_ms
        for d in decided
        if timeline.began + 1 <= d.firing.occurrence_ms / 1_000 <= timeline.full_until + 0.5
    }
    assert len(window) >= int(timeline.full_until - timeline.began) - 1
    unreported = sorted(o for i, o in window.items() if i not in sends and i not in missed)
    assert unreported == []
    during = [o for i, o in window.items() if i in missed]
    assert all(o / 1_000 >= timeline.full_from - 1 for o in during)
    return missed


@pytest.mark.slow
def test_a_full_store_sends_no_firing_twice_and_reports_every_unjudged_firing_missed(
    server: RedisServer, filler: Filler
) -> None:
    schedule = Schedule(
        [Entry(name="beat", task="tasks.t", trigger=Every(1), jitter="0s", max_late="2s")]
    )
    sent: list[Firing] = []
    decided: list[Decision] = []
    lock = threading.Lock()

    def enqueue(firing: Firing) -> None:
        with lock:
            sent.append(firing)

    def on_decision(decision: Decision) -> None:
        with lock:
            decided.append(decision)

    stores = [RedisStore(server.url, namespace="fleet") for _ in range(2)]
    nodes = [
        Scheduler(
            schedule,
            store=store,
            node=f"n{i}",
            enqueue=enqueue,
            on_decision=on_decision,
            lease="1s",
        )
        for i, store in enumerate(stores)
    ]
    try:
        timeline = full_for_a_while(nodes, filler)
    finally:
        for node in nodes:
            node.stop(timeout=5)
        for store in stores:
            store.close()

    missed = sent_once_or_missed(Counter(f.id for f in sent), decided, timeline)
    counted = sum(node.stats["beat"].missed for node in nodes)
    assert counted >= len(missed)


@pytest.mark.slow
def test_a_full_broker_redis_pushes_nothing_twice_and_reports_each_refused_firing_missed(
    server: RedisServer, filler: Filler, caplog: pytest.LogCaptureFixture
) -> None:
    """The atomic path (Celery on its Redis, which is the claim store): two nodes, an
    entry every second, Redis full for 3.5 s. Every firing of the run is in the queue once
    or reported missed, none is told as a record that cannot be read, and the nodes say
    that Redis is full."""
    celery = pytest.importorskip("celery", reason="the atomic path is Celery's here")
    from beatless.celery._atomic import CeleryRedisAtomic

    app = celery.Celery("full", broker=server.url, set_as_current=False)
    app.conf.update(task_default_queue="full-queue", worker_enable_remote_control=False)
    schedule = Schedule(
        [Entry(name="beat", task="tasks.t", trigger=Every(1), jitter="0s", max_late="2s")]
    )
    decided: list[Decision] = []
    lock = threading.Lock()

    def on_decision(decision: Decision) -> None:
        with lock:
            decided.append(decision)

    atomics = [CeleryRedisAtomic(app, RedisStore(server.url, namespace="atomic")) for _ in range(2)]
    nodes = [
        Scheduler(schedule, store=a, node=f"n{i}", on_decision=on_decision)
        for i, a in enumerate(atomics)
    ]
    try:
        with caplog.at_level(logging.WARNING):
            timeline = full_for_a_while(nodes, filler)
    finally:
        for node in nodes:
            node.stop(timeout=5)
        for atomic in atomics:
            atomic.close()
            atomic.store.close()

    queued = Counter(
        json.loads(raw)["headers"]["id"] for raw in filler.client.lrange("full-queue", 0, -1)
    )
    outcomes = Counter(d.outcome for d in decided)
    assert "corrupt" not in outcomes, outcomes
    # Refused while full; a loaded machine may fill it late enough that all are sent.
    assert outcomes["store_full"] > 0, outcomes
    sent_once_or_missed(queued, decided, timeline, some_missed=False)
    told = [r.getMessage() for r in caplog.records if "Redis is full" in r.getMessage()]
    assert told, "no node said that Redis is full"
    assert not [r for r in caplog.records if "cannot read" in r.getMessage()]


def test_a_full_redis_answers_a_judging_claim_which_writes_nothing(
    server: RedisServer, filler: Filler
) -> None:
    with (
        RedisStore(server.url, namespace="full") as winner,
        RedisStore(server.url, namespace="full") as judge,
    ):
        committed, held, free = request(winner), request(winner), request(winner)
        assert winner.claim([committed, held], node="n1", lease_ms=60_000) == [Outcome.WON] * 2
        assert winner.commit([committed.id], node="n1") == [True]
        assert judge.claim([request(judge)], node="n2", lease_ms=5_000) == [Outcome.WON]
        filler.fill()

        asked = [judging(r) for r in (committed, held, free)]
        assert judge.claim(asked, node="n2", lease_ms=5_000) == [
            Outcome.LOST,
            Outcome.HELD,
            Outcome.LATE,
        ]
