"""Periodic declarations next to the actor: ``periodic=cron(...)`` or ``periodic=every(...)``.

A declaration is a frozen value checked when it is made (durations, the expression, the
jitter against the trigger's shortest gap, in UTC), so a typo fails at import; the
middleware checks it again, with every other entry, when it builds the schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from beatless.durations import DurationLike, as_timedelta
from beatless.entry import DEFAULT_MAX_LATE, Entry, Tenants, check_timing
from beatless.errors import ConfigError, ScheduleError
from beatless.triggers import Cron, Every, Trigger

OPTION = "periodic"
"""The actor option that holds one :class:`Periodic`, or a list of them."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Periodic:
    """When an actor runs on its own: a trigger, its timing, and what to send it.

    ``jitter`` and ``max_late`` left as ``None`` take the middleware's defaults. ``name``
    names the entry (the actor's name by default); an actor with several declarations
    gives each a name.
    """

    trigger: Trigger
    jitter: timedelta | None = None
    max_late: timedelta | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    tenants: Tenants = None
    name: str | None = None

    def entry(
        self,
        actor_name: str,
        *,
        jitter: DurationLike = 0,
        max_late: DurationLike = DEFAULT_MAX_LATE,
    ) -> Entry:
        """The entry of this declaration on ``actor_name``, with the defaults given."""
        return Entry(
            name=self.name or actor_name,
            task=actor_name,
            trigger=self.trigger,
            args=self.args,
            kwargs=self.kwargs,
            options=self.options,
            jitter=jitter if self.jitter is None else self.jitter,
            max_late=max_late if self.max_late is None else self.max_late,
            tenants=self.tenants,
        )


def cron(
    expr: str,
    *,
    tz: str | None = None,
    day_and: bool | None = None,
    jitter: DurationLike | None = None,
    max_late: DurationLike | None = None,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    tenants: Tenants = None,
    name: str | None = None,
) -> Periodic:
    """Run the actor on a cron expression, in ``tz`` (the middleware's time zone if
    ``None``): ``periodic=cron("0 2 * * *", jitter="2m")``."""
    trigger = Cron(expr, tz, day_and=day_and)
    return _periodic(
        trigger,
        jitter=jitter,
        max_late=max_late,
        args=args,
        kwargs=kwargs,
        options=options,
        tenants=tenants,
        name=name,
    )


def every(
    interval: DurationLike,
    *,
    anchor: datetime | None = None,
    jitter: DurationLike | None = None,
    max_late: DurationLike | None = None,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    tenants: Tenants = None,
    name: str | None = None,
) -> Periodic:
    """Run the actor every ``interval`` (``"30s"``, ``90``, ``timedelta``), on slots
    anchored to ``anchor`` (the Unix epoch): ``periodic=every("30s")``."""
    trigger = Every(interval, anchor)
    return _periodic(
        trigger,
        jitter=jitter,
        max_late=max_late,
        args=args,
        kwargs=kwargs,
        options=options,
        tenants=tenants,
        name=name,
    )


def _periodic(
    trigger: Cron | Every,
    *,
    jitter: DurationLike | None,
    max_late: DurationLike | None,
    args: Iterable[Any],
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    tenants: Tenants,
    name: str | None,
) -> Periodic:
    what = f"periodic {trigger.describe()}"
    return _checked(
        Periodic(
            trigger=trigger,
            jitter=_duration(jitter, f"{what}: jitter"),
            max_late=_duration(max_late, f"{what}: max_late"),
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            options=dict(options or {}),
            tenants=tenants,
            name=name,
        )
    )


def _duration(value: DurationLike | None, name: str) -> timedelta | None:
    return None if value is None else as_timedelta(value, name=name)


def _checked(declared: Periodic) -> Periodic:
    """Check now what can be checked without the actor: durations, names, jitter vs gap."""
    probe = declared.entry(
        declared.name or "periodic declaration", max_late=_probe_max_late(declared)
    )
    errors = check_timing([probe])
    if errors:
        raise ScheduleError("; ".join(errors), errors)
    return declared


def _probe_max_late(declared: Periodic) -> timedelta:
    """A max_late that lets a declaration with no max_late of its own be checked alone."""
    if declared.max_late is not None:
        return declared.max_late
    if declared.jitter is None:
        return DEFAULT_MAX_LATE
    return max(DEFAULT_MAX_LATE, declared.jitter + timedelta(seconds=1))


def declarations(actor_name: str, value: object) -> Sequence[Periodic]:
    """The declarations in an actor's ``periodic`` option, with a clear error for a wrong
    value or for several declarations that do not name themselves apart."""
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    found: list[Periodic] = []
    for item in items:
        if not isinstance(item, Periodic):
            raise ConfigError(
                f"actor {actor_name!r}: the periodic option takes cron(...), every(...) or a "
                f"list of them, got {item!r}"
            )
        found.append(item)
    names = [p.name or actor_name for p in found]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"actor {actor_name!r}: {len(found)} periodic declarations share the entry name "
            f"{actor_name!r}; give each one a name=... of its own"
        )
    return found
