"""A complete in-memory claim store for one process: tests, single-node use, examples."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from beatless.stores.base import ClaimRequest, ClaimStore, Outcome, judge


@dataclass(slots=True)
class _Claim:
    node: str
    committed: bool
    until_ms: int
    memory_ms: int


def _forget_at(claim: _Claim) -> int:
    """A pending claim is kept past its lease so that a takeover is reported as one."""
    return claim.until_ms + (0 if claim.committed else claim.memory_ms)


class MemoryStore(ClaimStore):
    """Claims in a dict guarded by a lock; the store's clock is ``clock`` (``time.time``).

    Expired claims are swept as the store is used, oldest first from a heap of expiry
    instants, so memory stays bounded by the firings of the last ``memory_ms`` (twice
    that for a pending claim whose winner never committed) and a sweep costs only what
    it removes.
    """

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._expiry: list[tuple[int, str]] = []

    def _now_ms(self) -> int:
        return int(self._clock() * 1_000)

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        with self._lock:
            now = self._now_ms()
            self._sweep(now)
            return [self._claim_one(r, node, lease_ms, now) for r in requests]

    def _claim_one(self, request: ClaimRequest, node: str, lease_ms: int, now: int) -> Outcome:
        held = self._claims.get(request.id)
        outcome = judge(request, held, node, now)
        if outcome.is_won:
            claim = _Claim(node, False, now + lease_ms, request.memory_ms)
            self._claims[request.id] = claim
            self._expire_at(claim, request.id)
        return outcome

    def commit(self, ids: Sequence[str], *, node: str) -> list[bool]:
        with self._lock:
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
            return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        with self._lock:
            for id_ in ids:
                held = self._claims.get(id_)
                if held is not None and held.node == node and not held.committed:
                    del self._claims[id_]

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
