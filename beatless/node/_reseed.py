"""Re-seeding: what a node does when its claim store lost its memory.

A store restarted empty (or a promoted replica that lacks the last claims) forgets which
firings were sent. Without help, every firing released before the new epoch's start plus
the tolerance that nobody holds must be dropped: it may have been sent. But the nodes
together know what they sent. So each node keeps a :class:`Ring` of the firings it sent
(or won atomically) that some node could still claim, and its store object *holds off*
such a firing (:attr:`~beatless.stores.base.Outcome.RESEEDING`: nothing written, tried
again) rather than forgetting it. When the node sees the store's epoch change, the
:class:`Reseeder` writes the ring back (:meth:`~beatless.stores.base.ClaimStore.reseed`:
each firing committed, so no node sends it again), then posts a note for the new epoch:
who it is (name and start instant: a restarted process is another node, with an empty
ring) and which nodes it knew before the loss. A node also re-seeds when another node's
note names an epoch it has not met, and before it writes back, its store object reads
the epoch again (:meth:`~beatless.stores.base.ClaimStore.recheck_epoch`): on a store
whose epoch is made of parts, each met by a claim in it (Redis Cluster), every node then
names the same epoch, the one that covers every change so far.

The *gate* of an epoch opens on a node once every node it knew, and every node that any
re-seeded node knew, has posted its note for that epoch, and ``GRACE_MS`` has passed
since its own (for notes of nodes it did not know to arrive). Then its store object
settles the epoch: a firing still absent was sent by nobody and is claimed as new. A node
knows the nodes whose registry record it read within the reach of a claim (the longest
``max_late`` plus the tolerance) before the loss: a node last seen earlier cannot have
sent a firing still claimable. A known node that never re-seeds (it died with the store,
or was restarted) keeps the gate shut: the firings before the horizon are tried until
late and reported ``forgotten``, as without re-seeding.

Why no firing is sent twice: a node adds a firing to its ring when it is sent, before
any step after the send, and re-seeds in its loop between two dispatches, so every
firing it sent from a claim won before the loss is in the store before its note is.
A node cut off or frozen through the loss is a known node that has not re-seeded: the
gate waits for it (its own sends of claims won before the loss stop at its first failed
commit, and a claim older than half its lease is never sent).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from beatless.core._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless.errors import StoreError
from beatless.schedule.firing import Firing, claim_request
from beatless.stores.base import TOLERANCE_MS, ClaimRequest, ClaimStore, Epoch, Note, Outcome

logger = logging.getLogger(__name__)

NOTE_VERSION = 1
RESEEDED_TTL_MS = 300_000
"""How long a node's note that it re-seeded lives."""
GRACE_MS = 2_000
"""A gate opens at the earliest this long after the node's own re-seed: time for the notes
of nodes it did not know (each sync reads them, every second) to arrive."""
RING_LIMIT = 200_000
"""At most this many firings in a node's ring; the oldest go first."""
PRUNE_EVERY = 1_024
"""The ring drops what the store refuses as late once per this many firings sent."""
CHUNK = 1_000
"""Firings per re-seed call."""
HELD_TRIES = 3
HELD_PAUSE_S = 0.05
"""A firing written back that another claim holds pending is tried this many times, this
long apart, in one wake."""
RETRY_MS = 500
"""A write-back that failed (a store error, or a firing still held) is tried again after
this long."""

Instance = tuple[str, int]
"""A node as the re-seed notes name it: its name and its start instant (its registry
record's ``started_ms``): a process restarted under the same name is another."""


def reseeded_kind(namespace: str) -> str:
    return f"beatless/{namespace}/reseeded"


def _until_ms(firing: Firing) -> int:
    """Until when a node could claim ``firing``: then the store refuses it as late."""
    return firing.occurrence_ms + firing.entry.max_late_ms + TOLERANCE_MS


class Ring:
    """The firings this node sent (or won atomically) that a node could still claim: each
    kept until its occurrence is more than ``max_late`` + the tolerance behind the node's
    clock, when the store refuses it as late to everyone."""

    def __init__(self, limit: int = RING_LIMIT) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, Firing] = OrderedDict()
        """By firing id, in the order sent (its claim to write back is built only when one
        is written back: the ring is on every send's path). Ordered, so that the oldest
        go first in constant time."""
        self._added = 0
        """Firings added since the ring last dropped those the store refuses as late."""

    def add(self, firing: Firing) -> None:
        """Keep ``firing``; the oldest go when over the limit, and every ``PRUNE_EVERY``
        sends those the store refuses as late by now (:meth:`_prune`)."""
        kept = self._kept
        if firing.id in kept:
            return
        kept[firing.id] = firing
        if len(kept) > self.limit:
            kept.popitem(last=False)
        self._added += 1
        if self._added >= PRUNE_EVERY:
            self._prune(firing.occurrence_ms - TOLERANCE_MS)

    def _prune(self, horizon_ms: int) -> None:
        """Drop the oldest firings whose claim window ended before ``horizon_ms``: the
        tolerance before the occurrence of a firing just sent, which is at most the
        tolerance ahead of the store's clock (a claim of it was won), so the store's clock
        is past them, and it refuses them as late whatever the node's clock says."""
        self._added = 0
        kept = self._kept
        while kept and _until_ms(next(iter(kept.values()))) < horizon_ms:
            kept.popitem(last=False)

    def requests(self, now_ms: int) -> list[ClaimRequest]:
        """The claims of the firings still claimable by the store's rule, oldest first."""
        for id_ in [i for i, firing in self._kept.items() if _until_ms(firing) < now_ms]:
            del self._kept[id_]
        return [claim_request(firing) for firing in self._kept.values()]

    def __len__(self) -> int:
        return len(self._kept)


@dataclass(frozen=True, slots=True)
class Reseeded:
    """One node's note: it wrote back what it sent, for the epoch ``epoch``."""

    epoch: str
    node: Instance
    known: frozenset[Instance]
    count: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": NOTE_VERSION,
                "epoch": self.epoch,
                "node": list(self.node),
                "known": sorted([list(k) for k in self.known]),
                "count": self.count,
            },
            separators=(",", ":"),
        )

    @classmethod
    def of(cls, text: str) -> Reseeded | None:
        """The note in ``text``, or ``None`` for one this version cannot read."""
        try:
            data = json.loads(text)
            if data.get("v") != NOTE_VERSION:
                return None
            node = (str(data["node"][0]), int(data["node"][1]))
            known = frozenset((str(k[0]), int(k[1])) for k in data["known"])
            return cls(str(data["epoch"]), node, known, int(data.get("count", 0)))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None


def gate_open(
    epoch: str, known: Iterable[Instance], notes: Iterable[Reseeded]
) -> tuple[bool, set[Instance]]:
    """Whether every node that must re-seed for ``epoch`` did: the nodes this node knew and
    those any node that re-seeded knew. Also the nodes still awaited."""
    mine = [n for n in notes if n.epoch == epoch]
    done = {n.node for n in mine}
    required = set(known).union(*(n.known for n in mine))
    waiting = required - done
    return not waiting, waiting


class Reseeder:
    """One node's part in re-seeding (see the module docstring), run by its loop between
    two dispatches: :meth:`sent` for each firing sent, :meth:`step` at each wake."""

    def __init__(
        self,
        store: ClaimStore,
        *,
        node: Instance,
        namespace: str,
        lease_ms: int,
        reach_ms: int,
        known_since: Callable[[int], set[Instance]],
        notes: Callable[[], Mapping[str, str]],
    ) -> None:
        self.store = store
        self.node = node
        self.kind = reseeded_kind(namespace)
        self.lease_ms = lease_ms
        self.reach_ms = reach_ms
        """How long before the loss a node seen in the registry is known."""
        self._known_since = known_since
        self._notes = notes
        self.ring = Ring()
        self._token: str | None = None
        """The epoch this node last re-seeded for (or first saw)."""
        self._acted: set[str] = set()
        """Epochs named in notes that this node re-seeded for already."""
        self._known: frozenset[Instance] = frozenset()
        self._since_ms: int | None = None
        """When this node re-seeded for ``_token``; ``None``: it did not (a first sighting)."""
        self._waiting: set[Instance] = set()
        self._retry_at_ms = 0
        self._warned = WarnEvery()

    @property
    def enabled(self) -> bool:
        return self.store.reseeds

    def sent(self, firing: Firing) -> None:
        if self.store.reseeds:  # as :attr:`enabled`, on every send's path
            self.ring.add(firing)

    def step(self, now_ms: int) -> bool:
        """Re-seed if the store's epoch changed (or another node's note says it did), and
        settle it once its gate opens; whether it settled now (the loop then forgets which
        firings it saw held before the loss: a holder that sent one wrote it back)."""
        epoch = self.store.epoch
        if epoch is None or not self.store.reseeds:  # as :attr:`enabled`, on every wake
            return False
        if self._token is None:
            self._token = epoch.token  # a first sighting: nothing to write back
            return False
        if (
            epoch.token == self._token
            and not self._notes()
            and (self._since_ms is None or self.store.forgot_before_ms is None)
        ):
            return False  # nothing changed, no note, and nothing to settle (every wake)
        notes = self._read_notes()
        hinted = next((n.epoch for n in notes if self._is_news(n.epoch)), None)
        changed = epoch.token != self._token or hinted is not None
        if changed and not self._reseed(now_ms, epoch, hinted):
            return False
        return self._settle(now_ms, notes)

    def _is_news(self, token: str) -> bool:
        return token != self._token and token not in self._acted

    def _read_notes(self) -> list[Reseeded]:
        return [n for text in self._notes().values() if (n := Reseeded.of(text)) is not None]

    def _reseed(self, now_ms: int, seen: Epoch, hinted: str | None) -> bool:
        """Write the ring back and post this node's note; whether it was done (a store
        error is told, and the next wake tries again)."""
        if now_ms < self._retry_at_ms:
            return False
        requests = self.ring.requests(now_ms)
        known = frozenset(self._known_since(now_ms - self.reach_ms) | {self.node})
        try:
            self.store.recheck_epoch()  # every change so far, one a note told of too
            held = self._write_back(requests)
            if held:
                self._retry_at_ms = now_ms + RETRY_MS
                if self._warned.allows("reseed-held", 10_000, now_ms):
                    logger.warning(
                        "node %s: the claim store lost its memory; %d firing(s) this node "
                        "sent are held pending by another claim and could not be written "
                        "back yet (first: %s): tried again in %d ms, and until then firings "
                        "released before the loss wait",
                        shown(self.node[0], quoted=False),
                        len(held),
                        held[0],
                        RETRY_MS,
                    )
                return False
            epoch = self.store.epoch or seen
            # The epoch the store object adopted, unless only a note told of a newer one.
            stale = not requests and epoch.token == self._token and hinted is not None
            token = hinted if stale and hinted is not None else epoch.token
            note = Reseeded(token, self.node, known, len(requests))
            self.store.post([Note(self.kind, self.node[0], note.to_json(), RESEEDED_TTL_MS)])
        except StoreError as exc:
            self._retry_at_ms = now_ms + RETRY_MS
            if self._warned.allows("reseed", 10_000, now_ms):
                logger.warning(
                    "node %s: the claim store lost its memory; writing back the %d firing(s) "
                    "this node sent failed (%s): tried again at the next wake",
                    shown(self.node[0], quoted=False),
                    len(requests),
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )
            return False
        self._acted.update(t for t in (token, hinted) if t is not None)
        self._token, self._known, self._since_ms = token, known, now_ms
        logger.warning(
            "node %s: the claim store lost its memory (epoch %s): wrote back the %d firing(s) "
            "this node sent that could still be claimed; firings nobody holds that were "
            "released before the loss wait until every node it knew (%s) has done the same",
            shown(self.node[0], quoted=False),
            token[:12],
            len(requests),
            ", ".join(sorted(shown(n, quoted=False) for n, _ in known)),
        )
        return True

    def _write_back(self, requests: list[ClaimRequest]) -> list[str]:
        """Write ``requests`` back; the ids still held pending by another claim after a
        few tries (a claim that holds off on a store that must take a slot to answer, or
        a node that never saw the old epoch): not written, so the note must wait."""
        held = []
        for start in range(0, len(requests), CHUNK):
            chunk = requests[start : start + CHUNK]
            for attempt in range(HELD_TRIES):
                outcomes = self.store.reseed(chunk, node=self.node[0], lease_ms=self.lease_ms)
                chunk = [r for r, o in zip(chunk, outcomes, strict=True) if o is Outcome.HELD]
                if not chunk:
                    break
                if attempt + 1 < HELD_TRIES:
                    time.sleep(HELD_PAUSE_S)
            held += [r.id for r in chunk]
        return held

    def _settle(self, now_ms: int, notes: list[Reseeded]) -> bool:
        epoch = self.store.epoch
        if (
            epoch is None
            or self.store.forgot_before_ms is None
            or epoch.token != self._token
            or self._since_ms is None
            or now_ms - self._since_ms < GRACE_MS
        ):
            return False
        done, waiting = gate_open(epoch.token, self._known, notes)
        if not done:
            if waiting != self._waiting:
                self._waiting = waiting
                logger.info(
                    "node %s: epoch %s: firings released before the loss wait for node(s) %s "
                    "to write back what they sent",
                    shown(self.node[0], quoted=False),
                    epoch.token[:12],
                    ", ".join(sorted(shown(n, quoted=False) for n, _ in waiting)),
                )
            return False
        if not self.store.settle(epoch):
            return False
        self._waiting = set()
        logger.warning(
            "node %s: epoch %s: every node wrote back what it sent; firings released before "
            "the loss that nobody holds are claimed again",
            shown(self.node[0], quoted=False),
            epoch.token[:12],
        )
        return True
