"""What a worker's run check sends and keeps: the run policy a message carries in its
header (:data:`RUN_HEADER`, ``v1|{overlap}|{lease_ms}|{heartbeat_ms}|{once}|{memory_ms}``),
the claims of a run's two records (the once-only record and the run lease), and a
:class:`Run`. The check itself, its heartbeat and its recording are
:class:`beatless.node.runs.Runs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from beatless.core.durations import to_ms
from beatless.schedule.firing import executed_id, run_lease_id
from beatless.stores.base import NEVER_LATE_MS, ClaimRequest

if TYPE_CHECKING:
    from beatless.schedule.entry import Entry

RUN_HEADER = "beatless_run"
"""The message header (Celery) or option (Dramatiq) that carries a :class:`RunPolicy`."""

RUN_RECORD_MEMORY_MS = 1_000
"""How long a released run lease is kept: it only needs to outlive the release."""

_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class RunPolicy:
    """What a worker must check for the firings of one entry; travels with the message."""

    overlap: str
    lease_ms: int
    heartbeat_ms: int
    once_only: bool
    memory_ms: int
    """How long the once-only record is remembered once the run ends."""

    @classmethod
    def of_entry(cls, entry: Entry) -> RunPolicy:
        return cls(
            overlap=entry.overlap,
            lease_ms=to_ms(entry.run_lease),
            heartbeat_ms=to_ms(entry.heartbeat),
            once_only=entry.once_only,
            memory_ms=entry.memory_ms,
        )

    @property
    def guarded(self) -> bool:
        """Whether a worker has anything to check."""
        return self.once_only or self.overlap == "skip"

    def encode(self) -> str:
        once = "1" if self.once_only else "0"
        return (
            f"{_VERSION}|{self.overlap}|{self.lease_ms}|{self.heartbeat_ms}|{once}|{self.memory_ms}"
        )

    @classmethod
    def decode(cls, text: object) -> RunPolicy | None:
        """The policy in a header, or ``None`` when the header is absent or unreadable
        (a message of an older beatless, or not a beatless firing)."""
        if not isinstance(text, str):
            return None
        parts = text.split("|")
        if len(parts) != 6 or parts[0] != _VERSION:
            return None
        _, overlap, lease, heartbeat, once, memory = parts
        try:
            return cls(overlap, int(lease), int(heartbeat), once == "1", int(memory))
        except ValueError:
            return None


@dataclass(eq=False)
class Run:
    """One task run a worker asked about: whether it may proceed, and what it holds."""

    firing_id: str
    address: str
    policy: RunPolicy
    token: str
    verdict: str
    """``run``, ``rerun``, ``unchecked`` (may proceed) or ``duplicate``, ``skipped_overlap``."""
    held: tuple[str, ...] = ()
    """Ids of the records this run holds pending: the once-only record first, if held."""
    executed: str = ""
    """The id of the once-only record, if this run holds it."""
    next_renewal: float = 0.0
    lost: bool = False
    unrecorded: str = ""
    """The id of the once-only record this run still tries to record, until the store
    answers: an ``unchecked`` run's, or the record of a checked run whose commit at its end
    could not reach the store (:attr:`commit_owed`)."""
    commit_owed: bool = False
    """The run won its once-only record at its check and ended while the store could not
    be reached: only the commit of that record is owed (:mod:`beatless.node._unchecked`)."""
    next_record: float = 0.0
    record_until: float | None = None
    """When the tries stop (monotonic): the end of the run plus the once-only memory."""
    _ended: bool = field(default=False, repr=False)

    @property
    def proceed(self) -> bool:
        return self.verdict in ("run", "rerun", "unchecked")


def _record(id_: str, address: str, now_ms: int, memory_ms: int | None) -> ClaimRequest:
    """A claim of a run's record, made now: never late; ``memory_ms`` for a once-only
    record, a short memory for a run lease. Its address is marked (``run:`` or
    ``executed:``), so that a store's list of the last firing won per address
    (``recent()``) is not taken over by the records of runs."""
    kind = "run" if memory_ms is None else "executed"
    return ClaimRequest(
        id=id_,
        address=f"{kind}:{address}",
        occurrence_ms=now_ms,
        max_late_ms=NEVER_LATE_MS,
        memory_ms=RUN_RECORD_MEMORY_MS if memory_ms is None else memory_ms,
        release_ms=now_ms,
    )


def _requests(
    firing_id: str, address: str, attempt: int, policy: RunPolicy, now_ms: int
) -> list[ClaimRequest]:
    requests = []
    if policy.once_only:
        requests.append(_record(executed_id(firing_id, attempt), address, now_ms, policy.memory_ms))
    if policy.overlap == "skip":
        requests.append(_record(run_lease_id(address), address, now_ms, None))
    return requests
