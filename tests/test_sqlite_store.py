"""What the SQLite store adds to the contract: processes, the file, its schema and sweep."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
from stores import ManualClock

import beatless.stores.sqlite as sqlite_module
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import TOLERANCE_MS, Note
from beatless.stores.sqlite import SCHEMA_VERSION, SQLiteStore

MEMORY_MS = 80_000


def request(
    id_: str,
    occurrence_ms: int,
    memory_ms: int = MEMORY_MS,
    release_ms: int | None = None,
    tag: str = "",
) -> ClaimRequest:
    release = occurrence_ms if release_ms is None else release_ms
    return ClaimRequest(id_, f"sqlite/{id_}", occurrence_ms, 60_000, memory_ms, release, tag)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "claims.db"


# -- many processes on one file -------------------------------------------------------------

WORKER = """
import json, random, sys, time
from beatless.stores import ClaimRequest
from beatless.stores.sqlite import SQLiteStore

path, node, count, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
now_ms = int(time.time() * 1000)
requests = [
    ClaimRequest(f"id-{i}", f"mp/{i}", now_ms, 60_000, 80_000, now_ms) for i in range(count)
]
rng = random.Random(node)
rng.shuffle(requests)
won = []
with SQLiteStore(path, busy_timeout=10) as store:
    time.sleep(max(0.0, start_at - time.time()))
    while requests:
        size = rng.choice((1, 1, 3, 17, 60))
        batch, requests = requests[:size], requests[size:]
        outcomes = store.claim(batch, node=node, lease_ms=60_000)
        mine = [r.id for r, o in zip(batch, outcomes) if o.is_won]
        if mine and rng.random() < 0.5:
            assert all(store.commit(mine, node=node))
        won += mine
print(json.dumps(won))
"""


@pytest.mark.slow
def test_each_firing_is_won_exactly_once_by_processes_hammering_one_file(path: Path) -> None:
    SQLiteStore(path).close()  # create the file and its schema before the race
    count, nodes = 400, [f"proc-{i}" for i in range(3)]
    start_at = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), node, str(count), str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in nodes
    ]
    won: dict[str, list[str]] = {}
    try:
        for node, proc in zip(nodes, procs, strict=True):
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            won[node] = json.loads(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
    assert not any(psutil.pid_exists(p.pid) and _is_running(p.pid) for p in procs)

    every = [id_ for ids in won.values() for id_ in ids]
    assert sorted(every) == sorted(f"id-{i}" for i in range(count))
    with SQLiteStore(path) as store:
        winners = {row["id"]: row["node"] for row in store.recent(count)}
    assert winners == {id_: node for node, ids in won.items() for id_ in ids}


def _is_running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def test_one_store_shared_by_threads_lets_each_firing_be_won_once(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    requests = [request(f"id-{i}", clock.now_ms()) for i in range(100)]
    won: list[str] = []

    def run(node: str) -> None:
        order = random.Random(node).sample(requests, len(requests))
        for r in order:
            if store.claim([r], node=node, lease_ms=60_000)[0].is_won:
                won.append(r.id)

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    store.close()

    assert sorted(won) == sorted(r.id for r in requests)


def test_a_commit_never_waits_for_a_long_read_of_another_thread(path: Path) -> None:
    """A node's board reads the registry and the history every second from a thread of
    its own, through the store object its loop commits with: the loop's commit, whose
    lease is running, is made while that read is still under way, not after it. Here the
    read waits, in the store's call, for the test to let it go."""
    reading, let_go, left = threading.Event(), threading.Event(), threading.Event()

    def clock() -> float:
        if threading.current_thread().name == "board":
            reading.set()
            let_go.wait(10)
            left.set()
        return time.time()

    store = SQLiteStore(path, clock=clock)
    firing = request("a", int(time.time() * 1_000))
    assert store.claim([firing], node="a", lease_ms=60_000) == [Outcome.WON]
    store.post([Note("history", "k", "v", 60_000)])
    read: list[Any] = []
    board = threading.Thread(
        target=lambda: read.append(store.read_synced(["history"], {})), name="board"
    )
    board.start()
    assert reading.wait(10)
    committed = store.commit([firing.id], node="a")
    waited = left.is_set()
    let_go.set()
    board.join(10)
    store.close()

    assert not waited, "the commit waited for the other thread's read to end"
    assert committed == [True]
    assert read == [({"history": {"k": "v"}}, {})]


# -- the file and its schema ----------------------------------------------------------------


def test_the_file_is_in_wal_mode_and_records_its_schema_version(path: Path) -> None:
    SQLiteStore(path).close()

    with sqlite3.connect(path) as raw:
        (mode,) = raw.execute("PRAGMA journal_mode").fetchone()
        (version,) = raw.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    raw.close()
    assert mode == "wal"
    assert int(version) == SCHEMA_VERSION == 1


def test_a_file_with_a_newer_schema_version_is_refused_with_both_versions_named(
    path: Path,
) -> None:
    SQLiteStore(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(SCHEMA_VERSION + 1),))
    raw.close()

    with pytest.raises(StoreError, match=r"schema version 2.*newer beatless.*version 1"):
        SQLiteStore(path)


def test_reopening_a_file_keeps_its_claims(path: Path, clock: ManualClock) -> None:
    with SQLiteStore(path, clock=clock) as store:
        assert store.claim([request("x", clock.now_ms())], node="a", lease_ms=1_000) == [
            Outcome.WON
        ]
    with SQLiteStore(path, clock=clock) as store:
        assert store.claim([request("x", clock.now_ms())], node="b", lease_ms=1_000) == [
            Outcome.HELD
        ]


def test_a_file_of_an_earlier_beatless_without_an_epoch_gets_one_and_keeps_its_claims(
    path: Path, clock: ManualClock
) -> None:
    with SQLiteStore(path, clock=clock) as store:
        store.claim([request("x", clock.now_ms())], node="a", lease_ms=60_000)
    with sqlite3.connect(path) as raw:
        raw.execute("DELETE FROM meta WHERE key = 'epoch'")
    raw.close()

    with SQLiteStore(path, clock=clock) as store:
        assert store.claim([request("x", clock.now_ms())], node="b", lease_ms=1_000) == [
            Outcome.HELD
        ]
        assert store.epoch is not None


OLD_CLAIMS = """CREATE TABLE claims (
    id TEXT PRIMARY KEY, address TEXT NOT NULL, occurrence_ms INTEGER NOT NULL,
    node TEXT NOT NULL, committed INTEGER NOT NULL, until_ms INTEGER NOT NULL,
    memory_ms INTEGER NOT NULL, claimed_ms INTEGER NOT NULL
) WITHOUT ROWID"""
"""The claims table as a beatless without task tags made it."""
OLD_WRITE = (
    "INSERT OR REPLACE INTO claims (id, address, occurrence_ms, node, committed, until_ms,"
    " memory_ms, claimed_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
"""How such a beatless writes a claim: its columns named, so a table with more takes it."""


def old_write(path: Path, id_: str, committed: int, now: int, *, made: bool = True) -> None:
    """A claim row as a beatless before task tags writes it, in a file it made (unless
    ``made`` is false: the file is made first, as that beatless made it)."""
    with sqlite3.connect(path) as raw:
        if not made:
            raw.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            raw.execute("INSERT INTO meta VALUES ('version', '1')")
            raw.execute(OLD_CLAIMS)
        row = (id_, f"sqlite/{id_}", now, "old", committed, now + 60_000, MEMORY_MS, now)
        raw.execute(OLD_WRITE, row)
    raw.close()


def test_a_file_made_before_task_tags_gains_the_column_and_keeps_its_claims(
    path: Path, clock: ManualClock
) -> None:
    now = clock.now_ms()
    old_write(path, "x", 0, now, made=False)

    store = SQLiteStore(path, clock=clock)
    # The old row has no tag: held, never foreign, for a tagged request.
    assert store.claim([request("x", now, tag="ab")], node="new", lease_ms=1_000) == [Outcome.HELD]
    # A beatless without tags still writes the file, its rows untagged.
    old_write(path, "y", 1, now)
    assert _row(path, "y")[-2] == ""
    assert store.claim([request("y", now, tag="ab")], node="new", lease_ms=1_000) == [Outcome.LOST]
    assert store.claim([request("z", now, tag="ab")], node="new", lease_ms=1_000) == [Outcome.WON]
    assert _row(path, "z")[-2:] == ("ab", None)  # the tag; no live revision
    assert meta(path, "version") == "1"
    store.close()


def test_a_file_made_before_claim_records_kept_revisions_gains_the_column_read_as_none(
    path: Path, clock: ManualClock
) -> None:
    now = clock.now_ms()
    old_write(path, "x", 1, now, made=False)

    store = SQLiteStore(path, clock=clock)
    live = dataclasses.replace(request("z", now), revision=9)
    assert store.claim([live], node="new", lease_ms=1_000) == [Outcome.WON]
    # A beatless that does not know the column names its columns: NULL, not recorded.
    old_write(path, "y", 1, now)
    records = store.claim_records(["x", "y", "z"])
    assert {i: (r.node, r.committed, r.revision) for i, r in records.items()} == {
        "x": ("old", True, None),
        "y": ("old", True, None),
        "z": ("new", False, 9),
    }
    store.close()


def test_a_file_made_before_notes_gains_the_table_and_keeps_its_claims(
    path: Path, clock: ManualClock
) -> None:
    with SQLiteStore(path, clock=clock) as store:
        store.claim([request("x", clock.now_ms())], node="a", lease_ms=60_000)
    # What a beatless without notes left: the same file, no notes table.
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE notes")
    raw.close()

    with SQLiteStore(path, clock=clock) as store:
        assert store.claim([request("x", clock.now_ms())], node="b", lease_ms=1_000) == [
            Outcome.HELD
        ]
        store.post([Note("nodes", "b", "up", 60_000)])
        assert store.read_notes(["nodes"]) == {"nodes": {"b": "up"}}
    assert meta(path, "version") == "1"


def test_a_commit_whose_notes_cannot_be_written_commits_nothing(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    now = clock.now_ms()
    store.claim([request("x", now), request("y", now)], node="a", lease_ms=60_000)
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE notes")
    raw.close()
    history = [Note("history", "x", "sent", 60_000)]

    with pytest.raises(StoreError, match="notes"):
        store.commit(["x"], node="a", notes=history)

    assert _row(path, "x")[4] == 0  # still pending: the commit went with its notes
    assert store.commit(["y"], node="a") == [True]  # without notes it never reads the table
    store.close()


# -- the epoch -----------------------------------------------------------------------------


FAR = 4_000_000_000_000
"""An until_ms in the year 2096: a row that no sweep removes."""


def meta(path: Path, key: str) -> str | None:
    with sqlite3.connect(path) as raw:
        row = raw.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    raw.close()
    return None if row is None else str(row[0])


def delete_file(path: Path) -> None:
    """Delete the database as an operator would: the file and its WAL companions."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_the_epoch_is_a_meta_row_written_with_the_schema_and_adopted_at_the_first_claim(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    started = clock.now_ms()
    clock.advance(500)
    assert store.epoch is None

    store.claim([request("x", clock.now_ms())], node="a", lease_ms=1_000)

    assert store.epoch is not None
    assert meta(path, "epoch") == f"{started}|{store.epoch.token}"
    assert store.epoch.started_ms == started
    assert meta(path, "version") == str(SCHEMA_VERSION)
    store.close()


def test_a_deleted_file_gives_forgotten_to_a_store_object_that_saw_it_before(
    path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beatless")
    a = SQLiteStore(path, clock=clock)
    sent = request("sent", clock.now_ms())
    assert a.claim([sent], node="a", lease_ms=1_000) == [Outcome.WON]
    assert a.commit(["sent"], node="a") == [True]
    seen = a.epoch
    unsent = request("unsent", clock.now_ms())
    delete_file(path)
    clock.advance(2_000)

    # The same store object opens the path again: a new file, a new epoch.
    assert a.claim([sent, unsent], node="a", lease_ms=1_000) == [Outcome.FORGOTTEN] * 2
    assert a.epoch is not None
    assert a.epoch != seen
    assert a.epoch.started_ms == clock.now_ms()
    assert "deleted or replaced" in caplog.text
    assert "lost its memory" in caplog.text
    third = SQLiteStore(path, clock=clock)
    assert third.claim([sent], node="c", lease_ms=1_000) == [Outcome.LOST]
    assert [r["committed"] for r in third.recent(5)] == [True, True]
    horizon = a.epoch.started_ms + TOLERANCE_MS
    before = request("before", clock.now_ms(), release_ms=horizon - 1)
    at = request("at", clock.now_ms(), release_ms=horizon)
    assert a.claim([before, at], node="a", lease_ms=1_000) == [Outcome.FORGOTTEN, Outcome.WON]
    a.close()
    third.close()


def test_a_store_object_opened_after_the_file_was_recreated_adopts_its_epoch_and_wins(
    path: Path, clock: ManualClock
) -> None:
    a = SQLiteStore(path, clock=clock)
    sent = request("sent", clock.now_ms())
    assert a.claim([sent], node="a", lease_ms=1_000) == [Outcome.WON]
    assert a.commit(["sent"], node="a") == [True]
    delete_file(path)

    fresh = SQLiteStore(path, clock=clock)

    assert fresh.claim([sent], node="b", lease_ms=60_000) == [Outcome.WON]
    assert fresh.epoch is not None
    assert a.claim([sent], node="a", lease_ms=1_000) == [Outcome.HELD]
    assert a.epoch == fresh.epoch
    a.close()
    fresh.close()


def test_a_store_object_that_moves_to_a_recreated_file_leaves_the_new_file_s_log_intact(
    path: Path, clock: ManualClock
) -> None:
    old = SQLiteStore(path, clock=clock)
    old.claim([request("x", clock.now_ms())], node="old", lease_ms=60_000)
    delete_file(path)
    new = SQLiteStore(path, clock=clock)
    new.claim([request("y", clock.now_ms())], node="new", lease_ms=60_000)
    assert Path(f"{path}-wal").exists()

    # The old connection is closed as the store object opens the new file.
    assert old.claim([request("z", clock.now_ms())], node="old", lease_ms=60_000) == [
        Outcome.FORGOTTEN
    ]

    assert Path(f"{path}-wal").exists()
    with SQLiteStore(path, clock=clock) as other:
        assert other.claim([request("y", clock.now_ms())], node="o", lease_ms=1) == [Outcome.HELD]
    old.close()
    new.close()


# -- unreadable rows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [(7, FAR, 0), (0, "garbage", 0), (0, FAR, "soon"), (None, FAR, 0), (0, FAR, 0)],
    ids=["committed-7", "until-text", "claimed-text", "committed-blob", "tag-blob"],
)
def test_a_row_it_cannot_read_fails_only_its_own_firing_as_corrupt(
    path: Path, clock: ManualClock, values: tuple[object, object, object]
) -> None:
    store = SQLiteStore(path, clock=clock)
    committed, until_ms, claimed_ms = values
    with sqlite3.connect(path) as raw:
        raw.execute(
            "INSERT INTO claims (id, address, occurrence_ms, node, committed, until_ms,"
            " memory_ms, claimed_ms) VALUES ('bad', 'sqlite/bad', 0, 'a', ?, ?, 80000, ?)",
            (committed if committed is not None else 0, until_ms, claimed_ms),
        )
        if committed is None:
            raw.execute("UPDATE claims SET committed = x'00' WHERE id = 'bad'")
        if values == (0, FAR, 0):
            raw.execute("UPDATE claims SET tag = x'6162' WHERE id = 'bad'")
    raw.close()
    before = _row(path, "bad")
    now = clock.now_ms()
    batch = [request("fresh", now), request("bad", now), request("late", now - 100_000)]

    assert store.claim(batch, node="a", lease_ms=1_000) == [
        Outcome.WON,
        Outcome.CORRUPT,
        Outcome.LATE,
    ]
    assert store.commit(["bad", "fresh"], node="a") == [False, True]
    store.release(["bad"], node="a")
    clock.advance(200_000)
    store.claim([request("later", clock.now_ms())], node="a", lease_ms=1_000)  # sweeps
    assert _row(path, "bad") == before
    store.close()


def _row(path: Path, id_: str) -> tuple[object, ...]:
    with sqlite3.connect(path) as raw:
        row = raw.execute("SELECT * FROM claims WHERE id = ?", (id_,)).fetchone()
    raw.close()
    return tuple(row)


def test_an_unreadable_epoch_row_is_a_store_error(path: Path, clock: ManualClock) -> None:
    store = SQLiteStore(path, clock=clock)
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value = 'not an epoch' WHERE key = 'epoch'")
    raw.close()

    with pytest.raises(StoreError, match="unreadable epoch") as caught:
        store.claim([request("x", clock.now_ms())], node="a", lease_ms=1_000)
    assert not isinstance(caught.value, StoreUnavailable)
    store.close()


# -- release, clock and probe ---------------------------------------------------------------


def test_release_keeps_the_row_with_its_lease_ended(path: Path, clock: ManualClock) -> None:
    store = SQLiteStore(path, clock=clock)
    store.claim([request("x", clock.now_ms())], node="a", lease_ms=60_000)
    clock.advance(10)

    store.release(["x"], node="a")

    (row,) = store.recent(5)
    assert (row["id"], row["node"], row["committed"]) == ("x", "a", False)
    assert row["until_ms"] == clock.now_ms() - 1
    clock.advance(MEMORY_MS - 1)
    store.claim([request("y", clock.now_ms())], node="a", lease_ms=1)  # sweeps
    assert len(store) == 2
    clock.advance(sqlite_module.SWEEP_EVERY_MS)
    store.claim([request("z", clock.now_ms())], node="a", lease_ms=1)
    assert "x" not in {r["id"] for r in store.recent(5)}
    store.close()


def test_time_ms_is_the_store_clock(path: Path, clock: ManualClock) -> None:
    with SQLiteStore(path, clock=clock) as store:
        clock.advance(42)
        assert store.time_ms() == clock.now_ms()


def test_probe_writes_reads_and_deletes_a_meta_row(path: Path) -> None:
    with SQLiteStore(path) as store:
        store.probe()
    with sqlite3.connect(path) as raw:
        keys = [key for (key,) in raw.execute("SELECT key FROM meta ORDER BY key")]
    raw.close()
    assert keys == ["epoch", "version"]


def test_probe_of_a_path_that_cannot_be_written_fails_naming_the_path(path: Path) -> None:
    store = SQLiteStore(path)
    delete_file(path)
    path.mkdir()  # what stands at the path now cannot be a database file

    with pytest.raises(StoreError, match="unable to open") as caught:
        store.probe()
    assert str(path) in str(caught.value)
    store.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only files")
def test_probe_of_a_read_only_file_fails_naming_the_path(path: Path) -> None:
    SQLiteStore(path).close()
    path.chmod(0o444)
    try:
        with pytest.raises(StoreError) as caught, SQLiteStore(path) as store:
            store.probe()
        assert str(path) in str(caught.value)
    finally:
        path.chmod(0o644)


# -- sweeping -------------------------------------------------------------------------------


def test_sweep_removes_committed_claims_once_their_memory_ran_out(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    store.claim([request("old", clock.now_ms(), memory_ms=5_000)], node="a", lease_ms=500)
    assert store.commit(["old"], node="a") == [True]

    clock.advance(5_001)
    store.claim([request("new", clock.now_ms())], node="a", lease_ms=500)

    assert [row["id"] for row in store.recent(10)] == ["new"]
    store.close()


def test_sweep_keeps_an_abandoned_pending_claim_so_it_is_reported_as_a_takeover(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    abandoned = request("abandoned", clock.now_ms(), memory_ms=MEMORY_MS)
    store.claim([abandoned], node="a", lease_ms=500)

    clock.advance(2_000)
    store.claim([request("other", clock.now_ms())], node="a", lease_ms=500)  # sweeps
    assert len(store) == 2
    assert store.claim([abandoned], node="b", lease_ms=500) == [Outcome.TAKEOVER]

    clock.advance(500 + MEMORY_MS + 1)
    store.claim([request("last", clock.now_ms())], node="a", lease_ms=500)
    assert [row["id"] for row in store.recent(10)] == ["last"]
    store.close()


def test_sweep_runs_at_most_once_a_second_and_deletes_a_bounded_number_of_rows(
    path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "SWEEP_LIMIT", 3)
    store = SQLiteStore(path, clock=clock)
    old = [request(f"old-{i}", clock.now_ms(), memory_ms=1_000) for i in range(8)]
    store.claim(old, node="a", lease_ms=100)
    store.commit([r.id for r in old], node="a")
    clock.advance(500)
    store.claim([request("young", clock.now_ms())], node="a", lease_ms=100)
    clock.advance(600)  # the old claims ran out, but a sweep ran 600 ms ago
    assert len(store) == 9

    counts = []
    for i in range(4):
        store.claim([request(f"new-{i}", clock.now_ms())], node="a", lease_ms=60_000)
        counts.append(len(store))
    clock.advance(400)
    store.claim([request("later", clock.now_ms())], node="a", lease_ms=60_000)

    # Full sweeps (3 rows) run again at once; the one that finds less waits a second.
    assert counts == [10 - 3, 8 - 3, 6 - 2, 5]
    assert len(store) == 6
    store.close()


# -- reading who won ------------------------------------------------------------------------


def test_recent_lists_who_won_and_when_newest_first(path: Path, clock: ManualClock) -> None:
    store = SQLiteStore(path, clock=clock)
    start = clock.now_ms()
    store.claim([request("first", start)], node="a", lease_ms=1_000)
    store.commit(["first"], node="a")
    clock.advance(10)
    store.claim([request("second", start)], node="b", lease_ms=1_000)
    store.claim([request("second", start)], node="a", lease_ms=1_000)  # held: not recorded

    rows = store.recent(5)

    assert [(r["id"], r["node"], r["claimed_ms"], r["committed"]) for r in rows] == [
        ("second", "b", start + 10, False),
        ("first", "a", start, True),
    ]
    assert rows[1]["until_ms"] == start + MEMORY_MS
    assert rows[0]["address"] == "sqlite/second"
    assert store.recent(1) == rows[:1]
    store.close()


# -- errors ---------------------------------------------------------------------------------


def test_a_database_locked_by_another_connection_raises_store_unavailable(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock, busy_timeout=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            store.claim([request("x", clock.now_ms())], node="a", lease_ms=1_000)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    assert store.claim([request("x", clock.now_ms())], node="a", lease_ms=1_000) == [Outcome.WON]
    store.close()


def test_a_file_that_cannot_be_opened_raises_store_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="unable to open"):
        SQLiteStore(tmp_path / "no-such-dir" / "claims.db")


def test_a_file_that_is_not_a_database_raises_store_error_not_unavailable(path: Path) -> None:
    path.write_bytes(b"this is not a database" * 100)

    with pytest.raises(StoreError) as caught:
        SQLiteStore(path)
    assert not isinstance(caught.value, StoreUnavailable)


def test_a_closed_store_refuses_claims_and_closing_twice_is_harmless(path: Path) -> None:
    with SQLiteStore(path) as store:
        pass
    store.close()

    with pytest.raises(StoreError, match="closed"):
        store.claim([request("x", 0)], node="a", lease_ms=1_000)


# -- URLs -----------------------------------------------------------------------------------


def test_a_url_with_three_slashes_names_a_file_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with SQLiteStore.from_url("sqlite:///relative.db") as store:
        assert store.path == "relative.db"
    assert (tmp_path / "relative.db").exists()


def test_a_store_opened_by_a_relative_path_keeps_its_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("relative.db", clock=clock)
    store.claim([request("x", clock.now_ms())], node="a", lease_ms=60_000)

    monkeypatch.chdir(tmp_path / "elsewhere")

    assert store.claim([request("x", clock.now_ms())], node="b", lease_ms=1) == [Outcome.HELD]
    assert not (tmp_path / "elsewhere" / "relative.db").exists()
    store.close()


def test_a_url_with_four_slashes_names_an_absolute_path(tmp_path: Path) -> None:
    with SQLiteStore.from_url(f"sqlite:///{tmp_path}/abs%20path.db?busy_timeout=2s") as store:
        assert store.path == f"{tmp_path}/abs path.db"
        assert store._busy_timeout == 2.0
    assert (tmp_path / "abs path.db").exists()


def test_open_store_opens_a_sqlite_url(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/claims.db", namespace="app", busy_timeout=1) as store:
        assert isinstance(store, SQLiteStore)
        assert repr(store) == f"SQLiteStore('{tmp_path}/claims.db')"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "no file path"),
        ("sqlite:///", "no file path"),
        ("sqlite://somehost/claims.db", "names a host"),
        ("sqlite:///claims.db?timeout=3", "unknown option timeout"),
        ("redis://localhost/0", "not a sqlite URL"),
    ],
)
def test_a_sqlite_url_without_a_usable_path_is_a_config_error(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SQLiteStore.from_url(url)


def test_a_negative_busy_timeout_is_a_config_error(path: Path) -> None:
    with pytest.raises(ConfigError, match="busy_timeout"):
        SQLiteStore(path, busy_timeout=-1)


def _claim_in_child(store: SQLiteStore, now_ms: int) -> None:
    outcome = store.claim([request("forked", now_ms)], node="child", lease_ms=60_000)
    sys.exit(0 if outcome == [Outcome.WON] else 1)


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX only")
def test_a_child_process_that_inherits_the_store_opens_a_connection_of_its_own(
    path: Path, clock: ManualClock
) -> None:
    import multiprocessing

    store = SQLiteStore(path, clock=clock)
    store.claim([request("before", clock.now_ms())], node="parent", lease_ms=60_000)
    child = multiprocessing.get_context("fork").Process(
        target=_claim_in_child, args=(store, clock.now_ms())
    )
    child.start()
    child.join(timeout=10)
    if child.is_alive():
        child.kill()
        child.join(timeout=5)

    assert child.exitcode == 0
    assert store.claim([request("forked", clock.now_ms())], node="parent", lease_ms=1) == [
        Outcome.HELD
    ]
    store.close()


# -- run leases -------------------------------------------------------------------------------


def test_overlap_writes_the_firing_committed_for_its_memory_and_leaves_the_run_lease_alone(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    now = clock.now_ms()
    run = ClaimRequest(run_lease_id("sqlite/x"), "sqlite/x", now, 60_000, 1_000, now)
    assert store.claim([run], node="worker", lease_ms=5_000) == [Outcome.WON]
    lease_row = _row(path, run.id)
    clock.advance(10)
    firing = dataclasses.replace(request("f", now, tag="ab"), address="sqlite/x", run_id=run.id)

    assert store.claim([firing], node="a", lease_ms=1_000) == [Outcome.OVERLAP]

    (row,) = [r for r in store.recent() if r["id"] == "f"]
    assert (row["node"], row["committed"]) == ("a", True)
    assert row["until_ms"] == now + 10 + MEMORY_MS
    assert _row(path, run.id) == lease_row
    store.close()


def test_a_run_lease_row_it_cannot_read_holds_nothing_and_is_left_alone(
    path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(path, clock=clock)
    now = clock.now_ms()
    run_id = run_lease_id("sqlite/y")
    with sqlite3.connect(path) as raw:
        raw.execute(
            "INSERT INTO claims (id, address, occurrence_ms, node, committed, until_ms,"
            " memory_ms, claimed_ms) VALUES (?, 'sqlite/y', 0, 'w', 0, 'soon', 1000, 0)",
            (run_id,),
        )
    raw.close()
    before = _row(path, run_id)
    firing = dataclasses.replace(request("g", now), address="sqlite/y", run_id=run_id)

    assert store.claim([firing], node="a", lease_ms=1_000) == [Outcome.WON]
    assert _row(path, run_id) == before
    store.close()


def _open_at_once(path: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    try:
        sqlite_module.SQLiteStore(path).close()
        out.put("ok")
    except StoreError as exc:
        out.put(str(exc))


@pytest.mark.slow
def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # The first processes to open a file race for its switch to WAL mode, and SQLite
    # answers the losers "database is locked" without waiting (seen in 4 of 160 opens).
    import multiprocessing

    failed = []
    for round_ in range(20):
        path = str(tmp_path / f"new-{round_}.db")
        barrier, out = multiprocessing.Barrier(4), multiprocessing.Queue()
        procs = [
            multiprocessing.Process(target=_open_at_once, args=(path, barrier, out))
            for _ in range(4)
        ]
        for proc in procs:
            proc.start()
        try:
            failed += [said for said in (out.get(timeout=30) for _ in procs) if said != "ok"]
        finally:
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
    assert failed == []
