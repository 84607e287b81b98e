"""Notes posted again without a script: the refresh of a kind swept lately.

Every node posts a few notes of its own every second (its progress, and every few seconds
its member and alive notes). Each post is a script that writes them and sweeps their
kinds (``notes.lua``): on a busy server, about 70 µs of Redis's time each, the one cost of
a node that grows with the fleet. A store object that swept a kind lately writes its next
notes of that kind with plain commands in one ``MULTI`` instead, as ``write_note`` does:

* per note, ``HSET`` of ``v={version}|{expires_ms}|{value}`` and ``ZADD`` of its expiry;
* per kind, on its hash and its expiry index, ``PEXPIRE ... NX`` (a key the ``HSET``
  created again has none) then ``PEXPIRE ... GT``, to the last note's expiry + slack:
  never shortened, as a sweep would not shorten it while it holds a later note.

Nothing is swept: readers drop the notes that expired (``live_records``), and the kind's
next post by script, at least once per :data:`SWEEP_EVERY_MS` from each store object,
sweeps it. So only notes kept in place with no bound take this path (a ``keep`` needs the
sweep; a logged note is one ``XADD`` already), and only on Redis 7 and later (``PEXPIRE``
with ``NX`` and ``GT``); otherwise every post is a script, as before.

A ``MULTI`` cannot read the server's clock, and a note's expiry is on it: it is the
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

    def saw(self, server_ms: int) -> None:
        """The server's clock read ``server_ms`` just now."""
        self._server = (server_ms, self.clock() * 1_000)

    def split(self, notes: Sequence[Note]) -> tuple[list[Note], list[Note]]:
        """``notes`` as (refreshes, notes to post by script): a kind goes whole one way,
        a refresh when all its notes are kept in place with no bound and this object
        swept it less than :data:`SWEEP_EVERY_MS` ago."""
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
        }
        quick = [note for note in notes if note.kind not in scripted]
        return quick, [note for note in notes if note.kind in scripted]

    def swept(self, notes: Sequence[Note]) -> None:
        """A script posted ``notes``: their kinds are swept."""
        now = self.clock() * 1_000
        for note in notes:
            if not note.logged:
                self._swept[note.kind] = now
        if len(self._swept) > 10_000:  # kinds no longer posted
            self._swept = {k: at for k, at in self._swept.items() if now - at < SWEEP_EVERY_MS}

    def write(self, client: Any, notes: Sequence[Note]) -> None:
        """Write the refreshes ``notes`` in one ``MULTI`` (see the module)."""
        if self._server is None:  # split() gives none without a reading of it
            raise RuntimeError("a refresh with no reading of the server's clock")
        server_ms, read_ms = self._server
        now = server_ms + round(self.clock() * 1_000 - read_ms)
        last: dict[str, int] = {}
        pipe = client.pipeline(transaction=True)
        for note in notes:
            notes_key, expiry_key = self.hash_keys(note.kind)
            expires = now + note.ttl_ms
            pipe.hset(notes_key, note.key, f"v={self.note_version}|{expires}|{note.value}")
            pipe.zadd(expiry_key, {note.key: expires})
            last[note.kind] = max(last.get(note.kind, 0), expires)
        for kind, expires in last.items():
            ttl = expires - now + self.slack_ms
            for key in self.hash_keys(kind):
                pipe.pexpire(key, ttl, nx=True)
                pipe.pexpire(key, ttl, gt=True)
        pipe.execute()

    def supported(self) -> bool:
        """Whether the server takes ``PEXPIRE`` with ``NX`` and ``GT`` (asked once)."""
        if self._supported is None:
            version = self.server_version()
            major = (version or "0").split(".", 1)[0]
            self._supported = major.isdigit() and int(major) >= REFRESH_VERSION
        return self._supported
