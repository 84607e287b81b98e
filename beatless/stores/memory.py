"""A complete in-memory claim store for one process: tests, single-node use, examples."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from beatless.stores._epoch import adopt, horizon_ms, new_token
from beatless.stores._fences import fence_of, is_revisions_kind, live_checks
from beatless.stores.base import (
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    Epoch,
    KeptNote,
    Note,
    Outcome,
    judge,
)

logger = logging.getLogger(__name__)

_WRITTEN_UNWON = frozenset({Outcome.OVERLAP, Outcome.FORGOTTEN})
"""The outcomes not won that a claim writes, as a module name: an Enum class's attribute
is a slow look-up on Python 3.11, and every claim asks."""

NOTES_SWEEP_EVERY_MS = 60_000
"""How often a post also drops the expired notes of every kind, read or not."""


@dataclass(slots=True)
class _Claim:
    node: str
    committed: bool
    until_ms: int
    memory_ms: int
    tag: str
    revision: int | None = None


@dataclass(slots=True)
class _Shared:
    """What every view of one memory store shares beside its dicts: the epoch."""

    epoch: Epoch


def _forget_at(claim: _Claim) -> int:
    """A pending claim is kept past its lease so that a takeover is reported as one."""
    return claim.until_ms + (0 if claim.committed else claim.memory_ms)


class MemoryStore(ClaimStore):
    """Claims in a dict guarded by a lock; the store's clock is ``clock`` (``time.time``).

    Expired claims are swept as the store is used, oldest first from a heap of expiry
    instants, so memory stays bounded by the firings of the last ``memory_ms`` (twice
    that for a pending claim whose winner never committed) and a sweep costs only what
    it removes.

    The store loses its memory only when told (:meth:`lose_memory`, as a server restarted
    empty would); every object of it is then another store object that saw the old epoch,
    so it is one store shared by the nodes of one process, each through a view of its own
    (:meth:`view`), which follows the epoch as a server store's object does.
    """

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._expiry: list[tuple[int, str]] = []
        self._shared = _Shared(Epoch(new_token(), self._now_ms()))
        self._notes: dict[str, dict[str, tuple[int, str]]] = {}
        """Per kind, per key: (expires at, value)."""
        self._notes_swept_ms = 0
        self._kept: dict[str, dict[str, str]] = {}
        """Kept notes, per kind, per key: the value."""

    def __repr__(self) -> str:
        return "MemoryStore()"

    def _now_ms(self) -> int:
        return int(self._clock() * 1_000)

    def time_ms(self) -> int:
        return self._now_ms()

    def probe(self) -> None:
        """Nothing to connect to: a memory store is always there."""

    reseeds = True

    def view(self) -> MemoryStore:
        """Another store object of the same claims and notes, with an epoch, a horizon and
        :attr:`holds_off` of its own: another node's client, as a server store's would be."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.epoch, other._forgot_before_ms, other.holds_off = None, None, False
        return other

    def lose_memory(self) -> None:
        """Forget every claim and note and begin a new epoch, as a server restarted empty
        does (a test of the identity rule, or a process that starts afresh)."""
        with self._lock:
            self._claims.clear()
            self._expiry.clear()
            self._notes.clear()
            self._shared.epoch = Epoch(new_token(), self._now_ms())

    @property
    def _epoch(self) -> Epoch:
        return self._shared.epoch

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        with self._lock:
            now = self._now_ms()
            self._sweep(now)
            current = self._epoch
            horizon = horizon_ms(self.epoch, current, self._forgot_before_ms)
            fences = self._fences(requests)
            outcomes = [
                self._claim_one(
                    r, node, lease_ms, now, horizon=horizon, hold_off=hold_off, fence=fence
                )
                for r, fence in zip(requests, fences, strict=True)
            ]
            adopt(self, current, logger=logger, label="memory store", horizon=horizon)
            return outcomes

    def _claim_one(
        self,
        request: ClaimRequest,
        node: str,
        lease_ms: int,
        now: int,
        *,
        horizon: int | None,
        hold_off: bool,
        fence: int | None,
    ) -> Outcome:
        held = self._claims.get(request.id)
        running = self._claims.get(request.run_id) if request.run_id else None
        outcome = judge(
            request,
            held,
            node,
            now,
            horizon,
            running=running,
            hold_off=hold_off,
            next_fence_ms=fence,
        )
        revision = request.revision
        if outcome.is_won:
            claim = _Claim(node, False, now + lease_ms, request.memory_ms, request.tag, revision)
        elif outcome in _WRITTEN_UNWON:
            until = now + request.memory_ms
            claim = _Claim(node, True, until, request.memory_ms, request.tag, revision)
        else:
            return outcome
        self._claims[request.id] = claim
        self._expire_at(claim, request.id)
        return outcome

    checks_revisions = True

    def _fences(self, requests: Sequence[ClaimRequest]) -> list[int | None]:
        """Per request, the fence of the live revision after its own (``None``: none)."""
        if not any(is_revisions_kind(kind) for kind in self._kept):
            return [None] * len(requests)  # no revision kept: none is newer than a claim's
        notes, numbers = live_checks(requests)
        fences: list[int | None] = [None]
        for kind, key in notes:
            value = self._kept.get(kind, {}).get(key)
            fences.append(None if value is None else fence_of(value))
        return [fences[number] for number in numbers]

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        with self._lock:
            held = ((id_, self._claims.get(id_)) for id_ in ids)
            return {
                id_: ClaimRecord(c.node, c.committed, c.until_ms, c.revision)
                for id_, c in held
                if c is not None
            }

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        with self._lock:
            self._post(notes)
            now = self._now_ms()
            done = []
            for id_ in ids:
                held = self._claims.get(id_)
                mine = held is not None and held.node == node and held.until_ms >= now
                if held is not None and mine:
                    held.committed = True
                    held.until_ms = now + held.memory_ms
                    self._expire_at(held, id_)
                done.append(mine)
            if self.epoch is None:  # a commit never adopts a changed epoch
                self.epoch = self._epoch
            return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        with self._lock:
            now = self._now_ms()
            for id_ in ids:
                held = self._claims.get(id_)
                if held is not None and held.node == node and not held.committed:
                    held.until_ms = min(held.until_ms, now - 1)
                    self._expire_at(held, id_)

    def post(self, notes: Sequence[Note]) -> None:
        with self._lock:
            self._post(notes)

    def _post(self, notes: Sequence[Note]) -> None:
        if not notes:
            return
        now = self._now_ms()
        bounds: dict[str, int] = {}
        for note in notes:
            self._notes.setdefault(note.kind, {})[note.key] = (now + note.ttl_ms, note.value)
            if note.keep:
                bounds[note.kind] = note.keep
        if now - self._notes_swept_ms > NOTES_SWEEP_EVERY_MS:
            self._notes_swept_ms = now
            for kind in list(self._notes):
                self._live(kind, now)
        for kind, keep in bounds.items():
            kept = self._live(kind, now)
            if len(kept) > keep:
                by_expiry = sorted(kept.items(), key=lambda item: item[1][0])
                for key, _ in by_expiry[: len(kept) - keep]:
                    del kept[key]

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        with self._lock:
            now = self._now_ms()
            return {
                kind: {key: value for key, (_, value) in self._live(kind, now).items()}
                for kind in kinds
            }

    def _live(self, kind: str, now: int) -> dict[str, tuple[int, str]]:
        """The notes of ``kind``, with those whose time ran out removed."""
        notes = self._notes.get(kind)
        if notes is None:
            return {}
        for key in [key for key, (until, _) in notes.items() if until < now]:
            del notes[key]
        if not notes:
            del self._notes[kind]
        return notes

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """Both under one lock."""
        with self._lock:
            now = self._now_ms()
            notes = {kind: {k: v for k, (_, v) in self._live(kind, now).items()} for kind in kinds}
            found = {
                kind: {
                    key: self._kept[kind][key] for key in keys if key in self._kept.get(kind, {})
                }
                for kind, keys in kept.items()
            }
            return notes, found

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        with self._lock:
            for note in notes:
                self._kept.setdefault(note.kind, {})[note.key] = note.value

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        with self._lock:
            kept = self._kept.get(kind, {})
            if keys is None:
                return dict(kept)
            return {key: kept[key] for key in keys if key in kept}

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        with self._lock:
            kept = self._kept.get(kind, {})
            for key in keys:
                kept.pop(key, None)
            if not kept:
                self._kept.pop(kind, None)

    def _expire_at(self, claim: _Claim, id_: str) -> None:
        heapq.heappush(self._expiry, (_forget_at(claim), id_))

    def _sweep(self, now: int) -> None:
        while self._expiry and self._expiry[0][0] < now:
            _, id_ = heapq.heappop(self._expiry)
            claim = self._claims.get(id_)
            if claim is not None and _forget_at(claim) < now:
                del self._claims[id_]

    def __len__(self) -> int:
        return len(self._claims)
