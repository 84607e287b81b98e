"""Building ahead: what a dispatcher builds for the firings due within a second, kept
until their release.

A dispatcher that builds its messages ahead (:attr:`Dispatcher.prepares_ahead
<beatless.node.dispatch.Dispatcher.prepares_ahead>`) is handed, while the loop would
sleep, the firings due within ``PREPARE_AHEAD_MS`` that this node will claim at their
release, ``PREPARE_CHUNK`` at a time; at a burst, the work left at the instant is the
claim and the send. What it built is taken back once (:meth:`BuildAhead.take`), and what
was built for a firing never dispatched (decided late, paused or delegated) is dropped
after ``PREPARED_STALE_MS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from beatless.node._timeline import MAX_BATCH, Timeline
from beatless.node.dispatch import Dispatcher, Wake
from beatless.schedule.firing import Firing

PREPARE_AHEAD_MS = 1_000
"""A dispatcher that builds its messages ahead is handed the firings due within this
long, while the loop would sleep."""
PREPARE_IDLE_MS = 20
"""Firings are prepared ahead only while the next wake is at least this far: a loop
with releases every few milliseconds has no burst to prepare for."""
PREPARE_CHUNK = 500
"""Firings prepared per call, so that the loop wakes on time (a few tens of ms)."""
PREPARED_MAX = 2 * MAX_BATCH
"""At most this many firings wait prepared."""
PREPARED_STALE_MS = 60_000
"""What was prepared for a firing released this long ago and not dispatched (decided
late, paused or delegated) is dropped."""
SWEEP_EVERY_MS = 1_000
"""How often what went stale is dropped."""


class BuildAhead:
    """What ``dispatcher`` built ahead, by firing id, with the firing's release; ``now_ms``
    is the node's clock. ``claims_at_release`` says whether this node will claim a firing
    at its release (nothing is built for one it leaves to another node)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        timeline: Timeline,
        claims_at_release: Callable[[Firing], bool],
        now_ms: Callable[[], int],
    ) -> None:
        self._dispatcher = dispatcher
        self._now_ms = now_ms
        self._timeline = timeline
        self._claims_at_release = claims_at_release
        self._built: dict[str, tuple[int, object] | tuple[int, object, object]] = {}
        self._swept_ms = 0

    def __len__(self) -> int:
        return len(self._built)

    def build(self, wake: Wake) -> bool:
        """Have the dispatcher build what it needs for the firings due within
        ``PREPARE_AHEAD_MS`` (``PREPARE_CHUNK`` at a time, so the loop wakes on
        time); whether it built any, so the loop calls again at once."""
        if not self._dispatcher.prepares_ahead:
            return False
        now = self._now_ms()
        wake_ms = self._timeline.next_wake_ms()
        if wake_ms is None or wake_ms - now < PREPARE_IDLE_MS:
            return False
        if now - self._swept_ms >= SWEEP_EVERY_MS:
            self._swept_ms = now
            stale = now - PREPARED_STALE_MS
            self._built = {k: v for k, v in self._built.items() if v[0] >= stale}
        room = min(PREPARE_CHUNK, PREPARED_MAX - len(self._built))
        if room <= 0:
            return False
        firings = self._timeline.upcoming(now + PREPARE_AHEAD_MS, room, self._wanted)
        if not firings:
            return False
        try:
            built: Sequence[object] = self._dispatcher.prepare(firings, wake)
        except Exception:
            built = [None] * len(firings)  # built when due, where a failure is told
        for firing, payload in zip(firings, built, strict=True):
            self._built[firing.id] = (firing.release_ms, payload, firing.entry)
        return True

    def _wanted(self, firing: Firing) -> bool:
        """Whether to build for ``firing``: not built yet, and this node claims it at its
        release (one most likely left to the node preferred for it is marked built)."""
        if firing.id in self._built:
            return False
        if self._claims_at_release(firing):
            return True
        self._built[firing.id] = (firing.release_ms, None)
        return False

    def take(self, firing: Firing) -> object | None:
        """What the dispatcher built ahead for ``firing``, once; ``None`` if nothing."""
        built = self._built.pop(firing.id, None)
        if built is None or (len(built) > 2 and built[2] is not firing.entry):
            return None  # built under a definition a live revision replaced
        return built[1]
