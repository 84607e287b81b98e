"""The shortest gap between consecutive occurrences of a cron trigger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from beatless.firing import EPOCH, from_datetime

if TYPE_CHECKING:
    from beatless.triggers import Cron

YEAR_MS = 366 * 86_400_000


def cron_min_gap_ms(cron: Cron, start_ms: int | None = None) -> int:
    """Brute force over a year of occurrences (placeholder for the windowed algorithm)."""
    import time

    start = int(time.time() * 1000) if start_ms is None else start_ms
    best = None
    prev = None
    for occ in cron.after(start):
        if occ > start + YEAR_MS:
            break
        if prev is not None:
            gap = occ - prev
            best = gap if best is None else min(best, gap)
        prev = occ
    return best if best is not None else YEAR_MS


__all__ = ["EPOCH", "cron_min_gap_ms", "from_datetime"]
