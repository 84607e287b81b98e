"""The same schedule as ``schedule.toml``, in Python.

beatless check examples.schedule:schedule
"""

from datetime import UTC, datetime, timedelta

from beatless import Cron, Entry, Every, Schedule

schedule = Schedule(
    [
        Entry(
            name="heartbeat",
            task="ops.heartbeat",
            trigger=Every("30s"),
            max_late="20s",
        ),
        Entry(
            name="nightly-report",
            task="reports.nightly",
            trigger=Cron("0 2 * * *"),
            jitter="2m",
            max_late="5m",
            tenants=["acme", "globex", "initech", "umbrella"],
            kwargs={"format": "pdf"},
        ),
        Entry(
            name="invoice-run",
            task="billing.invoices",
            trigger=Cron("0 6 1-7 * mon", tz="America/New_York", day_and=True),
            args=["monthly"],
            options={"queue": "billing"},
            max_late="5m",
        ),
        Entry(
            name="cache-warm",
            task="cache.warm",
            trigger=Every(timedelta(minutes=15), anchor=datetime(2026, 1, 1, 0, 5, tzinfo=UTC)),
            jitter=timedelta(seconds=90),
            max_late="5m",
        ),
    ],
    namespace="shop",
    timezone="Europe/Berlin",
)
