"""What the bridge reads of the Django database: django-celery-beat's tables, through its
models, on the database alias the bridge is given.

Four reads, each one query (or a few):

* :meth:`DjangoRows.probe`: ``PeriodicTasks.last_update`` (django-celery-beat's own
  change marker, written by its signals on every ``save()`` and ``delete()`` of a task or
  schedule row), ``max(date_changed)``, the number of ``PeriodicTask`` rows and their
  highest id;
* :meth:`DjangoRows.changed_since`: the rows whose ``date_changed`` is after an
  instant, with their schedule rows;
* :meth:`DjangoRows.by_ids`: the rows of some ids (what a full read that lost found
  different, read again);
* :meth:`DjangoRows.all`: every row, with its schedule row (the full pass, which also
  sees what no marker shows: ``queryset.update()``, raw SQL, a writer whose clock is
  behind).

Django's connections belong to a thread: each read first drops a connection Django
would have dropped at the end of a request (``close_old_connections``), so a database
restart or a closed idle connection costs one failed poll, not every one after it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from beatless.django._mapping import KINDS, Row, row_of

BY_IDS_CHUNK = 500
"""Ids per query of :meth:`DjangoRows.by_ids` (under SQLite's bound-parameter limit)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """The cheap markers of the table, read at every poll (one query, and one for
    ``last_update``)."""

    last_update: datetime | None
    max_changed: datetime | None
    count: int
    max_id: Any = None
    """The highest row id: a row created later has a higher one (ids are not reused)."""


class DjangoRows:
    """django-celery-beat's rows in the database ``using`` (Django's alias)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def _tasks(self) -> Any:
        from django_celery_beat.models import PeriodicTask

        manager = PeriodicTask.objects
        return manager.using(self.using) if self.using else manager.all()

    def _fresh(self) -> None:
        from django.db import close_old_connections

        close_old_connections()

    def probe(self) -> Probe:
        from django.db.models import Count, Max
        from django_celery_beat.models import PeriodicTasks

        self._fresh()
        marks = PeriodicTasks.objects.using(self.using) if self.using else PeriodicTasks.objects
        marker = marks.filter(ident=1).values_list("last_update", flat=True).first()
        found = self._tasks().aggregate(last=Max("date_changed"), count=Count("id"), top=Max("id"))
        return Probe(marker, found["last"], int(found["count"]), found["top"])

    def changed_since(self, instant: datetime) -> list[Row]:
        """The rows whose ``date_changed`` is after ``instant``."""
        self._fresh()
        query = self._tasks().select_related(*KINDS).filter(date_changed__gt=instant)
        return [row_of(task) for task in query]

    def by_ids(self, ids: Collection[Any]) -> list[Row]:
        """The rows whose id is in ``ids`` (those that exist), by id."""
        self._fresh()
        wanted = list(ids)
        found: list[Row] = []
        for start in range(0, len(wanted), BY_IDS_CHUNK):
            chunk = wanted[start : start + BY_IDS_CHUNK]
            query = self._tasks().select_related(*KINDS).filter(id__in=chunk).order_by("id")
            found += [row_of(task) for task in query]
        return found

    def all(self) -> list[Row]:
        self._fresh()
        return [row_of(task) for task in self._tasks().select_related(*KINDS).order_by("id")]

    def record_runs(self, runs: dict[str, tuple[datetime, int]]) -> None:
        """Per row name, its latest run and how many more runs: ``last_run_at`` moved
        forward only, ``total_run_count`` added to, one ``UPDATE`` per row in autocommit
        (:mod:`beatless.django._writeback`)."""
        from django.db.models import Case, DateTimeField, F, Q, Value, When

        self._fresh()
        for name, (last, count) in runs.items():
            later = Q(last_run_at__isnull=True) | Q(last_run_at__lt=last)
            self._tasks().filter(name=name).update(
                total_run_count=F("total_run_count") + count,
                last_run_at=Case(
                    When(later, then=Value(last, output_field=DateTimeField())),
                    default=F("last_run_at"),
                ),
            )

    def close(self) -> None:
        """Close this thread's connections to the database."""
        from django.db import connections

        connections.close_all()
