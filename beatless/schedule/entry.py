"""Entries and schedules: what a node runs, validated when it is built."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypeVar

from beatless.core._time import InstantLike, from_datetime
from beatless.core.durations import DurationLike, describe, to_ms
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger, Windowed, zone
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.options import (
    DEFAULT_CATCH_UP,
    DEFAULT_HEARTBEAT,
    DEFAULT_MAX_LATE,
    DEFAULT_OVERLAP,
    DEFAULT_RUN_LEASE,
    OPTIONS,
    default_max_late,
    timing_problems,
    window_problems,
)
from beatless.stores.base import STORE_TOLERANCE

SECOND_MS = 1_000
FINGERPRINT_CHUNK = 10_000
"""Tenants joined at a time into the text of the schedule fingerprint."""
T = TypeVar("T")
D = TypeVar("D")

TASK_TAG_LENGTH = 8
"""Hex digits of a task tag (:attr:`Entry.task_tag`)."""

Tenants = Sequence[str] | Callable[[], Iterable[str]] | None


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Entry:
    """One named periodic task: task, args, trigger, options, jitter and lateness budget.

    ``tenants`` fans the entry out: each tenant gets its own address, firing id and
    offset. A callable is called at each occurrence, so the list may change; every node
    must return the same list.

    ``max_late`` left unset (``None``) is the trigger's default: 60 s, or an hour for a
    one-off (:class:`~beatless.core.triggers.At`), shortened at start to fit a store
    that remembers a claim less long (:meth:`fitted`). ``start_at`` and ``end_at`` (aware
    instants, epoch milliseconds or ISO 8601 text) keep the occurrences from ``start_at``,
    inclusive, to ``end_at``, exclusive (:attr:`windowed`); ``enabled=False`` keeps the
    entry known (listed, explained) but schedules none of its occurrences.
    """

    name: str
    task: str
    trigger: Trigger
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    jitter: timedelta = timedelta(0)
    max_late: timedelta = DEFAULT_MAX_LATE
    tenants: Tenants = None
    catch_up: str = DEFAULT_CATCH_UP
    overlap: str = DEFAULT_OVERLAP
    run_lease: timedelta = DEFAULT_RUN_LEASE
    heartbeat: timedelta = DEFAULT_HEARTBEAT
    once_only: bool = True
    start_at: datetime | None = None
    end_at: datetime | None = None
    enabled: bool = True
    max_late_given: bool = field(default=True, init=False, repr=False)
    """Whether ``max_late`` was set (on the entry, or as a default of every entry) rather
    than taken from the trigger: only a one-off's default is fitted to the store."""
    windowed: Trigger = field(init=False, repr=False)
    """The trigger as this entry runs it: its occurrences from ``start_at`` (inclusive)
    to ``end_at`` (exclusive); the trigger itself when the entry has no window. (A
    disabled entry runs none of them: ask :attr:`enabled` too.)"""
    jitter_ms: int = field(init=False, repr=False)
    max_late_ms: int = field(init=False, repr=False)
    memory_ms: int = field(init=False, repr=False)
    """:attr:`memory_needed` in milliseconds."""

    def __init__(
        self,
        *,
        name: str,
        task: str,
        trigger: Trigger,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        jitter: DurationLike = 0,
        max_late: DurationLike | None = None,
        tenants: Tenants = None,
        catch_up: str = DEFAULT_CATCH_UP,
        overlap: str = DEFAULT_OVERLAP,
        run_lease: DurationLike = DEFAULT_RUN_LEASE,
        heartbeat: DurationLike = DEFAULT_HEARTBEAT,
        once_only: bool = True,
        start_at: InstantLike | None = None,
        end_at: InstantLike | None = None,
        enabled: bool = True,
    ) -> None:
        setter = object.__setattr__
        setter(self, "name", _name(name, "entry name"))
        label = f"entry {name!r}"
        found = _Problems()
        # What most entries give is set at once; the rest is read, its problems noted.
        if type(task) is not str or not task:
            task = found.keep(lambda: _task(label, task), task)
        setter(self, "task", task)
        if type(trigger) not in _TRIGGERS:
            trigger = found.keep(lambda: _trigger(label, trigger), trigger)
        setter(self, "trigger", trigger)
        setter(self, "args", tuple(args))
        setter(self, "kwargs", dict(kwargs or {}))
        setter(self, "options", dict(options or {}))
        if tenants is not None:
            tenants = found.keep(lambda: _tenants(label, tenants), None)
        setter(self, "tenants", tenants)
        setter(self, "max_late_given", True)
        given = {
            "jitter": jitter,
            "max_late": max_late,
            "catch_up": catch_up,
            "overlap": overlap,
            "run_lease": run_lease,
            "heartbeat": heartbeat,
            "once_only": once_only,
            "start_at": start_at,
            "end_at": end_at,
            "enabled": enabled,
        }
        for option in OPTIONS:
            value = given[option.name]
            if value is option.default:  # read as itself: most options of most entries
                setter(self, option.name, value)
                continue
            # A value that cannot be read is None, so the rules between options skip it.
            unread = option.default is None or option.kind == "duration"
            fallback = None if unread else option.default
            read = functools.partial(option.value, value, label)
            setter(self, option.name, found.keep(read, fallback))
        if max_late is None:
            setter(self, "max_late", default_max_late(self.trigger))
            setter(self, "max_late_given", False)
        found.extend(
            timing_problems(label, self.jitter, self.max_late, self.run_lease, self.heartbeat)
        )
        found.extend(window_problems(label, self.start_at, self.end_at))
        found.raise_any()
        # What follows from the fields, which the loop reads for every firing.
        setter(self, "windowed", self._windowed())
        setter(self, "jitter_ms", to_ms(self.jitter))
        setter(self, "max_late_ms", to_ms(self.max_late))
        setter(self, "memory_ms", to_ms(self.memory_needed))

    def _windowed(self) -> Trigger:
        """The trigger within the entry's window (see :attr:`windowed`)."""
        if self.start_at is None and self.end_at is None:
            return self.trigger
        start, end = self.start_at, self.end_at
        return Windowed(
            self.trigger,
            None if start is None else from_datetime(start),
            None if end is None else from_datetime(end),
        )

    def describe(self) -> str:
        """When the entry fires, in a few words: its trigger within its window, and
        ``(disabled)`` when it is."""
        return self.windowed.describe() + ("" if self.enabled else " (disabled)")

    @property
    def memory_needed(self) -> timedelta:
        """How long a store must remember a claim of this entry (rule 5)."""
        return self.jitter + self.max_late + STORE_TOLERANCE

    @property
    def task_tag(self) -> str:
        """The first 8 hex digits of the SHA-256 of the task name: stored with each claim,
        so that a claim of another task under the same address is noticed (two apps
        sharing one store and namespace)."""
        return _task_tag(self.task)

    def tenant_list(self) -> tuple[str, ...] | None:
        """The tenants now: the fixed list, or what the callable returns."""
        if self.tenants is None:
            return None
        if callable(self.tenants):
            return tuple(str(t) for t in self.tenants())
        return tuple(self.tenants)

    def replace(self, **changes: Any) -> Entry:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        if not self.max_late_given:
            values["max_late"] = None  # still the trigger's default
        values.update(changes)
        return Entry(**values)

    def fitted(self, remembers: timedelta | None) -> Entry:
        """This entry, with a one-off's default ``max_late`` shortened, to whole seconds,
        so that it fits what the store remembers (rule 5: ``jitter + max_late +
        tolerance`` under ``remembers``). A ``max_late`` that was set is never changed:
        :meth:`Schedule.check_store` refuses it when it does not fit."""
        if (
            remembers is None
            or self.max_late_given
            or not isinstance(self.trigger, At)
            or self.memory_needed < remembers
        ):
            return self
        room = remembers - STORE_TOLERANCE - self.jitter - timedelta(seconds=1)
        room = timedelta(seconds=int(room.total_seconds()))
        if room <= self.jitter:
            return self  # no max_late fits: check_store says so, naming the numbers
        entry = self.replace(max_late=room)
        object.__setattr__(entry, "max_late_given", False)
        return entry


@functools.lru_cache(maxsize=4_096)
def _task_tag(task: str) -> str:
    return hashlib.sha256(task.encode()).hexdigest()[:TASK_TAG_LENGTH]


class _Problems:
    """The problems of one entry, collected rather than raised at the first, so that a
    typo in one option does not hide a timing rule another one breaks."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.first: ConfigError | None = None

    def keep(self, build: Callable[[], T], default: D) -> T | D:
        """``build()``, or ``default`` with what it raised noted."""
        try:
            return build()
        except ScheduleError as exc:
            self.first = self.first or exc
            self.found.extend(exc.errors)
        except ConfigError as exc:
            self.first = self.first or exc
            self.found.append(str(exc))
        return default

    def extend(self, problems: Iterable[str]) -> None:
        for problem in problems:
            self.first = self.first or ScheduleError(problem)
            self.found.append(problem)

    def raise_any(self) -> None:
        """Nothing when no problem was found; the one error as it was raised when there
        is one; else a :class:`ScheduleError` listing them all."""
        if self.first is None:
            return
        if len(self.found) == 1:
            raise self.first
        raise ScheduleError("; ".join(self.found), list(self.found))


def _task(label: str, task: object) -> str:
    if not isinstance(task, str) or not task:
        raise ConfigError(f"{label}: task must be a non-empty string, got {task!r}")
    return task


_PLAIN_TRIGGERS = (Cron, Every, At)
"""Triggers whose equal values have equal texts (no float field: ``0.0 == -0.0``)."""
_TRIGGERS = (Cron, Every, At, Solar)
"""The triggers beatless makes, known at once (a node reading 100,000 live entries checks
each)."""


def _trigger(label: str, trigger: object) -> Trigger:
    if type(trigger) in _TRIGGERS:
        return trigger  # type: ignore[return-value]
    if not isinstance(trigger, Trigger):  # a protocol check: slow, for other triggers
        raise ConfigError(
            f"{label}: trigger must be a Cron, an Every, an At or a Solar, got {trigger!r}"
        )
    return trigger


def _tenants(label: str, tenants: Tenants) -> Tenants:
    if tenants is None or callable(tenants):
        return tenants
    if isinstance(tenants, str):
        raise ConfigError(f"{label}: tenants must be a list, not a string")
    if type(tenants) is not tuple or not all(type(t) is str for t in tenants):
        tenants = tuple(str(t) for t in tenants)  # a tuple of str is kept as given
    repeated = _repeated(tenants)
    if repeated is not None:
        raise ConfigError(f"{label}: tenants must not repeat ({repeated!r} does)")
    return tenants


def _repeated(tenants: tuple[str, ...]) -> str | None:
    """A tenant listed twice, if any. Found in a sorted copy of the references (8 bytes
    a tenant) rather than a set of them (about 50): a fan-out of a million tenants is
    checked without a transient 50 MB on top of its list."""
    ordered = sorted(tenants)
    return next((a for a, b in itertools.pairwise(ordered) if a == b), None)


def _name(value: str, what: str, *, slash: bool = True) -> str:
    if not isinstance(value, str) or not value or value != value.strip():
        raise ConfigError(f"{what} {value!r}: use a non-empty name without edge spaces")
    if not slash and "/" in value:
        raise ConfigError(f"{what} {value!r}: use a name without '/'")
    return value


def address_segment(name: str) -> str:
    """An entry name as it stands in an address: ``%`` and ``/`` written ``%25`` and
    ``%2F``, so that ``namespace/entry/tenant`` reads one way only. Names without them,
    the usual case, stand as they are."""
    return name.replace("%", "%25").replace("/", "%2F")


def tenant_address(base: str, tenant: str) -> str:
    """The address of a tenant's firing, from its entry's address ``namespace/entry``:
    the one place the tenant part is written (the fan-out expands through it too)."""
    return f"{base}/{tenant}"


def base_address(address: str, tenant: str) -> str:
    """The entry's address of a tenant's firing at ``address``: :func:`tenant_address`
    undone."""
    return address[: -len(tenant) - 1]


@dataclass(frozen=True, eq=False)
class Schedule:
    """The set of entries a node runs; identical on every node.

    Building one binds each cron without a zone to ``timezone`` and checks the timing
    rules; every problem found is reported at once in a :class:`ScheduleError`.
    """

    entries: tuple[Entry, ...]
    namespace: str = "default"
    timezone: str = "UTC"

    def __init__(
        self, entries: Iterable[Entry], *, namespace: str = "default", timezone: str = "UTC"
    ) -> None:
        object.__setattr__(self, "namespace", _name(namespace, "namespace", slash=False))
        zone(timezone)
        object.__setattr__(self, "timezone", timezone)
        crons: dict[Cron, Cron] = {}
        bound = tuple(_bind(entry, timezone, crons) for entry in entries)
        object.__setattr__(self, "entries", bound)
        errors = check_timing(bound)
        if errors:
            raise ScheduleError("; ".join(errors), errors)

    def address(self, entry: Entry, tenant: str | None = None) -> str:
        """``namespace/entry`` or ``namespace/entry/tenant``: the stable name the firing id
        is derived from (see :func:`address_segment` for an entry name with a ``/``)."""
        base = f"{self.namespace}/{address_segment(entry.name)}"
        return base if tenant is None else tenant_address(base, tenant)

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits of a SHA-256 over every entry's address with its trigger (and
        window, and ``disabled`` when it is), jitter, max_late, task, tenants, policies,
        args, kwargs and options: equal on nodes that run the same schedule, different
        when a node runs another version of it (a rollout in progress, even one that
        changes only a task's arguments).

        The text hashed is one line per entry, ``|``-separated, the lines sorted and
        joined by newlines, the tenants joined by commas (``callable`` for a callable),
        the args, kwargs and options written by :func:`canonical`.
        It is fed to the hash a piece at a time, so that a million tenants are never
        joined into one string (14 MB, and as much again encoded)."""
        triggers: dict[tuple[Trigger, bool], str] = {}
        parts = sorted(
            (self._fingerprint_parts(e, triggers) for e in self.entries), key=lambda p: p[0]
        )
        if any(b[0].startswith(a[0]) for a, b in itertools.pairwise(parts)):
            # One head is the start of another (a name with "|"): only whole lines order them.
            parts.sort(key=lambda p: p[0] + ",".join(p[1]) + p[2])
        digest = hashlib.sha256()
        for number, (head, tenants, tail) in enumerate(parts):
            digest.update(b"\n" if number else b"")
            digest.update(head.encode())
            for start in range(0, len(tenants), FINGERPRINT_CHUNK):
                digest.update(b"," if start else b"")
                digest.update(",".join(tenants[start : start + FINGERPRINT_CHUNK]).encode())
            digest.update(tail.encode())
        return digest.hexdigest()[:16]

    def _fingerprint_parts(
        self, e: Entry, triggers: dict[tuple[Trigger, bool], str] | None = None
    ) -> tuple[str, Sequence[str], str]:
        """An entry's line of the fingerprint: what comes before its tenants, the
        tenants, and what comes after them. ``triggers`` holds the text of each trigger
        written so far, for the entries that share one."""
        key = (e.windowed, e.enabled)
        known = triggers is not None and type(e.windowed) in _PLAIN_TRIGGERS
        trigger = triggers.get(key) if triggers is not None and known else None
        if trigger is None:
            trigger = repr(e.windowed) + ("" if e.enabled else " disabled")
            if triggers is not None and known:
                triggers[key] = trigger
        head = (self.address(e), trigger, str(e.jitter_ms), str(e.max_late_ms), e.task)
        tail = (e.catch_up, e.overlap, str(to_ms(e.run_lease)), str(to_ms(e.heartbeat)))
        sent = (canonical(e.args), canonical(e.kwargs), canonical(e.options))
        tenants = ("callable",) if callable(e.tenants) else (e.tenants or ())
        return "|".join(head) + "|", tenants, "|" + "|".join((*tail, str(e.once_only), *sent))

    def entry(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise ConfigError(f"no entry named {name!r} in namespace {self.namespace!r}")

    def fitted(self, remembers: timedelta | None) -> Schedule:
        """This schedule with each one-off's default ``max_late`` fitted to what the store
        remembers (:meth:`Entry.fitted`): what a node on that store runs."""
        entries = tuple(entry.fitted(remembers) for entry in self.entries)
        if all(a is b for a, b in zip(entries, self.entries, strict=True)):
            return self
        return Schedule(entries, namespace=self.namespace, timezone=self.timezone)

    def check_store(
        self,
        remembers: timedelta | None,
        store: str,
        *,
        run_leases: bool = True,
        lengthen: Callable[[timedelta], str] | None = None,
    ) -> list[str]:
        """Rule 5: every entry's ``jitter + max_late + 10s`` fits the store's memory; and,
        on a store that cannot hold a run lease without a gap (``run_leases`` false), no
        entry asks for ``overlap = "skip"``. ``lengthen`` says, for the memory an entry
        needs, how to give the store that much
        (:meth:`~beatless.stores.base.ClaimStore.lengthen_memory`). A one-off's default
        ``max_late`` is checked as it is fitted to the store (:meth:`fitted`)."""
        errors = [
            f"entry {e.name!r}: overlap 'skip' needs a claim store that renews a run lease "
            f"without a gap, which the {store} store cannot (a renewal reopens the lease for "
            f"one round trip, and a run starting then would overlap); use another store, "
            f"or overlap 'allow'"
            for e in self.entries
            if e.overlap == "skip" and not run_leases
        ]
        if remembers is None:
            return errors
        how = lengthen or (lambda _: "lengthen the store's memory")
        return errors + [
            f"entry {e.name!r}: jitter {describe(e.jitter)} + max_late {describe(e.max_late)}"
            f" + tolerance {describe(STORE_TOLERANCE)} = {describe(e.memory_needed)} must be "
            f"under what {store} remembers ({describe(remembers)}); lower max_late or "
            f"jitter, or {how(e.memory_needed)}"
            for e in self.fitted(remembers).entries
            if e.memory_needed >= remembers
        ]


_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")
"""The memory address in a default ``repr``, which differs from process to process."""


def _mapping_text(value: Mapping[Any, Any]) -> str:
    if not value:
        return "{}"  # most entries' kwargs and options: two of every entry's three texts
    items = sorted((canonical(key), canonical(item)) for key, item in value.items())
    return "{" + ",".join(f"{key}:{item}" for key, item in items) + "}"


def _sequence_text(value: list[Any] | tuple[Any, ...]) -> str:
    return "[" + ",".join(canonical(item) for item in value) + "]"


_PLAIN_TEXT: dict[type, Callable[[Any], str]] = {
    str: json.dumps,
    int: str,  # as JSON writes it (a bool is not of type int)
    dict: _mapping_text,
    list: _sequence_text,
    tuple: _sequence_text,
}


def canonical(value: Any) -> str:
    """A text of ``value`` that every node writes alike for equal values: mappings with
    their keys sorted, lists and tuples alike (the wire makes both a list), sets sorted,
    plain values as JSON, and anything else by its ``repr`` without memory addresses
    (a kombu ``Queue``, a ``datetime``): what the schedule fingerprint hashes of an
    entry's args, kwargs and options."""
    plain = _PLAIN_TEXT.get(type(value))
    if plain is not None:  # the usual arguments, known by their type at once
        return plain(value)
    if isinstance(value, Mapping):
        return _mapping_text(value)
    if isinstance(value, list | tuple):
        return _sequence_text(value)
    if isinstance(value, set | frozenset):
        return "set(" + ",".join(sorted(canonical(item) for item in value)) + ")"
    if value is None or isinstance(value, str | int | float):
        return json.dumps(value)
    return _ADDRESS.sub("", repr(value))


def _bind(entry: Entry, timezone: str, crons: dict[Cron, Cron]) -> Entry:
    """``entry`` with its cron bound to ``timezone`` when it names no zone: the same entry
    else, copied rather than built again (a zone changes no rule of its options).
    ``crons`` holds the crons bound so far, for the entries that share one."""
    trigger = entry.trigger
    if not isinstance(trigger, Cron) or trigger.tz is not None:
        return entry
    cron = crons.get(trigger)
    if cron is None:
        cron = crons[trigger] = trigger.bind(timezone)
    bound: Entry = object.__new__(Entry)
    for name in _FIELDS:
        object.__setattr__(bound, name, getattr(entry, name))
    object.__setattr__(bound, "trigger", cron)
    object.__setattr__(bound, "windowed", bound._windowed())
    return bound


_FIELDS = tuple(f.name for f in dataclasses.fields(Entry))


def check_timing(entries: Sequence[Entry]) -> list[str]:
    """Rules 6 that need the trigger: unique names and jitter under half the shortest gap."""
    errors = []
    seen: set[str] = set()
    gaps: dict[Trigger, int] = {}
    for entry in entries:
        if entry.name in seen:
            errors.append(f"entry {entry.name!r}: the name is used twice")
        seen.add(entry.name)
        if not entry.jitter or 2 * entry.jitter_ms < _shortest_possible_ms(entry.trigger):
            continue  # no gap of this trigger can be too short for this jitter
        gap = gaps.get(entry.trigger)
        if gap is None:
            gap = gaps[entry.trigger] = entry.trigger.min_gap_ms()
        if 2 * entry.jitter_ms >= gap:
            half = timedelta(milliseconds=(gap - 1) // 2)
            errors.append(
                f"entry {entry.name!r}: jitter {describe(entry.jitter)} must be under half the "
                f"shortest gap between occurrences of {entry.trigger.describe()} "
                f"({describe(timedelta(milliseconds=gap))} → at most {describe(half)})"
            )
    return errors


def _shortest_possible_ms(trigger: Trigger) -> int:
    """A gap no two occurrences of ``trigger`` are closer than, known without looking for
    the shortest (:meth:`~beatless.core.triggers.Cron.shortest_possible_ms`); 0 when
    only the search tells."""
    return trigger.shortest_possible_ms() if isinstance(trigger, Cron) else 0


NODE_FIRINGS_PER_S = 10_000
"""About what one node claims and sends per second on a 2-core machine with a fast broker
(``bench/overload.py``: 17,000/s on the memory store, 13,000/s two-phase on Redis; the
atomic Redis path is faster). A broker that takes ``t`` per send caps it near ``1 / t``."""


def peak_firings_per_s(schedule: Schedule) -> tuple[float, str | None]:
    """An upper bound of the firings released in one second, and the entry that adds the
    most: each entry's fan-out spread over its jitter window (or released in one second
    without one), as if every entry's occurrences fell in the same second."""
    peak, busiest, most = 0.0, None, 0.0
    for entry in schedule.entries:
        fanout = len(entry.tenants) if isinstance(entry.tenants, tuple) else 1
        # A cron's occurrences are whole seconds apart at least: one a second at most.
        gap = SECOND_MS if isinstance(entry.trigger, Cron) else entry.trigger.min_gap_ms()
        per_second = max(1.0, 1_000 / max(gap, 1))
        rate = fanout * per_second / max(entry.jitter_ms / 1_000, 1.0)
        peak += rate
        if rate > most:
            busiest, most = entry.name, rate
    return peak, busiest
