"""The options of an entry beside its task, trigger and arguments, each declared once.

Ten options say how an entry fires and runs: ``jitter``, ``max_late``, ``catch_up``,
``overlap``, ``run_lease``, ``heartbeat``, ``once_only``, and its window: ``start_at``,
``end_at`` and ``enabled``. Each is written once here, with its default, how a value is
read and the text of its error, and every place that takes them reads them through
:data:`OPTIONS`: :class:`~beatless.schedule.entry.Entry`, the TOML loader (top-level
defaults and each ``[[entry]]``), Celery's ``beatless_*`` settings and
``options["beatless"]``, Dramatiq's middleware defaults and ``periodic=``, and the live
codec. So a new option, or a new rule of one, is one line here. The window belongs to
one entry (:attr:`Option.per_entry`): no top level or app setting gives it a default.

An error names where the value came from (``name``): ``entry 'report': max_late``,
``top level: max_late``, ``beatless_max_late``, ``Beatless: max_late``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from beatless.core._time import as_instant, iso, to_datetime
from beatless.core.durations import as_timedelta, describe
from beatless.core.triggers import At, Trigger
from beatless.errors import ConfigError

CATCH_UP = ("latest", "all", "none")
"""What a node that starts does with the occurrences before its start, within
``max_late``: claim only the latest of them (coalescing the others), all of them, or none."""
OVERLAP = ("allow", "skip")
"""What a firing does while a run of its address is still in progress: run on top of it
(``allow``), or not be enqueued, counted ``skipped_overlap`` (``skip``)."""

DEFAULT_MAX_LATE = timedelta(seconds=60)
DEFAULT_AT_MAX_LATE = timedelta(hours=1)
"""The ``max_late`` of a one-off (:class:`~beatless.core.triggers.At`) that sets none: no
later occurrence replaces a missed one, so a node started within the hour still sends it.
Shortened at start to fit a store that remembers a claim less long (rule 5)."""
DEFAULT_CATCH_UP = "latest"
DEFAULT_OVERLAP = "allow"
DEFAULT_RUN_LEASE = timedelta(seconds=30)
"""How long a run lease lives without a heartbeat: a worker killed mid-run frees its
address this long after its last heartbeat."""
DEFAULT_HEARTBEAT = timedelta(seconds=5)
_NO_TIME = timedelta(0)


Reader = Callable[[object, str], Any]
"""How a value of an option is read: the value, or a :class:`ConfigError` naming
``name``."""


def duration(value: object, name: str) -> timedelta:
    """A duration: seconds as a number, ``"90s"``/``"2m"``/``"1h"`` or a ``timedelta``."""
    return as_timedelta(value, name=name)  # type: ignore[arg-type]


def default_max_late(trigger: Trigger) -> timedelta:
    """The ``max_late`` of an entry of ``trigger`` when neither the entry nor a default
    of every entry sets one: :data:`DEFAULT_AT_MAX_LATE` for a one-off, else
    :data:`DEFAULT_MAX_LATE`."""
    return DEFAULT_AT_MAX_LATE if isinstance(trigger, At) else DEFAULT_MAX_LATE


def unless_none(read: Reader) -> Reader:
    """``read``, with ``None`` (not set) left as it is."""

    def read_set(value: object, name: str) -> Any:
        return None if value is None else read(value, name)

    return read_set


def instant(value: object, name: str) -> datetime:
    """An instant as an aware UTC datetime: an aware ``datetime``, integer epoch
    milliseconds or ISO 8601 text with ``Z`` or an offset; naive instants are refused."""
    return to_datetime(as_instant(value, name=name))


def choice(choices: tuple[str, ...], refused: Mapping[str, str] | None = None) -> Reader:
    """A reader of one of ``choices``; a value in ``refused`` is named with its reason."""

    def read(value: object, name: str) -> str:
        if isinstance(value, str) and refused and value in refused:
            raise ConfigError(f"{name.rpartition(': ')[0] or name}: {refused[value]}")
        if value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{name} must be one of {shown}, got {value!r}")
        return str(value)

    return read


def flag(value: object, name: str) -> bool:
    """``True`` or ``False``, nothing else (not ``"yes"``, not 1)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Option:
    """One option of an entry: its name, default, reader, and what its values are
    (``kind``: ``duration``, a ``timedelta``; ``instant``, an aware UTC ``datetime``; or a
    plain ``value``), for the formats that write them. A ``per_entry`` option is set on
    an entry only: a top level, an app's settings or a middleware gives no default of it
    to every entry. A default of ``None`` means "not set"."""

    name: str
    default: Any
    read: Reader
    doc: str
    kind: str = "value"
    per_entry: bool = False

    def value(self, value: object, where: str) -> Any:
        """``value`` read as this option, named ``where: name`` in an error."""
        return self.read(value, f"{where}: {self.name}")


BUFFER_ONE = (
    "overlap 'buffer_one' is not offered: holding one firing back until the running one "
    "ends needs a node to keep it claimed past max_late, which no firing may be; use "
    "'skip' (the firing is counted skipped_overlap) or 'allow'"
)

OPTIONS: tuple[Option, ...] = (
    Option(
        "jitter",
        timedelta(0),
        duration,
        "the window each firing's release is spread over",
        kind="duration",
    ),
    Option(
        "max_late",
        None,
        unless_none(duration),
        "how late a firing may still be sent (unset: 60s, 1h for a one-off)",
        kind="duration",
    ),
    Option("catch_up", DEFAULT_CATCH_UP, choice(CATCH_UP), "occurrences before a start"),
    Option(
        "overlap",
        DEFAULT_OVERLAP,
        choice(OVERLAP, {"buffer_one": BUFFER_ONE}),
        "a firing while a run of its address is in progress",
    ),
    Option(
        "run_lease",
        DEFAULT_RUN_LEASE,
        duration,
        "how long a run's records outlive it",
        kind="duration",
    ),
    Option(
        "heartbeat",
        DEFAULT_HEARTBEAT,
        duration,
        "how often a run's records are renewed",
        kind="duration",
    ),
    Option("once_only", True, flag, "a worker refuses a second execution of a firing"),
    Option(
        "start_at",
        None,
        unless_none(instant),
        "no occurrence before it",
        kind="instant",
        per_entry=True,
    ),
    Option(
        "end_at",
        None,
        unless_none(instant),
        "no occurrence at or after it",
        kind="instant",
        per_entry=True,
    ),
    Option("enabled", True, flag, "false: known, but schedules nothing", per_entry=True),
)
"""Every option of an entry, in the order they are documented."""
BY_NAME: Mapping[str, Option] = {option.name: option for option in OPTIONS}
NAMES = tuple(option.name for option in OPTIONS)
SHARED_NAMES = tuple(option.name for option in OPTIONS if not option.per_entry)
"""The options a top level, an app's settings or a middleware may set for every entry."""
DEFAULTS: Mapping[str, Any] = {option.name: option.default for option in OPTIONS}


def read_options(
    values: Mapping[str, object], name_of: Callable[[str], str], problems: list[str]
) -> dict[str, Any]:
    """The options given in ``values`` (others are left out), each read; a bad one is
    added to ``problems`` (named by ``name_of(option)``) and left out, so that what
    takes it still finds its other problems."""
    read = {}
    for key, value in values.items():
        try:
            read[key] = BY_NAME[key].read(value, name_of(key))
        except ConfigError as exc:
            problems.append(str(exc))
    return read


def timing_problems(
    label: str,
    jitter: timedelta | None,
    max_late: timedelta | None,
    run_lease: timedelta | None,
    heartbeat: timedelta | None,
) -> list[str]:
    """The rules between an entry's durations, each checked when the durations it
    compares could be read (``None``: one that could not, reported on its own)."""
    found = []
    if jitter is not None and jitter < _NO_TIME:
        found.append(f"{label}: jitter must not be negative, got {describe(jitter)}")
    if max_late is not None and max_late <= _NO_TIME:
        found.append(f"{label}: max_late must be positive, got {describe(max_late)}")
    elif max_late is not None and jitter is not None and max_late <= jitter:
        found.append(
            f"{label}: max_late {describe(max_late)} must be longer than jitter "
            f"{describe(jitter)}, or a node waiting its full offset is already late; raise "
            f"max_late above {describe(jitter)} or lower the jitter"
        )
    return found + run_timing_problems(label, run_lease, heartbeat)


def window_problems(label: str, start_at: datetime | None, end_at: datetime | None) -> list[str]:
    """The rule of a window: it ends after it starts (``start_at`` is in it, ``end_at``
    is not); nothing when either side is open or could not be read."""
    if start_at is None or end_at is None or end_at > start_at:
        return []
    return [
        f"{label}: end_at {iso_of(end_at)} must be after start_at {iso_of(start_at)} (the "
        f"window holds start_at and ends before end_at); move end_at later or start_at "
        f"earlier"
    ]


def iso_of(instant: datetime) -> str:
    """An aware datetime as :func:`~beatless.core._time.iso` writes an instant."""
    return iso(as_instant(instant))


def run_timing_problems(
    label: str,
    run_lease: timedelta | None,
    heartbeat: timedelta | None,
    *,
    names: tuple[str, str] = ("run_lease", "heartbeat"),
) -> list[str]:
    """The rule between a run lease and its heartbeat (rule 6), the two ``names`` as the
    problem calls them; nothing when either could not be read."""
    if run_lease is None or heartbeat is None:
        return []
    lease_name, heartbeat_name = names
    where = f"{label}: " if label else ""
    if run_lease <= _NO_TIME or heartbeat <= _NO_TIME:
        return [
            f"{where}{lease_name} {describe(run_lease)} and {heartbeat_name} "
            f"{describe(heartbeat)} must be positive"
        ]
    if 2 * heartbeat >= run_lease:
        return [
            f"{where}{heartbeat_name} {describe(heartbeat)} must be under half the "
            f"{lease_name} {describe(run_lease)} (rule 6: a run lease is renewed at least "
            f"twice before it can run out); lower the {heartbeat_name} under "
            f"{describe(run_lease / 2)} or lengthen the {lease_name}"
        ]
    return []


def catch_up_policy(value: object, where: str) -> str:
    """``value`` if it is one of :data:`CATCH_UP`, else a :class:`ConfigError` naming
    ``where`` and the choices."""
    return str(BY_NAME["catch_up"].value(value, where))


def overlap_policy(value: object, where: str) -> str:
    """``value`` if it is one of :data:`OVERLAP`, else a :class:`ConfigError` naming
    ``where`` and the choices (``buffer_one`` is named as not offered, and why)."""
    return str(BY_NAME["overlap"].value(value, where))
