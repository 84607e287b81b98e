"""The embedded default claim store: one SQLite file shared by many processes on one host.

Every claim, commit and release is one ``BEGIN IMMEDIATE`` transaction, so a batch is
atomic and two processes cannot both win a firing: SQLite lets one writer in at a time
and the others wait up to ``busy_timeout``. The file is in WAL mode, so readers such as
``beatless status`` never block the writers.

The store's clock is the ``clock`` callable, read once per transaction after the write
lock is taken. Every process on the host shares the system clock, so leases are judged
on one clock. The file must be on a local disk: SQLite's locks are not reliable over
NFS or SMB, so do not share it between hosts.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from beatless.durations import DurationLike, as_timedelta
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.stores.base import ClaimRequest, ClaimStore, Outcome, judge

SCHEMA_VERSION = 1
"""The layout of the file; a file written by a newer beatless is refused."""

DEFAULT_BUSY_TIMEOUT = 5.0
SWEEP_EVERY_MS = 1_000
SWEEP_LIMIT = 10_000
"""Rows deleted by one sweep, so that no claim waits on a long delete."""

_CHUNK = 500
_TRANSIENT = {5, 6, 14}  # SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN
_TRANSIENT_TEXT = ("database is locked", "database table is locked", "unable to open")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS claims (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        occurrence_ms INTEGER NOT NULL,
        node TEXT NOT NULL,
        committed INTEGER NOT NULL,
        until_ms INTEGER NOT NULL,
        memory_ms INTEGER NOT NULL,
        claimed_ms INTEGER NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS claims_until_ms ON claims (until_ms)",
)
_WRITE = (
    "INSERT OR REPLACE INTO claims (id, address, occurrence_ms, node, committed, until_ms,"
    " memory_ms, claimed_ms) VALUES (?, ?, ?, ?, 0, ?, ?, ?)"
)
_COMMIT = (
    "UPDATE claims SET committed = 1, until_ms = ? + memory_ms"
    " WHERE id = ? AND node = ? AND until_ms >= ?"
)
_RELEASE = "DELETE FROM claims WHERE id = ? AND node = ? AND committed = 0"
# A committed claim goes when its memory ends. A pending claim whose lease ran out is kept
# for its memory_ms more, so that the next claim can still report it as a takeover.
_SWEEP = (
    "DELETE FROM claims WHERE id IN (SELECT id FROM claims WHERE until_ms < :now"
    " AND (committed = 1 OR until_ms + memory_ms < :now) LIMIT :limit)"
)
_HELD = "SELECT id, node, committed, until_ms, claimed_ms FROM claims WHERE id IN"
_RECENT = (
    "SELECT id, address, occurrence_ms, node, committed, until_ms, claimed_ms"
    " FROM claims ORDER BY claimed_ms DESC, id LIMIT ?"
)


@dataclass(slots=True)
class _Held:
    node: str
    committed: bool
    until_ms: int
    claimed_ms: int


class SQLiteStore(ClaimStore):
    """Claims in one SQLite file, shared by the processes of one host.

    ``path`` is the file, created if missing (its directory must exist); ``clock``
    returns the store's time in seconds (``time.time``); ``busy_timeout`` (seconds,
    ``"2s"``, ``timedelta``) is how long a transaction waits for another process's lock
    before :class:`~beatless.errors.StoreUnavailable` is raised. Commits are synced to
    disk (``synchronous=FULL``), so a claim survives a power cut as well as a crash.

    Each row records the winner (``node``) and when the store granted it
    (``claimed_ms``) until the claim is swept; :meth:`recent` reads them.

    One store object may be shared by the threads of a process: it holds one connection
    and a lock, so its calls run one at a time (SQLite admits one writer at a time
    anyway). A child process that inherits the object opens a connection of its own.
    The file is opened, and its schema version checked, in the constructor.
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
        self._lock = threading.Lock()
        self._next_sweep_ms = 0
        self._closed = False
        self._pid = os.getpid()
        with self._lock, self._errors():
            self._conn: sqlite3.Connection | None = self._open()

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

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if not requests:
            return []
        with self._transaction() as (conn, now):
            self._sweep(conn, now)
            held = self._held(conn, [r.id for r in requests])
            outcomes = []
            writes: dict[str, tuple[Any, ...]] = {}
            for request in requests:
                outcome, row = _decide(request, held.get(request.id), node, lease_ms, now)
                outcomes.append(outcome)
                if row is not None:
                    writes[request.id] = row
                    held[request.id] = _Held(node, False, row[4], row[6])
            conn.executemany(_WRITE, writes.values())
        return outcomes

    def commit(self, ids: Sequence[str], *, node: str) -> list[bool]:
        if not ids:
            return []
        with self._transaction() as (conn, now):
            return [conn.execute(_COMMIT, (now, id_, node, now)).rowcount > 0 for id_ in ids]

    def release(self, ids: Sequence[str], *, node: str) -> None:
        if not ids:
            return
        with self._transaction() as (conn, _now):
            conn.executemany(_RELEASE, ((id_, node) for id_ in ids))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()

    # -- reading, for ``beatless status`` ------------------------------------------------

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The ``limit`` most recent claims still remembered, newest first.

        Each is a dict of ``id``, ``address``, ``occurrence_ms``, ``node`` (the winner),
        ``committed``, ``until_ms`` and ``claimed_ms`` (when the store granted it).
        """
        with self._lock, self._errors():
            rows = self._connection().execute(_RECENT, (max(0, limit),)).fetchall()
        keys = ("id", "address", "occurrence_ms", "node", "committed", "until_ms", "claimed_ms")
        return [{**dict(zip(keys, row, strict=True)), "committed": bool(row[4])} for row in rows]

    def __len__(self) -> int:
        """How many claims the file holds now, including expired ones not yet swept."""
        with self._lock, self._errors():
            (count,) = self._connection().execute("SELECT count(*) FROM claims").fetchone()
        return int(count)

    # -- internals ------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1_000)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

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
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"sqlite store {self.path!r} is closed")
        if self._conn is None or self._pid != os.getpid():
            # A connection must not cross a fork: the child opens its own and leaves
            # the parent's untouched.
            self._pid = os.getpid()
            self._conn = self._open()
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One write transaction holding the file's write lock; yields the store's now."""
        with self._lock, self._errors():
            conn = self._connection()
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

    def _held(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, _Held]:
        unique = list(dict.fromkeys(ids))
        held = {}
        for start in range(0, len(unique), _CHUNK):
            chunk = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = f"{_HELD} ({marks})"
            for id_, node, committed, until_ms, claimed_ms in conn.execute(sql, chunk):
                held[id_] = _Held(node, bool(committed), until_ms, claimed_ms)
        return held


def _decide(
    request: ClaimRequest, held: _Held | None, node: str, lease_ms: int, now: int
) -> tuple[Outcome, tuple[Any, ...] | None]:
    """The outcome of one claim, and the row to write for it (``None``: write nothing)."""
    outcome = judge(request, held, node, now)
    if not outcome.is_won:
        return outcome, None
    mine = held is not None and held.node == node and not held.committed and held.until_ms >= now
    claimed_ms = held.claimed_ms if held is not None and mine else now
    return outcome, _row(request, node, now + lease_ms, claimed_ms)


def _row(request: ClaimRequest, node: str, until_ms: int, claimed_ms: int) -> tuple[Any, ...]:
    return (
        request.id,
        request.address,
        request.occurrence_ms,
        node,
        until_ms,
        request.memory_ms,
        claimed_ms,
    )


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
