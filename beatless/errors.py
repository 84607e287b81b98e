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


class BrokerUnavailable(BeatlessError, ConnectionError):
    """A two-phase send refused at once: the previous one failed a moment ago, and the
    broker is left alone for a short cooldown rather than costing a deadline per firing."""
