"""Reading ``app.conf.beat_schedule`` as it is, into a beatless :class:`~beatless.Schedule`.

Each entry's ``task``, ``schedule``, ``args``, ``kwargs`` and ``options`` are read as
Celery beat reads them. The trigger:

* ``crontab(...)`` is a :class:`~beatless.core.triggers.Cron` built from the crontab's
  expanded fields, with Celery's AND rule for day of month and day of week
  (``crontab(0, 0, day_of_month='13', day_of_week='fri')`` is Friday the 13th only), in
  the app's time zone (``timezone``; UTC with ``enable_utc``), or in the zone of the
  crontab's own ``nowfun`` when it returns aware datetimes.
* ``schedule(run_every)``, a ``timedelta`` and a plain number of seconds are an
  :class:`~beatless.core.triggers.Every` anchored to the Unix epoch. Stock beat anchors an
  interval to the entry's last run instead, which differs from process to process;
  the epoch is the same instant on every node, so every node agrees on every slot.
* ``solar(event, lat, lon)`` is a :class:`~beatless.core.solar.Solar` (the ``solar``
  extra: ``ephem``, which Celery's own ``solar`` needs too), computed as Celery computes
  it; its firings are keyed by event and local solar date.
* django-celery-beat's ``clocked(clocked_time)`` is an :class:`~beatless.core.triggers.At`:
  one firing at that instant, claimed once across nodes and restarts.
* any other schedule is refused, naming the entry.

* a beatless trigger (``beatless.At(...)`` for a one-off, ``beatless.Every``,
  ``beatless.Cron``) is taken as it is. Stock beat cannot run one: an entry holding it
  does not load under ``celery beat`` without beatless.

beatless settings of one entry live in ``options["beatless"]``: ``jitter``,
``max_late``, ``tenants`` (a list; a callable every node answers alike; or the import
path of such a callable, ``"proj.tenants:active"``), ``catch_up``, what a worker
checks when a firing's task starts (:mod:`beatless.node.runs`): ``overlap``, ``run_lease``,
``heartbeat`` and ``once_only``, and the entry's window: ``start_at``, ``end_at`` and
``enabled``. Stock beat passes that key along as a harmless message
property, so rolling back to it is one line of configuration; on the Redis transport the
property must be serialisable, so give a list or an import path, not a function object,
where you may roll back.

:func:`check_app` collects every problem at once, each naming its entry: the settings,
each entry's trigger and options, the timing rules, and arguments the JSON serializer
refuses. The worker bootstep, the beat scheduler and ``beatless check --celery`` all
read the schedule through it.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import partial
from numbers import Real
from typing import Any, TypeVar

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule
from celery.utils.imports import symbol_by_name

from beatless.celery._messages import SETTINGS_OPTION
from beatless.celery._sending import Sender
from beatless.celery._settings import CelerySettings, normalise_redis_url, zone_name
from beatless.core._logtext import shown
from beatless.core.durations import to_ms
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger
from beatless.core.urls import mask_url
from beatless.errors import ConfigError, ScheduleError, StoreError
from beatless.fleet.limits import checked
from beatless.node.scheduler import Decision, Enqueue, Scheduler, send_deadline_s
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.options import DEFAULTS, NAMES, SHARED_NAMES
from beatless.schedule.problems import (
    STAND_IN_TRIGGER,
    Checked,
    argument_problems,
    collect,
    entry_of,
    keep,
)
from beatless.stores import missing_driver, open_store, probed
from beatless.stores.base import ClaimStore

logger = logging.getLogger(__name__)
T = TypeVar("T")

ENTRY_SETTINGS = (*NAMES, "tenants")
"""The keys allowed in an entry's ``options["beatless"]``."""

_CRON_FIELDS = (  # attribute, the full range as Celery expands it
    ("minute", range(60)),
    ("hour", range(24)),
    ("day_of_month", range(1, 32)),
    ("month_of_year", range(1, 13)),
    ("day_of_week", range(7)),
)


def read_schedule(app: Any, settings: CelerySettings | None = None) -> Schedule:
    """The beatless schedule of ``app.conf.beat_schedule``; a
    :class:`~beatless.errors.ScheduleError` lists every problem, each naming its entry.

    ``settings`` default to :meth:`CelerySettings.from_app`; they give the namespace,
    the time zone and the default jitter and ``max_late``.
    """
    found = check_app(app, settings)
    if found.schedule is None:
        raise ScheduleError("; ".join(found.problems), list(found.problems))
    return found.schedule


def check_app(app: Any, settings: CelerySettings | None = None) -> Checked:
    """Every problem of the app's beatless settings and ``beat_schedule`` at once, each
    naming its entry: what a node refuses to start with, and what ``beatless check
    --celery`` reports. Connects to nothing."""
    beat_schedule = app.conf.beat_schedule or {}
    if not isinstance(beat_schedule, Mapping):
        return Checked(None, (f"beat_schedule must be a dict of entries, got {beat_schedule!r}",))
    foreign = foreign_scheduler(app, len(beat_schedule))
    problems = [] if foreign is None else [foreign]
    if settings is None:
        settings = collect(lambda: CelerySettings.from_app(app), problems)
        if settings is None:
            return Checked(None, tuple(problems))
    missing = _missing_driver(settings, app)
    if missing is not None:
        problems.append(missing)
    whole = bool(problems)  # a problem of the whole schedule: no part of it is usable
    entries, left_out = [], []
    for name, spec in beat_schedule.items():
        entry = collect(partial(read_entry, name, spec, settings), problems)
        found = [] if entry is None else argument_problems_of(app, entry)
        problems.extend(found)
        if entry is None or found:
            left_out.append(name)
        else:
            entries.append(entry)
    return checked(
        entries,
        problems,
        namespace=settings.namespace,
        timezone=settings.timezone,
        left_out=None if whole else left_out,
    )


MIGRATING = "docs/migrating-from-beat.md, 'From django-celery-beat or RedBeat: what to do now'"
FOREIGN_SCHEDULERS = {
    "django_celery_beat.schedulers.DatabaseScheduler": (
        "django-celery-beat's DatabaseScheduler",
        "in the database (its PeriodicTask rows)",
        "turn on the django-celery-beat bridge (app.conf.beatless_django = True: every node "
        "then schedules the rows, and the Django admin keeps editing them; see "
        "docs/migrating-from-django-celery-beat.md)",
    ),
    "redbeat.RedBeatScheduler": (
        "RedBeat's RedBeatScheduler",
        "in Redis (with the entries saved there at run time)",
        "import its entries once with `beatless schedule import --from "
        "redbeat://HOST:PORT/DB` (they become live entries; see "
        "docs/migrating-from-redbeat.md)",
    ),
}
"""The beat schedulers whose schedule lives outside ``beat_schedule``: by class path,
what it is, where its schedule lives, and what moves that schedule to beatless."""
_SCHEDULER_ALIASES = {
    "django": "django_celery_beat.schedulers.DatabaseScheduler",
    "redbeat.schedulers.RedBeatScheduler": "redbeat.RedBeatScheduler",
}
"""Other names of :data:`FOREIGN_SCHEDULERS`: django-celery-beat's entry point
(``celery beat -S django``) and the module RedBeat's class is defined in."""


def foreign_scheduler(app: Any, entries: int) -> str | None:
    """The problem of an app whose ``beat_scheduler`` is django-celery-beat's
    ``DatabaseScheduler`` or RedBeat's ``RedBeatScheduler``, given by name (with ``:`` or
    ``.``, or an alias) or as the class: its schedule lives elsewhere, beatless reads
    only ``beat_schedule`` (``entries`` of them), and both would send those."""
    value = app.conf.get("beat_scheduler")
    if isinstance(value, type):
        value = f"{value.__module__}.{value.__qualname__}"
    if not isinstance(value, str):
        return None
    name = value.strip().replace(":", ".")
    name = _SCHEDULER_ALIASES.get(name, name)
    if name not in FOREIGN_SCHEDULERS:
        return None
    what, where, move = FOREIGN_SCHEDULERS[name]
    return (
        f"beat_scheduler {value!r} is {what}: its schedule lives {where}, and beatless does "
        f"not load it: this node would schedule only beat_schedule ({entries} entr"
        f"{'y' if entries == 1 else 'ies'} here), which that scheduler sends as well. To "
        f"move that schedule, {move}, or move the periodic tasks into beat_schedule; then "
        f"remove the beat_scheduler setting and stop celery beat. See {MIGRATING}"
    )


def _missing_driver(settings: CelerySettings, app: Any) -> str | None:
    """A line naming the extra to install when the claim store's driver is missing."""
    problem = missing_driver(settings.store_url)
    if problem is None:
        return None
    configured = app.conf.get("beatless_store_url")
    which = "beatless_store_url" if configured else "the claim store (the broker's own server)"
    return f"{which} {mask_url(settings.store_url)}: {problem}"


def argument_problems_of(app: Any, entry: Entry) -> list[str]:
    """The arguments of ``entry`` that the JSON serializer refuses, when the entry's
    serializer (its ``serializer`` option, else ``task_serializer``) is JSON; each one
    would fail every firing."""
    serializer = entry.options.get("serializer") or app.conf.task_serializer
    if serializer != "json":
        return []
    from kombu.utils.json import dumps

    return argument_problems(entry, dumps, "JSON (the task serializer)")


def unregistered_tasks(app: Any, schedule: Schedule) -> list[str]:
    """A warning per entry whose task this app does not register. Celery sends tasks by
    name, so another worker may well run it; a typo, though, would never run."""
    registered = app.tasks
    return [
        f"entry {entry.name!r}: task {entry.task!r} is not registered in this app; it runs "
        f"only where another worker registers it (check the name if none does)"
        for entry in schedule.entries
        if entry.task not in registered
    ]


def read_entry(name: str, spec: Any, settings: CelerySettings) -> Entry:
    """One ``beat_schedule`` entry as a beatless :class:`~beatless.Entry`; a
    :class:`~beatless.errors.ScheduleError` lists every problem of it at once."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"entry {name!r}: expected a dict with 'task' and 'schedule'")
    found: list[str] = []
    options = dict(spec.get("options") or {})
    beatless = entry_settings(name, options.pop(SETTINGS_OPTION, None), found)
    if "schedule" not in spec:
        found.append(f"entry {name!r}: 'schedule' is missing")
    trigger = keep(
        lambda: trigger_of(name, spec["schedule"], settings.timezone), STAND_IN_TRIGGER, found
    )
    task: Any = spec.get("task")
    return entry_of(
        f"entry {name!r}",
        found,
        lambda: Entry(
            name=name,
            task=task,
            trigger=trigger,
            args=spec.get("args") or (),
            kwargs=spec.get("kwargs") or {},
            options=options,
            tenants=_tenants(name, beatless.get("tenants")),
            **{key: beatless.get(key, _default(settings, key)) for key in NAMES},
        ),
    )


def _default(settings: CelerySettings, option: str) -> Any:
    """The app's default of an entry option (``beatless_*``), or the option's own for one
    set on an entry only (its window)."""
    return getattr(settings, option) if option in SHARED_NAMES else DEFAULTS[option]


def _tenants(name: str, value: Any) -> Any:
    """A list or a callable as given; an import path ``"module:function"`` resolved."""
    if not isinstance(value, str):
        return value
    try:
        found = symbol_by_name(value)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"entry {name!r}: tenants {value!r} is neither a list nor an importable "
            f"callable ({exc})"
        ) from None
    if not callable(found):
        raise ConfigError(f"entry {name!r}: tenants {value!r} names {found!r}, not a callable")
    return found


def entry_settings(name: str, value: Any, problems: list[str] | None = None) -> dict[str, Any]:
    """The beatless settings of one entry, with unknown keys refused: raised, or, with
    ``problems`` given, added there and the known keys returned (so that they are still
    checked)."""
    found: list[str] = []
    known = _entry_settings(name, value, found)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise ConfigError(found[0])
    return known


def _entry_settings(name: str, value: Any, problems: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(
            f"entry {name!r}: options[{SETTINGS_OPTION!r}] must be a dict with keys "
            f"{', '.join(ENTRY_SETTINGS)}; got {value!r}"
        )
        return {}
    unknown = sorted(set(value) - set(ENTRY_SETTINGS))
    if unknown:
        hint = (
            " (the namespace is app-wide: set app.conf.beatless_namespace)"
            if "namespace" in unknown
            else ""
        )
        named = ", ".join(_guess(key) for key in unknown)
        problems.append(
            f"entry {name!r}: unknown beatless setting(s) {named} in "
            f"options[{SETTINGS_OPTION!r}]; allowed: {', '.join(ENTRY_SETTINGS)}{hint}"
        )
    return {key: item for key, item in value.items() if key in ENTRY_SETTINGS}


def _guess(key: Any) -> str:
    """An unknown setting, with the known one it is likely a typo of."""
    close = difflib.get_close_matches(key, ENTRY_SETTINGS, n=1) if isinstance(key, str) else []
    return f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def trigger_of(name: str, value: Any, timezone: str) -> Trigger:
    """The beatless trigger of a Celery schedule value (a beatless trigger as it is)."""
    if isinstance(value, At | Every | Cron | Solar):
        return value
    if isinstance(value, crontab):
        return cron_of(value, timezone, name)
    if isinstance(value, solar):
        return _named(name, lambda: Solar(value.event, value.lat, value.lon))
    if _is_clocked(value):
        return _named(name, lambda: At(value.clocked_time))
    return _every(name, _interval(name, value))


def _interval(name: str, value: Any) -> timedelta:
    """The interval of ``schedule(run_every)``, a ``timedelta`` or a number of seconds;
    any other value is refused, naming the entry."""
    if isinstance(value, interval_schedule):
        return value.run_every  # type: ignore[no-any-return]
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ScheduleError(f"entry {name!r}: schedule {value!r} is not a number of seconds")
    if isinstance(value, Real):
        return timedelta(seconds=float(value))
    raise ScheduleError(
        f"entry {name!r}: unsupported schedule {value!r} ({type(value).__name__}): use "
        f"crontab(...), schedule(timedelta), a timedelta, a number of seconds, solar(...), "
        f"clocked(...) or beatless.At(instant) for a one-off"
    )


CLOCKED = ("django_celery_beat.clockedschedule", "clocked")
"""django-celery-beat's one-off schedule, by module and class: recognised without
importing django-celery-beat (which needs Django)."""


def _is_clocked(value: Any) -> bool:
    return any((c.__module__, c.__qualname__) == CLOCKED for c in type(value).__mro__)


def _every(name: str, interval: timedelta) -> Every:
    return _named(name, lambda: Every(interval))


def _named(name: str, build: Callable[[], T]) -> T:
    """``build()``, its :class:`~beatless.errors.ConfigError` said as the entry's."""
    try:
        return build()
    except ConfigError as exc:
        raise ScheduleError(f"entry {name!r}: {exc}") from None


def cron_of(value: Any, timezone: str, name: str = "crontab") -> Cron:
    """A crontab's expanded fields as a 5-field expression, with Celery's AND semantics."""
    fields = [_field(getattr(value, attr), full) for attr, full in _CRON_FIELDS]
    return Cron(" ".join(fields), _own_zone(value, name) or timezone, day_and=True)


def _field(values: set[int], full: range) -> str:
    if set(values) >= set(full):
        return "*"
    return ",".join(str(v) for v in sorted(values))


def _own_zone(value: Any, name: str) -> str | None:
    """The IANA zone of a crontab's ``nowfun``, when it returns an aware datetime."""
    if value.nowfun is None:
        return None
    tzinfo = value.nowfun().tzinfo
    if tzinfo is None:
        return None
    found = zone_name(tzinfo)
    if found is None:
        raise ScheduleError(
            f"entry {name!r}: the crontab's nowfun returns datetimes in {tzinfo!r}, which "
            f"has no IANA name every node would read alike; return datetimes in a ZoneInfo "
            f"or pytz zone, or drop nowfun to use the app's timezone"
        )
    return found


# -- the node's scheduler ----------------------------------------------------------------


class CeleryScheduler(Scheduler):
    """The beatless loop of one Celery node, as :func:`build_scheduler` wires it.

    ``store`` is what the loop claims in: the claim store itself (two-phase: claim
    pending, ``send_task``, commit), or, on the broker's own Redis, the atomic wrapper
    around it, which claims and pushes the message in one script and sends the firings
    of entries it cannot route that way through the two-phase path on the same store.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        claim_store: ClaimStore,
        atomic: Any = None,
        sender: Sender | None = None,
        paths: Mapping[str, tuple[bool, str]],
        **options: Any,
    ) -> None:
        if sender is not None:
            options.setdefault("enqueue", sender)
        super().__init__(schedule, store=atomic or claim_store, **options)
        self.claim_store = claim_store
        self.atomic = atomic
        self.sender = sender
        """The two-phase send, on a broker connection of its own."""
        self.paths = dict(paths)
        """Per entry name: ``(atomic, why)``, as decided at start."""

    def describe(self) -> str:
        """One line: the store, and which path each entry takes and why."""
        parts = [f"store {self.claim_store!r}, namespace {self.schedule.namespace!r}"]
        for is_atomic, label in ((True, "atomic claim-and-enqueue"), (False, "two-phase")):
            names = [
                f"{shown(name)} ({why})"
                for name, (kind, why) in self.paths.items()
                if kind is is_atomic
            ]
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        return "; ".join(parts)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the loop, then close what this node opened: the broker connections of the
        atomic path and of the two-phase send, and the claim store."""
        self.stop(timeout)
        if self.atomic is not None:
            self.atomic.close()
        if self.sender is not None:
            self.sender.close()
        self.claim_store.close()


def build_scheduler(
    app: Any,
    *,
    node: str | None = None,
    clock: Callable[[], float] = time.time,
    on_decision: Callable[[Decision], None] | None = None,
    settings: CelerySettings | None = None,
    schedule: Schedule | None = None,
    framework: str = "celery",
) -> CeleryScheduler:
    """The scheduler of one node of ``app``, shared by the worker bootstep, the beat
    scheduler and tests. Reads the settings and ``beat_schedule``, opens the claim store
    and probes it (:func:`~beatless.stores.probed`: a store that refuses the credentials
    or cannot be reached is a :class:`~beatless.errors.StoreError` naming it), and picks
    the path of each entry, logged once at INFO.

    The atomic path is used when the claim store URL is the broker's own Redis (same
    host, port and db) and ``beatless_force_two_phase`` is off; every other case is
    two-phase, through ``app.send_task`` by a :class:`~beatless.celery._sending.Sender`
    whose every publish ends within :func:`~beatless.node.scheduler.send_deadline_s` of the
    lease. ``schedule`` is the one :func:`check_app` found, read again if not given.
    Call :meth:`CeleryScheduler.close` when done.
    """
    settings = settings or CelerySettings.from_app(app)
    schedule = schedule or read_schedule(app, settings)
    store = open_claim_store(settings)
    sender = None
    atomic = None
    try:
        probed(store)  # the store, not the broker, is named when it cannot be used
        sender = Sender(
            app,
            deadline_s=send_deadline_s(to_ms(settings.lease)),
            expires_from_lateness=settings.expires_from_lateness,
        )
        atomic = _atomic_store(app, store, settings, sender)
        scheduler = CeleryScheduler(
            schedule,
            claim_store=store,
            atomic=atomic,
            sender=sender,
            paths=_paths(schedule, settings, atomic),
            node=node,
            clock=clock,
            on_decision=on_decision,
            lease=settings.lease,
            framework=framework,
            preferred=settings.preferred_claimer,
            live=settings.live,
        )
    except BaseException:
        if atomic is not None:
            atomic.close()
        if sender is not None:
            sender.close()
        store.close()
        raise
    logger.info("beatless node %s: %s", shown(scheduler.node, quoted=False), scheduler.describe())
    _warn_if_weaker(settings, scheduler.paths)
    return scheduler


def _warn_if_weaker(settings: CelerySettings, paths: dict[str, tuple[bool, str]]) -> None:
    """A WARNING when the broker is Redis but the claim store is not its own database:
    every firing then goes two-phase where one script could claim and enqueue it."""
    if settings.force_two_phase or normalise_redis_url(settings.broker_url) is None:
        return
    elsewhere = [
        name for name, (atomic, why) in paths.items() if not atomic and "not the broker's" in why
    ]
    if elsewhere:
        logger.warning(
            "beatless: the broker is Redis but the claim store %s is not its own database, so "
            "%d entr%s go two-phase; leave beatless_store_url unset (or point it at the "
            "broker's Redis database) for claim and enqueue in one step",
            mask_url(settings.store_url),
            len(elsewhere),
            "y" if len(elsewhere) == 1 else "ies",
        )


def open_claim_store(settings: CelerySettings, url: str | None = None) -> ClaimStore:
    """The claim store of ``beatless_store_url`` (or of ``url``), keyed by the app's
    namespace."""
    return open_store(url or settings.store_url, namespace=settings.namespace)


def _atomic_store(
    app: Any, store: ClaimStore, settings: CelerySettings, enqueue: Enqueue
) -> Any | None:
    """The atomic wrapper around ``store`` when this node may use it, else ``None``."""
    from beatless.stores.redis.store import RedisStore

    if settings.two_phase_reason is not None or not isinstance(store, RedisStore):
        return None
    from beatless.celery._atomic import CeleryRedisAtomic

    return CeleryRedisAtomic(
        app,
        store,
        expires_from_lateness=settings.expires_from_lateness,
        fallback_enqueue=enqueue,
        lease=settings.lease,
    )


def _paths(
    schedule: Schedule, settings: CelerySettings, atomic: Any | None
) -> dict[str, tuple[bool, str]]:
    reason = settings.two_phase_reason
    if atomic is None:
        return {entry.name: (False, reason or "two-phase") for entry in schedule.entries}
    paths = {}
    for entry in schedule.entries:
        try:
            kind, why = atomic.route_kind(entry)
        except StoreError as exc:
            kind, why = "two-phase", f"decided per firing: the broker did not answer ({exc})"
        paths[entry.name] = (kind == "atomic", why)
    return paths
