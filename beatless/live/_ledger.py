"""Where a namespace's revisions live in the store, and how a writer commits one.

Kept notes (:class:`~beatless.stores.base.KeptNote`, no time to live), two kinds:

``beatless.live/{namespace}/revisions``
    key ``{number}`` (and ``{number}.{part}`` for a revision over one note): the revision
    as JSON (:meth:`~beatless.live.revisions.Revision.to_json`; a split one says
    ``"parts": n`` in its first note and each further note holds ``{"changes": [...]}``),
    written once and never changed.
``beatless.live/{namespace}/head``
    key ``head``: ``{"v": 1, "number": n}``, the last revision committed. It may lag (a
    writer that died after its commit): a reader follows the revisions past it until one
    is missing, so the head is a hint, the revisions are the truth.

A writer (:func:`commit`):

1. reads the latest revision ``h`` (head, then forward);
2. claims number ``h + 1`` with the store's own exactly-once claim: a
   :class:`~beatless.stores.base.ClaimRequest` whose id is the SHA-256 of
   ``{namespace}/.live/revision@{n}``, never late, remembered ``REVISION_MEMORY_MS``,
   pending for ``LEASE_MS``. Two writers never both win a number. ``held`` (another writer
   is at it) waits and reads again; ``lost`` (committed by another) reads again;
3. reads the store's clock, writes the revision note(s), checking first that its claim
   is younger than half the lease (as a node checks before it enqueues) and that the
   clock read is less than ``READ_SLACK_MS / 2`` old; when either is not, it releases
   the number, writes nothing, and goes back to 1 (until its deadline);
4. commits the claim, then writes the head.

A writer that dies after its claim and before its commit leaves a pending claim whose
lease runs out: the next writer takes the number over (``takeover``) and writes its
own revision under it. Readers read only numbers at or below a committed one's (the
head points only at committed revisions, and a reader follows past it only to notes
that were written before their claim's commit or by a later takeover of it).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from beatless.errors import BeatlessError, StaleRevision, StoreError
from beatless.live.codec import dumps
from beatless.live.revisions import Change, Revision, content_hash
from beatless.stores._fences import revisions_kind
from beatless.stores.base import (
    NEVER_LATE_MS,
    NOTE_VALUE_LIMIT,
    TOLERANCE_MS,
    ClaimRequest,
    ClaimStore,
    KeptNote,
    Outcome,
)

LEASE_MS = 30_000
"""How long a writer holds its revision number pending before its commit."""
REVISION_MEMORY_MS = 30 * 86_400_000
"""How long the store remembers a committed revision number: far longer than a writer
takes between its claim and its head (a store that forgets sooner, NATS with its
window, is still right: a forgotten number is below the head)."""
PROPAGATION_MS = 2_000
"""The propagation bound: no revision's fence is sooner than its commit + this, on the
store's clock (the writer refuses a sooner one, and :func:`Ledger.commit` never writes
one). A node claims an occurrence ``o`` only after a read of the head that began later
than ``o - PROPAGATION_MS + READ_SLACK_MS``, so it knows every revision in force at
``o`` (rule 6 of issue 24, on every store)."""
READ_SLACK_MS = 500
"""The part of the propagation bound left for a writer's note to become visible after
it read the store's clock for its commit instant (one round trip; a writer slower than
this between the two gives up and writes nothing) and for the error of a node's
measured offset to the store's clock."""
WAIT_S = 0.05
FORWARD = 8
"""Revisions a reader looks for past the head in one round trip."""
HEAD_VERSION = 1


class _TooSlow(StoreError):
    """A writer took too long between its claim or its clock read and its write: it wrote
    nothing and released its number, so :meth:`Ledger.commit` tries again (and raises
    this past its deadline)."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """A namespace's revisions in one store."""

    store: ClaimStore
    namespace: str

    @property
    def revisions_kind(self) -> str:
        return revisions_kind(self.namespace)  # where the stores read a claim's next fence

    @property
    def head_kind(self) -> str:
        return f"beatless.live/{self.namespace}/head"

    @property
    def address(self) -> str:
        return f"{self.namespace}/.live/revision"

    def claim_id(self, number: int) -> str:
        return hashlib.sha256(f"{self.address}@{number}".encode()).hexdigest()

    # -- reading -----------------------------------------------------------------------

    def latest(self) -> int:
        """The last revision number: the head, followed forward while revisions exist."""
        found = self.store.read_kept(self.head_kind, ["head"]).get("head")
        number = int(json.loads(found)["number"]) if found else 0
        while True:
            ahead = [str(n) for n in range(number + 1, number + 1 + FORWARD)]
            present = self.store.read_kept(self.revisions_kind, ahead)
            step = 0
            while str(number + step + 1) in present:
                step += 1
            number += step
            if step < FORWARD:
                return number

    def read(self, numbers: Sequence[int]) -> list[Revision]:
        """The revisions numbered ``numbers`` (those that exist), in number order."""
        if not numbers:
            return []
        firsts = self.store.read_kept(self.revisions_kind, [str(n) for n in numbers])
        found = {int(k): json.loads(v) for k, v in firsts.items()}
        extra = [f"{n}.{p}" for n, d in found.items() for p in range(1, int(d.get("parts", 1)))]
        rest = self.store.read_kept(self.revisions_kind, extra) if extra else {}
        revisions = []
        for number in sorted(found):
            data = found[number]
            for part in range(1, int(data.get("parts", 1))):
                data["changes"] += json.loads(rest[f"{number}.{part}"])["changes"]
            revisions.append(Revision.from_json(data))
        return revisions

    # -- writing -----------------------------------------------------------------------

    def commit(
        self,
        changes: Sequence[Change],
        *,
        writer: str,
        host: str,
        note: str,
        fence: Any,
        if_revision: int | None,
        node: str,
    ) -> Revision:
        """Write ``changes`` as the next revision (see the module docstring); ``fence`` is
        a callable ``(committed_ms, last fence) -> fence_ms``."""
        deadline = time.monotonic() + LEASE_MS / 1_000 + 5
        while True:
            head = self.latest()
            refuse_stale(self.namespace, if_revision, head)
            number = head + 1
            claimed = time.monotonic()
            outcome = self._claim(number, node)
            if outcome.is_won:
                try:
                    return self._write(
                        number,
                        changes,
                        writer=writer,
                        host=host,
                        note=note,
                        fence=fence,
                        node=node,
                        claimed=claimed,
                    )
                except _TooSlow:
                    if time.monotonic() > deadline:
                        raise
                    continue  # nothing was written and the number was released
            if outcome is Outcome.RESEEDING:
                raise StoreError(
                    f"live entries of {self.namespace!r}: the store lost its memory (a restart "
                    f"empty) less than {TOLERANCE_MS // 1_000} s ago, so revision {number} "
                    f"may have been claimed before it; nothing was written, try again in a "
                    f"few seconds"
                )
            if outcome not in (Outcome.HELD, Outcome.LOST):
                raise StoreError(
                    f"live entries of {self.namespace!r}: claiming revision {number} was "
                    f"answered {outcome.value}; nothing was written"
                )
            if time.monotonic() > deadline:
                raise StoreError(
                    f"live entries of {self.namespace!r}: revision {number} stayed held by "
                    f"another writer; nothing was written"
                )
            if outcome is Outcome.HELD:
                time.sleep(WAIT_S)

    def _claim(self, number: int, node: str) -> Outcome:
        now = self.store.time_ms()
        request = ClaimRequest(
            id=self.claim_id(number),
            address=self.address,
            occurrence_ms=now,
            max_late_ms=NEVER_LATE_MS,
            memory_ms=REVISION_MEMORY_MS,
            release_ms=now,
        )
        # Held off: a number the store forgot is never written committed without a
        # revision (which would refuse it to every writer for REVISION_MEMORY_MS).
        return self.store.claim_held_off([request], node=node, lease_ms=LEASE_MS)[0]

    def _write(
        self,
        number: int,
        changes: Sequence[Change],
        *,
        writer: str,
        host: str,
        note: str,
        fence: Any,
        node: str,
        claimed: float,
    ) -> Revision:
        previous = self.read([number - 1]) if number > 1 else []
        last_fence = previous[0].fence_ms if previous else 0
        # Everything that grows with the changes is done before the clock is read: their
        # JSON, their hash and how they are split into notes (100,000 entries take seconds).
        changes = tuple(changes)
        texts = [dumps(change.to_json()) for change in changes]
        digest = content_hash(changes)
        sketch = Revision(number, (), -(10**15), -(10**15), writer, host, note, "0" * 64)
        parts = self._split(sketch, changes, texts)
        rest = [
            KeptNote(self.revisions_kind, f"{number}.{index}", '{"changes":[' + part + "]}")
            for index, part in enumerate(parts[1:], start=1)
        ]
        read_at = time.monotonic()
        now = self.store.time_ms()
        revision = Revision(
            number=number,
            changes=changes,
            committed_ms=now,
            fence_ms=max(int(fence(now)), last_fence, now + PROPAGATION_MS),
            writer=writer,
            host=host,
            note=note,
            hash=digest,
        )
        notes = [self._first_note(revision, parts), *rest]
        if time.monotonic() - claimed > LEASE_MS / 2_000:
            self.store.release([self.claim_id(number)], node=node)
            raise _TooSlow(
                f"live entries of {self.namespace!r}: revision {number} was claimed too long "
                f"ago to be written safely; nothing was written, try again"
            )
        if time.monotonic() - read_at > READ_SLACK_MS / 2_000:
            self.store.release([self.claim_id(number)], node=node)
            raise _TooSlow(
                f"live entries of {self.namespace!r}: revision {number} took over "
                f"{READ_SLACK_MS // 2} ms between its commit instant and its write; nothing "
                f"was written, try again"
            )
        self.store.keep_notes(notes)
        if not self.store.commit([self.claim_id(number)], node=node)[0]:
            raise BeatlessError(
                f"live entries of {self.namespace!r}: revision {number} was taken over by "
                f"another writer before this one committed it; read the revisions again"
            )
        head = dumps({"v": HEAD_VERSION, "number": number})
        self.store.keep_notes([KeptNote(self.head_kind, "head", head)])
        return revision

    def _split(
        self, sketch: Revision, changes: Sequence[Change], texts: Sequence[str]
    ) -> list[str]:
        """The changes' JSON ``texts``, joined into the parts of a revision's notes, each
        under ``NOTE_VALUE_LIMIT`` with the revision's other fields as ``sketch`` has
        them (its instants longer than any the clock gives): one part when the whole
        revision fits in one note."""
        widest = sketch.meta_json() | {"parts": 99999}
        room = NOTE_VALUE_LIMIT - len(dumps(widest).encode())
        whole = sum(len(text.encode()) + 1 for text in texts)
        if whole + len(',"changes":[]') <= room:
            return [",".join(texts)]
        parts: list[list[str]] = [[]]
        size = len('{"changes":[]}')
        for change, text in zip(changes, texts, strict=True):
            cost = len(text.encode()) + 1
            if cost + size > room:
                if not parts[-1]:
                    raise StoreError(
                        f"live entry {change.name!r} is {cost} bytes as JSON, over the "
                        f"{NOTE_VALUE_LIMIT} a store note holds"
                    )
                parts.append([])
                size = len('{"changes":[]}')
            parts[-1].append(text)
            size += cost
        return [",".join(part) for part in parts]

    def _first_note(self, revision: Revision, parts: Sequence[str]) -> KeptNote:
        """The revision's note (its first, with ``"parts": n``, when its changes were
        split by :meth:`_split`; the notes ``{number}.{part}`` hold the others)."""
        meta = revision.meta_json() | ({"parts": len(parts)} if len(parts) > 1 else {})
        text = dumps(meta)[:-1] + ',"changes":[' + parts[0] + "]}"
        return KeptNote(self.revisions_kind, str(revision.number), text)


def refuse_stale(namespace: str, if_revision: int | None, head: int) -> None:
    """Raise :class:`~beatless.errors.StaleRevision` unless a change based on
    ``if_revision`` (``None``: on any) may follow ``head``, the current revision."""
    if if_revision is not None and if_revision != head:
        raise StaleRevision(
            f"live entries of {namespace!r}: the change was based on revision {if_revision}, "
            f"but the current revision is {head}; read it again and retry",
            current=head,
        )
