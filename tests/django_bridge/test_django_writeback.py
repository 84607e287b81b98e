"""Writing last_run_at and total_run_count back: only what this node sent, never back in
time, and never a republished row."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from celery import Celery

from beatless.celery._settings import CelerySettings
from beatless.core._time import from_datetime
from beatless.django import Bridge, DjangoRows, entry_of_row, row_of
from beatless.django._writeback import WriteBack
from beatless.live import Live
from beatless.schedule.firing import Decision, Firing
from beatless.stores.memory import MemoryStore

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def decision(entry: object, at: datetime, outcome: str = "won", manual: bool = False) -> Decision:
    firing = Firing.of(entry, None, f"proj/{entry.name}", from_datetime(at))  # type: ignore[arg-type, attr-defined]
    return Decision(dataclasses.replace(firing, manual=manual), outcome, "n1", 0)


def test_sent_firings_are_written_to_their_rows_and_change_no_definition(
    database: str,
) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url="memory://")
    settings = CelerySettings.from_app(app)
    every = IntervalSchedule.objects.create(every=10, period="seconds")
    row = PeriodicTask.objects.create(name="ping", task="proj.ping", interval=every)
    live = Live(MemoryStore(), namespace="proj", owner="django")
    bridge = Bridge(live, DjangoRows(), settings)
    bridge.poll()
    entry = entry_of_row(row_of(row), settings, fence_ms=0)

    write_back = WriteBack(DjangoRows())
    write_back.decided(decision(entry, T0.replace(second=20)))
    write_back.decided(decision(entry, T0.replace(second=10)))  # sent later, by a slow node
    write_back.decided(decision(entry, T0.replace(second=30), outcome="lost"))
    write_back.decided(decision(entry, T0.replace(second=40), manual=True))
    assert write_back.flush() == 1
    row.refresh_from_db()
    assert (row.last_run_at, row.total_run_count) == (T0.replace(second=20), 2)
    write_back.decided(decision(entry, T0.replace(second=5)))  # never back in time
    write_back.flush()
    row.refresh_from_db()
    assert (row.last_run_at, row.total_run_count) == (T0.replace(second=20), 3)
    assert write_back.flush() == 0
    again = bridge.poll(full=True)
    assert again is not None
    assert again.revision is None  # neither column is part of the definition


def test_a_write_that_fails_is_kept_for_the_next_flush(database: str) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url="memory://")
    every = IntervalSchedule.objects.create(every=10, period="seconds")
    row = PeriodicTask.objects.create(name="ping", task="proj.ping", interval=every)
    entry = entry_of_row(row_of(row), CelerySettings.from_app(app), fence_ms=0)

    class Failing(DjangoRows):
        fail = True

        def record_runs(self, runs: dict[str, tuple[datetime, int]]) -> None:
            if self.fail:
                self.fail = False
                raise ConnectionError("database down")
            super().record_runs(runs)

    write_back = WriteBack(Failing())
    write_back.decided(decision(entry, T0))
    with pytest.raises(ConnectionError):
        write_back.flush()
    write_back.decided(decision(entry, T0.replace(second=10)))
    assert write_back.flush() == 1
    row.refresh_from_db()
    assert (row.last_run_at, row.total_run_count) == (T0.replace(second=10), 2)
