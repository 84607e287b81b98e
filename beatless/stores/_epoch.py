"""How a store object follows its store's epoch (the "Identity" rule in ``base``).

A store object remembers the epoch it last saw and, once it has seen the epoch change,
the *horizon* of that change: the new epoch's start plus the tolerance. Every later claim
of a firing nobody holds and released before the horizon is forgotten, not only the
first batch after the change: a firing the old memory may have seen enqueued stays
unsendable whichever batch, or retry, brings it to the store.

A failover is a change of identity too: a replica promoted to primary keeps the epoch
record but may lack the last claims its old primary granted. A store that can tell (Redis:
the ``master_replid`` of the server, and the history it continued when it was promoted)
writes the epoch again with a new token and marks it begun by a failover
(:data:`FAILOVER`), so that the store object of a node that never saw the old primary
judges the same horizon.
"""

from __future__ import annotations

import enum
import logging
import secrets

from beatless.stores.base import TOLERANCE_MS, ClaimStore, Epoch


def new_token() -> str:
    """A random token for a new epoch record."""
    return secrets.token_hex(16)


NEW = "new"
"""The cause of an epoch written on a store that had none (first use, or memory lost)."""
FAILOVER = "failover"
"""The cause of an epoch written on a promoted replica: the claims its old primary
granted in the replication lag may be lost."""
EVICTED = "evicted"
"""The cause of an epoch begun again by a node that found its Redis evicting keys: claims
made before the claims stopped may be evicted."""


def has_changed(seen: Epoch | None, current: Epoch) -> bool:
    """Whether the store lost its memory since a store object saw ``seen``."""
    return seen is not None and seen.token != current.token


def horizon_ms(seen: Epoch | None, current: Epoch, remembered: int | None) -> int | None:
    """``forgot_before_ms`` for ``judge``: the horizon of a change from ``seen`` to
    ``current``, else the one ``remembered`` from an earlier change (``None``: none)."""
    return current.started_ms + TOLERANCE_MS if has_changed(seen, current) else remembered


def describe_change(seen: Epoch, current: Epoch) -> str:
    return (
        f"the store lost its memory: its epoch changed from {seen.token[:12]} to "
        f"{current.token[:12]} (started {current.started_ms} ms); firings released before "
        f"{current.started_ms + TOLERANCE_MS} ms that nobody holds are written committed "
        f"and reported forgotten, not enqueued"
    )


class _Now(enum.Enum):
    NOW = "now"


def adopt(
    store: ClaimStore,
    current: Epoch,
    *,
    logger: logging.Logger,
    label: str,
    horizon: int | _Now | None = _Now.NOW,
) -> bool:
    """Make ``current`` the epoch ``store`` last saw, with the horizon of its change (from
    :func:`horizon_ms`), and warn on ``logger`` (``"{label}: ..."``) when it is not the
    epoch ``store`` saw before. ``label`` names the store as its warnings do, every name
    in it written through :func:`~beatless.core._logtext.shown` by the caller (where
    it is: ``"sqlite store '/var/beatless.db'"``). ``horizon``: the one the claims were
    judged with, when the store worked it out before it judged them. Whether the epoch
    changed."""
    seen = store.epoch
    if horizon is _Now.NOW:
        horizon = horizon_ms(seen, current, store._forgot_before_ms)
    if seen is not None and has_changed(seen, current):
        logger.warning("%s: %s", label, describe_change(seen, current))
    store.epoch, store._forgot_before_ms = current, horizon
    return has_changed(seen, current)


def describe_failover(seen: Epoch | None, current: Epoch, *, waits: bool) -> str:
    """What a store object says when it finds its store failed over to a replica."""
    horizon = current.started_ms + TOLERANCE_MS
    were = f"from epoch {seen.token[:12]} " if seen is not None else ""
    lost = (
        "pending claims whose lease ran out"
        if waits
        else "firings nobody holds, and pending claims whose lease ran out,"
    )
    return (
        f"the store failed over to a replica that may lack the last claims of its old "
        f"primary: its epoch changed {were}to {current.token[:12]} (started "
        f"{current.started_ms} ms); {lost} released before {horizon} ms are written "
        f"committed and reported forgotten, not enqueued"
    )
