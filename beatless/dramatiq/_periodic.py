"""Periodic declarations next to the actor: ``periodic=cron(...)``, ``every(...)`` or
``at(...)`` (a one-off).

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
from functools import partial
from typing import Any

from beatless.core._time import InstantLike
from beatless.core.durations import DurationLike
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry, Tenants
from beatless.schedule.options import BY_NAME, DEFAULTS, NAMES
from beatless.schedule.problems import STAND_IN_TRIGGER, collect, entry_of

OPTION = "periodic"
"""The actor option that holds one :class:`Periodic`, or a list of them."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Periodic:
    """When an actor runs on its own: a trigger, its timing, and what to send it.

    ``jitter``, ``max_late``, ``catch_up``, ``overlap``, ``run_lease``, ``heartbeat`` and
    ``once_only`` left as ``None`` take the middleware's defaults (``max_late``, where the
    middleware sets none, the trigger's: 60 s, one hour for :func:`at`); ``start_at``,
    ``end_at`` and ``enabled`` are the entry's window. ``name`` names the entry (the
    actor's name by default); an actor with several declarations gives each a name.
    ``problems`` holds what is wrong with the declaration (``trigger`` is ``None`` when it
    could not be built); :meth:`entry` raises them, naming the entry.
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
    start_at: datetime | None = None
    end_at: datetime | None = None
    enabled: bool | None = None
    problems: tuple[str, ...] = ()

    def entry(self, actor_name: str, **defaults: Any) -> Entry:
        """The entry of this declaration on ``actor_name``, with the ``defaults`` given
        (by option name, as :meth:`DramatiqSettings.entry_defaults
        <beatless.dramatiq._settings.DramatiqSettings.entry_defaults>` gives them; an
        option without one takes its own)."""
        name = self.name or actor_name
        trigger = STAND_IN_TRIGGER if self.trigger is None else self.trigger
        own = {key: getattr(self, key) for key in NAMES}
        options = {
            key: defaults.get(key, DEFAULTS[key]) if value is None else value
            for key, value in own.items()
        }
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
                tenants=self.tenants,
                **options,
            ),
        )


def cron(
    expr: str, *, tz: str | None = None, day_and: bool | None = None, **declared: Any
) -> Periodic:
    """Run the actor on a cron expression, in ``tz`` (the middleware's time zone if
    ``None``): ``periodic=cron("0 2 * * *", jitter="2m")``.

    ``declared`` is what the firing sends, ``args``, ``kwargs``, ``options`` and
    ``tenants``; the entry's ``name`` (the actor's by default); and the entry's options
    by name (:mod:`beatless.schedule.options`): ``jitter``, ``max_late``, ``catch_up``,
    ``overlap`` (``"allow"`` or ``"skip"``), ``run_lease``, ``heartbeat`` and
    ``once_only`` (what a worker checks before the actor's body, see
    :meth:`~beatless.dramatiq.Beatless.before_process_message`), each ``None`` or left
    out to take the middleware's default; and the entry's window, ``start_at``,
    ``end_at`` and ``enabled``."""
    return _declare(lambda: Cron(expr, tz, day_and=day_and), **declared)


def every(interval: DurationLike, *, anchor: datetime | None = None, **declared: Any) -> Periodic:
    """Run the actor every ``interval`` (``"30s"``, ``90``, ``timedelta``), on slots
    anchored to ``anchor`` (the Unix epoch): ``periodic=every("30s")``. ``declared`` is
    as for :func:`cron`."""
    return _declare(lambda: Every(interval, anchor), **declared)


def at(instant: InstantLike, **declared: Any) -> Periodic:
    """Run the actor once, at ``instant`` (an aware datetime, epoch milliseconds or ISO
    8601 text with ``Z`` or an offset): ``periodic=at("2027-01-01T09:00:00Z")``. The one
    firing is claimed once across nodes and restarts; a node started after it, within
    ``max_late`` (an hour unless set), still sends it. ``declared`` is as for
    :func:`cron`."""
    return _declare(lambda: At(instant), **declared)


def solar(event: str, lat: float, lon: float, **declared: Any) -> Periodic:
    """Run the actor at a solar ``event`` (Celery's names: ``"sunrise"``, ``"sunset"``,
    ``"solar_noon"``, ``"dawn_civil"`` ...) at latitude ``lat`` and longitude ``lon``,
    each day it happens: ``periodic=solar("sunset", 52.52, 13.405)``. Needs
    ``pip install 'beatless[solar]'``; without it this entry alone is a problem, naming
    the extra. ``declared`` is as for :func:`cron`."""
    return _declare(lambda: Solar(event, lat, lon), **declared)


def _declare(
    trigger: Callable[[], Trigger],
    *,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    tenants: Tenants = None,
    name: str | None = None,
    **settings: Any,
) -> Periodic:
    """The declaration of ``trigger`` with what it sends and its ``settings``, each read
    now; what is wrong with any is kept in its ``problems``."""
    problems: list[str] = []
    built = collect(trigger, problems)
    unknown = sorted(set(settings) - set(NAMES))
    if unknown:
        problems.append(
            f"unknown setting(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(NAMES)}"
        )
    read = {key: collect(partial(_option, key, settings.get(key)), problems) for key in NAMES}
    return Periodic(
        trigger=built,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        options=dict(options or {}),
        tenants=tenants,
        name=name,
        problems=tuple(problems),
        **read,
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
                f"actor {actor_name!r}: the periodic option takes cron(...), every(...), "
                f"at(...) or a list of them, got {item!r}"
            )
        found.append(item)
    names = [p.name or actor_name for p in found]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"actor {actor_name!r}: {len(found)} periodic declarations share the entry name "
            f"{actor_name!r}; give each one a name=... of its own"
        )
    return found
