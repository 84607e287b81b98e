"""Firing ids, offsets and releases: the arithmetic every node must agree on.

For an address ``A`` and an occurrence at ``T`` integer Unix epoch milliseconds::

    d         = sha256(f"{A}@{T}".encode("utf-8")).digest()
    id        = str(uuid.UUID(bytes=d[:16]))
    lead53    = int.from_bytes(d[:8], "big") >> 11
    offset_ms = (window_ms * lead53) >> 53
    release   = T + offset_ms

The id, the claim key and the occurrence handed to the task never depend on the jitter
window; only the release does. Changing a jitter therefore never re-fires anything.

A trigger whose occurrences come from floating-point astronomy
(:class:`~beatless.core.solar.Solar`) gives each occurrence a key (``sunrise/2026-06-21``)
that stands for ``T`` in the digest (:func:`~beatless.core.triggers.occurrence_key`):
nodes that compute the instant a millisecond apart derive the same id and offset.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from beatless.core._time import EPOCH, from_datetime, iso, to_datetime
from beatless.core.triggers import occurrence_key
from beatless.stores.base import ClaimRequest

if TYPE_CHECKING:
    from beatless.schedule.entry import Entry

__all__ = [
    "EPOCH",
    "Decision",
    "Firing",
    "claim_request",
    "digest",
    "executed_id",
    "firing_id",
    "from_datetime",
    "id_from_digest",
    "iso",
    "offset_from_digest",
    "offset_ms",
    "run_lease_id",
    "to_datetime",
]


def digest(address: str, occurrence: int | str) -> bytes:
    """SHA-256 of ``"{address}@{occurrence}"``: the material of the id and the offset.
    ``occurrence`` is the occurrence in epoch ms, or its key where its trigger gives one
    (:func:`~beatless.core.triggers.occurrence_key`)."""
    return hashlib.sha256(f"{address}@{occurrence}".encode()).digest()


def firing_id(address: str, occurrence: int | str) -> str:
    """The firing id: the first 16 bytes of the digest, written as a UUID."""
    return id_from_digest(digest(address, occurrence))


def run_lease_id(address: str) -> str:
    """The id of an address's run-lease record: held while a run of it is in progress."""
    return id_from_digest(hashlib.sha256(f"run|{address}".encode()).digest())


def executed_id(firing_id: str, attempt: int = 0) -> str:
    """The id of the record that a firing's ``attempt`` (a framework retry is the next
    attempt) was executed: a second copy of the same attempt is refused."""
    return id_from_digest(hashlib.sha256(f"executed|{firing_id}|{attempt}".encode()).digest())


def missed_id(firing_id: str) -> str:
    """The id of the record that says a firing was found missed: the node that wins it
    is the one in the fleet that counts, logs and records it."""
    return id_from_digest(hashlib.sha256(f"missed|{firing_id}".encode()).digest())


def manual_id(address: str, request: str) -> str:
    """The id of the manual firing a run-now ``request`` makes of ``address``: never a
    scheduled firing's id."""
    return id_from_digest(hashlib.sha256(f"manual|{address}|{request}".encode()).digest())


def id_from_digest(d: bytes) -> str:
    """``str(uuid.UUID(bytes=d[:16]))``, written out: it is on every firing's path."""
    h = d[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def offset_from_digest(d: bytes, window_ms: int) -> int:
    """``window_ms × (leading 53 bits of the digest / 2**53)``, in exact integer arithmetic."""
    lead53 = int.from_bytes(d[:8], "big") >> 11
    return (window_ms * lead53) >> 53


def offset_ms(address: str, occurrence: int | str, window_ms: int) -> int:
    """The release offset of one firing inside a jitter window of ``window_ms``."""
    return offset_from_digest(digest(address, occurrence), window_ms)


@dataclass(frozen=True, slots=True)
class Firing:
    """One occurrence of one address: what a node claims and enqueues."""

    entry: Entry
    tenant: str | None
    address: str
    occurrence_ms: int
    id: str
    offset_ms: int
    manual: bool = False
    """A run-now firing (:mod:`beatless.fleet._controls`): its id is not the scheduled one's."""

    @classmethod
    def of(cls, entry: Entry, tenant: str | None, address: str, occurrence_ms: int) -> Firing:
        d = digest(address, occurrence_key(entry.trigger, occurrence_ms))
        return cls(
            entry=entry,
            tenant=tenant,
            address=address,
            occurrence_ms=occurrence_ms,
            id=id_from_digest(d),
            offset_ms=offset_from_digest(d, entry.jitter_ms),
        )

    @property
    def release_ms(self) -> int:
        return self.occurrence_ms + self.offset_ms

    @property
    def occurrence(self) -> datetime:
        return to_datetime(self.occurrence_ms)

    @property
    def release(self) -> datetime:
        return to_datetime(self.release_ms)


def claim_request(firing: Firing, revision: int | None = None) -> ClaimRequest:
    """The claim of ``firing``, with the numbers of its entry the store judges it by;
    ``revision``: the live revision the node had applied (``None``: no live check)."""
    entry = firing.entry
    return ClaimRequest(
        id=firing.id,
        address=firing.address,
        occurrence_ms=firing.occurrence_ms,
        max_late_ms=entry.max_late_ms,
        memory_ms=entry.memory_ms,
        release_ms=firing.release_ms,
        tag=entry.task_tag,
        run_id=run_lease_id(firing.address) if entry.overlap == "skip" else "",
        revision=revision,
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """What this node decided for one firing, and how late after its release."""

    firing: Firing
    outcome: str
    """A :class:`~beatless.schedule.outcomes.DecisionOutcome` (``won``, ``late``, ...; each
    is described there), equal to its string."""
    node: str
    lateness_ms: int
