"""The history as logs on Redis, and a fleet that still has a node of an earlier beatless.

A node logs its history (one ``XADD`` per firing: :mod:`beatless.stores.redis._logs`) only
while every live node says in its registry record that it reads logs. A record without
``reads_logs`` is an earlier beatless, which reads the history kept in place only: beside
it, the history is written in place, so its status and its missed sweep see every firing.
Here a real-clock node on the shared Redis (a key prefix of the test's own) runs beside
such a record, then alone.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

pytest.importorskip("redis")

import redis
from service_check import require_service

from beatless import Entry, Every, Schedule
from beatless.fleet._members import LAYOUT_CHECK_EVERY_MS
from beatless.fleet._notes import HistoryItem, NodeRecord, history_kind, nodes_kind
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import Decision, Firing
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import Note
from beatless.stores.redis.store import RedisStore

HOST, PORT = "127.0.0.1", 6379
NS = "history-logs"


@pytest.fixture
def store() -> Iterator[RedisStore]:
    require_service("Redis", HOST, PORT)
    prefix = f"beatless-test:{uuid.uuid4().hex}:"
    opened = RedisStore(f"redis://{HOST}:{PORT}/0", prefix=prefix)
    yield opened
    opened.close()
    with redis.Redis(host=HOST, port=PORT) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
        if keys:
            client.delete(*keys)


def earlier_record(now_ms: int) -> str:
    """The registry record of a node of an earlier beatless: no ``reads_logs``."""
    data = json.loads(
        NodeRecord(
            node="old",
            host="host",
            pid=1,
            version="0.9.0",
            framework="standalone",
            store="redis",
            fingerprint="f",
            tzdata="2025b",
            clock_offset_ms=0,
            last_wake_ms=now_ms,
            posted_ms=now_ms,
            started_ms=now_ms,
            loop_alive=True,
            entries=1,
        ).to_json()
    )
    del data["reads_logs"]
    return json.dumps(data)


def run(node: Scheduler, seconds: float) -> None:
    """Wake and sync the node every 100 ms for ``seconds``, as its loop and board do."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        node.tick()
        node.board.sync()
        time.sleep(0.1)


def test_history_is_written_in_place_beside_an_earlier_node_and_logged_once_it_left(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    plan = Schedule([Entry(name="tick", task="t.tick", trigger=Every(1))], namespace=NS)
    sent: list[str] = []
    node = Scheduler(plan, store=store, node="new", enqueue=lambda f: sent.append(f.id))
    kind = history_kind(plan.address(plan.entry("tick")))
    store.post([Note(nodes_kind(NS), "old", earlier_record(node.now_ms()), 60_000)])

    with caplog.at_level(logging.INFO, logger="beatless.fleet"):
        run(node, 2.5)
        beside = list(sent)
        # What the earlier node reads: the notes kept in place. Every firing is there.
        assert beside
        assert set(store.read_notes([kind])[kind]) == set(beside)
        assert not node.board.logs_history

        store.post([Note(nodes_kind(NS), "old", earlier_record(node.now_ms()), 1)])
        time.sleep(0.01)
        node.board.sync(node.now_ms() + LAYOUT_CHECK_EVERY_MS)  # the registry checked again
        assert node.board.logs_history
        run(node, 2.5)

    alone = sent[len(beside) :]
    assert alone
    history = store.read_logs([kind])[kind]
    assert set(history) == set(sent), "both layouts read back as one history"
    assert set(store.read_notes([kind])[kind]) == set(beside), "nothing more in place"
    told = [r.getMessage() for r in caplog.records if "history written" in r.getMessage()]
    assert any("node old (beatless 0.9.0) does not read logs" in m for m in told), told
    assert any("every live node reads logs" in m for m in told), told


def test_the_first_history_kept_in_place_is_not_read_beside_a_log_trimmed_past_it(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet posts its first history in place (before its nodes know that all of them
    read logs), then logs it. Once the log holds more than the history's keep (3 here, 50
    in use), the address reads as its last 3 firings, not the first two beside them with
    a hole between: the missed sweep (of the occurrences past max_late, 60 s, and the
    tolerance) counts no firing missed, as every one was sent."""
    plan = Schedule([Entry(name="tick", task="t.tick", trigger=Every(1))], namespace=NS)
    node = Scheduler(plan, store=store, node="new", enqueue=lambda f: None)
    entry = plan.entry("tick")
    address = plan.address(entry)
    now = node.now_ms() // 1_000 * 1_000

    def sent(seconds_ago: int, *, logged: bool) -> Note:
        firing = Firing.of(entry, None, address, now - seconds_ago * 1_000)
        item = HistoryItem.of(Decision(firing, DecisionOutcome.WON, "new", 5))
        return replace(node.board.history_note(address, item), keep=3, logged=logged)

    store.post([sent(s, logged=False) for s in (150, 149)])
    store.post([sent(s, logged=True) for s in range(148, 0, -1)])
    with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
        node.board.sync()  # its first sync sweeps for missed firings

    assert node.stats["tick"].missed == 0
    assert not [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
    kind = history_kind(address)
    occurrences = sorted(
        json.loads(v)["occurrence_ms"] for v in store.read_logs([kind])[kind].values()
    )
    assert occurrences == [now - s * 1_000 for s in (3, 2, 1)]


def test_a_malformed_logged_note_is_counted_and_warned_once_like_one_kept_in_place(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    plan = Schedule([Entry(name="tick", task="t.tick", trigger=Every(1))], namespace=NS)
    node = Scheduler(plan, store=store, node="new", enqueue=lambda f: None)
    kind = history_kind(plan.address(plan.entry("tick")))
    logged = Note(kind, "bad-logged", '{"id": "x", "occurrence_ms": "soon"}', 60_000, 50, True)
    in_place = Note(kind, "bad-in-place", '{"id": "y"', 60_000, 50)
    store.post([logged, in_place])
    assert store._log_key(kind).encode() in redis.Redis(host=HOST, port=PORT).keys(
        f"{store.prefix}log:*"
    )

    with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
        for _ in range(3):  # three missed-firing sweeps reading the same notes
            node.board._swept_ms = None
            node.board.sync()

    assert node.board.skipped.counts == {"history": 2}
    for key in ("bad-logged", "bad-in-place"):
        told = [r for r in caplog.records if f"note {key!r} of kind {kind!r}" in r.getMessage()]
        assert len(told) == 1, [r.getMessage() for r in told]
