"""The entries' notes: what the fleet publishes of its schedule (``beatless status``,
``explain``), posted by one node a minute, not by each.

Every node runs the same schedule, so every node's entry notes are the same. A node posts
them when it starts with no other member on its schedule, then only in the minutes
(``ENTRIES_EVERY_MS``) it is the *poster*: the node ranked first for that minute, by
rendezvous hashing, among the members whose schedule has its fingerprint
(:func:`poster`). So the fleet writes each entry's note about once a minute whatever its
size, rather than once a minute per node: with 100,000 entries, one post is 100,000 notes.

A live edit changes the schedule on every node within a sync: the poster of that minute
among all the members posts the new schedule at once.

Should the poster die, or the nodes' views of the members disagree, a minute goes without
a post, or has two: the notes live ``ENTRIES_TTL_MS`` (five minutes), the next minute has
another poster, and two posts of one schedule write the same notes.

A post is sent in batches of ``ENTRIES_BATCH`` notes, at most ``ENTRIES_POST_BUDGET_S`` of
them at each sync (the rest at the next): one script of 100,000 notes would hold a Redis
server half a second, every node's claims waiting behind it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from beatless.fleet._notes import ENTRIES_EVERY_MS, NodeRecord
from beatless.stores.base import ClaimStore, Note

ENTRIES_BATCH = 1_000
"""Entry notes per post: a script of a few milliseconds on Redis, one statement's rows on
PostgreSQL."""
ENTRIES_POST_BUDGET_S = 0.25
"""How long a sync may spend posting batches of entry notes; the rest wait for the next."""


def rank(minute: int, node: str) -> int:
    """``node``'s rank for ``minute`` (higher first): the same on every node."""
    digest = hashlib.sha256(f"{minute}\0{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def poster(registry: Sequence[NodeRecord], fingerprint: str | None, minute: int) -> str | None:
    """The node that posts the entries of the schedule with ``fingerprint`` in ``minute``
    (``now // ENTRIES_EVERY_MS``): the first by :func:`rank` among the members of
    ``registry`` running that schedule (with ``None``, among all of them); ``None`` when
    none does."""
    names = {r.node for r in registry if fingerprint in (None, r.fingerprint)}
    return max(names, key=lambda name: rank(minute, name), default=None)


class EntriesPoster:
    """One node's posts of its entries' notes (see the module)."""

    def __init__(self, node: str, notes: Callable[[], list[Note]]) -> None:
        self.node = node
        self._notes = notes
        self._minute: int | None = None
        self._fingerprint: str | None = None
        self.pending: list[Note] = []
        """The notes of the post under way, not yet sent."""
        self.posts = 0
        """How many posts this node made (started, not only sent)."""

    def due(self, now_ms: int, registry: Sequence[NodeRecord], fingerprint: str) -> bool:
        """Whether this node posts its entries now: at its first sync when no other member
        runs its schedule (the first node of a new schedule); once in each minute this node
        is the :func:`poster` of, or one whose poster is unknown; and when its schedule
        changed (a live edit, which every node applies within a sync), if it is the
        poster of the minute among all the members, so that one node posts the new
        schedule at once."""
        minute = now_ms // ENTRIES_EVERY_MS
        changed = self._fingerprint not in (None, fingerprint)
        first = self._fingerprint is None
        self._fingerprint = fingerprint
        if changed and poster(registry, None, minute) in (self.node, None):
            self._minute = minute
            return True
        if self._minute == minute:
            return False
        self._minute = minute
        peers = (r for r in registry if r.node != self.node)
        if first and all(r.fingerprint != fingerprint for r in peers):
            return True
        return poster(registry, fingerprint, minute) in (self.node, None)

    def sync(
        self, store: ClaimStore, now_ms: int, registry: Sequence[NodeRecord], fingerprint: str
    ) -> None:
        """Start a post when :meth:`due`, and send the batches of the post under way that
        fit in ``ENTRIES_POST_BUDGET_S``. A store error is raised, the batch kept."""
        if self.due(now_ms, registry, fingerprint):
            self.pending = self._notes()
            self.posts += 1
        began = time.monotonic()
        while self.pending and time.monotonic() - began < ENTRIES_POST_BUDGET_S:
            store.post(self.pending[:ENTRIES_BATCH])
            del self.pending[:ENTRIES_BATCH]
