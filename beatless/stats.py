"""Counters per entry, and a bounded histogram of release-to-enqueue lateness."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000)
"""Upper bounds of the lateness histogram, in milliseconds; one more bucket holds the rest."""


@dataclass
class Histogram:
    """Counts of lateness per bucket, plus the recent samples for percentiles."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_MS) + 1))
    total: int = 0
    sum_ms: int = 0
    max_ms: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=4_096))

    def observe(self, ms: int) -> None:
        ms = max(ms, 0)
        self.counts[bisect.bisect_left(BUCKETS_MS, ms)] += 1
        self.total += 1
        self.sum_ms += ms
        self.max_ms = max(self.max_ms, ms)
        self.recent.append(ms)

    def percentile(self, q: float) -> int | None:
        """The q-th percentile (0..100) of the recent samples, or None with none."""
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


@dataclass
class EntryStats:
    """What one node decided for one entry since it started."""

    won: int = 0
    lost: int = 0
    late_node: int = 0
    late_store: int = 0
    enqueue_failures: int = 0
    takeovers: int = 0
    lateness: Histogram = field(default_factory=Histogram)

    def as_dict(self) -> dict[str, int | None]:
        return {
            "won": self.won,
            "lost": self.lost,
            "late_node": self.late_node,
            "late_store": self.late_store,
            "enqueue_failures": self.enqueue_failures,
            "takeovers": self.takeovers,
            "lateness_p50_ms": self.lateness.percentile(50),
            "lateness_p99_ms": self.lateness.percentile(99),
            "lateness_max_ms": self.lateness.max_ms,
        }
