"""Late firings a full or refusing store kept this node from judging: asked about before
any of them is said missed.

A firing whose every claim the store refused as full or refusing (*unjudged*,
:mod:`beatless.node._inflight`) may still have been claimed by another node just before
the store filled, and sent: that node's commit went through without room. So when it
goes late it is not decided ``missed`` on the spot. It waits here, and at each wake the
node asks the store who holds the waiting firings, in one *judging claim*
(:func:`~beatless.stores.base.judging`) that never wins a firing nobody holds:

* nobody holds it (``late``): ``missed``, recorded as such;
* another node holds it pending (``held``) or committed it (``lost``, or ``foreign`` for
  a claim of another task): decided so, as for any firing another node took; never
  missed, never sent;
* the store holds a record it cannot read: ``corrupt``, as a claim would be told;
* this node's own pending claim (a claim whose answer was lost, then refused as full
  until late): renewed by the judging claim as any claim of its holder is, then
  released; ``missed``, since this node never sent it.

A store that still refuses (full, refusing, unreachable) leaves the firings waiting,
asked again at the next wake, until their memory (``memory_ms`` from the occurrence)
runs out: past that even the store may have forgotten a claim, so they are decided
``missed`` and told at WARNING as firings that could not be judged. A node that stops
asks once more and decides what is left so too: a miss is never silent.
"""

from __future__ import annotations

import logging
from typing import Protocol

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import StoreError
from beatless.node._tally import WARN_EVERY_MS, Tally
from beatless.schedule.firing import Firing, claim_request
from beatless.stores.base import ClaimStore, Outcome, judging

logger = logging.getLogger("beatless.node.scheduler")

JUDGED = {
    Outcome.LATE: "missed",
    Outcome.HELD: "held",
    Outcome.LOST: "lost",
    Outcome.FOREIGN: "foreign",
    Outcome.CORRUPT: "corrupt",
}
"""The decision of a waiting firing, by what its judging claim was answered. Any other
answer (this node's own pending claim, won again) is ``missed``."""


class Decide(Protocol):
    """How a judged firing is decided: :meth:`beatless.node._wake.LoopWake.decide`."""

    def __call__(self, firing: Firing, outcome: str, *, recorded: bool = False) -> None: ...


class Judging:
    """The late firings waiting for the store's judgment, asked about with ``store``'s
    claims as ``node`` (its own pending claims renewed for ``lease_ms``, then released)."""

    def __init__(self, store: ClaimStore, node: str, lease_ms: int, tally: Tally) -> None:
        self._store = store
        self._node = node
        self._lease_ms = lease_ms
        self._tally = tally
        self._waiting: dict[str, Firing] = {}

    def add(self, firing: Firing) -> None:
        """``firing``, unjudged, went late: ask the store about it at the next wake."""
        self._waiting[firing.id] = firing

    def __len__(self) -> int:
        return len(self._waiting)

    def judge(self, now: int, decide: Decide, *, last: bool = False) -> None:
        """Ask the store who holds each waiting firing, in one judging claim, and decide
        those it answers; those past their memory first, unjudged. With ``last`` (the
        node stops), what the store does not answer now is decided unjudged too."""
        if not self._waiting:
            return
        forgotten = [f for f in self._waiting.values() if now - f.occurrence_ms > f.entry.memory_ms]
        for firing in forgotten:  # even the store may have forgotten who held them
            self._unjudged(firing, now, decide)
        firings = list(self._waiting.values())
        if not firings:
            return
        try:
            outcomes = self._store.claim(
                [judging(claim_request(f)) for f in firings],
                node=self._node,
                lease_ms=self._lease_ms,
            )
        except Exception as exc:
            self._still_unjudged(firings, exc, now, decide, last=last)
            return
        own = [f for f, o in zip(firings, outcomes, strict=True) if o.is_won]
        self._release(own)
        for firing, outcome in zip(firings, outcomes, strict=True):
            del self._waiting[firing.id]
            judged = JUDGED.get(outcome, "missed")
            decide(firing, judged, recorded=judged == "missed")

    def _still_unjudged(
        self, firings: list[Firing], exc: Exception, now: int, decide: Decide, *, last: bool
    ) -> None:
        """The store did not answer: the firings wait for the next wake, unless the node
        stops or the error is not the store's (a bug is not retried)."""
        if isinstance(exc, StoreError) and not last:
            return
        if not isinstance(exc, StoreError):
            logger.exception("judging %d late firing(s) failed", len(firings))
        for firing in firings:
            self._unjudged(firing, now, decide)

    def _unjudged(self, firing: Firing, now: int, decide: Decide) -> None:
        """Decide ``firing`` missed without the store's word, and say so."""
        del self._waiting[firing.id]
        self._tally.unjudged(firing, now)
        decide(firing, "missed", recorded=True)

    def _release(self, firings: list[Firing]) -> None:
        """Release this node's own pending claims that judging claims renewed."""
        if not firings:
            return
        try:
            self._store.release([f.id for f in firings], node=self._node)
        except StoreError as exc:
            if self._tally.may_warn("judging release", WARN_EVERY_MS):
                logger.warning(
                    "could not release %d claim(s) of late firings (%s); their leases run "
                    "out instead",
                    len(firings),
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )
