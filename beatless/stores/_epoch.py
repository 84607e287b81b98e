"""How a store object follows its store's epoch (the "Identity" rule in ``base``).

A store object remembers the epoch it last saw and, once it has seen the epoch change,
the *horizon* of that change: the new epoch's start plus the tolerance. Every later claim
of a firing nobody holds and released before the horizon is forgotten, not only the
first batch after the change: a firing the old memory may have seen enqueued stays
unsendable whichever batch, or retry, brings it to the store.
"""

from __future__ import annotations

import secrets

from beatless.stores.base import TOLERANCE_MS, Epoch


def new_token() -> str:
    """A random token for a new epoch record."""
    return secrets.token_hex(16)


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
