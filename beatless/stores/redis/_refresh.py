"""Notes posted again without a script: the refresh of a kind swept lately.

Every node posts a few notes of its own every second (its progress, and every few seconds
its member and alive notes). Each post is a script that writes them and sweeps their
kinds (``notes.lua``): on a busy server, about 70 µs of Redis's time each, the one cost of
a node that grows with the fleet. A store object that swept a kind lately writes its next
notes of that kind with plain commands instead, as ``write_note`` does:

* per note, ``ZADD`` of its expiry and ``HSET`` of ``v={version}|{expires_ms}|{value}``
  (the index first: a sweep between the two finds the note's new expiry, not its old);
* per kind, on its hash and its expiry index, ``PEXPIRE ... NX`` (a key the ``HSET``
  created again has none) then ``PEXPIRE ... GT``, to the last note's expiry + slack:
  never shortened, as a sweep would not shorten it while it holds a later note.

They go in one ``MULTI`` (:meth:`Refresh.write`), or at a node's sync in the same
pipeline as its reads, one round trip for the whole sync (:meth:`Refresh.queue`,
``RedisStore.post_and_read``). Not a ``MULTI`` there, so that a full Redis still answers
the reads; the writes are safe apart because a kind is refreshed only while a note this
store object wrote there is still live (:meth:`Refresh.wrote`): its keys exist, so no
``HSET`` creates them again, and a write lost with the connection is written again by the
next post, a second later.

Nothing is swept: readers drop the notes that expired (``live_records``), and the kind's
next post by script, at least once per :data:`SWEEP_EVERY_MS` from each store object,
sweeps it. So only notes kept in place with no bound take this path (a ``keep`` needs the
sweep; a logged note is one ``XADD`` already), and only on Redis 7 and later (``PEXPIRE``
with ``NX`` and ``GT``); otherwise every post is a script, as before.

A refresh cannot read the server's clock, and a note's expiry is on it: it is the
server's time as the store object last read it (:meth:`Refresh.saw`, the ``TIME`` in
front of each sync's read), moved on by the monotonic clock since, so it is at most that
read's round trip early. With no reading of the server's clock in the last
:data:`CLOCK_FRESH_MS`, the post is a script.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from beatless.stores.base import Note

SWEEP_EVERY_MS = 30_000
"""How often, at least, each store object posts a kind by script, which sweeps it."""
CLOCK_FRESH_MS = 10_000
"""How old a reading of the server's clock may be for a refresh to date its notes by it."""
REFRESH_VERSION = 7
"""The first major version of Redis whose ``PEXPIRE`` takes ``NX`` and ``GT``."""
LIVE_MARGIN_MS = 1_000
"""A kind is refreshed only while the notes this store object last wrote there have at
least this long left (on its own clock, so a refresh is never the write that finds their
keys gone)."""


@dataclass
class Refresh:
    """Which notes of a post are refreshes, and how they are written (see the module)."""

    hash_keys: Callable[[str], tuple[str, str]]
    """The keys of a kind kept in place: its hash and that hash's expiry index."""
    note_version: int
    slack_ms: int
    server_version: Callable[[], str | None]
    """The server's ``redis_version``; ``None`` when it cannot be read."""
    clock: Callable[[], float] = time.monotonic
    _supported: bool | None = None
    _swept: dict[str, float] = field(default_factory=dict)
    """When this store object last posted each kind by script (monotonic ms)."""
    _server: tuple[int, float] | None = None
    """The server's clock as last read (epoch ms), and when (monotonic ms)."""
    _live: dict[str, float] = field(default_factory=dict)
    """Until when the notes this store object last wrote of each kind are live, less
    :data:`LIVE_MARGIN_MS` (monotonic ms)."""

    def saw(self, server_ms: int) -> None:
        """The server's clock read ``server_ms`` just now."""
        self._server = (server_ms, self.clock() * 1_000)

    def split(self, notes: Sequence[Note]) -> tuple[list[Note], list[Note]]:
        """``notes`` as (refreshes, notes to post by script): a kind goes whole one way,
        a refresh when all its notes are kept in place with no bound, this object swept it
        less than :data:`SWEEP_EVERY_MS` ago, and the notes it last wrote there are live
        (:meth:`wrote`)."""
        now = self.clock() * 1_000
        fresh = self._server is not None and now - self._server[1] <= CLOCK_FRESH_MS
        if not notes or not fresh or not self.supported():
            return [], list(notes)
        scripted = {
            note.kind
            for note in notes
            if note.logged
            or note.keep
            or now - self._swept.get(note.kind, -math.inf) >= SWEEP_EVERY_MS
            or now >= self._live.get(note.kind, -math.inf)
        }
        quick = [note for note in notes if note.kind not in scripted]
        return quick, [note for note in notes if note.kind in scripted]

    def swept(self, notes: Sequence[Note]) -> None:
        """A script posted ``notes``: their kinds are swept."""
        now = self.clock() * 1_000
        for note in notes:
            if not note.logged:
                self._swept[note.kind] = now
        self.wrote(notes)
        if len(self._swept) > 10_000:  # kinds no longer posted
            self._swept = {k: at for k, at in self._swept.items() if now - at < SWEEP_EVERY_MS}
            self._live = {k: at for k, at in self._live.items() if k in self._swept}

    def wrote(self, notes: Sequence[Note]) -> None:
        """``notes`` were written: each kind's are live until the first of them expires."""
        now = self.clock() * 1_000
        live: dict[str, float] = {}
        for note in notes:
            if not note.logged:
                until = now + note.ttl_ms - LIVE_MARGIN_MS
                live[note.kind] = min(live.get(note.kind, math.inf), until)
        self._live.update(live)

    def write(self, client: Any, notes: Sequence[Note]) -> None:
        """Write the refreshes ``notes`` in one ``MULTI`` (see the module)."""
        pipe = client.pipeline(transaction=True)
        self.queue(pipe, notes)
        pipe.execute()
        self.wrote(notes)

    def queue(self, pipe: Any, notes: Sequence[Note]) -> int:
        """Queue the writes of the refreshes ``notes`` on ``pipe`` (see the module); how
        many commands. The caller tells :meth:`wrote` once they went through."""
        if self._server is None:  # split() gives none without a reading of it
            raise RuntimeError("a refresh with no reading of the server's clock")
        server_ms, read_ms = self._server
        now = server_ms + round(self.clock() * 1_000 - read_ms)
        last: dict[str, int] = {}
        for note in notes:
            notes_key, expiry_key = self.hash_keys(note.kind)
            expires = now + note.ttl_ms
            pipe.zadd(expiry_key, {note.key: expires})
            pipe.hset(notes_key, note.key, f"v={self.note_version}|{expires}|{note.value}")
            last[note.kind] = max(last.get(note.kind, 0), expires)
        for kind, expires in last.items():
            ttl = expires - now + self.slack_ms
            for key in self.hash_keys(kind):
                pipe.pexpire(key, ttl, nx=True)
                pipe.pexpire(key, ttl, gt=True)
        return 2 * len(notes) + 4 * len(last)

    def supported(self) -> bool:
        """Whether the server takes ``PEXPIRE`` with ``NX`` and ``GT`` (asked once)."""
        if self._supported is None:
            version = self.server_version()
            major = (version or "0").split(".", 1)[0]
            self._supported = major.isdigit() and int(major) >= REFRESH_VERSION
        return self._supported
