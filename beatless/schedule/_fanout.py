"""One occurrence of a fan-out entry, expanded lazily and in the order of release.

A fan-out of a million tenants is not a million objects in the loop's heap. It is one
cursor. The tenants' offsets are computed in chunks (a few tens of milliseconds of work
per wake, so the loop stays on time for everything else); each tenant becomes one
integer key, ``offset << 24 | tenant index``, appended to the bucket of its slice of the
jitter window (about ``BUCKET_SIZE`` keys each). A bucket is sorted only when the
cursor reaches it, so a fan-out never holds more than one bucket's sort on top of its
keys. The cursor sits in the heap at its next release; when it is due it hands out the
firings released by then, one :class:`~beatless.schedule.firing.Firing` each, and goes back into
the heap. When the occurrence is already late, whatever is left is dropped in one step
and counted.

Memory per pending firing: 8 bytes, its key in an ``array('q')`` (a bucket's header and
spare room add well under a byte per key). The tenant names are the entry's list, not
the fan-out's: a tuple of ``str``, about 70 bytes per tenant name of 13 characters.
Preparing a firing costs one SHA-256 (its offset); handing it out, a second one (the
:class:`~beatless.schedule.firing.Firing` with its id).

With the preferred claimer on a fleet of several nodes, the keys go to *lanes* by where
this node ranks for each firing (see :class:`FanOut`): at a burst a node builds only the
firings it is preferred for, about ``1 / nodes`` of them, and the others when it would
first look at them, at its rung.

:func:`earliest` answers "which firings of this occurrence are released first" for
``beatless next`` without building the others: every tenant's offset is needed for
that, but only as one integer at a time, through a bounded heap.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from beatless.core.triggers import occurrence_key
from beatless.schedule.entry import Entry, tenant_address
from beatless.schedule.firing import Firing, digest, offset_from_digest

CHUNK = 20_000
"""Tenants whose offsets are computed per wake while a fan-out is being prepared."""
INDEX_BITS = 24
MAX_TENANTS = 1 << INDEX_BITS
INDEX_MASK = MAX_TENANTS - 1
BUCKET_SIZE = 4_096
"""About how many keys share one bucket: what one sort at a time holds (a list of this
many Python integers, about 160 KB), however wide the fan-out."""
PREPARE_US_PER_TENANT = 5
"""A generous cost of preparing one tenant, to start big fan-outs early enough."""


def prepare_ahead_ms(tenants: int) -> int:
    """How long before its occurrence a fan-out of ``tenants`` should start preparing."""
    return tenants * PREPARE_US_PER_TENANT // 1_000


def release_keys(
    base: str,
    tenants: Sequence[str],
    occurrence: int | str,
    window_ms: int,
    *,
    index_bits: int = INDEX_BITS,
) -> Iterator[int]:
    """``offset << index_bits | index`` of each tenant: one SHA-256 each and one integer
    out, so that ordering the keys orders the firings by release (ties by their place in
    the list), without a :class:`Firing` per tenant."""
    for index in range(len(tenants)):
        d = digest(tenant_address(base, tenants[index]), occurrence)
        yield (offset_from_digest(d, window_ms) << index_bits) | index


def earliest(
    entry: Entry, base: str, occurrence_ms: int, tenants: Sequence[str], count: int
) -> list[Firing]:
    """The ``count`` firings of one occurrence released first, in release order (ties
    in the order of ``tenants``).

    Which ones they are depends on every tenant's offset, so each tenant costs one
    SHA-256; but the keys stream through a heap of ``count`` (``heapq.nsmallest``), and
    only the firings returned are built: memory grows with ``count``, not with the
    tenants.
    """
    if count <= 0 or not tenants:
        return []
    bits = max(INDEX_BITS, len(tenants).bit_length())
    key = occurrence_key(entry.trigger, occurrence_ms)
    keys = release_keys(base, tenants, key, entry.jitter_ms, index_bits=bits)
    mask = (1 << bits) - 1
    chosen = heapq.nsmallest(count, keys)
    return [_firing(entry, base, tenants[key & mask], occurrence_ms) for key in chosen]


def _firing(entry: Entry, base: str, tenant: str, occurrence_ms: int) -> Firing:
    return Firing.of(entry, tenant, tenant_address(base, tenant), occurrence_ms)


def bucket_count(tenants: int, window_ms: int) -> int:
    """How many slices of the jitter window a fan-out sorts its keys by: about
    ``BUCKET_SIZE`` keys each, and none narrower than a millisecond."""
    return max(1, min(tenants // BUCKET_SIZE, window_ms))


@dataclass(frozen=True, slots=True)
class Ranking:
    """Which lane each firing of a fan-out goes to on this node, under one view of the
    fleet (:func:`beatless.node._prefer.lane_of`): ``lane(key)`` of a firing's 64-bit key
    (the first 64 bits of its digest), ``delays_ms`` when each lane is handed out after
    the release, and the view's ``digest``."""

    digest: str
    lane: Callable[[int], int]
    delays_ms: tuple[int, ...]


@dataclass(slots=True, eq=False)
class Lane:
    """Keys of one lane of a fan-out, in buckets of the jitter window, sorted one bucket
    at a time as the cursor reaches it."""

    buckets: list[array[int]]
    """The keys of each slice of the window, in the order computed; emptied when sorted."""
    current: array[int] = field(default_factory=lambda: array("q"))
    """The sorted keys of the bucket the cursor is in."""
    position: int = 0
    """The place in ``current`` of the next key."""
    bucket: int = 0
    """The next bucket to sort, once ``current`` is used up."""

    def advance(self) -> bool:
        """Make ``current`` hold the next key, sorting the next non-empty bucket when
        the cursor has used up the last; whether there is one."""
        while self.position >= len(self.current):
            if self.bucket >= len(self.buckets):
                return False
            keys = self.buckets[self.bucket]
            self.buckets[self.bucket] = array("q")
            self.bucket += 1
            self.current, self.position = array("q", sorted(keys)), 0
        return True

    def take(self, bound: int, limit: int) -> list[int]:
        """The indexes of the keys up to ``bound``, at most ``limit``, in key order."""
        indexes: list[int] = []
        while len(indexes) < limit and self.advance():
            keys, start = self.current, self.position
            stop = min(bisect_right(keys, bound, lo=start), start + limit - len(indexes))
            indexes.extend(keys[i] & INDEX_MASK for i in range(start, stop))
            self.position = stop
            if stop < len(keys):
                break  # the rest of this bucket is released later
        return indexes


@dataclass(slots=True, eq=False)
class FanOut:
    """The firings of one fan-out entry at one occurrence, not yet handed out.

    With a :class:`Ranking` (the preferred claimer, more than one live node), each tenant
    goes to a lane by where this node ranks for it, computed from the digest that gives
    its offset anyway: lane 0 holds the firings this node is preferred for and is handed
    out at the release; the others later, at the rung where this node would look at them
    (:mod:`beatless.node._prefer`). So at a burst a node builds only its own share of the
    firings; the rest are built when the preferred node has most likely dealt with them.
    When the view changes, :meth:`unrank` hands every lane out at the release again, and
    the loop places each firing under the new view as it would without lanes.
    """

    entry: Entry
    base: str
    occurrence_ms: int
    tenants: tuple[str, ...]
    prepared: int = 0
    """How many tenants have their offset computed."""
    handed: int = 0
    """How many firings were handed out (or dropped)."""
    lanes: list[Lane] = field(init=False)
    delays_ms: tuple[int, ...] = (0,)
    """When each lane is handed out after the release."""
    view: str | None = None
    """The digest of the view the lanes were ranked under; ``None`` for one lane."""
    staged: list[tuple[int, Firing]] = field(default_factory=list)
    """Firings built ahead (:meth:`stage`), each with when it is handed out, in that
    order."""

    def __post_init__(self) -> None:
        self.lanes = [self._lane()]

    def _lane(self) -> Lane:
        count = bucket_count(len(self.tenants), self.entry.jitter_ms)
        return Lane([array("q") for _ in range(count)])

    @property
    def is_prepared(self) -> bool:
        return self.prepared >= len(self.tenants)

    @property
    def remaining(self) -> int:
        """Firings not handed out yet."""
        return len(self.tenants) - self.handed

    def prepare(self, ranking: Ranking | None = None) -> None:
        """Compute the offsets of the next chunk of tenants, each into its bucket (and,
        with ``ranking``, its lane: the first chunk's ranking holds for the fan-out)."""
        if ranking is not None and self.prepared == 0 and len(ranking.delays_ms) > 1:
            self.view, self.delays_ms = ranking.digest, ranking.delays_ms
            self.lanes = [self._lane() for _ in ranking.delays_ms]
        ranked = ranking is not None and self.view is not None and ranking.digest == self.view
        lane_of = ranking.lane if ranked and ranking is not None else None
        window, base, tenants, occurrence = (
            self.entry.jitter_ms,
            self.base,
            self.tenants,
            occurrence_key(self.entry.trigger, self.occurrence_ms),
        )
        lanes = [lane.buckets for lane in self.lanes]
        spread = len(lanes[0])
        start, stop = self.prepared, min(self.prepared + CHUNK, len(tenants))
        for index in range(start, stop):
            d = digest(tenant_address(base, tenants[index]), occurrence)
            offset = offset_from_digest(d, window)
            buckets = lanes[lane_of(int.from_bytes(d[:8], "big")) if lane_of else 0]
            slot = (offset * spread) // window if spread > 1 else 0
            buckets[slot].append((offset << INDEX_BITS) | index)
        self.prepared = stop

    def unrank(self) -> None:
        """Hand every lane out at the release from now on: the view the lanes were ranked
        under is not the node's any more."""
        self.view = None
        self.delays_ms = (0,) * len(self.lanes)
        self.staged = sorted(((f.release_ms, f) for _, f in self.staged), key=_handed_at)

    def next_release_ms(self) -> int:
        """When the next firing is handed out (its release, plus its lane's delay); only
        while :attr:`remaining`."""
        return min(
            [
                self.occurrence_ms + delay + (lane.current[lane.position] >> INDEX_BITS)
                for lane, delay in zip(self.lanes, self.delays_ms, strict=True)
                if lane.advance()
            ]
            + [at for at, _ in self.staged[:1]]
        )

    def stage(self, until_ms: int, limit: int) -> list[Firing]:
        """Build now, ahead of their time, the firings handed out at their release by
        ``until_ms`` (at most ``limit``; the lanes handed out later, left to the nodes
        preferred for them, are not): :meth:`take` hands them out at their time, before
        any other. Returns the firings built."""
        built = self._from_lanes(until_ms, limit, own=True)
        if built:
            self.staged += built
            self.staged.sort(key=_handed_at)
        return [firing for _, firing in built]

    def take(self, until_ms: int, limit: int) -> list[Firing]:
        """The firings handed out by ``until_ms``, at most ``limit``: those built ahead
        first, then lane by lane, each in release order."""
        count = 0
        while count < min(limit, len(self.staged)) and self.staged[count][0] <= until_ms:
            count += 1
        firings = [firing for _, firing in self.staged[:count]]
        del self.staged[:count]
        firings += [firing for _, firing in self._from_lanes(until_ms, limit - count)]
        self.handed += len(firings)
        return firings

    def _from_lanes(
        self, until_ms: int, limit: int, *, own: bool = False
    ) -> list[tuple[int, Firing]]:
        """The firings of the lanes handed out by ``until_ms``, at most ``limit``, each
        with when it is handed out; ``own``: of the lanes handed out at the release only."""
        firings: list[tuple[int, Firing]] = []
        for lane, delay in zip(self.lanes, self.delays_ms, strict=True):
            if len(firings) >= limit:
                break
            if own and delay:
                continue
            bound = ((until_ms - delay - self.occurrence_ms + 1) << INDEX_BITS) - 1
            for index in lane.take(bound, limit - len(firings)):
                firing = self._firing(index)
                firings.append((firing.release_ms + delay, firing))
        return firings

    def drop(self) -> int:
        """Drop every firing not handed out yet; how many there were."""
        count = self.remaining
        self.handed = len(self.tenants)
        self.lanes = [Lane([]) for _ in self.lanes]
        self.staged = []
        return count

    def _firing(self, index: int) -> Firing:
        return _firing(self.entry, self.base, self.tenants[index], self.occurrence_ms)


def _handed_at(staged: tuple[int, Firing]) -> int:
    return staged[0]
