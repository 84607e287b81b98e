"""Logged notes on Redis (see "Logged notes" in :mod:`beatless.stores.base`): one stream
per kind, one ``XADD`` per note, and the kind's notes computed on each read.

``{prefix}log:{digest}`` (Redis Cluster: ``{prefix}{notes:<digest>}:log``, in the slot of
the kind's hash)
    A stream per kind of logged notes, named by the SHA-256 of the kind like its hash:
    one entry per note appended, whose one field is the note's key and whose value is
    ``v=1|{expires_ms}|{keep}|{value}``. Each append trims the stream ``MAXLEN ~ keep``:
    Redis drops whole nodes of the stream at a time (of at most 100 entries or 4 kB, its
    ``stream-node-max-*`` settings), so at least the last ``keep`` notes stay, and a few
    more. Nothing sweeps it: a read drops the notes that expired, keeps the last note of
    each key, and bounds the kind to the ``keep`` notes that expire last (the ``keep`` of
    the last note appended).

    A log is created with an expiry that covers its first note (the note's ``ttl_ms`` +
    ``LOG_REFRESH_MS`` + ``EXPIRY_SLACK_MS``: its *life*), and a store object extends it
    to that life (``PTTL``, then ``PEXPIRE`` if it has less left: never shortened) when a
    note it appends would outlive what it last made the log live: so each store object
    extends a log about once per ``LOG_REFRESH_MS`` it appends to it, and a log nobody
    appends to disappears once its last note has expired.

A note costs one ``XADD`` in the script that writes it (a claim, a commit, a post), plus,
about once an hour per node and log, a ``PTTL`` and a ``PEXPIRE``; the first note of a
log costs two more (``XADD`` again, ``PEXPIRE``; Redis before 7 checks with ``EXISTS``
instead of ``NOMKSTREAM``). A read of one kind is one ``XRANGE`` of the whole log (at most
``keep`` notes and a node of the stream) beside the ``HGETALL`` of its hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from beatless.stores.base import Note

LOG_VERSION = 1
"""The layout of a log entry's value, ``v=1|{expires_ms}|{keep}|{value}``; an entry in any
other form is never read."""
LOG_REFRESH_MS = 3_600_000
"""How much longer than the note that extends it a log is made to live: so a store
object extends each log it appends to about once in this long."""
LIVES_KEPT = 100_000
"""The most logs a store object remembers the life of; beyond, it forgets them all (and
extends each again at its next note)."""


@dataclass
class Logs:
    """The keys and the layout of the kinds of notes a store object writes, and how long
    it last made each log it appends to live (on its monotonic clock)."""

    hash_keys: Callable[[str], tuple[str, str]]
    """The keys of a kind kept in place: its hash and that hash's expiry index."""
    log_key: Callable[[str], str]
    """The key of a kind's log."""
    slack_ms: int
    clock: Callable[[], float] = time.monotonic
    _until: dict[str, float] = field(default_factory=dict)

    def layout(
        self, kind: str, notes: Sequence[Note], extends: list[tuple[str, float]]
    ) -> tuple[list[str], str]:
        """The keys of ``kind`` and its layout as the scripts take it (``h``, or
        ``l|{life_ms}|{extend}``), for ``notes`` (all logged, or none); a log extended is
        added to ``extends``, for :meth:`made` once the script ran."""
        if not notes or not notes[0].logged:
            return list(self.hash_keys(kind)), "h"
        key = self.log_key(kind)
        ttl = max(note.ttl_ms for note in notes)
        now = self.clock() * 1_000
        life = ttl + LOG_REFRESH_MS + self.slack_ms
        extend = self._until.get(key, 0.0) < now + ttl + self.slack_ms
        if extend:
            extends.append((key, now + life))
        return [key], f"l|{life}|{int(extend)}"

    def made(self, extends: Iterable[tuple[str, float]]) -> None:
        """Remember the lives a script that ran gave its logs."""
        if len(self._until) > LIVES_KEPT:
            self._until.clear()
        for key, until in extends:
            self._until[key] = until

    def forget(self) -> None:
        """Forget every life made: the store lost its memory, its logs with it."""
        self._until.clear()


def kind_notes(
    in_place: Mapping[str, tuple[int, str]],
    entries: Iterable[tuple[Any, dict[Any, Any]]],
    now_ms: int,
) -> dict[str, str]:
    """The notes of a kind read from its hash and its log together, ``{key: value}``:
    ``in_place`` the hash's live notes (``{key: (expires_ms, value)}``), ``entries`` the
    log's (``XRANGE``'s, oldest first). Each key's last note (the log's, for a key in
    both), live at ``now_ms``; when the log has notes, at most its ``keep`` over both,
    those that expire last (the contract's bound on the kind). A log entry in another
    form is not read.

    Bounded over both, not each apart: a fleet posts its first history in place (before
    its nodes know that all of them read logs), and once the log is trimmed past those
    notes they would otherwise stay beside its latest for a day, with a hole between
    that a reader of the history (the missed sweep, ``status``) takes for firings nobody
    sent."""
    last: dict[str, tuple[int, str]] = {}
    keep = 0
    for _id, fields in entries:
        for raw_key, raw in fields.items():
            record = raw.decode() if isinstance(raw, bytes) else str(raw)
            version, _, rest = record.partition("|")
            expires, _, rest = rest.partition("|")
            bound, bar, value = rest.partition("|")
            if version != f"v={LOG_VERSION}" or not bar:
                continue
            if not (expires.isdigit() and bound.isdigit()):
                continue
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            last.pop(key, None)  # a key posted again counts from its last post
            last[key] = (int(expires), value)
            keep = int(bound)
    notes = {key: note for key, note in in_place.items() if key not in last} | last
    live = [(key, expires, value) for key, (expires, value) in notes.items() if expires >= now_ms]
    if keep and len(live) > keep:
        live = sorted(live, key=lambda note: note[1])[-keep:]
    return {key: value for key, _, value in live}
