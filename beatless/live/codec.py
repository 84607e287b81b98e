"""An entry as JSON, and back: the form in which live entries are stored.

One entry is one JSON object, version 1::

    {"v": 1, "name": "reports.nightly", "task": "app.report",
     "trigger": {"cron": "0 4 * * *", "timezone": "Europe/Paris", "day_and": null},
     "args": [1], "kwargs": {"to": "ops"}, "options": {"queue": "slow"},
     "jitter_us": 0, "max_late_us": 60000000, "catch_up": "latest", "overlap": "allow",
     "run_lease_us": 30000000, "heartbeat_us": 5000000, "once_only": true,
     "tenants": null}

An ``Every`` trigger is ``{"every_us": interval, "anchor": ISO 8601 in UTC}``. Every
option of :data:`beatless.schedule.options.OPTIONS` up to ``once_only`` is written,
durations as whole microseconds (so a ``timedelta`` comes back exactly); a time zone of
``null`` is bound to the app's when a node runs the entry, as for code entries. ``args``,
``kwargs`` and ``options`` must be JSON (``str``, numbers, ``bool``, ``None``, lists and
objects with text keys): what a broker carries. A tuple comes back as a list, as it does
on the wire. Fan-out takes a fixed list of tenants only: a callable cannot be stored.

Version 2 is written for an entry that a version-1 reader would run wrongly: a one-off
(``{"at": ISO 8601 in UTC}``), a solar event (``{"solar": "sunset", "lat": 52.52,
"lon": 13.405}``, read only where ``ephem`` is installed), a window (``"start_at"``,
``"end_at"``: ISO 8601 in UTC or ``null``) or ``"enabled": false``. Its ``max_late_us``
is ``null`` while ``max_late`` is the trigger's default (a one-off's is fitted to the
store by each node). A node that reads version 1 only refuses such an entry (logged, not
scheduled) rather than fire it outside its window; every other entry stays version 1,
byte for byte as before.

An entry written by a bridge from another source of truth says so: ``"owner"`` (e.g.
``"django"``; absent: ``"store"``, written through :class:`~beatless.live.Live` by hand)
and ``"source"``, what the bridge needs to know the entry again (a row's id and digest).
Readers of the entry ignore both: they say who may change it, not how it runs.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from beatless.core._time import from_datetime, iso
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry
from beatless.schedule.options import BY_NAME, OPTIONS

FORMAT_VERSION = 2
"""The newest layout of a stored entry; one this beatless does not read is refused,
naming both."""
FORMATS = (1, 2)
"""The layouts this beatless reads."""
WINDOW = ("start_at", "end_at", "enabled")
"""The options only version 2 writes (when they are not their defaults)."""


def entry_to_json(entry: Entry) -> dict[str, Any]:
    """``entry`` as a JSON object (see the module docstring); refuses what JSON cannot
    hold, naming the entry."""
    if callable(entry.tenants):
        raise ConfigError(
            f"entry {entry.name!r}: a live entry needs a fixed list of tenants, not a callable"
        )
    newer = isinstance(entry.trigger, At | Solar) or any(
        getattr(entry, name) != BY_NAME[name].default for name in WINDOW
    )
    data: dict[str, Any] = {
        "v": FORMAT_VERSION if newer else 1,
        "name": entry.name,
        "task": entry.task,
        "trigger": trigger_to_json(entry.trigger),
        "args": _plain(list(entry.args), entry.name, "args"),
        "kwargs": _plain(dict(entry.kwargs), entry.name, "kwargs"),
        "options": _plain(dict(entry.options), entry.name, "options"),
    }
    for option in OPTIONS:
        value = getattr(entry, option.name)
        if option.name in WINDOW:
            if newer:
                instant = option.kind == "instant" and value is not None
                data[option.name] = iso(from_datetime(value)) if instant else value
        elif option.kind == "duration":
            defaulted = newer and option.name == "max_late" and not entry.max_late_given
            data[f"{option.name}_us"] = None if defaulted else _micros(value)
        else:
            data[option.name] = value
    data["tenants"] = None if entry.tenants is None else list(entry.tenants)
    return data


STORE_OWNER = "store"
"""The owner of a live entry written by hand (:class:`~beatless.live.Live`'s default)."""


def owner_of(data: Any) -> str:
    """Who owns a stored entry: its ``"owner"``, else :data:`STORE_OWNER`."""
    owner = data.get("owner") if isinstance(data, dict) else None
    return owner if isinstance(owner, str) and owner else STORE_OWNER


def entry_from_json(data: Any) -> Entry:
    """The entry a JSON object of :func:`entry_to_json` holds; a bad one is a
    :class:`~beatless.errors.ConfigError` naming what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"a stored entry must be a JSON object, got {data!r:.80}")
    if data.get("v") not in FORMATS:
        raise ConfigError(
            f"stored entry {data.get('name')!r} has format {data.get('v')!r}; this beatless "
            f"reads formats {', '.join(map(str, FORMATS))}: upgrade beatless"
        )
    given: dict[str, Any] = {}
    for option in OPTIONS:
        if option.kind == "duration":
            key = f"{option.name}_us"
            unset = option.name == "max_late" and data["v"] > 1 and data.get(key) is None
            given[option.name] = None if unset else timedelta(microseconds=_int(data, key))
        elif option.name not in WINDOW or data["v"] > 1:
            given[option.name] = data.get(option.name, option.default)
    tenants = data.get("tenants")
    return Entry(
        name=data.get("name"),  # type: ignore[arg-type]
        task=data.get("task"),  # type: ignore[arg-type]
        trigger=trigger_from_json(data.get("trigger")),
        args=data.get("args") or (),
        kwargs=data.get("kwargs") or {},
        options=data.get("options") or {},
        tenants=None if tenants is None else tuple(tenants),
        **given,
    )


def trigger_to_json(trigger: Trigger) -> dict[str, Any]:
    if isinstance(trigger, Cron):
        return {"cron": trigger.expr, "timezone": trigger.tz, "day_and": trigger.day_and}
    if isinstance(trigger, Every):
        return {"every_us": _micros(trigger.interval), "anchor": trigger.anchor.isoformat()}
    if isinstance(trigger, At):
        return {"at": iso(trigger.instant_ms)}
    if isinstance(trigger, Solar):
        return {"solar": trigger.event, "lat": trigger.lat, "lon": trigger.lon}
    raise ConfigError(
        f"a live entry's trigger must be a Cron, an Every, an At or a Solar, got {trigger!r}"
    )


def trigger_from_json(data: Any) -> Trigger:
    if isinstance(data, dict) and isinstance(data.get("cron"), str):
        return Cron(data["cron"], data.get("timezone"), day_and=data.get("day_and"))
    if isinstance(data, dict) and "every_us" in data:
        anchor = data.get("anchor")
        at = datetime.fromisoformat(anchor) if isinstance(anchor, str) else None
        return Every(timedelta(microseconds=_int(data, "every_us")), at)
    if isinstance(data, dict) and isinstance(data.get("at"), str):
        return At(data["at"])
    if isinstance(data, dict) and isinstance(data.get("solar"), str):
        return Solar(data["solar"], data.get("lat"), data.get("lon"))  # type: ignore[arg-type]
    raise ConfigError(
        f"a stored trigger must be a cron, an every, an at or a solar, got {data!r:.80}"
    )


def dumps(value: Any) -> str:
    """Compact JSON, keys in order of insertion, text as it is (not escaped)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _plain(value: Any, name: str, part: str) -> Any:
    """``value`` if JSON holds it as it is (a tuple as a list); else a refusal."""
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"entry {name!r}: {part} must be JSON (text, numbers, true/false, null, lists, "
            f"objects with text keys) to be stored: {exc}"
        ) from None
    back = json.loads(text)
    if dumps(back) != text:  # pragma: no cover - json.dumps output always reads back
        raise ConfigError(f"entry {name!r}: {part} does not come back from JSON as it is")
    return back


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"stored entry {data.get('name')!r}: {key} must be an integer")
    return value
