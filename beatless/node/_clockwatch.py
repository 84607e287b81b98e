"""A node's offset to the claim store's clock, measured as the seed's timing page says.

At start and every minute the node reads the store's clock a few times and keeps the
sample with the smallest round trip: ``offset = store - (before + after) / 2``. Over a
second is a WARNING; over the store's 10 s tolerance the node stops claiming (its claims
would be refused as early or late anyway) and says so, rate-limited, until its clock is
fixed, measuring again every few seconds meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import StoreError
from beatless.fleet._notes import OFFSET_WARN_MS
from beatless.stores.base import TOLERANCE_MS, ClaimStore

logger = logging.getLogger("beatless.node.scheduler")

SAMPLES = 3
EVERY_MS = 60_000
"""How often a healthy node measures its offset again."""
EVERY_WHEN_OFF_MS = 10_000
"""How often a node that stopped claiming measures again, to notice a fixed clock."""
WARN_MS = OFFSET_WARN_MS
"""An offset over this is worth a WARNING (as every node reading the registry says)."""
WARN_EVERY_MS = 60_000


@dataclass(frozen=True, slots=True)
class Sample:
    offset_ms: int
    round_trip_ms: int


def measure(store: ClaimStore, clock: Callable[[], float], samples: int = SAMPLES) -> Sample:
    """The offset of ``store``'s clock to ``clock``, from the sample with the smallest
    round trip. Raises :class:`~beatless.errors.StoreError` when the store fails."""

    def sample() -> Sample:
        began, before = time.monotonic(), clock()
        store_ms = store.time_ms()
        after, took = clock(), time.monotonic() - began
        return Sample(round(store_ms - (before + after) * 500), round(took * 1_000))

    return min((sample() for _ in range(max(1, samples))), key=lambda s: s.round_trip_ms)


class ClockWatch:
    """Whether this node's clock is close enough to the store's to claim."""

    def __init__(self, store: ClaimStore, clock: Callable[[], float], node: str) -> None:
        self.store = store
        self.clock = clock
        self.node = node
        self.offset_ms: int | None = None
        self.round_trip_ms: int | None = None
        """The round trip of the sample the offset was taken from."""
        self.refusing = False
        self._next_ms: int | None = None
        self._warned_ms: int | None = None

    def check(self, now_ms: int) -> bool:
        """Measure when due; ``True`` while this node may claim."""
        if self._next_ms is None or now_ms >= self._next_ms:
            self._measure(now_ms)
        return not self.refusing

    def _measure(self, now_ms: int) -> None:
        try:
            sample = measure(self.store, self.clock)
        except StoreError as exc:
            logger.debug(
                "node %s: clock offset not measured: %s",
                shown(self.node, quoted=False),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
            )
            self._next_ms = now_ms + EVERY_WHEN_OFF_MS
            return
        was_refusing = self.refusing
        self.offset_ms = sample.offset_ms
        self.round_trip_ms = sample.round_trip_ms
        self.refusing = abs(sample.offset_ms) > TOLERANCE_MS
        self._next_ms = now_ms + (EVERY_WHEN_OFF_MS if self.refusing else EVERY_MS)
        if was_refusing and not self.refusing:
            logger.warning(
                "node %s: clock back within %dms of the store's (offset %+dms); claiming again",
                shown(self.node, quoted=False),
                TOLERANCE_MS,
                sample.offset_ms,
            )
            self._warned_ms = None
        elif abs(sample.offset_ms) > WARN_MS:
            self._warn(now_ms, sample)

    def _warn(self, now_ms: int, sample: Sample) -> None:
        if self._warned_ms is not None and now_ms - self._warned_ms < WARN_EVERY_MS:
            return
        self._warned_ms = now_ms
        if self.refusing:
            logger.warning(
                "node %s: clock is %+dms off the claim store's (round trip %dms), over the "
                "%dms tolerance: this node claims nothing until its clock is fixed (run NTP); "
                "other nodes carry on",
                shown(self.node, quoted=False),
                -sample.offset_ms,
                sample.round_trip_ms,
                TOLERANCE_MS,
            )
        else:
            logger.warning(
                "node %s: clock is %+dms off the claim store's (round trip %dms); over %dms "
                "firings are released early or late: run NTP",
                shown(self.node, quoted=False),
                -sample.offset_ms,
                sample.round_trip_ms,
                WARN_MS,
            )
