"""The exceptions beatless raises: one root, a few clear branches."""

from __future__ import annotations


class BeatlessError(Exception):
    """The root of every error beatless raises on purpose."""


class ConfigError(BeatlessError, ValueError):
    """A value given to beatless is malformed: a duration, a time zone, a store URL."""


class ScheduleError(ConfigError):
    """An entry or a schedule breaks a rule: a bad expression or an unsafe timing.

    The message names the entry, the rule and the numbers, and says what to change.
    ``errors`` holds every problem found when several were collected at once.
    """

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = errors if errors is not None else [message]


class StoreError(BeatlessError):
    """A claim store failed in a way that is not transient."""


class StoreUnavailable(StoreError):
    """The claim store cannot be reached right now; the loop retries until the firing is late."""


class StoreFull(StoreError):
    """The claim store refused a write because it is full: Redis at ``maxmemory`` under
    ``noeviction`` (``OOM command not allowed``), PostgreSQL out of disk (``53100``), a
    JetStream stream at its storage limit. Nothing the refused call would have written
    was written; the loop retries the firing until it is late, and counts it missed then.

    ``usage`` says how full the store is when it could tell (``used_memory 8.1 MB of
    maxmemory 8.0 MB``); ``kept`` is set by a commit that could still make its claims
    committed without room (Redis: a script allowed to run out of memory) but not write
    its notes: per id, as :meth:`~beatless.stores.base.ClaimStore.commit` returns it."""

    def __init__(
        self, message: str, *, usage: str | None = None, kept: list[bool] | None = None
    ) -> None:
        super().__init__(message)
        self.usage = usage
        self.kept = kept


class StoreRefused(StoreError):
    """The claim store's settings are refused (:meth:`~beatless.stores.base.ClaimStore.facts`):
    a Redis that evicts keys, a PostgreSQL standby. Nothing is claimed from it until a
    setting is fixed; the message names the setting and the fix."""


class StaleRevision(BeatlessError):
    """A change to live entries based on a revision that is no longer the current one
    (``if_revision=``): nothing was written. ``current`` is the current revision."""

    def __init__(self, message: str, *, current: int) -> None:
        super().__init__(message)
        self.current = current


class BrokerUnavailable(BeatlessError, ConnectionError):
    """A two-phase send refused at once: the previous one failed a moment ago, and the
    broker is left alone for a short cooldown rather than costing a deadline per firing."""
