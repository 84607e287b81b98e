"""The limits of the store's notes as rules of a schedule, and the check of a whole
schedule that applies them.

An address names its firings' history note and every entry has a note of what the fleet
shows of it, so a name too long for them is refused before a node starts, not found
after a send (:func:`limits`). :func:`checked` is the start-up check both integrations
run: every problem at once (see :mod:`beatless.schedule.problems`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence

from beatless.core._logtext import shown
from beatless.fleet._controls import audit_kind, controls_kind, json_text, run_now_kind
from beatless.fleet._notes import (
    TENANTS_PUBLISHED,
    entries_kind,
    entry_note,
    fan_out_history_kind,
    history_kind,
    nodes_kind,
)
from beatless.schedule.entry import Entry, Schedule, tenant_address
from beatless.schedule.problems import Checked, collect
from beatless.stores.base import NOT_IN_NAMES, NOTE_NAME_LIMIT, NOTE_VALUE_LIMIT


def checked(
    entries: Iterable[Entry],
    problems: list[str],
    *,
    namespace: str,
    timezone: str,
    left_out: Sequence[str] | None = None,
) -> Checked:
    """The schedule of ``entries`` with the rules that need them all (unique names, jitter
    against each trigger's gaps, the :func:`limits` of names), added to ``problems``
    found before; sound or not.

    ``left_out``: the names of entries already refused, when each problem found before is
    one of those entries' (``entries`` may hold them: they are checked with the rest, so
    that every problem is found, and never usable); then a schedule with problems also has its
    :attr:`~beatless.schedule.problems.Checked.usable` part, the entries that pass every
    rule on their own. ``None``: a problem is the whole schedule's, nothing is usable."""
    entries = list(entries)
    schedule = collect(lambda: Schedule(entries, namespace=namespace, timezone=timezone), problems)
    if schedule is not None:
        problems.extend(limits(schedule))
    if not problems:
        return Checked(schedule)
    if left_out is None or _namespace_limits(namespace):
        return Checked(None, tuple(problems))
    refused = set(left_out)
    kept = [
        entry
        for entry in entries
        if entry.name not in refused and _sound_alone(entry, namespace, timezone)
    ]
    usable = collect(lambda: Schedule(kept, namespace=namespace, timezone=timezone), [])
    if usable is None:  # names given twice: no part is sound on its own
        return Checked(None, tuple(problems))
    sound = {id(entry) for entry in kept}  # not `in kept`: quadratic in a big schedule
    dropped = [
        *left_out,
        *(e.name for e in entries if id(e) not in sound and e.name not in refused),
    ]
    return Checked(None, tuple(problems), usable=usable, left_out=tuple(dropped))


def _sound_alone(entry: Entry, namespace: str, timezone: str) -> bool:
    """Whether ``entry`` passes every rule of a schedule in a schedule of its own."""
    alone = collect(lambda: Schedule([entry], namespace=namespace, timezone=timezone), [])
    return alone is not None and not _entry_limits(alone, alone.entries[0])


NAME_SHOWN = 60
"""How much of a long name a problem shows."""
LATEST_OCCURRENCE_MS = 10**13 - 1
"""The longest occurrence a note's name may hold (13 digits: until the year 2286)."""


def limits(schedule: Schedule) -> list[str]:
    """One problem per name of ``schedule`` that a store's notes cannot hold: the
    namespace, each entry's address and each fixed tenant's (every address names its
    history note, ``NOTE_NAME_LIMIT`` characters at most), NUL in any of them, and each
    entry's note of what the fleet shows of it (``NOTE_VALUE_LIMIT`` bytes at most).
    Tenants from a callable are known only when called; a firing sent for one whose
    note is refused is still sent once, and the refusal counted."""
    known = _found.get(schedule)
    if known is not None:
        return list(known)
    found = _namespace_limits(schedule.namespace)
    if not found:  # else every address would be refused for the same reason
        for entry in schedule.entries:
            found += _entry_limits(schedule, entry)
    _found[schedule] = tuple(found)
    return found


_found: weakref.WeakKeyDictionary[Schedule, tuple[str, ...]] = weakref.WeakKeyDictionary()
"""What :func:`limits` found in each schedule still in use: a schedule is immutable, and
both the loader and the node's start check it."""


def _namespace_limits(namespace: str) -> list[str]:
    if NOT_IN_NAMES in namespace:
        shown_name = shown(namespace, limit=NAME_SHOWN)
        return [f"namespace {shown_name}: holds a NUL character, which no store keeps"]
    kinds = (nodes_kind, entries_kind, controls_kind, run_now_kind, audit_kind)
    longest = max(len(kind(namespace)) for kind in kinds)
    if longest <= NOTE_NAME_LIMIT:
        return []
    return [
        f"namespace {shown(namespace, limit=NAME_SHOWN)}: {len(namespace)} characters name "
        f"notes of {longest} characters, over the {NOTE_NAME_LIMIT} a note's name may have; "
        f"shorten the namespace by {longest - NOTE_NAME_LIMIT} characters or more"
    ]


def _entry_limits(schedule: Schedule, entry: Entry) -> list[str]:
    name = f"entry {shown(entry.name, limit=NAME_SHOWN)}"
    if NOT_IN_NAMES in entry.name:
        return [f"{name}: its name holds a NUL character, which no store keeps"]
    address = schedule.address(entry)
    room = NOTE_NAME_LIMIT - len(history_kind(""))
    if len(address) > room:
        return [
            f"{name}: its address (namespace/entry) is {len(address)} characters, over the "
            f"{room} an address may have (its history note is named {history_kind('')}"
            f"<address>, at most {NOTE_NAME_LIMIT} characters); shorten the entry name (or "
            f"the namespace) by {len(address) - room} characters or more"
        ]
    found = []
    if entry.tenants is not None:
        batch = len(fan_out_history_kind(address, LATEST_OCCURRENCE_MS))
        if batch > NOTE_NAME_LIMIT:
            found.append(
                f"{name}: its address (namespace/entry) is {len(address)} characters, which "
                f"names its fan-out history notes with {batch}, over the {NOTE_NAME_LIMIT} a "
                f"note's name may have; shorten the entry name (or the namespace) by "
                f"{batch - NOTE_NAME_LIMIT} characters or more"
            )
        if not callable(entry.tenants):
            found += _tenant_limits(name, address, tuple(entry.tenants), room)
    if _note_fits(schedule, entry):
        return found
    value = json_text(entry_note(schedule, entry))
    size = len(value.encode())
    if size > NOTE_VALUE_LIMIT:
        found.append(
            f"{name}: what the fleet shows of it (its entry note: task, trigger and its first "
            f"tenants) is {size} bytes, over the {NOTE_VALUE_LIMIT} a note may hold; shorten "
            f"its task name or its first tenants' names"
        )
    return found


NOTE_FRAME = 1_024
"""More than an entry note holds beside its texts: keys, numbers, punctuation."""
ESCAPED = 12
"""The most bytes one character takes in a note (``\\ud83d\\ude00``, JSON-escaped)."""


def _note_fits(schedule: Schedule, entry: Entry) -> bool:
    """Whether the entry's note surely fits, bound from the length of its texts without
    writing it (most entries' notes are a few hundred bytes)."""
    tenants = entry.tenants
    published = () if tenants is None or callable(tenants) else tuple(tenants[:TENANTS_PUBLISHED])
    texts = (
        len(schedule.address(entry))
        + len(entry.name)
        + len(entry.task)
        + 2 * len(entry.describe())  # the trigger is written twice: as data and described
        + sum(len(t) + 3 for t in published)
        + len(entry.catch_up)
        + len(entry.overlap)
        + len(schedule.fingerprint)
    )
    return ESCAPED * texts + NOTE_FRAME <= NOTE_VALUE_LIMIT


def _tenant_limits(name: str, address: str, tenants: tuple[str, ...], room: int) -> list[str]:
    """The tenants of an entry whose address is too long for its history note, or that
    hold a NUL: one problem for each kind, with the count and the first."""
    found = []
    with_nul = [t for t in tenants if NOT_IN_NAMES in t]
    if with_nul:
        found.append(
            f"{name}: {len(with_nul)} tenant(s) hold a NUL character, which no store keeps "
            f"(the first: {shown(with_nul[0], limit=NAME_SHOWN)}); remove it from their names"
        )
    longest = room - len(tenant_address(address, ""))
    over = [t for t in tenants if len(t) > longest]
    if over:
        worst = max(over, key=len)
        found.append(
            f"{name}: {len(over)} tenant(s) make addresses (namespace/entry/tenant) over the "
            f"{room} characters an address may have (its history note is named "
            f"{history_kind('')}<address>, at most {NOTE_NAME_LIMIT} characters); the "
            f"longest, {shown(worst, limit=NAME_SHOWN)}, is {len(worst)} characters: tenants "
            f"of this entry may have at most {longest}"
        )
    return found
