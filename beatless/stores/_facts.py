"""What a store's server settings mean for its claims: each setting read (:class:`Fact`),
judged (:class:`Verdict`), and a store's together (:class:`StoreFacts`). See "What the
store remembers" in :mod:`beatless.stores.base`, which re-exports these names."""

from __future__ import annotations

import enum
from dataclasses import dataclass

UNKNOWN = "unknown"
"""The value of a setting that nothing answered for (a managed Redis that renames
``CONFIG``, a server that cannot be reached)."""


class Verdict(enum.Enum):
    """What a store's setting means for the claims: see "What the store remembers" in
    :mod:`beatless.stores.base`."""

    OK = "ok"
    WARN = "warn"
    """The store keeps the contract, but a fault (a restart, a failover) costs firings,
    or the setting could not be read."""
    REFUSE = "refuse"
    """The store cannot keep the contract: nodes do not claim from it."""

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Verdict.OK: 0, Verdict.WARN: 1, Verdict.REFUSE: 2}


@dataclass(frozen=True, slots=True)
class Fact:
    """One setting of a store that decides whether a claim survives, as read, judged."""

    name: str
    """The setting as the server names it: ``maxmemory-policy``, ``synchronous_commit``."""
    value: str
    """Its value as read, or :data:`UNKNOWN`."""
    verdict: Verdict = Verdict.OK
    why: str = ""
    """For a ``warn`` or ``refuse``: what the setting costs, and what to change."""


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """What :meth:`~beatless.stores.base.ClaimStore.facts` read: the store's settings,
    each judged."""

    store: str
    """The store as messages name it, its URL masked: ``redis store redis://host:6379/0``."""
    facts: tuple[Fact, ...] = ()
    usage: str | None = None
    """How full the store is, where it has a limit: ``used_memory 7.9 MB of maxmemory
    8.0 MB (99%)``."""

    @property
    def verdict(self) -> Verdict:
        """The worst verdict of the facts; ``ok`` for a store with none to read."""
        return max((f.verdict for f in self.facts), key=lambda v: v.rank, default=Verdict.OK)

    def fact(self, name: str) -> Fact | None:
        return next((f for f in self.facts if f.name == name), None)

    def refusal(self) -> str | None:
        """One line naming each refused setting, its value and the fix; ``None`` if none."""
        refused = [f for f in self.facts if f.verdict is Verdict.REFUSE]
        if not refused:
            return None
        return f"{self.store}: " + "; ".join(f"{f.name} {f.value}: {f.why}" for f in refused)

    def updated(self, fresh: StoreFacts) -> StoreFacts:
        """These facts, each one ``fresh`` read again replaced by its new value (and the
        usage, if ``fresh`` has one)."""
        again = {f.name: f for f in fresh.facts}
        facts = tuple(again.pop(f.name, f) for f in self.facts) + tuple(again.values())
        return StoreFacts(self.store, facts, usage=fresh.usage or self.usage)

    def summary(self) -> str:
        """The verdict and the settings that decide it, on one short line: ``ok``,
        ``warn: appendonly no, save ''``, ``refuse: maxmemory-policy allkeys-lru``."""
        verdict = self.verdict
        if verdict is Verdict.OK:
            return "ok"
        named = ", ".join(f"{f.name} {f.value}" for f in self.facts if f.verdict is verdict)
        return f"{verdict.value}: {named}"
