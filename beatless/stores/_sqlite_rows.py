"""The SQLite store's file: its tables, its statements, its rows and the decisions on them.

The sweep of old claims stays with the store (:mod:`beatless.stores.sqlite`), whose
``SWEEP_LIMIT`` and ``SWEEP_EVERY_MS`` bound it; everything here runs inside a
transaction the store opened.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from beatless.errors import StoreError
from beatless.stores._epoch import new_token
from beatless.stores._fences import fence_of, live_checks
from beatless.stores.base import ClaimRecord, ClaimRequest, Epoch, Note, Outcome, judge

NOTES_SWEEP_MIN = 200
"""Expired notes each post may delete, at least; twice the batch when larger, so that
deletion keeps pace with insertion."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS claims (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        occurrence_ms INTEGER NOT NULL,
        node TEXT NOT NULL,
        committed INTEGER NOT NULL,
        until_ms INTEGER NOT NULL,
        memory_ms INTEGER NOT NULL,
        claimed_ms INTEGER NOT NULL,
        tag TEXT NOT NULL DEFAULT '',
        revision INTEGER
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS claims_until_ms ON claims (until_ms)",
    # A rowid table, as a value may be 16 kB: SQLite keeps large rows better in one.
    """CREATE TABLE IF NOT EXISTS notes (
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        PRIMARY KEY (kind, key)
    )""",
    "CREATE INDEX IF NOT EXISTS notes_until_ms ON notes (until_ms)",
    # Kept notes: no end, replaced or deleted only (added within schema version 1).
    """CREATE TABLE IF NOT EXISTS kept_notes (
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (kind, key)
    )""",
)
# A file made before claims carried a task tag gains the column in place. A beatless
# without it names its columns, so it reads and writes the file as before (tag '').
_ADD_TAG = "ALTER TABLE claims ADD COLUMN tag TEXT NOT NULL DEFAULT ''"
# And the live revision a claim carried (added within schema version 1): a beatless
# without it names its columns, so it writes NULL there (not recorded) and never reads it.
_ADD_REVISION = "ALTER TABLE claims ADD COLUMN revision INTEGER"
_WRITE = (
    "INSERT OR REPLACE INTO claims (id, address, occurrence_ms, node, committed, until_ms,"
    " memory_ms, claimed_ms, tag, revision) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Commit and release change only rows this version can read (see ``_parse_held``).
_COMMIT = (
    "UPDATE claims SET committed = 1, until_ms = ? + memory_ms"
    " WHERE id = ? AND node = ? AND until_ms >= ? AND committed IN (0, 1)"
    " AND typeof(until_ms) = 'integer' AND typeof(memory_ms) = 'integer'"
    " AND typeof(claimed_ms) = 'integer' AND typeof(tag) = 'text'"
)
# A released claim is kept with its lease ended, so that the next claim is a takeover.
_RELEASE = (
    "UPDATE claims SET until_ms = min(until_ms, ?) WHERE id = ? AND node = ? AND committed = 0"
    " AND typeof(until_ms) = 'integer' AND typeof(memory_ms) = 'integer'"
    " AND typeof(claimed_ms) = 'integer' AND typeof(tag) = 'text'"
)
_EPOCH = "SELECT value FROM meta WHERE key = 'epoch'"
_NEW_EPOCH = "INSERT OR IGNORE INTO meta VALUES ('epoch', ?)"
_HELD = "SELECT id, node, committed, until_ms, memory_ms, claimed_ms, tag FROM claims WHERE id IN"
_RECORDS = "SELECT id, node, committed, until_ms, revision FROM claims WHERE id IN"
_POST = "INSERT OR REPLACE INTO notes (kind, key, value, until_ms) VALUES (?, ?, ?, ?)"
# The notes of a kind past its ``keep``, those that expire first.
_TRIM = (
    "DELETE FROM notes WHERE rowid IN (SELECT rowid FROM notes WHERE kind = ?"
    " ORDER BY until_ms DESC LIMIT -1 OFFSET ?)"
)
_SWEEP_NOTES = (
    "DELETE FROM notes WHERE rowid IN (SELECT rowid FROM notes WHERE until_ms < ?"
    " ORDER BY until_ms LIMIT ?)"
)
_NOTES = "SELECT kind, key, value FROM notes WHERE until_ms >= ? AND kind IN"
_KEEP = "INSERT OR REPLACE INTO kept_notes (kind, key, value) VALUES (?, ?, ?)"
_KEPT = "SELECT key, value FROM kept_notes WHERE kind = ?"
_KEPT_KEY = "SELECT value FROM kept_notes WHERE kind = ? AND key = ?"
_DELETE_KEPT = "DELETE FROM kept_notes WHERE kind = ? AND key = ?"
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
    tag: str


class _Unreadable:
    """A row this version cannot read: its firing is refused as ``CORRUPT``."""


_UNREADABLE = _Unreadable()


def _parse_held(values: Sequence[object]) -> _Held | _Unreadable:
    """A row's ``node, committed, until_ms, memory_ms, claimed_ms, tag`` as this version
    wrote them, or ``_UNREADABLE``."""
    node, committed, until_ms, memory_ms, claimed_ms, tag = values
    if (
        isinstance(node, str)
        and committed in (0, 1)
        and isinstance(until_ms, int)
        and isinstance(memory_ms, int)
        and isinstance(claimed_ms, int)
        and isinstance(tag, str)
    ):
        return _Held(node, committed == 1, until_ms, claimed_ms, tag)
    return _UNREADABLE


@dataclass(frozen=True, slots=True)
class _Decision:
    """Decides one claim of a batch: its outcome, and the row to write (``None``: none)."""

    node: str
    lease_ms: int
    now: int
    forgot_before_ms: int | None
    hold_off: bool = False

    def __call__(
        self,
        request: ClaimRequest,
        held: _Held | _Unreadable | None,
        running: _Held | _Unreadable | None = None,
        next_fence_ms: int | None = None,
    ) -> tuple[Outcome, tuple[Any, ...] | None]:
        """``running`` is the row of the request's run lease, if it has one: a row this
        version cannot read fails the run lease's own claims, not this one's, and holds
        nothing here. ``next_fence_ms``: the fence of the live revision after the
        request's (:func:`_fences`)."""
        if isinstance(held, _Unreadable):
            return Outcome.CORRUPT, None
        node, now = self.node, self.now
        run = None if isinstance(running, _Unreadable) else running
        outcome = judge(
            request,
            held,
            node,
            now,
            self.forgot_before_ms,
            running=run,
            hold_off=self.hold_off,
            next_fence_ms=next_fence_ms,
        )
        if outcome in (Outcome.FORGOTTEN, Outcome.OVERLAP):
            return outcome, _row(request, node, True, now + request.memory_ms, now)
        if not outcome.is_won:
            return outcome, None
        live = held is not None and held.until_ms >= now
        mine = held is not None and live and held.node == node and not held.committed
        claimed_ms = held.claimed_ms if held is not None and mine else now
        return outcome, _row(request, node, False, now + self.lease_ms, claimed_ms)


def _fences(conn: sqlite3.Connection, requests: Sequence[ClaimRequest]) -> list[int | None]:
    """Per request, the fence of the live revision after its own, read in the claim's
    transaction (``None``: no such revision, or no check)."""
    notes, numbers = live_checks(requests)
    fences: list[int | None] = [None]
    for kind, key in notes:
        row = conn.execute(_KEPT_KEY, (kind, key)).fetchone()
        fences.append(None if row is None else fence_of(str(row[0])))
    return [fences[number] for number in numbers]


def _row(
    request: ClaimRequest, node: str, committed: bool, until_ms: int, claimed_ms: int
) -> tuple[Any, ...]:
    return (
        request.id,
        request.address,
        request.occurrence_ms,
        node,
        int(committed),
        until_ms,
        request.memory_ms,
        claimed_ms,
        request.tag,
        request.revision,
    )


def _record(values: Sequence[object]) -> ClaimRecord | None:
    """A row's ``node, committed, until_ms, revision`` as a record; ``None`` for a row
    this version cannot read."""
    node, committed, until_ms, revision = values
    if not (isinstance(node, str) and committed in (0, 1) and isinstance(until_ms, int)):
        return None
    if not (revision is None or isinstance(revision, int)):
        return None
    return ClaimRecord(node, committed == 1, until_ms, revision)


def _write_notes(conn: sqlite3.Connection, now: int, notes: Sequence[Note]) -> None:
    """Write ``notes`` in the open transaction, trim the kinds with a ``keep``, and delete
    a bounded number of notes past their time."""
    bounds = {note.kind: note.keep for note in notes if note.keep}
    rows = ((n.kind, n.key, n.value, now + n.ttl_ms) for n in notes)
    conn.executemany(_POST, rows)
    conn.executemany(_TRIM, bounds.items())
    conn.execute(_SWEEP_NOTES, (now, max(NOTES_SWEEP_MIN, 2 * len(notes))))


def _epoch_value(started_ms: int, token: str) -> str:
    return f"{started_ms}|{token}"


def _current_epoch(conn: sqlite3.Connection, now: int, path: str) -> Epoch:
    """The file's epoch, written now if the row is missing (a file of an older beatless)."""
    row = conn.execute(_EPOCH).fetchone()
    if row is None:
        conn.execute(_NEW_EPOCH, (_epoch_value(now, new_token()),))
        row = conn.execute(_EPOCH).fetchone()
    started, _, token = str(row[0]).partition("|")
    if not started.isdigit() or not token:
        raise StoreError(
            f"sqlite store {path!r}: unreadable epoch record {row[0]!r} in its meta table; "
            f"this file was not written by beatless"
        )
    return Epoch(token, int(started))
