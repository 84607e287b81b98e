"""The example's ``beat_schedule``: eleven entries, one of them fanned out to five tenants.

Plain Celery entries, read by stock ``celery beat`` as they are; beatless reads its own
settings from ``options["beatless"]`` (stock beat passes that key along as a harmless
message property, so rolling back is one line).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule

TENANTS = ["acme", "globex", "initech", "umbrella", "hooli"]

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    # Every second: a plain number of seconds, and a timedelta with arguments.
    "tick-1s": {"task": "demo.tick", "schedule": 1.0},
    "tick-1s-args": {"task": "demo.tick", "schedule": timedelta(seconds=1), "args": ("a", 1)},
    # Every two seconds: Celery's own schedule(), with keyword arguments and options.
    "work-2s": {
        "task": "demo.work",
        "schedule": schedule(timedelta(seconds=2)),
        "kwargs": {"size": 2},
    },
    "work-2s-priority": {
        "task": "demo.work",
        "schedule": 2,
        "kwargs": {"size": 20},
        "options": {"priority": 3, "headers": {"source": "demo"}},
    },
    "work-3s": {"task": "demo.work", "schedule": 3, "kwargs": {"size": 3}},
    # Every five seconds, once plain and once spread over a two-second jitter window.
    "report-5s": {"task": "demo.report", "schedule": 5.0},
    "report-5s-jittered": {
        "task": "demo.report",
        "schedule": timedelta(seconds=5),
        "options": {"beatless": {"jitter": "2s"}},
    },
    # Every ten seconds; the message expires if no worker takes it within 30 s.
    "report-10s-expiring": {
        "task": "demo.report",
        "schedule": 10,
        "options": {"expires": 30},
    },
    # Every minute, on the minute and spread over three seconds.
    "minutely": {"task": "demo.report", "schedule": crontab()},
    "minutely-jittered": {
        "task": "demo.report",
        "schedule": crontab(minute="*"),
        "options": {"beatless": {"jitter": "3s"}},
    },
    # Fan-out: one firing per tenant every five seconds, spread over two seconds.
    "sync-tenants-5s": {
        "task": "demo.sync_tenant",
        "schedule": 5,
        "options": {"beatless": {"tenants": TENANTS, "jitter": "2s"}},
    },
}
