"""What both integrations' two-phase senders share: the cooldown after a broker failure,
recognising a timeout, and the WARNING for a send whose outcome is unknown."""

from __future__ import annotations

import logging
import time

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import BrokerUnavailable
from beatless.schedule.firing import Firing

logger = logging.getLogger("beatless.node.dispatch")

COOLDOWN_S = 1.0
"""After a broker error, sends are refused at once for this long."""


class Cooldown:
    """Refuses sends for ``seconds`` after a failure of the broker, so that a dead broker
    costs one deadline per cooldown rather than one per firing."""

    def __init__(self, seconds: float = COOLDOWN_S) -> None:
        self.seconds = seconds
        self._failed_at: float | None = None
        self._failure: BaseException | None = None

    def refuse(self) -> None:
        """Raise :class:`~beatless.errors.BrokerUnavailable` while cooling down."""
        if self._failed_at is None:
            return
        since = time.monotonic() - self._failed_at
        if since < self.seconds:
            raise BrokerUnavailable(
                f"the previous send failed {since:.1f}s ago ({self._failure!r}); the broker "
                f"is tried again in {self.seconds - since:.1f}s"
            )
        self._failed_at = self._failure = None

    def failed(self, exc: BaseException) -> None:
        """The broker failed: start the cooldown."""
        self._failed_at, self._failure = time.monotonic(), exc


def timed_out(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, is a timeout (any library's)."""
    seen = exc
    for _ in range(10):
        if seen is None:
            return False
        name = type(seen).__name__
        if isinstance(seen, TimeoutError) or "Timeout" in name or "timed out" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def warn_outcome_unknown(
    firing: Firing, exc: BaseException, took: float, deadline_s: float, id_name: str
) -> None:
    """The one residual case of two-phase: the send may have reached the broker."""
    logger.warning(
        "firing %s of entry %s: the send failed after %.1fs (deadline %.1fs) with %s: %s; its "
        "outcome is unknown: the claim is released and the firing retried while it is not "
        "late, so if the broker did take the message a second copy with the same %s %s "
        "may reach it",
        firing.id,
        shown(firing.entry.name),
        took,
        deadline_s,
        type(exc).__name__,
        shown(exc, quoted=False, limit=ERROR_LIMIT),
        id_name,
        firing.id,
    )
