"""beatless: periodic tasks for Celery and Dramatiq with no beat process and no leader."""

from __future__ import annotations

from beatless.entry import Entry, Schedule
from beatless.errors import (
    BeatlessError,
    ConfigError,
    ScheduleError,
    StoreError,
    StoreUnavailable,
)
from beatless.firing import Firing, firing_id, offset_ms
from beatless.triggers import Cron, Every, Trigger

__version__ = "0.1.0"

__all__ = [
    "BeatlessError",
    "ConfigError",
    "Cron",
    "Entry",
    "Every",
    "Firing",
    "Schedule",
    "ScheduleError",
    "StoreError",
    "StoreUnavailable",
    "Trigger",
    "firing_id",
    "offset_ms",
]
