"""The live revision a claim must not be older than: rule 6 of issue 24, in the claim.

A node's claim carries the live revision it had applied when it built the firing
(:attr:`~beatless.stores.base.ClaimRequest.revision`; ``None``: a node that does not read
live entries, never checked). The revisions of a namespace are kept notes
(:mod:`beatless.live._ledger`) of the kind :func:`revisions_kind`, one per number, and a
revision's fence is never before the previous one's. So the earliest fence of all the
revisions newer than ``r`` is the fence of revision ``r + 1``, and a claim of revision
``r`` is *stale* when revision ``r + 1`` exists and its fence is at or before the
occurrence: the node does not know a revision in force there. The store reads that one
note in the claim's own script or transaction (:func:`live_checks` lists the notes a
batch needs) and answers :attr:`~beatless.stores.base.Outcome.STALE`.

The stores read only the number after the first ``"fence_ms":`` of the note, which is
the revision's own (it is written before the changes, and a text holding those
characters is escaped). A note without one is taken as in force from the start of time:
stale, the safe side.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from beatless.stores._claims import ClaimRequest, Outcome

UNREADABLE_FENCE = -(2**63)
"""The fence of a revision note whose fence cannot be read: before every occurrence."""
_FENCE = re.compile(r'"fence_ms":(-?\d+)')


def revisions_kind(namespace: str) -> str:
    """The kind of the kept notes holding ``namespace``'s live revisions."""
    return f"beatless.live/{namespace}/revisions"


def is_revisions_kind(kind: str) -> bool:
    """Whether ``kind`` is the :func:`revisions_kind` of a namespace."""
    return kind.startswith("beatless.live/") and kind.endswith("/revisions")


def next_revision(request: ClaimRequest) -> tuple[str, str] | None:
    """The kept note (kind, key) of the revision after the claim's, ``None`` without one.
    The namespace is the first segment of the address (a namespace holds no ``/``)."""
    if request.revision is None:
        return None
    namespace = request.address.split("/", 1)[0]
    return revisions_kind(namespace), str(request.revision + 1)


def live_checks(requests: Sequence[ClaimRequest]) -> tuple[list[tuple[str, str]], list[int]]:
    """The distinct notes a batch's claims need (:func:`next_revision`), and for each
    request the number of its note among them, from 1 (``0``: none)."""
    notes: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, int], int] = {}
    """The number of each (namespace, revision) met: a batch builds each note once."""
    numbers = []
    for request in requests:
        revision = request.revision
        if revision is None:
            numbers.append(0)
            continue
        namespace = request.address.split("/", 1)[0]  # as next_revision
        number = seen.get((namespace, revision))
        if number is None:
            note = (revisions_kind(namespace), str(revision + 1))
            number = seen[namespace, revision] = notes.setdefault(note, len(notes) + 1)
        numbers.append(number)
    return list(notes), numbers


def fence_of(value: str) -> int:
    """The fence of a stored revision note (``UNREADABLE_FENCE`` when it has none)."""
    found = _FENCE.search(value)
    return UNREADABLE_FENCE if found is None else int(found.group(1))


def found_stale(
    requests: Sequence[ClaimRequest],
    outcomes: list[Outcome],
    numbers: Sequence[int],
    values: Sequence[str | None],
) -> None:
    """For a store that reads the revision notes beside its claims rather than in them
    (Redis Cluster): each won or renewed claim that is stale becomes
    :attr:`~beatless.stores.base.Outcome.STALE`, in place. ``numbers`` are
    :func:`live_checks`' numbers and ``values`` the notes it names (``None``: absent)."""
    fences = [None, *(None if v is None else fence_of(v) for v in values)]
    for i, (request, number) in enumerate(zip(requests, numbers, strict=True)):
        fence = fences[number]
        if outcomes[i].is_won and fence is not None and request.occurrence_ms >= fence:
            outcomes[i] = Outcome.STALE
