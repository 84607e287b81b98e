"""The values of a claim: the request, its outcome, the store's epoch, and the rule that
judges a claim for stores that decide outside their server. See the contract in
:mod:`beatless.stores.base`, which re-exports these names."""

from __future__ import annotations

import enum
import string
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Protocol

from beatless.core.durations import to_ms
from beatless.errors import ConfigError

STORE_TOLERANCE = timedelta(seconds=10)
"""The store refuses a new claim more than ``max_late`` + this behind its own clock."""
TOLERANCE_MS = to_ms(STORE_TOLERANCE)
NEVER_LATE_MS = 7 * 86_400_000
"""The lateness allowed to a claim made "now" (a run's records, a missed marker): never
late on any sane clock."""

TAG_LENGTH = 16
"""The longest task tag a store keeps: hex digits only."""
_HEX = frozenset(string.hexdigits)


class Outcome(enum.Enum):
    """What a claim decided for one firing."""

    WON = "won"
    TAKEOVER = "takeover"
    """Won, after the previous winner's pending lease ran out uncommitted."""
    LOST = "lost"
    """Another node won and committed (or, on an atomic store, enqueued) the firing."""
    HELD = "held"
    """Lost for now: another node holds the firing pending. If its lease runs out
    uncommitted, a later claim that is not late takes the firing over."""
    LATE = "late"
    """Refused: the occurrence is more than ``max_late + 10 s`` behind the store's clock."""
    EARLY = "early"
    """Refused: the release is more than ``10 s`` ahead of the store's clock."""
    FORGOTTEN = "forgotten"
    """The store lost its memory since this store object last saw it, and the firing was
    released before the loss: it may already have been enqueued. Written committed; it
    must not be enqueued."""
    CORRUPT = "corrupt"
    """The store holds a record for this firing that it cannot read; nothing written."""
    FOREIGN = "foreign"
    """Lost: a live claim of another task holds the firing (its record's tag is not the
    request's), pending or committed. Two apps share one store and namespace, and an
    entry of each has the same name and occurrence; nothing written."""
    RESEEDING = "reseeding"
    """Not decided yet: the store lost its memory, the firing was released before the loss
    and nobody holds it, and the nodes are writing back what they sent (see "Re-seeding"
    in :mod:`beatless.stores.base`). Nothing written; claim it again later."""
    OVERLAP = "skipped_overlap"
    """Not enqueued: the entry's overlap policy is ``skip`` and a run of its address is in
    progress (its run lease is live). Written committed, so no other node enqueues it."""
    STALE = "stale_revision"
    """Not won: the claim's live revision is older than one in force at the occurrence
    (see "Live revisions" in :mod:`beatless.stores.base`). Nothing written; the node reads
    the live head and claims again under the newer definition."""

    @property
    def is_won(self) -> bool:
        return self in _WON_OUTCOMES

    # A member is equal to itself alone, so it hashes by identity: in C, where Enum's
    # hash (of the member's name) is a Python call, and every claim's outcome is looked
    # up by it (:meth:`~beatless.schedule.outcomes.DecisionOutcome.of_claim`).
    __hash__ = object.__hash__


# An Enum class's attribute is a slow look-up on Python 3.11 (EnumType.__getattr__);
# every claim's path names these through module names instead.
_WON_OUTCOMES = frozenset({Outcome.WON, Outcome.TAKEOVER})
_WON, _TAKEOVER, _LOST, _HELD = Outcome.WON, Outcome.TAKEOVER, Outcome.LOST, Outcome.HELD

OUTCOME_LETTERS = {
    "W": Outcome.WON,
    "T": Outcome.TAKEOVER,
    "L": Outcome.LOST,
    "H": Outcome.HELD,
    "R": Outcome.RESEEDING,
    "X": Outcome.LATE,
    "E": Outcome.EARLY,
    "F": Outcome.FORGOTTEN,
    "C": Outcome.CORRUPT,
    "A": Outcome.FOREIGN,
    "O": Outcome.OVERLAP,
    "S": Outcome.STALE,
}
"""The letter for each outcome in the answer of a claim decided on the server (the Redis
scripts, the PostgreSQL function): one letter per firing, in the order asked."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One firing to claim, with the numbers the store needs to judge it (a firing's claim:
    :func:`beatless.schedule.firing.claim_request`)."""

    id: str
    address: str
    occurrence_ms: int
    max_late_ms: int
    memory_ms: int
    """How long to remember the claim once committed (at least jitter + max_late + 10 s)."""
    release_ms: int
    """When nodes act on the firing: occurrence + offset."""
    tag: str = ""
    """A short tag of the entry's task (:attr:`~beatless.schedule.entry.Entry.task_tag`), up to
    ``TAG_LENGTH`` hex digits: a live claim with another tag is :attr:`Outcome.FOREIGN`.
    Empty: never foreign."""
    run_id: str = ""
    """The id of the address's run-lease record (:func:`beatless.schedule.firing.run_lease_id`) when
    the entry's overlap policy is ``skip``: while that record is a live pending claim, the
    claim is answered :attr:`Outcome.OVERLAP`. Empty: no overlap check."""
    revision: int | None = None
    """The live revision the claiming node had applied when it built the firing
    (:mod:`beatless.stores._fences`): a claim at or past the fence of a newer revision
    is answered :attr:`Outcome.STALE` by the stores that check it. ``None``: no check (a
    node without live entries, a run lease, a revision's own claim)."""

    def __post_init__(self) -> None:
        tag = self.tag
        if tag and (len(tag) > TAG_LENGTH or not _HEX.issuperset(tag)):
            raise ConfigError(
                f"claim of firing {self.id} ({self.address!r}): tag {tag!r} must be at most "
                f"{TAG_LENGTH} hex digits"
            )

    def is_late(self, store_now_ms: int) -> bool:
        """The store-side lateness rule: more than ``max_late + 10 s`` behind."""
        return store_now_ms - self.occurrence_ms > self.max_late_ms + TOLERANCE_MS

    def is_early(self, store_now_ms: int) -> bool:
        """The store-side early rule: a release more than ``10 s`` ahead."""
        return self.release_ms - store_now_ms > TOLERANCE_MS


class Held(Protocol):
    """What a store knows of a claim it holds: enough to judge the next claim."""

    node: str
    committed: bool
    until_ms: int
    tag: str
    """The task tag the claim was written with; empty for a record without one."""


def judge(
    request: ClaimRequest,
    held: Held | None,
    node: str,
    now_ms: int,
    forgot_before_ms: int | None = None,
    *,
    running: Held | None = None,
    hold_off: bool = False,
    next_fence_ms: int | None = None,
) -> Outcome:
    """The contract's outcome for one claim, for stores that decide outside the server.

    ``forgot_before_ms`` is set when the store's epoch changed since the store object
    last saw it: the new epoch's start plus the tolerance. A won outcome means the store
    must now write the claim as pending for the lease (for ``node``'s own pending claim:
    extend it); :attr:`Outcome.FORGOTTEN` and :attr:`Outcome.OVERLAP` mean it must write
    the claim committed. ``running`` is the record of the request's
    :attr:`~ClaimRequest.run_id`, if it has one and the store holds it. With ``hold_off``,
    a firing that would be forgotten is :attr:`Outcome.RESEEDING`, and nothing is written.
    ``next_fence_ms`` is the fence of the live revision after the request's
    (:mod:`beatless.stores._fences`): at or before the occurrence, a claim that would be
    won (or renewed) is :attr:`Outcome.STALE`, and nothing is written.
    """
    stale = next_fence_ms is not None and request.occurrence_ms >= next_fence_ms
    if held is not None and held.until_ms >= now_ms:
        outcome = _judge_live(request, held, node)
        return Outcome.STALE if stale and outcome is _WON else outcome
    if request.is_late(now_ms):
        return Outcome.LATE
    if request.is_early(now_ms):
        return Outcome.EARLY
    if stale:
        return Outcome.STALE
    return _judge_free(request, held, now_ms, forgot_before_ms, running=running, hold_off=hold_off)


def _judge_free(
    request: ClaimRequest,
    held: Held | None,
    now_ms: int,
    forgot_before_ms: int | None,
    *,
    running: Held | None,
    hold_off: bool,
) -> Outcome:
    """The outcome of a claim nobody holds live, on time and not stale."""
    if held is None and forgot_before_ms is not None and request.release_ms < forgot_before_ms:
        return Outcome.RESEEDING if hold_off else Outcome.FORGOTTEN
    if is_running(running, now_ms):
        return Outcome.OVERLAP
    return _WON if held is None or held.committed else _TAKEOVER


def is_running(record: Held | None, now_ms: int) -> bool:
    """Whether a run-lease record is held: a live pending claim."""
    return record is not None and not record.committed and record.until_ms >= now_ms


def _judge_live(request: ClaimRequest, held: Held, node: str) -> Outcome:
    """The outcome of a claim against a live claim: it decides before anything else."""
    if request.tag and held.tag and held.tag != request.tag:
        return Outcome.FOREIGN
    if held.committed:
        return _LOST
    return _WON if held.node == node else _HELD


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """What a store holds for one firing's claim, as :meth:`~beatless.stores.base.ClaimStore.
    claim_records` reads it: who claimed it, whether it is committed, until when it lives
    (the end of the lease, or of the memory once committed, on the store's clock), and the
    live revision its claim carried."""

    node: str
    committed: bool
    until_ms: int
    revision: int | None = None
    """The :attr:`ClaimRequest.revision` of the claim that wrote the record (the last
    renewal's, for a renewed one); ``None``: not recorded (a claim without a revision, or
    a record written by a beatless that did not record it)."""


@dataclass(frozen=True, slots=True)
class Epoch:
    """The identity of a store's memory: changes when the store loses what it knew."""

    token: str
    started_ms: int
    """When the epoch record was written, on the store's clock."""


def judging(request: ClaimRequest) -> ClaimRequest:
    """The claim that asks who holds ``request``'s firing and never wins a firing nobody
    holds (see "Judging claims" in :mod:`beatless.stores.base`): the same firing and
    numbers, its occurrence at the Unix epoch, no lateness allowed, no run lease or live
    revision to check."""
    return replace(request, occurrence_ms=0, max_late_ms=0, run_id="", revision=None)
