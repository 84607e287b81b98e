"""Periodic declarations next to the actor: ``periodic=cron(...)`` or ``periodic=every(...)``.

A declaration is a frozen value. What is wrong with it (an expression that does not
parse, a duration that cannot be read) is kept in it rather than raised at import, and
reported when the node starts, with every other problem of the schedule and naming the
entry (see :mod:`beatless.schedule.problems`); the timing rules are checked then too, once the
middleware's defaults are known. ``beatless check --dramatiq`` reports the same list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from beatless.core.durations import DurationLike
from beatless.core.triggers import Cron, Every, Trigger
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry, Tenants
from beatless.schedule.options import (
    BY_NAME,
    DEFAULT_CATCH_UP,
    DEFAULT_HEARTBEAT,
    DEFAULT_MAX_LATE,
    DEFAULT_OVERLAP,
    DEFAULT_RUN_LEASE,
)
from beatless.schedule.problems import STAND_IN_TRIGGER, collect, entry_of

OPTION = "periodic"
"""The actor option that holds one :class:`Periodic`, or a list of them."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Periodic:
    """When an actor runs on its own: a trigger, its timing, and what to send it.

    ``jitter``, ``max_late``, ``catch_up``, ``overlap``, ``run_lease``, ``heartbeat`` and
    ``once_only`` left as ``None`` take the middleware's defaults. ``name``
    names the entry (the actor's name by default); an actor with several declarations
    gives each a name. ``problems`` holds what is wrong with the declaration (``trigger``
    is ``None`` when it could not be built); :meth:`entry` raises them, naming the entry.
    """

    trigger: Trigger | None
    jitter: timedelta | None = None
    max_late: timedelta | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    tenants: Tenants = None
    name: str | None = None
    catch_up: str | None = None
    overlap: str | None = None
    run_lease: timedelta | None = None
    heartbeat: timedelta | None = None
    once_only: bool | None = None
    problems: tuple[str, ...] = ()

    def entry(
        self,
        actor_name: str,
        *,
        jitter: DurationLike = 0,
        max_late: DurationLike = DEFAULT_MAX_LATE,
        catch_up: str = DEFAULT_CATCH_UP,
        overlap: str = DEFAULT_OVERLAP,
        run_lease: DurationLike = DEFAULT_RUN_LEASE,
        heartbeat: DurationLike = DEFAULT_HEARTBEAT,
        once_only: bool = True,
    ) -> Entry:
        """The entry of this declaration on ``actor_name``, with the defaults given."""
        name = self.name or actor_name
        trigger = STAND_IN_TRIGGER if self.trigger is None else self.trigger
        return entry_of(
            f"entry {name!r}",
            self.problems,
            lambda: Entry(
                name=name,
                task=actor_name,
                trigger=trigger,
                args=self.args,
                kwargs=self.kwargs,
                options=self.options,
                jitter=jitter if self.jitter is None else self.jitter,
                max_late=max_late if self.max_late is None else self.max_late,
                tenants=self.tenants,
                catch_up=catch_up if self.catch_up is None else self.catch_up,
                overlap=overlap if self.overlap is None else self.overlap,
                run_lease=run_lease if self.run_lease is None else self.run_lease,
                heartbeat=heartbeat if self.heartbeat is None else self.heartbeat,
                once_only=once_only if self.once_only is None else self.once_only,
            ),
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
    catch_up: str | None = None,
    overlap: str | None = None,
    run_lease: DurationLike | None = None,
    heartbeat: DurationLike | None = None,
    once_only: bool | None = None,
) -> Periodic:
    """Run the actor on a cron expression, in ``tz`` (the middleware's time zone if
    ``None``): ``periodic=cron("0 2 * * *", jitter="2m")``.

    ``overlap`` (``"allow"`` or ``"skip"``), ``run_lease``, ``heartbeat`` and
    ``once_only`` say what a worker checks before the actor's body (see
    :meth:`~beatless.dramatiq.Beatless.before_process_message`); ``None`` takes the
    middleware's default."""
    return _periodic(
        lambda: Cron(expr, tz, day_and=day_and),
        jitter=jitter,
        max_late=max_late,
        args=args,
        kwargs=kwargs,
        options=options,
        tenants=tenants,
        name=name,
        catch_up=catch_up,
        overlap=overlap,
        run_lease=run_lease,
        heartbeat=heartbeat,
        once_only=once_only,
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
    catch_up: str | None = None,
    overlap: str | None = None,
    run_lease: DurationLike | None = None,
    heartbeat: DurationLike | None = None,
    once_only: bool | None = None,
) -> Periodic:
    """Run the actor every ``interval`` (``"30s"``, ``90``, ``timedelta``), on slots
    anchored to ``anchor`` (the Unix epoch): ``periodic=every("30s")``. The other
    arguments are those of :func:`cron`."""
    return _periodic(
        lambda: Every(interval, anchor),
        jitter=jitter,
        max_late=max_late,
        args=args,
        kwargs=kwargs,
        options=options,
        tenants=tenants,
        name=name,
        catch_up=catch_up,
        overlap=overlap,
        run_lease=run_lease,
        heartbeat=heartbeat,
        once_only=once_only,
    )


def _periodic(
    trigger: Callable[[], Trigger],
    *,
    jitter: DurationLike | None,
    max_late: DurationLike | None,
    args: Iterable[Any],
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    tenants: Tenants,
    name: str | None,
    catch_up: str | None,
    overlap: str | None,
    run_lease: DurationLike | None,
    heartbeat: DurationLike | None,
    once_only: bool | None,
) -> Periodic:
    problems: list[str] = []
    return Periodic(
        trigger=collect(trigger, problems),
        jitter=collect(lambda: _option("jitter", jitter), problems),
        max_late=collect(lambda: _option("max_late", max_late), problems),
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        options=dict(options or {}),
        tenants=tenants,
        name=name,
        catch_up=collect(lambda: _option("catch_up", catch_up), problems),
        overlap=collect(lambda: _option("overlap", overlap), problems),
        run_lease=collect(lambda: _option("run_lease", run_lease), problems),
        heartbeat=collect(lambda: _option("heartbeat", heartbeat), problems),
        once_only=collect(lambda: _option("once_only", once_only), problems),
        problems=tuple(problems),
    )


def _option(name: str, value: object) -> Any:
    """An entry option as ``periodic=`` was given it, read as every place that takes entry
    options reads it (:mod:`beatless.schedule.options`); ``None`` (not given) is left for
    the middleware's default."""
    return None if value is None else BY_NAME[name].read(value, name)


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
