"""A complete in-memory claim store for one process: tests, single-node use, examples."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from beatless.stores._epoch import new_token
from beatless.stores.base import (
    ClaimRequest,
    ClaimStore,
    Epoch,
    KeptNote,
    Note,
    Outcome,
    judge,
)

NOTES_SWEEP_EVERY_MS = 60_000
"""How often a post also drops the expired notes of every kind, read or not."""


@dataclass(slots=True)
class _Claim:
    node: str
    committed: bool
    until_ms: int
    memory_ms: int
    tag: str


def _forget_at(claim: _Claim) -> int:
    """A pending claim is kept past its lease so that a takeover is reported as one."""
    return claim.until_ms + (0 if claim.committed else claim.memory_ms)


class MemoryStore(ClaimStore):
    """Claims in a dict guarded by a lock; the store's clock is ``clock`` (``time.time``).

    Expired claims are swept as the store is used, oldest first from a heap of expiry
    instants, so memory stays bounded by the firings of the last ``memory_ms`` (twice
    that for a pending claim whose winner never committed) and a sweep costs only what
    it removes.

    The store cannot lose its memory while it exists, so its epoch is fixed when it is
    created and no claim is ever :attr:`~beatless.stores.base.Outcome.FORGOTTEN`.
    """

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._expiry: list[tuple[int, str]] = []
        self._epoch = Epoch(new_token(), self._now_ms())
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

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        with self._lock:
            now = self._now_ms()
            self._sweep(now)
            outcomes = [self._claim_one(r, node, lease_ms, now) for r in requests]
            self.epoch = self._epoch
            return outcomes

    def _claim_one(self, request: ClaimRequest, node: str, lease_ms: int, now: int) -> Outcome:
        held = self._claims.get(request.id)
        running = self._claims.get(request.run_id) if request.run_id else None
        outcome = judge(request, held, node, now, running=running)
        if outcome.is_won:
            claim = _Claim(node, False, now + lease_ms, request.memory_ms, request.tag)
        elif outcome is Outcome.OVERLAP:
            claim = _Claim(node, True, now + request.memory_ms, request.memory_ms, request.tag)
        else:
            return outcome
        self._claims[request.id] = claim
        self._expire_at(claim, request.id)
        return outcome

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
