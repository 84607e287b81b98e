"""The node's tally: what it decided, counted per entry, and what it tells the operator.

Every decision adds to its entry's counters (:class:`~beatless.node.stats.EntryStats`)
and to the summary a node logs once a minute at INFO; the outcomes an operator must hear
about (late, refused, forgotten, missed ...) are held per entry and occurrence and told in
one WARNING once their count settles, so that one dropped occurrence is one line with its
whole count. Warnings of the loop are rate-limited here too.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

from beatless.core._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless.node.stats import EntryStats
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import Firing, iso

logger = logging.getLogger("beatless.node.scheduler")

WARN_EVERY_MS = 10_000
"""One WARNING per kind of trouble, entry and occurrence at most this often."""
SETTLE_MS = 1_000
"""A count of trouble is told once no more of it came for this long."""
SUMMARY_EVERY_MS = 60_000
"""How often a node logs its counts at INFO."""
FOREIGN_WARN_EVERY_MS = 600_000
"""One WARNING per entry at most this often for firings lost to a claim of another task."""

WARNINGS = {
    "late": "more than max_late behind this node's clock, skipped (node overloaded, frozen, "
    "or its clock jumped)",
    "late_store": "refused by the store as late: the claim reached it more than max_late + "
    "10s after the occurrence (slow network, or this node's clock is behind)",
    "early": "refused by the store as early: released more than 10s ahead of the store's "
    "clock (this node's clock is ahead)",
    "forgotten": "not sent: the claim store lost its memory (restarted without persistence?) "
    "after they were released, so they may already have been enqueued",
    "corrupt": "not sent: the store holds a record for them that it cannot read",
    "stale_schedule": "not claimed: this node could not read the live schedule's head "
    "recently enough to know the revision in force at them (store link to the notes down, "
    "or its sync frozen) until they were late; see the live head in `beatless status`",
    "missed": "missed: not sent by this node, and once they were late the claim store held "
    "no claim of them (this node's claims were refused until then, full or by its settings: "
    "see its WARNING; or the node that held them pending gave them up unsent), or could not "
    "be asked (see the WARNING of firings not judged)",
    "unjudged": "not judged: the claim store refused every claim of them, and every question "
    "about who holds them, until their memory (jitter + max_late + 10s after the "
    "occurrence, or after another node was last seen holding them) ran out or this node "
    "stopped; counted missed, though another node may have claimed and sent them",
}
"""Outcomes an operator must hear about, and what they mean."""


class Trouble:
    """Counts of the outcomes an operator must hear about, per (outcome, entry name,
    occurrence): told in one WARNING once no more came for a second (or after
    ``WARN_EVERY_MS``, for trouble that goes on), so that one dropped occurrence is
    one line with its whole count."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, int], list[int]] = {}

    def add(self, key: tuple[str, str, int], count: int, now: int) -> None:
        held = self._counts.setdefault(key, [0, now, now])
        held[0] += count
        held[2] = now

    def settled(self, now: int) -> list[tuple[tuple[str, str, int], int]]:
        """The counts to tell now, each forgotten once told."""
        if not self._counts:
            return []
        ready = [
            key
            for key, (_, first, last) in self._counts.items()
            if now - last >= SETTLE_MS or now - first >= WARN_EVERY_MS
        ]
        return [(key, self._counts.pop(key)[0]) for key in ready]


class Tally:
    """One node's counts: per entry (:attr:`stats`), for the minute's summary, and the
    trouble to tell; ``now_ms`` is the node's clock."""

    def __init__(self, schedule: Schedule, node: str, now_ms: Callable[[], int]) -> None:
        self.stats = {entry.name: EntryStats() for entry in schedule.entries}
        """What this node decided for each entry since it started, by entry name."""
        self.node = node
        self._namespace = schedule.namespace
        self._now_ms = now_ms
        self._summary = Counter[str]()
        self._summary_ms: int | None = None
        self._trouble = Trouble()
        self._warned = WarnEvery()

    def of(self, entry: str) -> EntryStats:
        """The counters of ``entry`` (a live entry's are made at its first count)."""
        stats = self.stats.get(entry)
        if stats is None:
            stats = self.stats[entry] = EntryStats()
        return stats

    def may_warn(self, kind: str, every_ms: int) -> bool:
        """Whether a warning of ``kind`` may be logged now (at most once per ``every_ms``)."""
        return self._warned.allows(kind, every_ms, self._now_ms())

    def count(self, firing: Firing, outcome: str, now: int, *, seen_held: bool) -> None:
        """Add one decision (or retry) of ``firing``; ``seen_held`` when this node saw it
        held by another node before, so that it is counted lost once."""
        stats = self.stats.get(firing.entry.name) or self.of(firing.entry.name)
        if outcome in ("won", "takeover"):
            stats.lateness.observe(now - firing.release_ms)
        if outcome in ("lost", "held", "foreign") and not seen_held:
            stats.lost += 1  # once, when first seen held, lost or foreign
        if outcome not in ("lost", "held"):
            stats.count(outcome)
        self._summary[outcome] += 1
        if outcome == "foreign":
            self._warn_foreign(firing)
        elif outcome == "skipped_overlap":
            logger.info(
                "firing %s of %s (occurrence %s) not sent: a run of it is in progress and "
                "its overlap policy is 'skip'",
                firing.id,
                shown(firing.address),
                iso(firing.occurrence_ms),
            )
        elif outcome in WARNINGS:
            self._trouble.add((outcome, firing.entry.name, firing.occurrence_ms), 1, now)
            if outcome == "corrupt":
                logger.warning(
                    "firing %s of entry %s: the claim store holds a record for it that this "
                    "version cannot read; the firing is not sent",
                    firing.id,
                    shown(firing.entry.name),
                )

    def late(self, entry: str, count: int, occurrence: int | None = None) -> None:
        """``count`` firings of ``entry`` dropped as late in one step, without a decision
        each; with their ``occurrence``, told in one WARNING with the count."""
        self.of(entry).late_node += count
        self._summary["late"] += count
        if occurrence is not None:
            self._trouble.add(("late", entry, occurrence), count, self._now_ms())

    def stale(self, entry: str, count: int, occurrence: int) -> None:
        """``count`` firings of ``entry`` (a fan-out's, at ``occurrence``) dropped in one
        step, without a decision each, because this node could not confirm the live
        schedule in force at them until they were late: told in one WARNING with the
        count, as a decision ``stale_schedule`` is."""
        self.of(entry).stale_schedule += count
        self._summary["stale_schedule"] += count
        self._trouble.add(("stale_schedule", entry, occurrence), count, self._now_ms())

    def unjudged(self, firing: Firing, now: int) -> None:
        """``firing`` is decided missed without the store's word on who holds it
        (:mod:`beatless.node._judging`): told in one WARNING per entry and occurrence."""
        self._trouble.add(("unjudged", firing.entry.name, firing.occurrence_ms), 1, now)

    def caught_up(self, entry: str, count: int) -> None:
        """``count`` firings of ``entry`` left unclaimed by its catch-up policy."""
        self.of(entry).catch_up_skipped += count
        self._summary["catch_up_skipped"] += count

    def in_window(self, firings: Sequence[Firing]) -> None:
        """Sent firings found taken over at their commit (``two_phase_window``)."""
        for firing in firings:
            self.of(firing.entry.name).two_phase_window += 1

    def failed_step(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        """A step after a decision or a send failed: counted per entry
        (``post_send_errors``) and logged, one WARNING per minute."""
        for firing in firings:
            self.of(firing.entry.name).post_send_errors += 1
        self._summary["post_send_error"] += len(firings)
        if not firings or not self.may_warn("post_send", WARN_EVERY_MS):
            return
        first = firings[0]
        logger.warning(
            "firing %s of entry %s (and %d more): a step after its send or decision failed "
            "(%s: %s: %s); counted in post_send_errors, and it is not tried again",
            first.id,
            shown(first.entry.name),
            len(firings) - 1,
            step,
            type(exc).__name__,
            shown(exc, quoted=False, limit=ERROR_LIMIT),
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )

    def tell(self, now: int, offset_ms: int | None) -> None:
        """After a wake: the trouble whose count settled, one WARNING each; and once a
        minute the summary at INFO (``offset_ms``: the node's offset to the store's clock)."""
        trouble = self._trouble
        for (outcome, name, occurrence), count in trouble.settled(now) if trouble._counts else ():
            logger.warning(
                "entry %s, occurrence %s: %d firing(s) %s",
                shown(name),
                iso(occurrence),
                count,
                WARNINGS[outcome],
            )
        if self._summary_ms is None:
            self._summary_ms = now
        if now - self._summary_ms < SUMMARY_EVERY_MS:
            return
        counts, self._summary = self._summary, Counter()
        self._summary_ms = now
        logger.info(
            "node %s, last %ds: %s; clock offset to the store %s",
            shown(self.node, quoted=False),
            SUMMARY_EVERY_MS // 1_000,
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing due",
            "unknown" if offset_ms is None else f"{offset_ms:+d}ms",
        )

    def _warn_foreign(self, firing: Firing) -> None:
        """A claim of another task holds this firing's address: two apps (or two
        schedules) share one namespace in this store. One WARNING per entry per
        ``FOREIGN_WARN_EVERY_MS``."""
        entry = firing.entry
        if not self.may_warn(f"foreign {entry.name}", FOREIGN_WARN_EVERY_MS):
            return
        logger.warning(
            "entry %s: address %s is held by a claim of another task (its task tag is not "
            "%s, the tag of %s): two apps share namespace %s in this store and take each "
            "other's firings; give each its own namespace (or, if a rollout renamed the "
            "task, run one schedule on every node); %d firing(s) lost to it on this node",
            shown(entry.name),
            shown(firing.address),
            entry.task_tag,
            shown(entry.task),
            shown(self._namespace),
            self.of(entry.name).foreign,
        )
