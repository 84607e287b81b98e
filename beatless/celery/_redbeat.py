"""RedBeat's entries, read from its Redis, as beatless entries: ``beatless schedule import
--from redbeat://HOST:PORT/DB`` and :func:`import_redbeat`.

RedBeat keeps each entry as a hash ``PREFIX + name`` (``definition``, ``meta``) listed in
the sorted set ``PREFIX + ":schedule"``, and the names that came from ``beat_schedule``
in the set ``PREFIX + ":statics"`` (``PREFIX`` is ``redbeat_key_prefix``, ``"redbeat:"``
by default). Each definition is decoded by RedBeat's own decoder (``celery-redbeat``,
the ``redbeat`` extra, must be installed where the import runs), then read as a node
reads a ``beat_schedule`` item (:func:`beatless.celery._schedule.read_entry`):

* ``crontab``: a :class:`~beatless.core.triggers.Cron` with Celery's AND day rule, in
  the app's time zone (RedBeat stores none: its beat evaluates crontabs in the app's);
* an interval (``schedule``): an :class:`~beatless.core.triggers.Every` anchored at the
  entry's ``last_run_at`` (RedBeat's ``meta``, to the millisecond), so each later
  occurrence is the instant RedBeat's beat would reach, adding elapsed time as Celery
  does; an entry with no ``last_run_at`` is anchored at the Unix epoch (RedBeat would
  run it at once). A ``relative`` interval is anchored at Celery's rounding of its next
  run, and refused when that rounding does not keep the interval or, from a day up,
  follows the local calendar (a crontab says that);
* ``rrule`` with ``count=1``: a one-off, :class:`~beatless.core.triggers.At` its one
  occurrence; one already past is skipped (said, with when it last ran); any other
  rrule is refused, with the reason;
* ``enabled: false`` stays disabled; ``args``, ``kwargs`` and ``options`` as they are.

Statics (named in the statics set) and names the app's ``beat_schedule`` owns are
skipped as code-owned, and ``celery.backend_cleanup`` (which Celery beat adds by itself,
RedBeat saving it unmarked) is skipped with why. An entry that cannot be read (bad JSON,
a schedule beatless does not take) refuses the whole import, every such entry named;
``skip_bad=True`` imports the others and lists each as skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule
from celery.utils.time import delta_resolution

from beatless.celery._live import live
from beatless.celery._schedule import read_entry, trigger_of
from beatless.celery._settings import CelerySettings
from beatless.core._drivers import driver
from beatless.core._time import from_datetime, iso, to_datetime
from beatless.core.durations import DurationLike
from beatless.core.triggers import At, Every
from beatless.core.urls import mask_url
from beatless.errors import BeatlessError, ConfigError, StoreError
from beatless.live import Live, Plan, Revision
from beatless.live.api import DEFAULT_WINDOW
from beatless.schedule.entry import Entry
from beatless.stores.base import ClaimStore

DEFAULT_PREFIX = "redbeat:"
"""RedBeat's ``redbeat_key_prefix`` when the app sets none."""
SCHEMES = {"redbeat": "redis", "redbeats": "rediss", "redis": "redis", "rediss": "rediss"}
BEAT_DEFAULTS = {
    "celery.backend_cleanup": "Celery beat's own default entry, which RedBeat's beat saves "
    "at each start and beatless does not add: declare it in beat_schedule if you use it"
}
"""Entries beat adds by itself (not statics in RedBeat's set): skipped, with why."""


@dataclass(frozen=True)
class RedBeatRead:
    """What the import found under one prefix: the entries to write, and what it left."""

    url: str
    """The Redis URL, its password masked."""
    prefix: str
    entries: tuple[Entry, ...]
    statics: tuple[str, ...]
    """Names RedBeat marks as from ``beat_schedule``, or the app's code owns: skipped."""
    skipped: tuple[tuple[str, str], ...] = ()
    """``(name, why)``: one-offs already past, and bad entries under ``skip_bad``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "prefix": self.prefix,
            "imported": [e.name for e in self.entries],
            "statics": list(self.statics),
            "skipped": [{"name": n, "why": why} for n, why in self.skipped],
        }


@dataclass(frozen=True)
class RedBeatImport:
    """An import: what was read, the plan against the live entries, and the revision
    written (``None`` for a dry run or when nothing changes)."""

    read: RedBeatRead
    plan: Plan
    revision: Revision | None

    def to_json(self) -> dict[str, Any]:
        revision = None if self.revision is None else self.revision.to_json()
        return {**self.read.to_json(), "plan": self.plan.to_json(), "revision": revision}


def import_redbeat(
    app: Any,
    url: str,
    *,
    prefix: str | None = None,
    skip_bad: bool = False,
    dry_run: bool = False,
    note: str | None = None,
    window: DurationLike = DEFAULT_WINDOW,
    effective_in: DurationLike | None = None,
    store: ClaimStore | str | None = None,
) -> RedBeatImport:
    """Import the RedBeat entries of ``app`` (its zone, its ``beatless_*`` defaults, its
    ``redbeat_key_prefix`` unless ``prefix`` is given) from the Redis of ``url`` into the
    app's live entries (:func:`beatless.celery.live`, ``store`` as there), as one
    revision; ``dry_run=True`` plans and writes nothing. See :func:`read_redbeat`."""
    settings = CelerySettings.from_app(app)
    with live(app, store=store) as entries:
        read = read_redbeat(
            url, settings, prefix=prefix or app_prefix(app), code=entries.code, skip_bad=skip_bad
        )
        return import_into(
            entries, read, dry_run=dry_run, note=note, window=window, effective_in=effective_in
        )


def import_into(
    entries: Live,
    read: RedBeatRead,
    *,
    dry_run: bool = False,
    note: str | None = None,
    window: DurationLike = DEFAULT_WINDOW,
    effective_in: DurationLike | None = None,
) -> RedBeatImport:
    """Write what ``read`` found into ``entries`` as one revision: its entries added or
    replaced, every other live entry left as it is (a plan that merges)."""
    plan = entries.plan(list(read.entries), window, effective_in=effective_in, merge=True)
    if dry_run:
        return RedBeatImport(read, plan, None)
    said = note or f"imported from RedBeat {read.url}, prefix {read.prefix!r}"
    return RedBeatImport(read, plan, entries.apply(plan, note=said))


def app_prefix(app: Any) -> str:
    """The app's ``redbeat_key_prefix``, or RedBeat's default."""
    return str(app.conf.get("redbeat_key_prefix") or DEFAULT_PREFIX)


def redis_url(url: str) -> str:
    """The Redis URL of ``redbeat://HOST:PORT/DB`` (``redbeats://`` for TLS; ``redis://``
    and ``rediss://`` taken as they are)."""
    parts = urlsplit(url)
    scheme = SCHEMES.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise ConfigError(
            f"--from {mask_url(url)}: give redbeat://HOST:PORT/DB (the Redis that RedBeat "
            f"writes to, its redbeat_redis_url)"
        )
    return urlunsplit(parts._replace(scheme=scheme))


def read_redbeat(
    url: str,
    settings: CelerySettings,
    *,
    prefix: str = DEFAULT_PREFIX,
    code: Iterable[str] = (),
    skip_bad: bool = False,
    zone_known: bool = True,
    now: datetime | None = None,
) -> RedBeatRead:
    """Read every RedBeat entry under ``prefix`` in the Redis of ``url`` as an entry of an
    app with ``settings`` (its zone, its ``beatless_*`` defaults). ``code``: names the
    code owns (skipped). ``zone_known=False``: the zone is a guess, so a crontab is
    refused rather than read in it. A :class:`~beatless.errors.StoreError` when Redis
    cannot be reached; a :class:`~beatless.errors.ConfigError` when nothing is found
    under ``prefix`` or (without ``skip_bad``) any entry cannot be read."""
    how = _How(_decoder(), settings, zone_known, now or datetime.now(UTC))
    shown = mask_url(url)
    rows, statics = _fetch(redis_url(url), shown, prefix)
    owned = set(statics) | set(code)
    entries: list[Entry] = []
    skipped: list[tuple[str, str]] = []
    bad: list[tuple[str, str]] = []
    left: list[str] = []
    for name, definition, meta in rows:
        if name in owned:
            left.append(name)
            continue
        if name in BEAT_DEFAULTS:
            skipped.append((name, BEAT_DEFAULTS[name]))
            continue
        try:
            entry = _entry(name, definition, meta, how)
        except _Past as past:
            skipped.append((name, str(past)))
        except (BeatlessError, ValueError, TypeError, KeyError) as exc:
            bad.append((name, _reason(name, exc)))
        else:
            entries.append(entry)
    if bad and not skip_bad:
        named = "; ".join(f"entry {n!r}: {why}" for n, why in bad)
        raise ConfigError(
            f"RedBeat import from {shown} (prefix {prefix!r}) refused, nothing written: "
            f"{named} (fix or delete them, or import the others with --skip-bad, skip_bad=True)"
        )
    skipped += [(n, f"not imported: {why}") for n, why in bad]
    return RedBeatRead(shown, prefix, tuple(entries), tuple(sorted(left)), tuple(skipped))


@dataclass(frozen=True)
class _How:
    """How the entries are read: RedBeat's decoder, the app's settings, whether the zone
    is the app's, and the instant a one-off must be after."""

    decoder: type[json.JSONDecoder]
    settings: CelerySettings
    zone_known: bool
    now: datetime


class _Past(Exception):
    """A one-off whose one occurrence is past: skipped, not refused."""


def _decoder() -> type[json.JSONDecoder]:
    """RedBeat's own JSON decoder, so that an entry reads as RedBeat's beat reads it."""
    redbeat = driver("redbeat.decoder", "reading RedBeat's entries (with its own decoder)")
    decoder: type[json.JSONDecoder] = redbeat.decoder.RedBeatJSONDecoder
    return decoder


def _fetch(url: str, shown: str, prefix: str) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """``(name, definition, meta)`` of every entry in RedBeat's schedule set, by name, and
    the statics' names."""
    redis = driver("redis", "reading RedBeat's entries")
    schedule_key, statics_key = prefix + ":schedule", prefix + ":statics"
    try:
        with redis.Redis.from_url(url, decode_responses=True, socket_timeout=10) as client:
            keys = client.zrange(schedule_key, 0, -1)
            if not keys:
                raise ConfigError(_nothing_under(client, shown, prefix, schedule_key))
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hmget(key, "definition", "meta")
                found = pipe.execute()
            statics = sorted(client.smembers(statics_key))
    except redis.RedisError as exc:
        raise StoreError(f"RedBeat's Redis {shown} cannot be read: {exc}") from None
    rows = [
        (key[len(prefix) :] if key.startswith(prefix) else key, definition, meta)
        for key, (definition, meta) in zip(keys, found, strict=True)
    ]
    return sorted(rows), statics


def _nothing_under(client: Any, shown: str, prefix: str, schedule_key: str) -> str:
    found = client.scan_iter(match="*:schedule", count=1_000, _type="zset")
    others = [key[: -len(":schedule")] for key in islice(found, 5)]
    hint = f"; sorted sets that look like RedBeat's are under {others}" if others else ""
    return (
        f"no RedBeat entries under prefix {prefix!r} in {shown}: the sorted set "
        f"{schedule_key!r} is empty or missing (give --prefix, RedBeat's redbeat_key_prefix"
        f"{hint})"
    )


def _entry(
    name: str,
    definition: str | None,
    meta: str | None,
    how: _How,
) -> Entry:
    if not definition:
        raise ConfigError("listed in RedBeat's schedule set but its hash has no definition")
    data = json.loads(definition, cls=how.decoder)
    last_run_at = (json.loads(meta, cls=how.decoder) or {}).get("last_run_at") if meta else None
    if not isinstance(data, dict) or "task" not in data:
        raise ConfigError(f"the definition is not a RedBeat entry: {definition[:200]!r}")
    value = _schedule(name, data.get("schedule"), last_run_at, how)
    options = dict(data.get("options") or {})
    if data.get("enabled") is False:
        options["beatless"] = {**(options.get("beatless") or {}), "enabled": False}
    item = {
        "task": data["task"],
        "schedule": value,
        "args": data.get("args") or (),
        "kwargs": data.get("kwargs") or {},
        "options": options,
    }
    return read_entry(str(data.get("name") or name), item, how.settings)


def _schedule(
    name: str,
    value: Any,
    last_run_at: datetime | None,
    how: _How,
) -> Any:
    """The schedule value ``read_entry`` takes for a RedBeat schedule."""
    if isinstance(value, crontab):
        if not how.zone_known:
            raise ConfigError(
                "RedBeat stores no time zone for a crontab (its beat uses the Celery app's "
                "timezone): give --celery APP or --timezone ZONE"
            )
        return value
    if isinstance(value, interval_schedule):
        return _anchored(name, value, last_run_at, how.settings)
    if type(value).__name__ == "rrule" and hasattr(value, "rrule"):
        return _one_off(value, last_run_at, how.now)
    if isinstance(value, dict) and value.get("__type__") == "solar":
        raise ConfigError(
            "a solar schedule, which RedBeat's encoder cannot write: put it as a live entry "
            "with beatless's Solar trigger instead (the solar extra, beatless[solar])"
        )
    if isinstance(value, dict) and "__type__" in value:
        raise ConfigError(f"RedBeat's decoder does not know schedule type {value['__type__']!r}")
    return value  # a number or anything else: read_entry says what it takes


def _anchored(
    name: str, value: Any, last_run_at: datetime | None, settings: CelerySettings
) -> Every:
    every = trigger_of(name, value, settings.timezone)
    assert isinstance(every, Every)  # noqa: S101 - trigger_of maps an interval to Every
    if last_run_at is None:
        return every
    start = last_run_at if last_run_at.tzinfo is not None else last_run_at.replace(tzinfo=UTC)
    if value.relative and value.run_every >= timedelta(days=1):
        raise ConfigError(
            f"Celery runs a relative interval of {value.run_every} at local midnight, by the "
            f"calendar: re-create it as a crontab (hour=0, minute=0)"
        )
    if value.relative:
        unit = _unit_s(value.run_every)
        if value.run_every.total_seconds() % unit:
            raise ConfigError(
                f"a relative interval of {value.run_every} is rounded by Celery to whole "
                f"{_UNITS[unit]}, so it does not fire every {value.run_every}: re-create it "
                f"with relative=False, or as a crontab"
            )
        start = delta_resolution(start + value.run_every, value.run_every).replace(microsecond=0)
    return Every(every.interval, anchor=to_datetime(from_datetime(start)))


_UNITS = {86_400: "days", 3_600: "hours", 60: "minutes", 1: "seconds"}


def _unit_s(interval: timedelta) -> int:
    """The unit Celery rounds a relative interval's next run to (``delta_resolution``)."""
    return next(unit for unit in _UNITS if interval.total_seconds() >= unit or unit == 1)


def _one_off(value: Any, last_run_at: datetime | None, now: datetime) -> At:
    if value.count != 1:
        repeats = "with no count" if value.count is None else f"with count={value.count}"
        raise ConfigError(
            f"an rrule {repeats} repeats, and beatless imports an rrule only as a one-off "
            f"(count=1): re-create it as a crontab or an interval"
        )
    occurrences = list(value.rrule)
    if not occurrences:
        raise _Past("a one-off rrule with no occurrence (its until is before its start)")
    at = At(_aware(occurrences[0]))
    if at.instant_ms <= from_datetime(now):
        ran = "" if last_run_at is None else f", last run {iso(from_datetime(_aware(last_run_at)))}"
        raise _Past(f"a one-off at {iso(at.instant_ms)}, already past{ran}")
    return at


def _aware(instant: datetime) -> datetime:
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


def _reason(name: str, exc: BaseException) -> str:
    """The error's text, without the ``entry 'name':`` that the list adds anyway."""
    text = " ".join(str(exc).split()).removeprefix(f"entry {name!r}: ")
    return text or type(exc).__name__


def with_zone(settings: CelerySettings, timezone: str | None) -> CelerySettings:
    """``settings`` with ``timezone`` (the crontabs' zone) when one is given."""
    return settings if timezone is None else replace(settings, timezone=timezone)
