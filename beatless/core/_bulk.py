"""Building many objects at once, without the cyclic collector walking them meanwhile.

Loading a schedule of 100,000 entries makes millions of objects that all live on, and
none of them in a cycle that needs collecting; the collector, started by every few
hundred new objects, would walk the growing heap again and again (a seventh of the
time of a load). :func:`paused_collection` holds it off for the length of one such
build, and gives it back as it was: objects freed meanwhile are freed as always, and a
cycle made meanwhile is collected at the next run after.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_collection() -> Iterator[None]:
    """No cyclic garbage collection inside the block (if it was on, it is on after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
