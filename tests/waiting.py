"""Waiting in tests for something another thread or process does, bounded."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], within_s: float = 5.0, step: float = 0.05) -> bool:
    """Whether ``predicate`` came true within ``within_s``, asked every ``step``."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True
