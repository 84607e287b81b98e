"""django-celery-beat rows as beatless entries: a pure function of the row's values.

A :class:`Row` holds what the bridge reads of one ``PeriodicTask`` row and of its
schedule row, as plain values (:func:`row_of` reads a model instance); :func:`entry_of_row`
makes the :class:`~beatless.schedule.entry.Entry` that runs it, or raises
:class:`RowRefused` with the reason. The row is read as a ``beat_schedule`` item is
(:func:`beatless.celery._schedule.read_entry`), so every option keeps its one rule:

========================  ===============================================================
``crontab``               A :class:`~beatless.core.triggers.Cron` of the crontab's expanded
                          fields, in the row's own ``timezone`` (the app's with
                          ``DJANGO_CELERY_BEAT_TZ_AWARE = False``), day of month AND day of
                          week as Celery's crontab (and django-celery-beat) read them.
``interval``              An :class:`~beatless.core.triggers.Every` anchored at the row's
                          ``start_time``, else at the Unix epoch. django-celery-beat counts
                          an interval from the entry's last run instead, which moves with
                          every restart of beat; an anchor is the same on every node.
``clocked``               An :class:`~beatless.core.triggers.At` at ``clocked_time``.
``solar``                 A :class:`~beatless.core.solar.Solar` of the row's ``event``,
                          ``latitude`` and ``longitude``, computed as Celery's ``solar``
                          computes it; one firing per address, local solar date and
                          event, whatever the float arithmetic of each node. It needs
                          ``ephem`` (``pip install 'beatless[solar]'``): without it, only
                          that row is refused, naming the extra.
``one_off``               Only the first occurrence at or after ``fence_ms`` (the instant
                          from which the bridge's revision is in force), as an ``At``.
``start_time``            The window's ``start_at`` (and the interval's anchor).
``expires``               The window's ``end_at``, and the message's ``expires``.
``expire_seconds``        The message's ``expires``, in seconds from its sending.
``queue`` ... ``priority``  ``queue``, ``exchange``, ``routing_key``, ``priority`` options.
``headers``               The message's headers, with ``periodic_task_name`` (the row's
                          name, which django-celery-results reads) on every message.
``enabled``               The entry's ``enabled``.
``args``, ``kwargs``      JSON text, read as django-celery-beat reads it.
========================  ===============================================================

:meth:`Row.digest` is a SHA-256 over those values only: not ``last_run_at``,
``total_run_count`` or ``date_changed``, which change without the definition changing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from celery.schedules import crontab

from beatless.celery._messages import SETTINGS_OPTION
from beatless.celery._schedule import cron_of, read_entry
from beatless.celery._settings import CelerySettings, zone_name
from beatless.core._time import from_datetime, iso
from beatless.core.solar import Solar
from beatless.core.triggers import At, Every, Trigger, Windowed
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.entry import Entry

KINDS = ("crontab", "interval", "clocked", "solar")
"""The schedule columns of ``PeriodicTask``, one of which a row sets."""
CRONTAB_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
HEADER = "periodic_task_name"
"""The header django-celery-beat puts on every message: the row's name."""
ROUTING = ("queue", "exchange", "routing_key", "priority")


class RowRefused(ScheduleError):
    """A row the bridge does not schedule, with the reason (it names the row)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One ``PeriodicTask`` row and its schedule row, as plain values. ``schedule`` holds
    the schedule row's columns: the five crontab fields and ``timezone`` (an IANA name);
    ``every`` and ``period``; ``clocked_time``; ``event``, ``latitude``, ``longitude``."""

    id: int
    name: str
    task: str
    kind: str | None
    schedule: dict[str, Any]
    args: str | None = "[]"
    kwargs: str | None = "{}"
    queue: str | None = None
    exchange: str | None = None
    routing_key: str | None = None
    priority: int | None = None
    headers: str | None = "{}"
    expires: datetime | None = None
    expire_seconds: int | None = None
    one_off: bool = False
    start_time: datetime | None = None
    enabled: bool = True

    def digest(self) -> str:
        """SHA-256 of the row's definition: equal for two reads of an unchanged row."""
        values = [getattr(self, name) for name in _FIELDS]
        text = json.dumps(values, sort_keys=True, default=_plain, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


_FIELDS = tuple(f.name for f in fields(Row))
"""The columns a digest covers, in a fixed order."""


def _plain(value: Any) -> str:
    if isinstance(value, datetime):
        return iso(from_datetime(_aware(value)))
    return str(value)


def _aware(value: datetime) -> datetime:
    """A datetime as Django returns it: aware with ``USE_TZ``, naive UTC without."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def row_of(task: Any) -> Row:
    """The :class:`Row` of a ``PeriodicTask`` instance (its schedule row read through its
    foreign key: select it with the row, ``select_related(*KINDS)``)."""
    kinds = [kind for kind in KINDS if getattr(task, f"{kind}_id", None) is not None]
    kind = kinds[0] if len(kinds) == 1 else None
    schedule: dict[str, Any] = {}
    if kind == "crontab":
        row = task.crontab
        schedule = {name: str(getattr(row, name)) for name in CRONTAB_FIELDS}
        schedule["timezone"] = _zone_text(row.timezone)
    elif kind == "interval":
        schedule = {"every": task.interval.every, "period": task.interval.period}
    elif kind == "clocked":
        schedule = {"clocked_time": task.clocked.clocked_time}
    elif kind == "solar":
        row = task.solar
        schedule = {"event": row.event, "latitude": row.latitude, "longitude": row.longitude}
    elif kinds:
        schedule = {"kinds": kinds}
    return Row(
        id=task.pk,
        name=task.name,
        task=task.task,
        kind=kind,
        schedule=schedule,
        args=task.args,
        kwargs=task.kwargs,
        queue=task.queue,
        exchange=task.exchange,
        routing_key=task.routing_key,
        priority=task.priority,
        headers=task.headers,
        expires=task.expires,
        expire_seconds=task.expire_seconds,
        one_off=task.one_off,
        start_time=task.start_time,
        enabled=task.enabled,
    )


def _zone_text(value: Any) -> str:
    """A crontab row's ``timezone`` as an IANA name (a ZoneInfo, a pytz zone or text)."""
    found = value if isinstance(value, str) else zone_name(value)
    return str(value) if found is None else found


def entry_of_row(
    row: Row, settings: CelerySettings, *, fence_ms: int, tz_aware: bool = True
) -> Entry:
    """The entry that runs ``row`` (see the module docstring), with the app's ``beatless_*``
    defaults; ``fence_ms`` places a one-off row's occurrence. ``tz_aware`` is
    ``DJANGO_CELERY_BEAT_TZ_AWARE``: off, a crontab runs in the app's time zone, as
    django-celery-beat's does. A :class:`RowRefused` names the row and every reason."""
    label = f"django-celery-beat row {row.name!r} (id {row.id})"
    try:
        trigger = _trigger(row, settings.timezone, tz_aware)
        if row.one_off and not isinstance(trigger, At):
            trigger = _first_after(row, trigger, fence_ms)
        spec = {
            "task": row.task,
            "schedule": trigger,
            "args": _json(row, "args", row.args, list, []),
            "kwargs": _json(row, "kwargs", row.kwargs, dict, {}),
            "options": _options(row),
        }
        return read_entry(row.name, spec, settings)
    except ScheduleError as exc:
        raise RowRefused(f"{label}: {exc}", [f"{label}: {e}" for e in exc.errors]) from None
    except ConfigError as exc:
        raise RowRefused(f"{label}: {exc}") from None


def _trigger(row: Row, timezone: str, tz_aware: bool) -> Trigger:
    schedule = row.schedule
    if row.kind == "crontab":
        fields = {name: schedule[name] for name in CRONTAB_FIELDS}
        try:
            value = crontab(**fields)
        except ValueError as exc:
            raise ScheduleError(f"crontab {fields}: {exc}") from None
        return cron_of(value, schedule["timezone"] if tz_aware else timezone, row.name)
    if row.kind == "interval":
        return _every(schedule["every"], schedule["period"], row.start_time)
    if row.kind == "clocked":
        return At(_aware(schedule["clocked_time"]))
    if row.kind == "solar":
        return Solar(
            schedule["event"], _number(schedule["latitude"]), _number(schedule["longitude"])
        )
    kinds = schedule.get("kinds")
    if kinds:
        raise ScheduleError(f"sets {' and '.join(kinds)}: a row sets exactly one schedule")
    raise ScheduleError("sets no schedule (crontab, interval, clocked or solar)")


def _number(value: Any) -> Any:
    """A solar row's ``latitude`` or ``longitude`` (a ``Decimal`` column) as a float, as
    Celery's ``solar`` reads it; anything else is left for :class:`Solar` to refuse."""
    return float(value) if isinstance(value, Decimal) else value


def _every(every: int, period: str, start: datetime | None) -> Every:
    try:
        interval = timedelta(**{period: every})
    except TypeError:
        raise ScheduleError(
            f"interval period {period!r} is not one of days, hours, minutes, seconds, microseconds"
        ) from None
    if interval % timedelta(milliseconds=1):
        raise ScheduleError(f"interval of {interval} is not a whole number of milliseconds")
    return Every(interval, None if start is None else _aware(start))


def _first_after(row: Row, trigger: Trigger, fence_ms: int) -> At:
    """A one-off row's occurrence: the first of its window at or after ``fence_ms``."""
    window = Windowed(
        trigger,
        None if row.start_time is None else from_datetime(_aware(row.start_time)),
        None if row.expires is None else from_datetime(_aware(row.expires)),
    )
    for occurrence in window.after(fence_ms - 1):
        return At(occurrence)
    raise ScheduleError(
        f"one_off: no occurrence of {window.describe()} at or after {iso(fence_ms)}"
    )


def _json(row: Row, column: str, text: str | None, kind: type, empty: Any) -> Any:
    if not text:
        return empty
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ScheduleError(f"{column} is not JSON ({exc}): {text!r:.80}") from None
    if not isinstance(value, kind):
        raise ScheduleError(f"{column} must be a JSON {kind.__name__}, got {text!r:.80}")
    return value


def _options(row: Row) -> dict[str, Any]:
    """The row's message options and window, as a ``beat_schedule`` item's ``options``."""
    options: dict[str, Any] = {
        name: getattr(row, name) for name in ROUTING if getattr(row, name) is not None
    }
    if row.expires is not None:
        options["expires"] = iso(from_datetime(_aware(row.expires)))
    elif row.expire_seconds is not None:
        options["expires"] = row.expire_seconds
    options["headers"] = {**_json(row, "headers", row.headers, dict, {}), HEADER: row.name}
    window: dict[str, Any] = {"enabled": row.enabled}
    if row.start_time is not None:
        window["start_at"] = _aware(row.start_time)
    if row.expires is not None:
        window["end_at"] = _aware(row.expires)
    options[SETTINGS_OPTION] = window
    return options
