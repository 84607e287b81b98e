"""A schedule written as a TOML schedule file, the one :mod:`beatless.cli.loader` reads.

:func:`schedule_toml` writes each entry as an ``[[entry]]`` table so that loading the
file gives the same entries back: the trigger (``cron`` with its ``timezone`` and
``day_and`` when set, ``every`` with its ``anchor`` when not the epoch, or ``at``),
``args``, ``kwargs``, ``options`` and ``tenants`` when given, and each option that differs
from its default (durations as ``"90s"``, ``"1h30m"``, ``"250ms"``, or seconds when finer;
instants as ISO 8601 text in UTC; ``max_late`` when it is not the trigger's default, and a
one-off's whenever it was set, so that it is not fitted to the store when read back). A cron
without a zone of its own is written without one: the file's ``timezone`` (the fleet's)
binds it when loaded, as a node binds it. TOML has no null: a value holding one is
refused, naming the entry and where, so export those entries as JSON instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from beatless.core._time import EPOCH, from_datetime, iso
from beatless.core.durations import describe
from beatless.core.triggers import At, Cron, Every, Trigger
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry
from beatless.schedule.options import OPTIONS, default_max_late

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INT64 = range(-(2**63), 2**63)


def schedule_toml(
    entries: Iterable[Entry], *, namespace: str, timezone: str, header: str = ""
) -> str:
    """A TOML schedule file of ``entries`` (see the module docstring); ``header`` is
    written first as comment lines."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"namespace = {_string(namespace)}", f"timezone = {_string(timezone)}"]
    for entry in entries:
        lines += ["", "[[entry]]"]
        lines += [f"{_key(k)} = {_value(v, entry.name, k)}" for k, v in entry_table(entry)]
    return "\n".join(lines) + "\n"


def entry_table(entry: Entry) -> list[tuple[str, Any]]:
    """The keys and values of one ``[[entry]]`` table, in the loader's order."""
    if callable(entry.tenants):
        raise ConfigError(f"entry {entry.name!r}: tenants given by a callable cannot be written")
    table: list[tuple[str, Any]] = [("name", entry.name), ("task", entry.task)]
    table += _trigger(entry.trigger, entry.name)
    for option in OPTIONS:
        value = getattr(entry, option.name)
        if option.name == "max_late" and not _max_late_written(entry):
            continue
        if value != option.default:
            table.append((option.name, _plain(value)))
    if entry.tenants is not None:
        table.append(("tenants", list(entry.tenants)))
    for key in ("args", "kwargs", "options"):
        value = getattr(entry, key)
        if value:
            table.append((key, list(value) if key == "args" else dict(value)))
    return table


def _max_late_written(entry: Entry) -> bool:
    """Whether the table says the entry's ``max_late``: when it was set and is not the
    trigger's default, and for a one-off whenever it was set."""
    if not entry.max_late_given:
        return False
    return isinstance(entry.trigger, At) or entry.max_late != default_max_late(entry.trigger)


def _plain(value: Any) -> Any:
    """An option's value as the loader reads it back: a duration or an instant as text."""
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, datetime):
        return iso(from_datetime(value))
    return value


def _trigger(trigger: Trigger, name: str) -> list[tuple[str, Any]]:
    if isinstance(trigger, Cron):
        table: list[tuple[str, Any]] = [("cron", trigger.expr)]
        table += [("timezone", trigger.tz)] if trigger.tz is not None else []
        return table + ([("day_and", trigger.day_and)] if trigger.day_and is not None else [])
    if isinstance(trigger, Every):
        table = [("every", _duration(trigger.interval))]
        return table + ([("anchor", trigger.anchor.isoformat())] if trigger.anchor != EPOCH else [])
    if isinstance(trigger, At):
        return [("at", iso(trigger.instant_ms))]
    raise ConfigError(f"entry {name!r}: a {type(trigger).__name__} trigger cannot be written")


def _duration(delta: timedelta) -> str | float:
    """``delta`` as the loader reads it back exactly: ``"1h30m"``, else seconds."""
    if delta >= timedelta(0) and delta.microseconds % 1_000 == 0:
        return describe(delta)
    return delta.total_seconds()


def _value(value: Any, name: str, where: str) -> str:
    """``value`` as TOML (inline tables and arrays); refuses what TOML cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value in _INT64:
        return str(value)
    if isinstance(value, float):
        return repr(value)  # JSON values are finite: ``1e+20``, ``-0.0`` read as TOML
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        items = (_value(v, name, f"{where}[{i}]") for i, v in enumerate(value))
        return f"[{', '.join(items)}]"
    if isinstance(value, Mapping):
        pairs = (f"{_key(str(k))} = {_value(v, name, f'{where}.{k}')}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }" if value else "{}"
    what = "null" if value is None else f"{type(value).__name__} {value!r:.40}"
    raise ConfigError(
        f"entry {name!r}: {where} holds {what}, which TOML cannot hold; export as JSON "
        f"(--format json) instead"
    )


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but TOML refuses a raw DEL."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
