"""Logged notes on Redis (:mod:`beatless.stores.redis._logs`): one stream per kind, one
``XADD`` per note, and what a steady firing costs the claim script.

The contract of logged notes runs on every store in ``test_store_notes.py``; this file
checks the Redis layout: what is written, how the log is trimmed and kept alive, and the
commands a won firing costs, counted by a private server's ``INFO commandstats``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis")

import redis
import test_redis_store
from stores import PrivateRedis

from beatless.errors import StoreError
from beatless.stores import ClaimRequest, Outcome
from beatless.stores.base import Note
from beatless.stores.redis._logs import LOG_REFRESH_MS
from beatless.stores.redis._wire import EXPIRY_SLACK_MS, READ_PAGE
from beatless.stores.redis.store import RedisStore

URL = test_redis_store.URL
client = test_redis_store.client
"""A client of the shared Redis (the Redis store tests' fixture)."""
prefix = test_redis_store.prefix
"""A key prefix of the test's own (the Redis store tests' fixture)."""
now_ms = test_redis_store.server_now_ms
MAX_LATE_MS, MEMORY_MS = 60_000, 80_000
DAY_MS = 86_400_000
KEEP = 50
LIFE_MS = DAY_MS + LOG_REFRESH_MS + EXPIRY_SLACK_MS
"""The life a log gets from a note of a day."""


def firing(occurrence_ms: int) -> ClaimRequest:
    id_ = uuid.uuid4().hex
    return ClaimRequest(
        id_, f"test/{id_[:8]}", occurrence_ms, MAX_LATE_MS, MEMORY_MS, occurrence_ms
    )


def history(kind: str, key: str, ttl_ms: int = DAY_MS) -> Note:
    return Note(kind, key, f'{{"id":"{key}","outcome":"{{{{outcome}}}}"}}', ttl_ms, KEEP, True)


class Clock:
    """A monotonic clock the test moves, for the store object's record of its logs."""

    def __init__(self) -> None:
        self.s = 1_000.0

    def __call__(self) -> float:
        return self.s


def test_a_logged_note_of_a_claim_script_is_one_append_to_its_kind_s_log(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    kind, queue = f"history/{uuid.uuid4().hex}", f"{prefix}queue"
    request = firing(now_ms(client))

    outcomes = store.claim_and_push(
        [request], [[["RPUSH", queue, "m"]]], node="a", notes=[history(kind, request.id)]
    )

    assert outcomes == [Outcome.WON]
    log = store._log_key(kind)
    claim = f"{prefix}claim:{request.id}"
    assert set(client.keys(f"{prefix}*")) == {f"{prefix}epoch", claim, queue, log}
    ((_, fields),) = client.xrange(log)
    assert list(fields) == [request.id]
    assert fields[request.id].endswith(f'|{KEEP}|{{"id":"{request.id}","outcome":"won"}}')
    assert LIFE_MS - 60_000 < client.pttl(log) <= LIFE_MS
    assert store.read_logs([kind]) == {
        kind: {request.id: f'{{"id":"{request.id}","outcome":"won"}}'}
    }
    store.close()


def test_a_log_keeps_at_least_its_last_keep_notes_and_reads_exactly_keep(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    kind = f"history/{uuid.uuid4().hex}"
    for start in range(0, 600, 100):
        store.post([history(kind, f"f{i:03d}", DAY_MS + i) for i in range(start, start + 100)])

    length = client.xlen(store._log_key(kind))
    read = store.read_logs([kind])[kind]

    assert KEEP <= length < 200, "trimmed in whole nodes of the stream, never below keep"
    assert sorted(read) == [f"f{i:03d}" for i in range(550, 600)]
    store.close()


def test_a_store_object_extends_a_log_only_when_a_note_would_outlive_it(
    client: redis.Redis, prefix: str
) -> None:
    store, other = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    clock = Clock()
    store._logs.clock = clock
    kind = f"history/{uuid.uuid4().hex}"
    log = store._log_key(kind)
    store.post([history(kind, "first")])
    client.pexpire(log, 5_000)

    store.post([history(kind, "within the hour")])
    assert client.pttl(log) <= 5_000, "made to live long enough already: not extended"

    clock.s += LOG_REFRESH_MS / 1_000 + 1
    store.post([history(kind, "an hour later")])
    assert LIFE_MS - 60_000 < client.pttl(log) <= LIFE_MS

    client.pexpire(log, 3 * LIFE_MS)
    other.post([history(kind, "another node")])
    assert client.pttl(log) > 2 * LIFE_MS, "an extension never shortens a log's life"
    assert len(store.read_logs([kind])[kind]) == 4
    store.close()
    other.close()


def test_a_push_that_fails_leaves_no_claim_so_the_firing_is_won_again(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    kind, queue = f"history/{uuid.uuid4().hex}", f"{prefix}queue"
    client.set(queue, "not a list")
    request = firing(now_ms(client))
    note = [history(kind, request.id)]

    with pytest.raises(StoreError):
        store.claim_and_push([request], [[["RPUSH", queue, "m"]]], node="a", notes=note)

    assert client.get(f"{prefix}claim:{request.id}") is None
    client.delete(queue)
    assert store.claim_and_push([request], [[["RPUSH", queue, "m"]]], node="b", notes=note) == [
        Outcome.WON
    ]
    assert client.lrange(queue, 0, -1) == ["m"]
    assert store.claim_records([request.id])[request.id].node == "b"
    store.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_firing_won_and_pushed_costs_three_commands_and_the_two_scripts_seven(
    own_redis: PrivateRedis,
) -> None:
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    if int(admin.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("SET NX GET needs Redis 7: an earlier Redis claims with a GET and a SET")
    store = RedisStore(own_redis.url, prefix="beatless-test:")
    kinds = [f"history/{i}" for i in range(10)]
    warm = [firing(store.time_ms()) for _ in kinds]
    pushes = [[["RPUSH", "queue", r.id]] for r in warm]
    # The logs exist and are extended: what a steady node finds.
    store.claim_and_push(
        warm, pushes, node="a", notes=[history(k, r.id) for k, r in zip(kinds, warm, strict=True)]
    )
    batch = [firing(store.time_ms()) for _ in kinds]
    admin.config_resetstat()

    outcomes = store.claim_and_push(
        batch,
        [[["RPUSH", "queue", r.id]] for r in batch],
        node="a",
        notes=[history(k, r.id) for k, r in zip(kinds, batch, strict=True)],
    )

    stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in admin.info("commandstats").items()}
    stats.pop("config|resetstat", None)
    assert outcomes == [Outcome.WON] * len(batch)
    assert {name: stats.pop(name) for name in ("set", "rpush", "xadd")} == {
        "set": len(batch) + 1,  # and the letters the claim script leaves its notes script
        "rpush": len(batch),
        "xadd": len(batch),
    }
    # The claim script's TIME, epoch GET and INFO; the notes script's GETDEL of the letters.
    assert stats == {"evalsha": 2, "time": 1, "get": 1, "info": 1, "getdel": 1}
    store.close()
    admin.close()


def test_a_read_of_many_kinds_never_has_the_server_hold_all_their_replies_at_once(
    own_redis: PrivateRedis,
) -> None:
    """1,024 histories of 50 notes of 400 bytes (about 25 MB) read in one call: every note
    comes back, and the server's memory never grows by more than a few ``READ_KINDS`` of
    them (about 6 MB), where one pipeline for all had it hold every reply at once."""
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = RedisStore(own_redis.url, prefix="beatless-test:")
    kinds = [f"history/{i}" for i in range(1_024)]
    filler = "x" * 400
    for start in range(0, len(kinds), 64):
        store.post(
            [
                Note(kind, f"{kind}-{n}", f'{{"n":{n},"pad":"{filler}"}}', DAY_MS, KEEP, True)
                for kind in kinds[start : start + 64]
                for n in range(KEEP)
            ]
        )
    total = sum(len(filler) for _ in kinds for _ in range(KEEP))
    admin.config_resetstat()
    base = int(admin.info("memory")["used_memory"])

    read = store.read_logs(kinds)

    peak = int(admin.info("memory")["used_memory_peak"])
    assert {kind: len(notes) for kind, notes in read.items()} == dict.fromkeys(kinds, KEEP)
    assert peak - base < total // 2, (peak - base, total)
    store.close()
    admin.close()


def test_a_big_kind_is_read_a_page_of_fields_at_a_time_and_whole(
    own_redis: PrivateRedis,
) -> None:
    """20,000 notes of one kind (a big schedule's entries): read whole, by ``HSCAN`` calls
    of about ``READ_PAGE`` fields each, never one ``HGETALL`` of all of them that would
    hold the server while it writes 6 MB; a small kind beside it comes in its first page."""
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = RedisStore(own_redis.url, prefix="beatless-test:")
    big = [
        Note("entries/big", f"e{i:05d}", f'{{"pad":"{"x" * 300}"}}', DAY_MS) for i in range(20_000)
    ]
    for start in range(0, len(big), 1_000):
        store.post(big[start : start + 1_000])
    store.post([Note("nodes/big", "n1", "{}", DAY_MS)])
    admin.config_resetstat()

    read = store.read_notes(["entries/big", "nodes/big"])

    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in admin.info("commandstats").items()}
    assert read["entries/big"] == {note.key: note.value for note in big}
    assert read["nodes/big"] == {"n1": "{}"}
    assert "hgetall" not in calls
    assert 20_000 // READ_PAGE < calls["hscan"] <= 2 * 20_000 // READ_PAGE + 1
    store.close()
    admin.close()
