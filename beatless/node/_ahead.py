"""Building ahead: what a dispatcher builds for the firings due within a second, kept
until their release.

A dispatcher that builds its messages ahead (:attr:`Dispatcher.prepares_ahead
<beatless.node.dispatch.Dispatcher.prepares_ahead>`) is handed, while the loop would
sleep, the firings due within ``PREPARE_AHEAD_MS`` (under a second) that this node will
claim at their release, ``PREPARE_STEP`` at a time until the next wake is near; at a
burst, the work left at the instant is the claim and the send. What it built is taken
back once (:meth:`BuildAhead.take`), and what was built for a firing never dispatched
(decided late, paused or delegated) is dropped after ``PREPARED_STALE_MS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from beatless.node._prefer import Ranked
from beatless.node._timeline import MAX_BATCH, Timeline
from beatless.node.dispatch import Dispatcher, Wake
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing

PREPARE_AHEAD_MS = 750
"""A dispatcher that builds its messages ahead is handed the firings due within this
long, while the loop would sleep: its wake to build falls a quarter of a second off the
whole seconds most releases fall on, when other nodes send."""
PREPARE_IDLE_MS = 20
"""Firings are prepared ahead only while the next wake is at least this far: a loop
with releases every few milliseconds has no burst to prepare for."""
PREPARE_CHUNK = 500
"""Firings prepared per call at the most."""
PREPARE_STEP = 50
"""Firings handed to the dispatcher at a time: between two steps the clock is read, and a
call stops when the next wake is less than ``PREPARE_IDLE_MS`` away, so that the loop
wakes on time however slow the building (a busy machine)."""
PREPARED_MAX = 2 * MAX_BATCH
"""At most this many firings wait prepared."""
PREPARED_STALE_MS = 60_000
"""What was prepared for a firing released this long ago and not dispatched (decided
late, paused or delegated) is dropped."""
SWEEP_EVERY_MS = 1_000
"""How often what went stale is dropped."""


@dataclass(frozen=True, slots=True)
class Built:
    """What was built ahead for one firing: its release, the dispatcher's payload (``None``:
    nothing, the firing is most likely left to another node), the entry it was built
    under, and where this node ranked for it then (``None``: it claims it whatever the
    ranks)."""

    release_ms: int
    payload: object
    entry: Entry
    ranked: Ranked | None


class BuildAhead:
    """What ``dispatcher`` built ahead, by firing id, with the firing's release; ``now_ms``
    is the node's clock. ``rank_at_release`` says where this node ranks for a firing
    (nothing is built for one it leaves to another node), or ``None`` when it claims it
    at its release whatever the ranks; the rank is kept for the release
    (:meth:`ranked`)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        timeline: Timeline,
        rank_at_release: Callable[[Firing], Ranked | None],
        now_ms: Callable[[], int],
    ) -> None:
        self._dispatcher = dispatcher
        self._now_ms = now_ms
        self._timeline = timeline
        self._rank_at_release = rank_at_release
        self._built: dict[str, Built] = {}
        self._ranks: dict[str, Ranked | None] = {}
        """The ranks of the firings of one build call, until they are built."""
        self._swept_ms = 0

    def __len__(self) -> int:
        return len(self._built)

    def build(self, wake: Wake) -> bool:
        """Have the dispatcher build what it needs for the firings due within
        ``PREPARE_AHEAD_MS`` (at most ``PREPARE_CHUNK``, and none once the next wake is
        near, so the loop wakes on time); whether it built any, so the loop calls again
        at once."""
        if not self._dispatcher.prepares_ahead:
            return False
        now = self._now_ms()
        wake_ms = self._timeline.next_wake_ms()
        if wake_ms is None or wake_ms - now < PREPARE_IDLE_MS:
            return False
        if now - self._swept_ms >= SWEEP_EVERY_MS:
            self._swept_ms = now
            stale = now - PREPARED_STALE_MS
            self._built = {k: v for k, v in self._built.items() if v.release_ms >= stale}
        room = min(PREPARE_CHUNK, PREPARED_MAX - len(self._built))
        if room <= 0:
            return False
        firings = self._timeline.upcoming(now + PREPARE_AHEAD_MS, room, self._wanted)
        if not firings:
            return False
        for start in range(0, len(firings), PREPARE_STEP):
            if start and self._now_ms() > wake_ms - PREPARE_IDLE_MS:
                break  # the rest at the next call, or when due
            self._prepare(firings[start : start + PREPARE_STEP], wake)
        self._ranks.clear()
        return True

    def _prepare(self, firings: Sequence[Firing], wake: Wake) -> None:
        try:
            built: Sequence[object] = self._dispatcher.prepare(firings, wake)
        except Exception:
            built = [None] * len(firings)  # built when due, where a failure is told
        ranks = self._ranks
        for firing, payload in zip(firings, built, strict=True):
            ranked = ranks.get(firing.id)
            self._built[firing.id] = Built(firing.release_ms, payload, firing.entry, ranked)

    def _wanted(self, firing: Firing) -> bool:
        """Whether to build for ``firing``: not built yet, and this node claims it at its
        release (one most likely left to the node preferred for it is marked built)."""
        if firing.id in self._built:
            return False
        ranked = self._rank_at_release(firing)
        if ranked is None or ranked[1] == 0:
            self._ranks[firing.id] = ranked
            return True
        self._built[firing.id] = Built(firing.release_ms, None, firing.entry, ranked)
        return False

    def take(self, firing: Firing) -> object | None:
        """What the dispatcher built ahead for ``firing``, once; ``None`` if nothing."""
        built = self._built.pop(firing.id, None)
        if built is None or built.entry is not firing.entry:
            return None  # built under a definition a live revision replaced
        return built.payload

    def ranked(self, firing: Firing) -> Ranked | None:
        """Where this node ranked for ``firing`` when it was looked at ahead (its release
        then costs no ranking while the view is the same); ``None`` if it was not."""
        built = self._built.get(firing.id)
        return None if built is None or built.entry is not firing.entry else built.ranked
