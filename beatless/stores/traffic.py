"""A memory store that counts each client's traffic: round trips, and bytes each way.

:class:`TrafficStore` is the memory store (:class:`~beatless.stores.memory.MemoryStore`,
complete, passing the store contract suite), with every call a server store would make
one round trip for counted in the :class:`Traffic` of the store object that made it.
Each :meth:`~TrafficStore.view` (another node's client) counts its own, so a simulated
fleet on one store (``bench/scale.py``) tells each node's traffic apart.

The bytes are what the call carries, not a wire format: the UTF-8 length of each text
(an id, a note's kind, key and value), 8 for a number, 1 for a flag or an outcome, each
way. They compare one version of the board with another, and one fleet size with another.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import cast

from beatless.stores.base import ClaimRecord, ClaimRequest, KeptNote, Note, Outcome
from beatless.stores.memory import MemoryStore


def size(value: object) -> int:
    """What ``value`` weighs on the wire, roughly (see the module docstring)."""
    if isinstance(value, str) and not isinstance(value, Enum):
        return len(value.encode())
    if isinstance(value, Enum | bool | int | float) or value is None:
        return 1 if not isinstance(value, int | float) or isinstance(value, bool) else 8
    if isinstance(value, Mapping):
        return sum(size(k) + size(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return sum(size(v) for v in value)
    if dataclasses.is_dataclass(value):
        return sum(size(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 8


class Traffic:
    """One client's round trips (by call) and bytes sent and received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        """Bytes sent and received, by call."""
        self.sent = 0
        self.received = 0

    def add(self, call: str, sent: int, received: int) -> None:
        with self._lock:
            self.calls[call] += 1
            self.bytes[call] += sent + received
            self.sent += sent
            self.received += received

    @property
    def round_trips(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.bytes.clear()
            self.sent = self.received = 0


class TrafficStore(MemoryStore):
    """The memory store, counting the traffic of each store object (:class:`Traffic`)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock=clock)
        self.traffic = Traffic()
        self.traffics: list[Traffic] = [self.traffic]
        """The traffic of this store object and of every view made of it, in order."""

    def view(self) -> TrafficStore:
        other = cast(TrafficStore, super().view())  # a view is of the store's own type
        other.traffic = Traffic()
        self.traffics.append(other.traffic)  # one list, shared by the views
        return other

    def _count(self, call: str, sent: object, received: object) -> None:
        self.traffic.add(call, size(sent), size(received))

    def time_ms(self) -> int:
        found = super().time_ms()
        self._count("time", None, found)
        return found

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        outcomes = super().claim(requests, node=node, lease_ms=lease_ms)
        self._count("claim", (requests, node, lease_ms), outcomes)
        return outcomes

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        found = super().claim_records(ids)
        self._count("claim_records", ids, found)
        return found

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        done = super().commit(ids, node=node, notes=notes)
        self._count("commit", (ids, node, notes), done)
        return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        super().release(ids, node=node)
        self._count("release", (ids, node), None)

    def post(self, notes: Sequence[Note]) -> None:
        super().post(notes)
        self._count("post", notes, None)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        found = super().read_notes(kinds)
        self._count("read_notes", kinds, found)
        return found

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        found = super().read_synced(kinds, kept)
        self._count("read_synced", (kinds, kept), found)
        return found

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        super().keep_notes(notes)
        self._count("keep_notes", notes, None)

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        found = super().read_kept(kind, keys)
        self._count("read_kept", (kind, keys), found)
        return found

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        super().delete_kept(kind, keys)
        self._count("delete_kept", (kind, keys), None)
