"""beatless: periodic tasks for Celery and Dramatiq with no beat process and no leader.

The loop, the dispatchers and the stores are imported when first named
(``beatless.Scheduler``, ``from beatless import Entry``), so that importing a module
low in the package (``beatless.core.triggers``) does not start the whole of it. No module of
the package imports this one: each imports what it needs from where it is defined.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from beatless._version import __version__ as __version__
from beatless.core.triggers import At, Cron, Every, Trigger
from beatless.errors import (
    BeatlessError,
    ConfigError,
    ScheduleError,
    StoreError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from beatless.core.solar import Solar
    from beatless.node.dispatch import Dispatcher
    from beatless.node.scheduler import Scheduler
    from beatless.schedule.entry import Entry, Schedule
    from beatless.schedule.firing import Firing, firing_id, offset_ms
    from beatless.stores import ClaimStore, MemoryStore, open_store
    from beatless.stores.redis.store import RedisStore
    from beatless.stores.sqlite import SQLiteStore

__all__ = [
    "At",
    "BeatlessError",
    "ClaimStore",
    "ConfigError",
    "Cron",
    "Dispatcher",
    "Entry",
    "Every",
    "Firing",
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "Schedule",
    "ScheduleError",
    "Scheduler",
    "Solar",
    "StoreError",
    "StoreUnavailable",
    "Trigger",
    "firing_id",
    "offset_ms",
    "open_store",
]

_LAZY = {
    "ClaimStore": "beatless.stores",
    "Dispatcher": "beatless.node.dispatch",
    "Entry": "beatless.schedule.entry",
    "Schedule": "beatless.schedule.entry",
    "Firing": "beatless.schedule.firing",
    "MemoryStore": "beatless.stores",
    "RedisStore": "beatless.stores.redis.store",
    "SQLiteStore": "beatless.stores.sqlite",
    "Scheduler": "beatless.node.scheduler",
    "Solar": "beatless.core.solar",
    "firing_id": "beatless.schedule.firing",
    "offset_ms": "beatless.schedule.firing",
    "open_store": "beatless.stores",
}
"""The public names imported when first asked for (PEP 562), each with its module."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'beatless' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
