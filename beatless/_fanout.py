"""One occurrence of a fan-out entry, expanded lazily and in the order of release.

A fan-out of a million tenants is not a million objects in the loop's heap. It is one
cursor: the tenants' offsets are computed in chunks (a few tens of milliseconds of work
per wake, so the loop stays on time for everything else), then sorted into one compact
array of ``offset << 24 | tenant index``. The cursor sits in the heap at its next
release; when it is due it hands out the firings released by then, one
:class:`~beatless.firing.Firing` each, and goes back into the heap. When the occurrence
is already late, whatever is left is dropped in one step and counted.

Memory per pending firing: 8 bytes in the array (plus the tenant list the entry holds).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass, field

from beatless.entry import Entry, tenant_address
from beatless.firing import Firing, digest, offset_from_digest

CHUNK = 20_000
"""Tenants whose offsets are computed per wake while a fan-out is being prepared."""
INDEX_BITS = 24
MAX_TENANTS = 1 << INDEX_BITS
PREPARE_US_PER_TENANT = 5
"""A generous cost of preparing one tenant, to start big fan-outs early enough."""


def prepare_ahead_ms(tenants: int) -> int:
    """How long before its occurrence a fan-out of ``tenants`` should start preparing."""
    return tenants * PREPARE_US_PER_TENANT // 1_000


@dataclass(slots=True, eq=False)
class FanOut:
    """The firings of one fan-out entry at one occurrence, not yet handed out."""

    entry: Entry
    base: str
    occurrence_ms: int
    tenants: tuple[str, ...]
    keys: array[int] = field(default_factory=lambda: array("q"))
    prepared: int = 0
    """How many tenants have their offset computed."""
    next: int = 0
    """The position in ``keys`` of the next firing to hand out, once prepared."""

    @property
    def is_prepared(self) -> bool:
        return self.prepared >= len(self.tenants)

    @property
    def remaining(self) -> int:
        """Firings not handed out yet."""
        return len(self.tenants) - self.next

    def prepare(self) -> None:
        """Compute the offsets of the next chunk of tenants; sort once all are known."""
        window = self.entry.jitter_ms
        start, stop = self.prepared, min(self.prepared + CHUNK, len(self.tenants))
        keys, base, occurrence = self.keys, self.base, self.occurrence_ms
        for index in range(start, stop):
            d = digest(tenant_address(base, self.tenants[index]), occurrence)
            keys.append((offset_from_digest(d, window) << INDEX_BITS) | index)
        self.prepared = stop
        if self.is_prepared:
            self.keys = array("q", sorted(keys))

    def next_release_ms(self) -> int:
        return self.occurrence_ms + (self.keys[self.next] >> INDEX_BITS)

    def take(self, until_ms: int, limit: int) -> list[Firing]:
        """The firings released by ``until_ms``, at most ``limit``, in release order."""
        bound = ((until_ms - self.occurrence_ms + 1) << INDEX_BITS) - 1
        stop = min(bisect_right(self.keys, bound, lo=self.next), self.next + limit)
        firings = [self._firing(self.keys[i] & (MAX_TENANTS - 1)) for i in range(self.next, stop)]
        self.next = stop
        return firings

    def drop(self) -> int:
        """Drop every firing not handed out yet; how many there were."""
        count = self.remaining
        self.next = len(self.tenants)
        self.keys = array("q")
        return count

    def _firing(self, index: int) -> Firing:
        tenant = self.tenants[index]
        address = tenant_address(self.base, tenant)
        return Firing.of(self.entry, tenant, address, self.occurrence_ms)
