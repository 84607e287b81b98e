"""The last wakes of a stopping loop: what was released by the stop is decided first.

:meth:`Scheduler.stop <beatless.node.scheduler.Scheduler.stop>` asks the loop to stop at
an instant of the node's clock. The loop ends the wake in progress and then, before it
leaves, decides the firings released at or before that instant that it still has to try:

* those it had not woken for yet (the stop came while it slept until their release);
* those it tries again (a claim or an enqueue that failed, a claim that went stale while
  the node was starved of CPU): at once, then every ``RETRY_MS``;
* once, those it saw held by another node's pending claim: claimed again at once, so that
  one whose holder gave it up unsent is taken over; one still held is its holder's, which
  decides it as it stops in turn.

Without these wakes, a firing whose first claim went stale just before the whole fleet
stopped (a deploy stops every node within a second) was decided by no node: its winner
stopped before trying it again, and the nodes that saw it held would have looked again
only once its lease ran out. The drain ends when nothing released by the stop is left to
try, or at its deadline; what is left then is told in one WARNING (and counted missed by
the fleet once late, as any firing no node claimed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from beatless.core._logtext import shown
from beatless.node._timeline import Timeline
from beatless.node._wake import RETRY_MS
from beatless.schedule.firing import iso

logger = logging.getLogger("beatless.node.scheduler")

DRAIN_MS = 5_000
"""The longest a stopping loop goes on deciding what was released by the stop; at most half
the ``timeout`` given to :meth:`~beatless.node.scheduler.Scheduler.stop` as well, so that
the board's last write and the join fit in it."""


@dataclass(frozen=True, slots=True)
class Stopping:
    """A stop asked for: its instant on the node's clock, and the drain's deadline on the
    monotonic clock."""

    at_ms: int
    deadline: float

    @classmethod
    def at(cls, at_ms: int, timeout: float | None) -> Stopping:
        """A stop at ``at_ms``, asked with ``timeout`` (seconds; ``None``: no bound)."""
        budget = DRAIN_MS / 1_000 if timeout is None else min(DRAIN_MS / 1_000, timeout / 2)
        return cls(at_ms, time.monotonic() + max(budget, 0.0))


def drain(
    stopping: Stopping,
    timeline: Timeline,
    *,
    node: str,
    now_ms: Callable[[], int],
    wake: Callable[[], None],
) -> None:
    """Wake until every firing released by the stop that this node has to try is decided,
    or the deadline passes: always once, the firings seen held included in that one."""
    held = True
    while True:
        timeline.bring_forward(stopping.at_ms, now_ms(), held=held)
        held = False
        wake()
        firings, groups = timeline.left(stopping.at_ms)
        remaining = stopping.deadline - time.monotonic()
        if not (firings or groups):
            return
        if remaining <= 0:
            break
        time.sleep(min(RETRY_MS / 1_000, remaining))
    logger.warning(
        "node %s stopped with %d firing(s) and %d fan-out(s) or occurrence(s) released by "
        "its stop at %s not decided (their claim or enqueue still failed when its time to "
        "decide them ran out): a node still running takes them over once their leases run "
        "out, else the fleet counts them missed once late",
        shown(node, quoted=False),
        firings,
        groups,
        iso(stopping.at_ms),
    )
