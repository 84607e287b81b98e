"""beatless: periodic tasks for Celery and Dramatiq with no beat process and no leader."""

from __future__ import annotations

from beatless.dispatch import Dispatcher
from beatless.entry import Entry, Schedule
from beatless.errors import (
    BeatlessError,
    ConfigError,
    ScheduleError,
    StoreError,
    StoreUnavailable,
)
from beatless.firing import Firing, firing_id, offset_ms
from beatless.scheduler import Scheduler
from beatless.stores import ClaimStore, MemoryStore, open_store
from beatless.stores.redis import RedisStore
from beatless.stores.sqlite import SQLiteStore
from beatless.triggers import Cron, Every, Trigger

__version__ = "0.1.0"

__all__ = [
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
    "StoreError",
    "StoreUnavailable",
    "Trigger",
    "firing_id",
    "offset_ms",
    "open_store",
]
