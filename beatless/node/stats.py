"""Counters per entry, and a bounded histogram of release-to-enqueue lateness."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from beatless.schedule.outcomes import DecisionOutcome

BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000)
"""Upper bounds of the lateness histogram, in milliseconds; one more bucket holds the rest."""


RECENT_KEPT = 4_096
"""Samples a histogram keeps for its percentiles."""


@dataclass(slots=True)
class Histogram:
    """Counts of lateness per bucket, plus the recent samples for percentiles. Its lists
    are made at the first sample: a node of 100,000 entries holds one histogram each."""

    total: int = 0
    sum_ms: int = 0
    max_ms: int = 0
    _counts: list[int] | None = field(default=None, repr=False)
    _recent: deque[int] | None = field(default=None, repr=False)

    @property
    def counts(self) -> list[int]:
        """The samples per bucket of :data:`BUCKETS_MS`, and the rest in the last."""
        return [0] * (len(BUCKETS_MS) + 1) if self._counts is None else self._counts

    @property
    def recent(self) -> deque[int]:
        """The last :data:`RECENT_KEPT` samples."""
        return deque(maxlen=RECENT_KEPT) if self._recent is None else self._recent

    def observe(self, ms: int) -> None:
        ms = max(ms, 0)
        if self._counts is None or self._recent is None:
            self._counts, self._recent = self.counts, self.recent
        self._counts[bisect.bisect_left(BUCKETS_MS, ms)] += 1
        self.total += 1
        self.sum_ms += ms
        self.max_ms = max(self.max_ms, ms)
        self._recent.append(ms)

    def percentile(self, q: float) -> int | None:
        """The q-th percentile (0..100) of the recent samples, or None with none."""
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


_COUNTERS: dict[str, str] = {
    DecisionOutcome.WON: "won",
    DecisionOutcome.TAKEOVER: "won",
    DecisionOutcome.LOST: "lost",
    DecisionOutcome.LATE: "late_node",
    DecisionOutcome.LATE_STORE: "late_store",
    DecisionOutcome.EARLY: "early",
    DecisionOutcome.FORGOTTEN: "forgotten",
    DecisionOutcome.CORRUPT: "corrupt",
    DecisionOutcome.FOREIGN: "foreign",
    DecisionOutcome.SKIPPED_OVERLAP: "skipped_overlap",
    DecisionOutcome.CLOCK_SKEW: "skipped_clock",
    DecisionOutcome.MISSED: "missed",
    DecisionOutcome.PAUSED: "paused",
    DecisionOutcome.DELEGATED: "delegated",
    DecisionOutcome.ENQUEUE_FAILED: "enqueue_failures",
    DecisionOutcome.STALE_CLAIM: "stale_claims",
    DecisionOutcome.COMMIT_FAILED: "commit_failures",
    DecisionOutcome.UNAVAILABLE: "store_unavailable",
    DecisionOutcome.STORE_FULL: "store_full",
    DecisionOutcome.STORE_REFUSED: "store_refused",
    DecisionOutcome.RESEEDING: "reseeding",
    DecisionOutcome.ERROR: "errors",
    DecisionOutcome.STALE_SCHEDULE: "stale_schedule",
    DecisionOutcome.STALE_REVISION: "stale_revisions",
}
"""The counter each decision adds to (a takeover is also a win). ``lost`` and ``held`` are
counted by the loop, once per firing; a ``foreign`` firing is counted lost as well."""

COUNTS = (
    *dict.fromkeys(_COUNTERS.values()),
    "post_send_errors",
    "two_phase_window",
    "takeovers",
    "unscheduled",
    "catch_up_skipped",
)
"""The counters of :meth:`EntryStats.counts`, in their order."""
_counts_of = attrgetter(*COUNTS)


@dataclass(slots=True)
class EntryStats:
    """What one node decided for one entry since it started."""

    won: int = 0
    lost: int = 0
    late_node: int = 0
    late_store: int = 0
    early: int = 0
    forgotten: int = 0
    corrupt: int = 0
    foreign: int = 0
    """Firings lost to a claim of another task under the same address (two apps sharing
    one store and namespace); each is counted in ``lost`` too."""
    skipped_overlap: int = 0
    """Firings not enqueued because a run of their address was in progress (overlap
    ``skip``)."""
    skipped_clock: int = 0
    delegated: int = 0
    """Firings left to the node preferred for them, which showed it dealt with them (or
    which went late while left to it: then the fleet's missed sweep judges them)."""
    catch_up_skipped: int = 0
    """Firings of occurrences before the node's start that its catch-up policy left
    unclaimed (``latest``: coalesced into the last one; ``none``: all of them)."""
    missed: int = 0
    """Firings no node claimed in time, found by this node's sweep of the history and
    counted by this node alone in the fleet (:mod:`beatless._missed`); and firings whose
    every claim by this node the store refused (full, or its settings refused) until they
    were late, counted by each node that could not judge them."""
    paused: int = 0
    """Firings not claimed because an operator paused the entry (``beatless pause``)."""
    enqueue_failures: int = 0
    stale_claims: int = 0
    commit_failures: int = 0
    """Firings not sent, and retried, because a commit of this node had failed: after
    one, a node sends nothing until a commit succeeds again."""
    two_phase_window: int = 0
    """Sent firings whose commit found their claim taken over (the commit failed until
    the lease ran out, and another node claimed them): another node may have sent them
    too, under the same message id; the workers' once-only check refuses that copy."""
    post_send_errors: int = 0
    """Steps after a firing was sent or decided (its history note, the commit, a
    counter) that raised: counted and logged, never a reason to send it again."""
    store_unavailable: int = 0
    store_full: int = 0
    """Claims the store refused as full (each retry counts); a firing never claimed so is
    counted ``missed`` once it is late."""
    store_refused: int = 0
    """Claims not made because the store's settings are refused (an evicting Redis)."""
    reseeding: int = 0
    """Claims the store held off (each retry counts) while the nodes wrote back what they
    sent after it lost its memory; a firing still held off when late is ``forgotten``."""
    errors: int = 0
    stale_schedule: int = 0
    """Firings not claimed because this node had not read the live schedule's head
    recently enough to know the revision in force at them, until they were late."""
    stale_revisions: int = 0
    """Claims the store answered stale: it knew a live revision newer than this node's,
    in force at the occurrence (each retry counts); the node read the head and claimed
    again under the definition in force."""
    unscheduled: int = 0
    """Firings built under a live definition that a later revision replaced or deleted
    at or before their occurrence: dropped before any claim (the definition in force
    builds its own, under the same id when it has the occurrence)."""
    takeovers: int = 0
    lateness: Histogram = field(default_factory=Histogram)

    def count(self, outcome: str) -> None:
        """Add one decision (``won``, ``late``, ...) to its counter."""
        if outcome == DecisionOutcome.TAKEOVER:
            self.takeovers += 1
        name = _COUNTERS.get(outcome)
        if name is not None:
            setattr(self, name, getattr(self, name) + 1)

    def counts(self) -> dict[str, int]:
        """The counters alone (:data:`COUNTS`), without the lateness figures."""
        return dict(zip(COUNTS, _counts_of(self), strict=True))

    def as_dict(self) -> dict[str, int | None]:
        return {
            **self.counts(),
            "lateness_p50_ms": self.lateness.percentile(50),
            "lateness_p99_ms": self.lateness.percentile(99),
            "lateness_max_ms": self.lateness.max_ms,
        }


def total_counts(stats: Iterable[EntryStats]) -> dict[str, int]:
    """The counters of ``stats`` summed, by name (none without stats)."""
    rows = [_counts_of(entry) for entry in stats]
    if not rows:
        return {}
    return dict(zip(COUNTS, map(sum, zip(*rows, strict=True)), strict=True))


SKIPPED_SEEN_LIMIT = 10_000
"""Skipped notes remembered (so that one read again is not counted again); beyond, the
memory starts afresh."""


@dataclass
class SkippedNotes:
    """Notes read from the claim store that did not fit the schema of their kind
    (:mod:`beatless.fleet._schema`) and were skipped, by family of note (``nodes``,
    ``controls``, ``history`` ...). A note is one record: it is counted once, however
    often it is read again unchanged, and once more each time it is written anew."""

    counts: dict[str, int] = field(default_factory=dict)
    _seen: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, family: str, kind: str, key: str, text: str) -> bool:
        """Count the note ``key`` of ``kind``, unless it was counted as it is; whether it
        was counted now."""
        seen = hash(text)
        if self._seen.get((kind, key)) == seen:
            return False
        if len(self._seen) >= SKIPPED_SEEN_LIMIT:
            self._seen.clear()
        self._seen[(kind, key)] = seen
        self.counts[family] = self.counts.get(family, 0) + 1
        return True
