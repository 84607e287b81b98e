"""What a node decides for one firing: the outcomes, named once, and their groups.

Each outcome is a :class:`~enum.StrEnum` member, equal to (and written as) its string, so
the history notes, the counters, the logs and the metrics carry the same text as
before: ``DecisionOutcome.WON == "won"``. A claim's answer from the store
(:class:`~beatless.stores.base.Outcome`) becomes a decision by :meth:`DecisionOutcome.of_claim`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from beatless.stores.base import Outcome

__all__ = ["DecisionOutcome"]


class DecisionOutcome(StrEnum):
    """The outcome of a :class:`~beatless.schedule.firing.Decision`: final (the firing
    leaves this node's loop) or retried (it is tried again soon, until late)."""

    WON = "won"
    """Final: claimed and sent by this node."""
    TAKEOVER = "takeover"
    """Final: claimed after another node's pending claim ran out uncommitted, and sent."""
    LOST = "lost"
    """Final: another node won the firing."""
    HELD = "held"
    """Final for now: another node holds the firing pending; looked at again after its
    lease, and taken over if it runs out uncommitted (once late: ``lost`` if committed,
    ``missed`` if given up unsent)."""
    LATE = "late"
    """Final: more than max_late behind this node's clock, skipped."""
    LATE_STORE = "late_store"
    """Final: refused by the store, on its own clock, as late."""
    EARLY = "early"
    """Final: refused by the store as released more than 10 s ahead of its clock."""
    FORGOTTEN = "forgotten"
    """Final: the store lost its memory after the release; not sent (it may have been)."""
    CORRUPT = "corrupt"
    """Final: the store holds a record for the firing that it cannot read; not sent."""
    FOREIGN = "foreign"
    """Final: lost to a claim of another task under the same address."""
    SKIPPED_OVERLAP = "skipped_overlap"
    """Final: not sent, a run of the address is in progress (overlap ``skip``)."""
    CLOCK_SKEW = "clock_skew"
    """Final: this node's clock is too far off the store's to claim."""
    DELEGATED = "delegated"
    """Final: left to the node of the registry preferred for it."""
    PAUSED = "paused"
    """Final: not claimed, an operator paused the entry."""
    MISSED = "missed"
    """Final: no node claimed the firing in time (found by the fleet's sweep), or, once it
    was late, the store held no claim of it: every claim of this node was refused until
    then, or the node that held it pending gave it up unsent."""
    ENQUEUE_FAILED = "enqueue_failed"
    """Retried: the send to the broker failed; the claim is released."""
    STALE_CLAIM = "stale_claim"
    """Retried: the claim got older than half its lease before the send."""
    COMMIT_FAILED = "commit_failed"
    """Retried: a commit of this node failed, and it sends nothing until one succeeds."""
    UNAVAILABLE = "unavailable"
    """Retried: the claim store could not be reached."""
    STORE_FULL = "store_full"
    """Retried: the store refused the claim as full."""
    STORE_REFUSED = "store_refused"
    """Retried: the store's settings are refused (an evicting Redis); nothing claimed."""
    ERROR = "error"
    """Retried: the claim or the dispatch failed otherwise."""
    STALE_REVISION = "stale_revision"
    """Retried: the store knows a live revision newer than this node's in force at the
    occurrence; the node reads the live head at once and claims again under the
    definition in force (``stale_schedule`` if it cannot read it before the firing is
    late)."""
    STALE_SCHEDULE = "stale_schedule"
    """Final: this node could not confirm the live schedule in force at the occurrence
    (its last read of the live head was too old) until the firing was late; not sent."""
    RESEEDING = "reseeding"
    """Retried: the store lost its memory and holds the firing off while the nodes write
    back what they sent (``forgotten`` if still so when late)."""

    SENT: ClassVar[frozenset[DecisionOutcome]]
    """The outcomes of a firing this node sent: ``won``, ``takeover``."""
    HISTORY: ClassVar[frozenset[DecisionOutcome]]
    """The decisions a node writes into an address's history: those only it made. ``lost``
    and ``held`` belong to another node's history item; a node-side ``late`` is only this
    node's view (another node may have sent the firing)."""
    CLAIM_DECIDED: ClassVar[frozenset[DecisionOutcome]]
    """The history outcomes a claim decides: one of them at most per firing in the whole
    fleet (the store answers it to one node). The others (``paused``, ``missed``) are a
    node's own decision, which another node may contradict."""
    SETTLED: ClassVar[frozenset[DecisionOutcome]]
    """Outcomes after which a firing has a final claim record, or nobody could claim it
    any more. ``held`` is not one: another node's claim is pending, and may run out
    unsent."""

    @classmethod
    def of_claim(cls, outcome: Outcome) -> DecisionOutcome:
        """The decision a claim's answer makes: the same word, but a store's ``late`` is
        ``late_store`` (the node's own clock decides ``late``)."""
        return _OF_CLAIM[outcome]


_OF_CLAIM = {
    o: DecisionOutcome.LATE_STORE if o is Outcome.LATE else DecisionOutcome(o.value)
    for o in Outcome
}
"""What :meth:`DecisionOutcome.of_claim` answers, made once (it is on every claim's path)."""

DecisionOutcome.SENT = frozenset({DecisionOutcome.WON, DecisionOutcome.TAKEOVER})
DecisionOutcome.CLAIM_DECIDED = DecisionOutcome.SENT | {
    DecisionOutcome.FORGOTTEN,
    DecisionOutcome.SKIPPED_OVERLAP,
}
DecisionOutcome.HISTORY = DecisionOutcome.CLAIM_DECIDED | {
    DecisionOutcome.PAUSED,
    DecisionOutcome.MISSED,
}
DecisionOutcome.SETTLED = DecisionOutcome.CLAIM_DECIDED | {
    DecisionOutcome.LOST,
    DecisionOutcome.LATE,
    DecisionOutcome.LATE_STORE,
    DecisionOutcome.CORRUPT,
    DecisionOutcome.FOREIGN,
    DecisionOutcome.PAUSED,
    DecisionOutcome.DELEGATED,
}
