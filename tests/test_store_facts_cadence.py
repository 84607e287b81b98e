"""How often a node reads the store's settings: all of them every ten seconds, and at once
after a write refused as full; at the other syncs only the eviction policy, in one
command carried by the sync's own read. Counted on a private ``redis-server`` (``INFO
commandstats``), never the shared one; the syncs are driven with an injected instant."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis store needs redis-py")
import redis

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from pressure import Writer
from redis_server import RedisServer, admin_client, private_redis

from beatless import Entry, Every, Schedule
from beatless.fleet._notes import SYNC_EVERY_MS, NodeRecord, nodes_kind
from beatless.node._board import FACTS_EVERY_MS
from beatless.node.scheduler import Scheduler
from beatless.stores.base import Verdict
from beatless.stores.redis._facts import INFO_SECTIONS, SETTINGS
from beatless.stores.redis.store import RedisStore


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from private_redis(tmp_path)


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    yield from admin_client(server)


def calls(admin: redis.Redis) -> dict[str, int]:
    """How many CONFIG GET and INFO commands the server has run, counting the INFO of every
    earlier call of this function but not its own (counted once it has run)."""
    stats = admin.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
        for name, command in (("config", "config|get"), ("info", "info"))
    }


def scheduler_on(server: RedisServer) -> Scheduler:
    store = RedisStore(server.url, namespace=f"cadence-{uuid.uuid4().hex[:8]}")
    schedule = Schedule([Entry(name="beat", task="tasks.t", trigger=Every(1), max_late="3s")])
    return Scheduler(schedule, store=store, node="n1", enqueue=lambda _f: None)


def test_all_settings_are_read_every_ten_seconds_and_the_policy_at_every_sync(
    server: RedisServer, admin: redis.Redis
) -> None:
    scheduler = scheduler_on(server)
    start = scheduler.now_ms()
    scheduler.board.sync(start)  # the first sync reads every setting
    syncs = 2 * FACTS_EVERY_MS // SYNC_EVERY_MS  # 1 s, 2 s, ... 20 s
    before = calls(admin)

    for k in range(1, syncs + 1):
        scheduler.board.sync(start + k * SYNC_EVERY_MS)

    after = calls(admin)
    full_reads = 2  # at 10 s and 20 s
    assert after["info"] - before["info"] - 1 == full_reads * len(INFO_SECTIONS)
    # The policy rides in each sync's read (one CONFIG GET maxmemory-policy maxmemory),
    # the full reads' syncs too: the quick judgement between them takes it.
    quick_reads = syncs
    assert after["config"] - before["config"] == full_reads * len(SETTINGS) + quick_reads
    scheduler.store.close()


def test_the_first_registry_record_names_the_settings_the_start_judged(
    server: RedisServer,
) -> None:
    scheduler = scheduler_on(server)
    facts = scheduler.store.watched
    assert facts is not None  # read and judged when the node started
    kind = nodes_kind(scheduler.schedule.namespace)

    scheduler.board.sync(scheduler.now_ms())  # its first sync posts its registry record

    record = NodeRecord.parse(scheduler.store.read_notes([kind])[kind]["n1"])
    assert record.store_verdict == facts.summary()
    assert record.store_verdict  # this server has no persistence: a warning, named
    scheduler.store.close()


def test_an_evicting_policy_is_seen_at_the_next_sync_between_two_full_reads(
    server: RedisServer, admin: redis.Redis
) -> None:
    scheduler = scheduler_on(server)
    now = scheduler.now_ms()
    scheduler.board.sync(now)
    admin.config_set("maxmemory", "100mb")
    admin.config_set("maxmemory-policy", "volatile-lru")

    scheduler.board.sync(now + SYNC_EVERY_MS)  # a quick read: the policy only

    assert scheduler.store.refusal is not None
    assert "maxmemory-policy volatile-lru" in scheduler.store.refusal
    facts = scheduler.board.store_facts
    assert facts is not None
    assert facts.summary() == "refuse: maxmemory-policy volatile-lru"
    assert facts.fact("appendonly") is not None  # the rest, as the full read left it
    admin.config_set("maxmemory-policy", "noeviction")
    scheduler.board.sync(now + 2 * SYNC_EVERY_MS)
    assert scheduler.store.refusal is None
    scheduler.store.close()


def test_a_claim_refused_as_full_makes_the_next_sync_read_every_setting(
    server: RedisServer, admin: redis.Redis
) -> None:
    scheduler = scheduler_on(server)
    now = scheduler.now_ms()
    scheduler.board.sync(now)
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", str(used + 500_000))
    writer = Writer(server.port, rate=1)
    try:
        writer.fill()
        # Full, and kept so: a Redis at the edge of its limit refuses a small write or not
        # by a few kilobytes of client buffers, and the writer's keys expire; a limit at
        # half of what it uses refuses every write whatever is freed meanwhile.
        admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) // 2))
        scheduler.board.sync(now + SYNC_EVERY_MS)  # quick: how full is not read
        maxmemory = scheduler.board.store_facts.fact("maxmemory")  # type: ignore[union-attr]
        assert maxmemory is not None
        assert maxmemory.verdict is Verdict.OK

        time.sleep(1.1)  # a firing of the entry is due
        scheduler.tick()
        assert scheduler.stats["beat"].store_full > 0
        before = calls(admin)
        scheduler.board.sync(now + 2 * SYNC_EVERY_MS)

        # A full read (and the INFO memory of the notes refused as full, said at WARNING).
        assert calls(admin)["info"] - before["info"] - 1 >= len(INFO_SECTIONS)
        maxmemory = scheduler.board.store_facts.fact("maxmemory")  # type: ignore[union-attr]
        assert maxmemory is not None
        assert maxmemory.verdict is Verdict.WARN
        assert "a full Redis refuses claims" in maxmemory.why
    finally:
        writer.drain()
        writer.close()
        scheduler.store.close()
