"""Load a schedule from a target: ``module:attribute`` or a TOML schedule file.

A TOML schedule file looks like this::

    namespace = "billing"          # default "default"
    timezone = "Europe/Berlin"     # zone of crons that name none; default "UTC"
    max_late = "60s"               # default for entries that do not set it
    jitter = 0                     # default for entries that do not set it
    catch_up = "latest"            # default: "latest", "all" or "none"
    overlap = "allow"              # default: "allow" or "skip"
    run_lease = "30s"              # run lease of entries with overlap "skip" or once-only
    heartbeat = "5s"               # renewal of a run lease; under half the run_lease
    once_only = true               # refuse a second execution of a firing (default)

    [[entry]]
    name = "nightly-report"
    task = "reports.nightly"
    cron = "0 2 * * *"
    jitter = "2m"
    tenants = ["acme", "globex"]
    kwargs = { format = "pdf" }
    overlap = "skip"               # never two runs of one tenant's report at once

    [[entry]]
    name = "heartbeat"
    task = "ops.heartbeat"
    every = "30s"
    start_at = 2027-01-01T00:00:00Z   # no occurrence before it (inclusive)
    end_at = "2027-07-01T00:00:00Z"   # none at or after it
    enabled = true                    # false: known (listed, explained), schedules nothing

    [[entry]]
    name = "migrate-once"
    task = "ops.migrate"
    at = 2027-01-01T09:00:00Z         # one occurrence: a one-off

    [[entry]]
    name = "lights-on"
    task = "garden.lights"
    solar = "sunset"                  # Celery's solar events; needs beatless[solar]
    lat = 52.52
    lon = 13.405

Every problem in the file is collected and reported at once in one
:class:`~beatless.errors.ScheduleError`; a file that cannot be read or parsed, and a
module that cannot be imported, raise :class:`~beatless.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import tomli

from beatless.core._bulk import paused_collection
from beatless.core._logtext import shown
from beatless.core._time import as_datetime, as_instant
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger, zone
from beatless.errors import ConfigError, ScheduleError
from beatless.fleet.limits import limits
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.options import DEFAULTS, NAMES, SHARED_NAMES, read_options
from beatless.schedule.problems import STAND_IN_TRIGGER, entry_of, keep

TOP_KEYS = ("namespace", "timezone", *SHARED_NAMES, "entry")
"""The keys of the top level: the options there are the defaults of every entry (all
but an entry's window: ``start_at``, ``end_at``, ``enabled``)."""
TRIGGER_KEYS = ("cron", "every", "at", "solar")
SOLAR_KEYS = ("lat", "lon")
ENTRY_KEYS = (
    "name",
    "task",
    *TRIGGER_KEYS,
    "anchor",
    "timezone",
    "day_and",
    *SOLAR_KEYS,
    *NAMES,
    "tenants",
    "args",
    "kwargs",
    "options",
)
_ENTRY_KEY_SET = frozenset(ENTRY_KEYS)


def load_schedule(target: str) -> Schedule:
    """The schedule a target names: a path to a TOML file, or ``module:attribute``.

    The attribute may be a :class:`~beatless.Schedule` or a list of
    :class:`~beatless.Entry` (wrapped in a schedule with the default namespace). A
    schedule whose names break the store's :func:`~beatless.fleet.limits.limits` is a
    :class:`~beatless.errors.ScheduleError` listing them.
    """
    with paused_collection():
        schedule = _load(target)
        errors = limits(schedule)
    if errors:
        raise ScheduleError("; ".join(errors), errors)
    return schedule


def _load(target: str) -> Schedule:
    path = Path(target)
    if path.suffix.lower() == ".toml" or path.is_file():
        return load_toml(path)
    module, sep, attribute = target.partition(":")
    if sep and module and attribute:
        return load_object(module, attribute)
    raise ConfigError(f"cannot find schedule {target!r}: give a TOML file path or module:attribute")


def load_object(module_name: str, attribute: str) -> Schedule:
    """The schedule held by ``attribute`` (dotted names allowed) of ``module_name``."""
    try:
        value: Any = importlib.import_module(module_name)
    except ScheduleError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(value, Schedule):
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, Entry) for item in value):
        return Schedule(value)
    raise ConfigError(
        f"{module_name}:{attribute} is a {type(value).__name__}, "
        f"not a beatless Schedule or a list of Entry"
    )


def load_toml(path: Path) -> Schedule:
    """The schedule in a TOML file; see the module docstring for the format."""
    try:
        with path.open("rb") as file:
            data = tomli.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(
            f"{path}: values nested too deep to read; a schedule nests at most "
            f"{MAX_DEPTH} levels of tables and arrays"
        ) from None
    too_deep = _too_deep(data)
    if too_deep is not None:
        raise ConfigError(
            f"{path}: the value of {too_deep} is nested over {MAX_DEPTH} "
            f"levels of tables and arrays; a schedule nests at most {MAX_DEPTH}"
        )
    return schedule_from_mapping(data, source=str(path))


MAX_DEPTH = 100
"""Levels of tables and arrays a schedule file may nest: its options need 4, and task
``args`` and ``kwargs`` get the rest."""


def _too_deep(data: Mapping[str, Any]) -> str | None:
    """Where ``data`` nests over ``MAX_DEPTH`` levels (``entry[0].kwargs.k[0][0]...``),
    found without recursion; ``None`` if nowhere. Where it is, is only written out when
    some value is that deep."""
    if _depth(data) <= MAX_DEPTH:
        return None
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return where
        if len(where) > PATH_SHOWN and not where.endswith("..."):
            where += "..."
        shown_at = where if where.endswith("...") else None
        if isinstance(value, Mapping):
            stack += [
                (
                    v,
                    shown_at or (f"{where}.{shown(k, quoted=False)}" if where else str(k)),
                    depth + 1,
                )
                for k, v in value.items()
            ]
        elif isinstance(value, list):
            stack += [(v, shown_at or f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return None


PATH_SHOWN = 60
"""Characters of the path to a value nested too deep that an error shows."""


def _depth(data: Mapping[str, Any]) -> int:
    """How many levels of tables and arrays ``data`` nests (itself the first), found
    without recursion and without looking into anything else. (TOML reads tables as
    ``dict`` and arrays as ``list``, nothing else.)"""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        for item in value.values() if type(value) is dict else value:
            if type(item) is dict or type(item) is list:
                stack.append((item, depth + 1))
    return deepest


def schedule_from_mapping(data: Mapping[str, Any], *, source: str = "schedule") -> Schedule:
    """Build a schedule from parsed TOML (or any mapping of the same shape)."""
    errors: list[str] = []
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        errors.append(f"top level: {_unknown(unknown, TOP_KEYS)}")
    namespace = data.get("namespace", "default")
    timezone = data.get("timezone", "UTC")
    given = {key: data[key] for key in SHARED_NAMES if key in data}
    defaults = {**DEFAULTS, **read_options(given, lambda key: f"top level: {key}", errors)}
    try:
        zone(_text(timezone, "timezone"))
    except ConfigError as exc:
        errors.append(f"top level: {exc}")
        timezone = "UTC"
    tables = data.get("entry", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        errors.append("top level: 'entry' must be a list of tables, written [[entry]]")
        tables = []
    if not tables and not errors:
        errors.append("top level: no entries; add at least one [[entry]] table")
    entries = []
    for index, table in enumerate(tables, start=1):
        entry = _plain_entry(table, defaults, timezone)
        if entry is None:
            entry = _collect(lambda t=table, i=index: _entry(t, i, defaults, timezone), errors)
        if entry is not None:
            entries.append(entry)
    if errors:
        # Still run the rules that need every entry, so one run reports everything.
        _collect(lambda: Schedule(entries, timezone=timezone), errors)
        raise ScheduleError(f"{source}: {len(errors)} problem(s): " + "; ".join(errors), errors)
    return Schedule(entries, namespace=_text(namespace, "namespace"), timezone=timezone)


def _collect(build: Any, errors: list[str]) -> Any:
    try:
        return build()
    except ScheduleError as exc:
        errors.extend(exc.errors)
    except ConfigError as exc:
        errors.append(str(exc))
    return None


_CONTAINERS: tuple[tuple[str, type[list[Any]] | type[dict[str, Any]]], ...] = (
    ("args", list),
    ("kwargs", dict),
    ("options", dict),
)


def _plain_entry(
    table: Mapping[str, Any], defaults: Mapping[str, Any], timezone: str
) -> Entry | None:
    """The entry of a table with no problem, built at once: the entry :func:`_entry` makes
    of it, without the work of collecting problems (a fifth of the time 100,000 entries
    take to make). ``None`` for a table with any problem, which :func:`_entry` then reads
    again to name them all."""
    if not table.keys() <= _ENTRY_KEY_SET:
        return None
    name, task = table.get("name"), table.get("task")
    if not isinstance(name, str) or not name or not isinstance(task, str) or not task:
        return None
    pieces: dict[str, Any] = {}
    for key, kind in _CONTAINERS:
        if key in table:
            if not isinstance(table[key], kind):
                return None
            pieces[key] = table[key]
    options = {key: table.get(key, defaults[key]) for key in NAMES}
    try:
        if "tenants" in table:
            pieces["tenants"] = _tenants(table["tenants"])
        trigger = _trigger(table, timezone)
        return Entry(name=name, task=task, trigger=trigger, **pieces, **options)
    except (ConfigError, ScheduleError):
        return None


def _entry(
    table: Mapping[str, Any], index: int, defaults: Mapping[str, Any], timezone: str
) -> Entry:
    """The entry of one ``[[entry]]`` table; every problem of it at once. A cron that
    names no zone is in ``timezone``, the file's, as the schedule would bind it."""
    name = table.get("name")
    label = f"entry {name!r}" if isinstance(name, str) and name else f"entry #{index}"
    found: list[str] = []
    unknown = sorted(table.keys() - _ENTRY_KEY_SET)
    if unknown:
        found.append(_unknown(unknown, ENTRY_KEYS))
    if not isinstance(name, str) or not name:
        found.append("'name' is required and must be a string")
        problems = [f"{label}: {problem}" for problem in found]
        raise ScheduleError("; ".join(problems), problems)
    pieces: dict[str, Any] = {
        "task": keep(lambda: _text(table.get("task"), "task"), "?", found),
        "trigger": keep(lambda: _trigger(table, timezone), STAND_IN_TRIGGER, found),
    }
    for key, kind in _CONTAINERS:
        if key in table:  # else the entry's default
            pieces[key] = keep(functools.partial(_typed, table, key, kind, kind()), kind(), found)
    if "tenants" in table:
        pieces["tenants"] = keep(lambda: _tenants(table["tenants"]), None, found)
    options = {key: table.get(key, defaults[key]) for key in NAMES}
    return entry_of(label, found, lambda: Entry(name=name, **pieces, **options))


def _unknown(keys: Iterable[str], allowed: Sequence[str]) -> str:
    named = []
    for key in keys:
        close = difflib.get_close_matches(key, allowed, n=1)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown key(s) {', '.join(named)}; allowed: {', '.join(allowed)}"


def _trigger(table: Mapping[str, Any], timezone: str) -> Trigger:
    if sum(key in table for key in TRIGGER_KEYS) != 1:
        raise ConfigError(
            "give exactly one of 'cron' (an expression), 'every' (a duration), 'at' (an "
            "instant, for a one-off) or 'solar' (an event, with 'lat' and 'lon')"
        )
    if "solar" in table:
        return _solar(table)
    for key in SOLAR_KEYS:
        if key in table:
            raise ConfigError(f"{key!r} applies to 'solar' only")
    if "at" in table:
        for key in ("anchor", "timezone", "day_and"):
            if key in table:
                raise ConfigError(f"{key!r} does not apply to 'at' (one instant, with its offset)")
        return At(as_instant(table["at"], name="'at'"))
    if "cron" in table:
        if "anchor" in table:
            raise ConfigError("'anchor' applies to 'every' only, not to 'cron'")
        day_and = table.get("day_and")
        if day_and is not None and not isinstance(day_and, bool):
            raise ConfigError(f"'day_and' must be true or false, got {day_and!r}")
        tz = table.get("timezone")
        return Cron(
            _text(table["cron"], "cron"),
            timezone if tz is None else _text(tz, "timezone"),
            day_and=day_and,
        )
    for key in ("timezone", "day_and"):
        if key in table:
            raise ConfigError(f"{key!r} applies to 'cron' only, not to 'every'")
    return Every(table["every"], anchor=_anchor(table.get("anchor")))


def _solar(table: Mapping[str, Any]) -> Solar:
    for key in ("anchor", "timezone", "day_and"):
        if key in table:
            raise ConfigError(f"{key!r} does not apply to 'solar' (the sun keeps no time zone)")
    missing = [key for key in SOLAR_KEYS if key not in table]
    if missing:
        raise ConfigError(f"'solar' needs {' and '.join(map(repr, missing))} in degrees")
    return Solar(_text(table["solar"], "solar"), table["lat"], table["lon"])


def _anchor(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"'anchor' must be an ISO 8601 instant, got {value!r}")
    return parse_instant(value, what="anchor")


def parse_instant(text: str, *, what: str = "instant") -> datetime:
    """An aware datetime from ISO 8601 with a ``Z`` or an offset; naive times are refused
    (:func:`~beatless.core._time.as_datetime`)."""
    return as_datetime(text, name=what)


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def _typed(table: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = table.get(key, default)
    if not isinstance(value, kind):
        expected = "a list" if kind is list else "a table"
        raise ConfigError(f"{key!r} must be {expected}, got {value!r}")
    return value


def _tenants(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigError(f"'tenants' must be a list of non-empty strings, got {value!r}")
    return value
