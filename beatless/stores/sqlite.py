"""The embedded default claim store: one SQLite file shared by many processes on one host.

Every claim, commit and release is one ``BEGIN IMMEDIATE`` transaction, so a batch is
atomic and two processes cannot both win a firing: SQLite lets one writer in at a time
and the others wait up to ``busy_timeout``. The file is in WAL mode, so readers such as
``beatless status`` never block the writers. Calls made at once from threads of one
process run on connections of their own: a node's board reading the registry never holds
up its loop's commit, whose lease is running.

A run lease (:attr:`~beatless.stores.base.ClaimRequest.run_id`) is a row like any
claim's, read in the same transaction as the firings that name it, so the overlap check
and the claim it decides are one atomic step.

The store's clock is the ``clock`` callable, read once per transaction after the write
lock is taken. Every process on the host shares the system clock, so leases are judged
on one clock. The file must be on a local disk: SQLite's locks are not reliable over
NFS or SMB, so do not share it between hosts.

The file's epoch is the ``epoch`` row of its ``meta`` table, ``{started_ms}|{token}``,
written with the schema when the file is created. A store object checks before each
transaction that the file at its path is still the one it opened; when the file was
deleted (or replaced), it opens the path again, which creates a new file with a new
epoch, and the next claim reports what the old file may have held as forgotten.

Notes (:meth:`SQLiteStore.post`) are rows of a ``notes`` table beside the claims, one per
kind and key, with the last millisecond of the note's life on the store's clock. A post
is one transaction that writes them, trims the kinds with a ``keep``, and deletes up to
a bounded number of notes past their time, of any kind. A commit that carries notes does
the same after its claims, in its own transaction, so that both are written or neither.
A note costs its row (its kind, key and value as posted, and about 20 bytes more) and
two index entries, one with its kind and key, one with its end.

Kept notes (:meth:`SQLiteStore.keep_notes`) are rows of a ``kept_notes`` table, one per
kind and key, with no end: written, replaced and deleted each in one transaction.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from beatless.core._logtext import shown
from beatless.core.durations import DurationLike, as_timedelta
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.stores._epoch import adopt, horizon_ms, new_token
from beatless.stores._pool import Pool
from beatless.stores._sqlite_rows import (
    _ADD_REVISION,
    _ADD_TAG,
    _COMMIT,
    _DELETE_KEPT,
    _HELD,
    _KEEP,
    _KEPT,
    _KEPT_KEY,
    _NEW_EPOCH,
    _NOTES,
    _RECENT,
    _RECORDS,
    _RELEASE,
    _SCHEMA,
    _WRITE,
    _current_epoch,
    _Decision,
    _epoch_value,
    _fences,
    _Held,
    _parse_held,
    _record,
    _Unreadable,
    _write_notes,
)
from beatless.stores.base import (
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    KeptNote,
    Note,
    Outcome,
)

logger = logging.getLogger(__name__)

WAL_RETRY_S = 0.05
"""How long a store waits before it asks again for WAL mode that another process's
switch kept it from."""

SCHEMA_VERSION = 1
"""The layout of the file; a file written by a newer beatless is refused. The ``tag``
column of ``claims`` and the ``notes`` table came later without a new version: they are
added in place to a file that lacks them, and a beatless that does not know them reads
and writes the file as before, its rows tagged ``''`` (never foreign), its notes left
alone."""

DEFAULT_BUSY_TIMEOUT = 5.0
SWEEP_EVERY_MS = 1_000
SWEEP_LIMIT = 10_000
"""Rows deleted by one sweep, so that no claim waits on a long delete."""

_CHUNK = 500
_TRANSIENT = {5, 6, 14}  # SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN
_TRANSIENT_TEXT = ("database is locked", "database table is locked", "unable to open")

# A committed claim goes when its memory ends. A pending claim whose lease ran out is kept
# for its memory_ms more, so that the next claim can still report it as a takeover.
_SWEEP = (
    "DELETE FROM claims WHERE id IN (SELECT id FROM claims WHERE until_ms < :now"
    " AND (committed = 1 OR until_ms + memory_ms < :now) LIMIT :limit)"
)


class SQLiteStore(ClaimStore):
    """Claims in one SQLite file, shared by the processes of one host.

    ``path`` is the file, created if missing (its directory must exist); ``clock``
    returns the store's time in seconds (``time.time``); ``busy_timeout`` (seconds,
    ``"2s"``, ``timedelta``) is how long a transaction waits for another process's lock
    before :class:`~beatless.errors.StoreUnavailable` is raised. Commits are synced to
    disk (``synchronous=FULL``), so a claim survives a power cut as well as a crash.

    Each row records the winner (``node``), when the store granted it (``claimed_ms``)
    and the task tag of its request (``tag``) until the claim is swept; :meth:`recent`
    reads them. A row whose values are not what this version writes fails only its own
    firing, with :attr:`~beatless.stores.base.Outcome.CORRUPT`.

    One store object may be shared by the threads of a process: calls made at once run
    on connections of their own (one more is opened when every one is in use), so a
    read never holds up a write; writes still take the file's write lock one at a time.
    A child process that inherits the object opens connections of its own. The file is
    opened, and its schema version checked, in the constructor.
    """

    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: DurationLike = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ConfigError("sqlite store: the path is empty; give a file such as beatless.db")
        timeout = as_timedelta(busy_timeout, name="sqlite store: busy_timeout")
        if timeout.total_seconds() < 0:
            raise ConfigError(f"sqlite store: busy_timeout must not be negative, got {timeout}")
        self._clock = clock
        self._busy_timeout = timeout.total_seconds()
        self._epoch_lock = threading.Lock()
        self._next_sweep_ms = 0
        # Opened and watched by its absolute path, so that a chdir changes nothing.
        self._file = self.path if self.path == ":memory:" else os.path.abspath(self.path)
        self._file_id: tuple[int, int] | None = None
        """The file the store's connections opened last."""
        self._forgot_before_ms: int | None = None
        # A call takes a connection no other call is using, so that a node's loop commits
        # the firings it sent while its board reads; every connection of ":memory:" would
        # be a database of its own, so it has one.
        limit = 1 if self._file == ":memory:" else None
        name = f"sqlite store {self.path!r}"
        self._pool: Pool[_Slot] = Pool(_Slot, _Slot.close, name=name, limit=limit)
        with self._reading():
            pass

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open ``sqlite:///relative/file.db`` or ``sqlite:////absolute/file.db``.

        ``?busy_timeout=2s`` may be given in the URL; keyword ``options`` win over it.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() != "sqlite":
            raise ConfigError(f"not a sqlite URL: {url!r}; write sqlite:///path/to/file.db")
        if parts.netloc:
            raise ConfigError(
                f"sqlite URL {url!r} names a host ({parts.netloc!r}); a SQLite file is local: "
                f"write sqlite:///relative.db or sqlite:////absolute/path.db"
            )
        path = unquote(parts.path[1:])
        if not path:
            raise ConfigError(
                f"sqlite URL {url!r} has no file path; write sqlite:///relative.db or "
                f"sqlite:////absolute/path.db"
            )
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - {"busy_timeout"})
        if unknown:
            raise ConfigError(
                f"sqlite URL {url!r}: unknown option {', '.join(unknown)}; "
                f"the only option is busy_timeout"
            )
        if "busy_timeout" in query:
            options.setdefault("busy_timeout", query["busy_timeout"][-1])
        return cls(path, **options)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # -- the contract ---------------------------------------------------------------

    def time_ms(self) -> int:
        return self._now_ms()

    def probe(self) -> None:
        """Write, read back and delete a probe row of the ``meta`` table, in one
        transaction that is committed to disk."""
        key, value = f"probe:{uuid.uuid4().hex}", uuid.uuid4().hex
        with self._transaction() as (conn, _now):
            conn.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            conn.execute("DELETE FROM meta WHERE key = ?", (key,))
        if row is None or row[0] != value:
            raise StoreError(f"sqlite store {self.path!r}: a probe row written was not read back")

    reseeds = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if not requests:
            return []
        with self._transaction() as (conn, now):
            self._sweep(conn, now)
            epoch = _current_epoch(conn, now, self.path)
            forgot_before = horizon_ms(self.epoch, epoch, self._forgot_before_ms)
            held = self._held(
                conn, [r.id for r in requests] + [r.run_id for r in requests if r.run_id]
            )
            decide = _Decision(node, lease_ms, now, forgot_before, hold_off)
            outcomes = []
            writes: dict[str, tuple[Any, ...]] = {}
            for request, fence in zip(requests, _fences(conn, requests), strict=True):
                running = held.get(request.run_id) if request.run_id else None
                outcome, row = decide(request, held.get(request.id), running, fence)
                outcomes.append(outcome)
                if row is not None:
                    writes[request.id] = row
                    held[request.id] = _Held(node, bool(row[4]), row[5], row[7], row[8])
            conn.executemany(_WRITE, writes.values())
        label = f"sqlite store {shown(self.path)}"
        with self._epoch_lock:  # calls of two threads may find the change at once
            adopt(self, epoch, logger=logger, label=label, horizon=forgot_before)
        return outcomes

    checks_revisions = True

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        """One ``BEGIN IMMEDIATE`` transaction: the claims, then the notes, as :meth:`post`
        writes them."""
        if not ids:
            self.post(notes)
            return []
        with self._transaction() as (conn, now):
            epoch = _current_epoch(conn, now, self.path)
            done = [conn.execute(_COMMIT, (now, id_, node, now)).rowcount > 0 for id_ in ids]
            if notes:
                _write_notes(conn, now, notes)
        if self.epoch is None:
            self.epoch = epoch
        return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        if not ids:
            return
        with self._transaction() as (conn, now):
            conn.executemany(_RELEASE, ((now - 1, id_, node) for id_ in ids))

    def post(self, notes: Sequence[Note]) -> None:
        """One ``BEGIN IMMEDIATE`` transaction, on the store's clock as claims use it."""
        if not notes:
            return
        with self._transaction() as (conn, now):
            _write_notes(conn, now, notes)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {kind: {} for kind in kinds}
        unique = list(found)
        if not unique:
            return found
        with self._reading() as conn:
            now = self._now_ms()
            for start in range(0, len(unique), _CHUNK):
                chunk = unique[start : start + _CHUNK]
                sql = f"{_NOTES} ({','.join('?' * len(chunk))})"
                for kind, key, value in conn.execute(sql, [now, *chunk]):
                    found[kind][key] = value
        return found

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """Both in one read transaction, on the store's clock read in it."""
        notes: dict[str, dict[str, str]] = {kind: {} for kind in kinds}
        found: dict[str, dict[str, str]] = {kind: {} for kind in kept}
        with self._reading() as conn:
            conn.execute("BEGIN")
            try:
                now = self._now_ms()
                unique = list(notes)
                for start in range(0, len(unique), _CHUNK):
                    chunk = unique[start : start + _CHUNK]
                    sql = f"{_NOTES} ({','.join('?' * len(chunk))})"
                    for kind, key, value in conn.execute(sql, [now, *chunk]):
                        notes[kind][key] = value
                for kind, keys in kept.items():
                    for key in keys:
                        row = conn.execute(_KEPT_KEY, (kind, key)).fetchone()
                        if row is not None:
                            found[kind][key] = row[0]
            finally:
                conn.execute("COMMIT")
        return notes, found

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        """One ``BEGIN IMMEDIATE`` transaction over the ``kept_notes`` table."""
        if notes:
            with self._transaction() as (conn, _now):
                conn.executemany(_KEEP, ((n.kind, n.key, n.value) for n in notes))

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        with self._reading() as conn:
            found = dict(conn.execute(_KEPT, (kind,)).fetchall())
        return found if keys is None else {key: found[key] for key in keys if key in found}

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        if keys:
            with self._transaction() as (conn, _now):
                conn.executemany(_DELETE_KEPT, ((kind, key) for key in keys))

    def close(self) -> None:
        """Close the connections; one in use by a call of another thread is closed when
        that call ends."""
        self._pool.close()

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        unique = list(dict.fromkeys(ids))
        found = {}
        with self._reading() as conn:
            for start in range(0, len(unique), _CHUNK):
                chunk = unique[start : start + _CHUNK]
                sql = f"{_RECORDS} ({','.join('?' * len(chunk))})"
                for id_, *values in conn.execute(sql, chunk):
                    record = _record(values)
                    if record is not None:
                        found[id_] = record
        return found

    # -- reading, for ``beatless status`` ------------------------------------------------

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The ``limit`` most recent claims still remembered, newest first.

        Each is a dict of ``id``, ``address``, ``occurrence_ms``, ``node`` (the winner),
        ``committed``, ``until_ms`` and ``claimed_ms`` (when the store granted it).
        """
        with self._reading() as conn:
            rows = conn.execute(_RECENT, (max(0, limit),)).fetchall()
        keys = ("id", "address", "occurrence_ms", "node", "committed", "until_ms", "claimed_ms")
        return [{**dict(zip(keys, row, strict=True)), "committed": bool(row[4])} for row in rows]

    def __len__(self) -> int:
        """How many claims the file holds now, including expired ones not yet swept."""
        with self._reading() as conn:
            (count,) = conn.execute("SELECT count(*) FROM claims").fetchone()
        return int(count)

    # -- internals ------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1_000)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._file,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._to_wal(conn)
            conn.execute("PRAGMA synchronous=FULL")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _to_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode (kept in the file: a no-op once done). Processes that
        open a new file at once race for the switch, and SQLite answers the losers
        "database is locked" at once, without its busy handler: tried again here, every
        50 ms, for up to the store's busy timeout."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(WAL_RETRY_S)
            else:
                return

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            row = conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
            if row is not None:
                _check_version(row[0], self.path)
            for statement in _SCHEMA:
                conn.execute(statement)
            columns = {column[1] for column in conn.execute("PRAGMA table_info(claims)")}
            if "tag" not in columns:
                conn.execute(_ADD_TAG)
            if "revision" not in columns:
                conn.execute(_ADD_REVISION)
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('version', ?)", (str(SCHEMA_VERSION),))
            conn.execute(_NEW_EPOCH, (_epoch_value(self._now_ms(), new_token()),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _connection(self, slot: _Slot) -> sqlite3.Connection:
        """The connection of ``slot``, opened if need be, or again on the file now at the
        path if it was deleted or replaced."""
        moved = slot.file_id is not None and _file_id(self._file) != slot.file_id
        if slot.conn is not None and moved:
            self._reopen(slot)
        if slot.conn is None:
            slot.conn = self._open()
            slot.file_id = self._file_id = _file_id(self._file)
        return slot.conn

    def _reopen(self, slot: _Slot) -> None:
        """The file was deleted or replaced: close the connection, for ``_connection`` to
        open the path again (a new file, a new epoch). Said once, by the first connection
        that finds it.

        SQLite does not checkpoint nor delete the write-ahead log of a file that moved
        when its connection closes, so closing the old one leaves the new file's alone.
        """
        if slot.file_id == self._file_id:
            logger.warning(
                "sqlite store %s: the file was deleted or replaced while open; opening it again",
                shown(self.path),
            )
        slot.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection of this call's own, outside any transaction."""
        with self._errors(), self._pool.take() as slot:
            yield self._connection(slot)

    @contextmanager
    def _transaction(self) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One write transaction holding the file's write lock; yields the store's now."""
        with self._reading() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn, self._now_ms()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            if _is_transient(exc):
                raise StoreUnavailable(f"sqlite store {self.path!r}: {exc}") from exc
            raise StoreError(f"sqlite store {self.path!r}: {exc}") from exc

    def _sweep(self, conn: sqlite3.Connection, now: int) -> None:
        """Forget expired claims, at most once a second and ``SWEEP_LIMIT`` rows at a time."""
        if self._next_sweep_ms - SWEEP_EVERY_MS < now < self._next_sweep_ms:
            return
        deleted = conn.execute(_SWEEP, {"now": now, "limit": SWEEP_LIMIT}).rowcount
        # A full sweep may have left more behind: sweep again on the next transaction.
        self._next_sweep_ms = now if deleted >= SWEEP_LIMIT else now + SWEEP_EVERY_MS

    def _held(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, _Held | _Unreadable]:
        unique = list(dict.fromkeys(ids))
        held = {}
        for start in range(0, len(unique), _CHUNK):
            chunk = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = f"{_HELD} ({marks})"
            for id_, *values in conn.execute(sql, chunk):
                held[id_] = _parse_held(values)
        return held


class _Slot:
    """One connection of the store (``None`` until a call opens it) and the identity of
    the file it opened."""

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.file_id: tuple[int, int] | None = None

    def close(self) -> None:
        conn, self.conn, self.file_id = self.conn, None, None
        if conn is not None:
            conn.close()


def _file_id(path: str) -> tuple[int, int] | None:
    """The identity of the file at ``path`` (``None`` if there is none, or no file)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _check_version(value: str, path: str) -> None:
    try:
        version = int(value)
    except ValueError:
        raise StoreError(
            f"sqlite store {path!r}: unreadable schema version {value!r}; "
            f"this file was not written by beatless"
        ) from None
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"sqlite store {path!r} has schema version {version}, written by a newer "
            f"beatless; this one reads up to version {SCHEMA_VERSION}: upgrade beatless on "
            f"every node, or point this node at another file"
        )


def _is_transient(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _TRANSIENT
    return isinstance(exc, sqlite3.OperationalError) and any(
        text in str(exc) for text in _TRANSIENT_TEXT
    )
