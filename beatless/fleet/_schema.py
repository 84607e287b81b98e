"""What each kind of note must hold to be read: one schema per kind, checked field by field.

The claim store is shared: another client, an older or a newer beatless, a bug or an
operator's ``redis-cli`` can write any note. Every reader of notes (the registry, the
history and its batch notes, the controls and run-now requests, the audit, the preferred
claimers' progress, the published entries) parses what it reads with the schema of its
kind here, through :func:`parse_each` or :meth:`Schema.load`, and builds its object only
from what the schema returns. So a note with invalid JSON, a field of the wrong type, a
missing field or a value out of range never becomes an object that raises later in the
loop, ``status`` or the status page: it is skipped, and told to the reader's
:class:`Skipped` (the node counts it and warns once, ``status`` lists it as a problem).

A schema names every field its kind's object has: a field it names is checked, a missing
optional field takes the object's default, and a field it does not name (a newer
version's) is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from beatless.stores.base import NOTE_NAME_LIMIT, NOTE_VALUE_LIMIT

T = TypeVar("T")

INSTANT_MAX_MS = 32_503_680_000_000
"""3000-01-01T00:00:00Z: an instant in a note is between the epoch and this."""
SPAN_MAX_MS = 10 * 366 * 24 * 3_600_000
"""A duration or a clock offset in a note is at most this (ten years), either way."""
COUNT_MAX = 2**53
TEXT_LIMIT = NOTE_VALUE_LIMIT
"""A free text in a note (a host, a description) is at most this long: no note is longer."""
NAME_LIMIT = NOTE_NAME_LIMIT
"""A name in a note (a node, an entry, a tenant, an address) is at most this long: it is
a note's key or part of a note's kind, which are no longer."""
LIST_LIMIT = 10_000


class BadNote(ValueError):
    """A note that does not fit the schema of its kind; the message says what is wrong."""


class Skipped(Protocol):
    """Where a reader tells the notes it skipped."""

    def skip(self, kind: str, key: str, text: str, reason: str) -> None:
        """The note ``key`` of ``kind``, whose value is ``text``, does not fit: ``reason``."""


Check = Callable[[Any], Any]
"""A field's check: the value to keep, or :class:`BadNote` saying what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Field:
    check: Check
    required: bool = True


_QUICK: dict[Check, tuple[type, int, int, bool]] = {}
"""The checks of a plain integer, string or boolean (or ``null``), and what a value that
fits is: its type, the bounds of its value (an integer) or length (a string), and whether
``null`` fits too. :meth:`Schema.check` keeps such a value without calling the check (it reads
every note); any other value goes to the check, which accepts it or says why not."""


class _Never:
    """The type of no value read from JSON: a quick check that only ``null`` passes."""


_JSON_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}


def _got(value: object) -> str:
    """A value read from JSON as a message shows it: its start, and what it is."""
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:40] + "..."
    what = _JSON_TYPES.get(type(value)) or (
        "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else ""
    )
    return f"{shown} ({what})" if what else shown


def integer(low: int, high: int) -> Check:
    """An integer (not a boolean, not a float) from ``low`` to ``high``."""

    def check(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadNote(f"expected an integer, got {_got(value)}")
        if not low <= value <= high:
            raise BadNote(f"{value} is out of range ({low} to {high})")
        return value

    _QUICK[check] = (int, low, high, False)
    return check


def text(limit: int) -> Check:
    """A string of at most ``limit`` characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise BadNote(f"expected a string, got {_got(value)}")
        if len(value) > limit:
            raise BadNote(f"a string of {len(value)} characters is over {limit}")
        return value

    _QUICK[check] = (str, 0, limit, False)
    return check


def one_of(*values: str) -> Check:
    def check(value: Any) -> str:
        if value not in values:
            raise BadNote(f"expected one of {', '.join(values)}, got {_got(value)}")
        return str(value)

    return check


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadNote(f"expected true or false, got {_got(value)}")
    return value


_QUICK[flag] = (bool, 0, 0, False)


def nullable(inner: Check) -> Check:
    """``null`` (read as ``None``), or what ``inner`` accepts."""

    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    kind, low, high, _ = _QUICK.get(inner, (_Never, 0, 0, False))
    _QUICK[check] = (kind, low, high, True)
    return check


def listed(inner: Check, limit: int = LIST_LIMIT) -> Check:
    """A list of at most ``limit`` values, each as ``inner`` accepts it; read as a tuple."""

    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise BadNote(f"expected a list, got {_got(value)}")
        if len(value) > limit:
            raise BadNote(f"a list of {len(value)} values is over {limit}")
        try:
            return tuple(inner(v) for v in value)
        except BadNote as exc:
            raise BadNote(f"in the list: {exc}") from None

    return check


def row(*columns: Check) -> Check:
    """A list of exactly ``len(columns)`` values, each as its column accepts it."""

    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list) or len(value) != len(columns):
            raise BadNote(f"expected a list of {len(columns)} values, got {_got(value)}")
        return tuple(c(v) for c, v in zip(columns, value, strict=True))

    return check


def counters(value: Any) -> dict[str, int]:
    """Named counts: an object of at most 100 names, each a count."""
    if not isinstance(value, dict) or len(value) > 100:
        raise BadNote(f"expected an object of at most 100 counts, got {_got(value)}")
    name, count = text(NAME_LIMIT), integer(0, COUNT_MAX)
    return {name(k): count(v) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class Schema:
    """What one kind of note holds: its fields, each with its check."""

    name: str
    """What a note of the kind is, as a message says it (``registry record``)."""
    fields: Mapping[str, Field] = field(default_factory=dict)
    _plan: tuple[tuple[str, Check, bool, type | None, int, int, bool], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        plan = []
        for name, spec in self.fields.items():
            kind, low, high, null = _QUICK.get(spec.check, (None, 0, 0, False))
            plan.append((name, spec.check, spec.required, kind, low, high, null))
        object.__setattr__(self, "_plan", tuple(plan))

    def load(self, text: str) -> dict[str, Any]:
        """The fields of the note ``text``, checked; raises :class:`BadNote`."""
        if not isinstance(text, str):
            raise BadNote(f"expected text, got {type(text).__name__}")
        if len(text) > NOTE_VALUE_LIMIT:
            raise BadNote(f"{len(text)} characters, over the {NOTE_VALUE_LIMIT} of a note")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise BadNote(
                f"not JSON: {json.dumps(text[:40])}{'...' if len(text) > 40 else ''}"
            ) from None
        return self.check(data)

    def check(self, data: Any) -> dict[str, Any]:
        """The fields of ``data`` (an object read from JSON), checked."""
        if not isinstance(data, dict):
            raise BadNote(f"expected a JSON object, got {_got(data)}")
        fields = {}
        for name, check, required, kind, low, high, null in self._plan:
            if name not in data:
                if required:
                    raise BadNote(f"field {name} is missing")
                continue
            value = data[name]
            typed = type(value) is kind
            if typed and (kind is bool or low <= (value if kind is int else len(value)) <= high):
                fields[name] = value  # what the check keeps, unchecked again (see _QUICK)
            elif value is None and null:
                fields[name] = None
            else:
                try:
                    fields[name] = check(value)
                except BadNote as exc:
                    raise BadNote(f"field {name}: {exc}") from None
        return fields


def schema(name: str, **fields: Check | tuple[Check, bool]) -> Schema:
    """A schema from keyword fields: a check (required) or ``(check, False)`` (optional)."""
    specs = {
        key: Field(*spec) if isinstance(spec, tuple) else Field(spec)
        for key, spec in fields.items()
    }
    return Schema(name, specs)


def optional(check: Check) -> tuple[Check, bool]:
    return check, False


def parse_each(
    kind: str,
    notes: Mapping[str, str],
    parse: Callable[[str], T],
    skipped: Skipped | None,
) -> Iterator[tuple[str, T]]:
    """``(key, object)`` of each note of ``kind`` that ``parse`` reads; those it refuses
    with :class:`BadNote` are told to ``skipped``, and left out."""
    for key, value in notes.items():
        try:
            parsed = parse(value)
        except BadNote as exc:
            if skipped is not None:
                skipped.skip(kind, key, value, str(exc))
            continue
        yield key, parsed


def family(kind: str) -> str:
    """What a note of ``kind`` is, without its namespace or address: ``nodes``,
    ``controls``, ``history`` ... (a metric's label)."""
    parts = kind.split("/")
    if len(parts) > 2 and parts[1] in ("history", "fan-out-history"):
        return parts[1]
    if len(parts) > 3 and parts[2] == "node":  # a node's own kind: named by the node
        return "node"
    return parts[-1]


class Collected:
    """A :class:`Skipped` that keeps what it is told, for a report: ``(kind, key, reason)``."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, str, str]] = []

    def skip(self, kind: str, key: str, text: str, reason: str) -> None:
        self.notes.append((kind, key, reason))


# -- the schemas of the notes ---------------------------------------------------------

INSTANT = integer(0, INSTANT_MAX_MS)
SPAN = integer(-SPAN_MAX_MS, SPAN_MAX_MS)
COUNT = integer(0, COUNT_MAX)
NAME = text(NAME_LIMIT)
TEXT = text(TEXT_LIMIT)
OCCURRENCES = row(INSTANT, INSTANT)

NODE_RECORD = schema(
    "registry record",
    node=NAME,
    host=TEXT,
    pid=COUNT,
    version=TEXT,
    framework=TEXT,
    store=TEXT,
    fingerprint=NAME,
    tzdata=NAME,
    clock_offset_ms=nullable(SPAN),
    last_wake_ms=nullable(INSTANT),
    posted_ms=INSTANT,
    started_ms=INSTANT,
    loop_alive=flag,
    entries=COUNT,
    counters=optional(counters),
    restarts=optional(COUNT),
    last_failure=optional(nullable(TEXT)),
    last_failure_ms=optional(nullable(INSTANT)),
    store_verdict=optional(nullable(TEXT)),
    live_revision=optional(nullable(COUNT)),
    live_hash=optional(nullable(NAME)),
    live_lag_ms=optional(nullable(COUNT)),
    live_overrides=optional(nullable(TEXT)),
    ephem=optional(nullable(NAME)),
    left_out=optional(nullable(TEXT)),
    reads_logs=optional(flag),
)
"""A node's registry record (:class:`beatless.fleet._notes.NodeRecord`)."""

HISTORY_ITEM = schema(
    "history item",
    id=NAME,
    entry=NAME,
    tenant=nullable(NAME),
    occurrence_ms=INSTANT,
    release_ms=INSTANT,
    node=NAME,
    outcome=NAME,
    lateness_ms=SPAN,
    at_ms=INSTANT,
    manual=optional(flag),
    coalesced=optional(nullable(OCCURRENCES)),
    revision=optional(nullable(COUNT)),
)
"""One firing in an address's history (:class:`beatless.fleet._notes.HistoryItem`)."""

BATCH_NOTE = schema(
    "fan-out batch note",
    entry=NAME,
    node=NAME,
    occurrence_ms=INSTANT,
    at_ms=INSTANT,
    coalesced=optional(nullable(OCCURRENCES)),
    items=listed(row(NAME, NAME, SPAN)),
)
"""The firings of one fan-out occurrence decided by one node in one store call
(:func:`beatless.fleet._notes.batch_items`): ``[tenant, outcome, lateness_ms]`` each."""

CONTROL = schema(
    "control",
    action=one_of("pause", "resume", "run-now"),
    entry=NAME,
    by=TEXT,
    host=TEXT,
    at_ms=INSTANT,
    until_ms=optional(nullable(INSTANT)),
    tenant=optional(nullable(NAME)),
    request=optional(NAME),
    posted_ms=optional(INSTANT),
)
"""A pause, resume or run-now, or its audit record (:class:`beatless.fleet._controls.Control`)."""

PROGRESS = schema(
    "progress note",
    view=NAME,
    since_ms=INSTANT,
    until_ms=INSTANT,
    held=optional(listed(NAME)),
)
"""A preferred claimer's progress (:class:`beatless.node._prefer.Progress`)."""

MISSED_RECORD = schema(
    "missed-count note",
    node=NAME,
    occurrences=listed(INSTANT),
)
"""The missed firings of one address one node's sweep counted
(:class:`beatless.fleet._notes.MissedRecord`)."""

TRIGGER = schema(
    "trigger",
    every_ms=optional(integer(1, SPAN_MAX_MS)),
    anchor_ms=optional(integer(-INSTANT_MAX_MS, INSTANT_MAX_MS)),
    cron=optional(NAME),
    tz=optional(nullable(NAME)),
    day_and=optional(nullable(flag)),
    at_ms=optional(integer(-INSTANT_MAX_MS, INSTANT_MAX_MS)),
    describe=optional(TEXT),
)
"""An entry's trigger as plain data (:func:`beatless.fleet._notes.trigger_spec`)."""


def tenants(value: Any) -> tuple[str, ...] | str | None:
    """A published entry's tenants: none, ``"callable"``, or the first of them."""
    if value is None or value == "callable":
        return value  # type: ignore[no-any-return]
    return listed(NAME)(value)  # type: ignore[no-any-return]


ENTRY_NOTE = schema(
    "entry note",
    entry=NAME,
    address=NAME,
    task=optional(TEXT),
    trigger=optional(nullable(TRIGGER.check)),
    describe=optional(TEXT),
    jitter_ms=optional(integer(0, SPAN_MAX_MS)),
    max_late_ms=optional(integer(0, SPAN_MAX_MS)),
    tenants=optional(tenants),
    tenant_count=optional(nullable(COUNT)),
    catch_up=optional(NAME),
    overlap=optional(NAME),
    fingerprint=optional(NAME),
    start_ms=optional(nullable(integer(-INSTANT_MAX_MS, INSTANT_MAX_MS))),
    end_ms=optional(nullable(integer(-INSTANT_MAX_MS, INSTANT_MAX_MS))),
    enabled=optional(flag),
)
"""An entry as the nodes publish it (:func:`beatless.fleet._notes.entry_note`)."""
