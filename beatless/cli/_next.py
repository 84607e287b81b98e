"""``beatless next``: the coming firings of a schedule, sorted by release."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from beatless.cli._common import instant_ms, now_ms, print_table, tenant_of
from beatless.cli._fleet import fleet_from_args
from beatless.core.durations import to_ms
from beatless.errors import ConfigError
from beatless.schedule._window import silence
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import Firing, iso

if TYPE_CHECKING:
    from beatless.core.triggers import Trigger


def cmd_next(args: argparse.Namespace) -> int:
    schedule = fleet_from_args(args).known_schedule()
    if args.count < 1:
        raise ConfigError(f"--count must be at least 1, got {args.count}")
    after_ms = instant_ms(args.after, "--after") if args.after else now_ms()
    if args.tenant is not None and not args.entry:
        raise ConfigError("--tenant needs --entry: name the fan-out entry the tenant is one of")
    entries = [schedule.entry(args.entry)] if args.entry else list(schedule.entries)
    tenant = tenant_of(entries[0], args.tenant) if args.tenant is not None else None
    firings = sorted(
        upcoming(schedule, entries, after_ms, args.count, tenant=tenant),
        key=lambda f: (f.release_ms, f.address),
    )
    quiet = [(e.name, why) for e in entries if (why := silence(e, after_ms)) is not None]
    if args.json:
        for firing in firings:
            print(json.dumps(firing_json(firing)))
        for name, why in quiet:  # not firings: told beside them, as the table does
            print(f"entry {name!r}: {why}", file=sys.stderr)
    else:
        print_table(
            ["release", "occurrence", "offset", "address", "id", "policies"],
            [
                [
                    iso(f.release_ms),
                    iso(f.occurrence_ms),
                    f"{f.offset_ms} ms",
                    f.address,
                    f.id,
                    policies(f.entry),
                ]
                for f in firings
            ],
        )
        for name, why in quiet:
            print(f"entry {name!r}: {why}")
    return 0


def upcoming(
    schedule: Schedule,
    entries: Sequence[Entry],
    after_ms: int,
    count: int,
    *,
    tenant: str | None = None,
) -> Iterator[Firing]:
    """The next ``count`` firings of each enabled entry whose occurrence is after
    ``after_ms`` and within its window, in release order: for a fan-out entry, the
    ``count`` released first among all its tenants (with ``tenant``, that tenant's next
    ``count``).

    A fan-out's earliest releases depend on every tenant's offset: each tenant costs one
    SHA-256, streamed through a heap of ``count`` (:func:`beatless.schedule._fanout.earliest`),
    and only the firings printed are built. Its occurrences never interleave (the jitter
    is under half the shortest gap), so the first occurrence that has ``count`` tenants
    is the only one computed.
    """
    cache: dict[Trigger, list[int]] = {}
    for entry in entries:
        if not entry.enabled:
            continue
        occurrences = cache.get(entry.windowed)
        if occurrences is None:
            found = islice(entry.windowed.after(after_ms), count)
            occurrences = cache[entry.windowed] = list(found)
        tenants = entry.tenant_list() if tenant is None else (tenant,)
        if tenants is None or tenant is not None:
            address = schedule.address(entry, tenant)
            yield from (Firing.of(entry, tenant, address, o) for o in occurrences)
            continue
        yield from _earliest_of(schedule, entry, tenants, occurrences, count)


def _earliest_of(
    schedule: Schedule, entry: Entry, tenants: Sequence[str], occurrences: list[int], count: int
) -> Iterator[Firing]:
    """The ``count`` firings of a fan-out entry released first, occurrence by occurrence."""
    from beatless.schedule._fanout import earliest

    base = schedule.address(entry)
    for occurrence in occurrences:
        if count <= 0:
            return
        firings = earliest(entry, base, occurrence, tenants, count)
        count -= len(firings)
        yield from firings


def firing_json(firing: Firing) -> dict[str, Any]:
    entry = firing.entry
    return {
        "entry": firing.entry.name,
        "tenant": firing.tenant,
        "address": firing.address,
        "occurrence": iso(firing.occurrence_ms),
        "id": firing.id,
        "offset_ms": firing.offset_ms,
        "release": iso(firing.release_ms),
        "catch_up": entry.catch_up,
        "overlap": entry.overlap,
        "once_only": entry.once_only,
        "run_lease_ms": to_ms(entry.run_lease),
        "heartbeat_ms": to_ms(entry.heartbeat),
    }


def policies(entry: Entry) -> str:
    """The entry's policies in a few words: ``catch_up latest, overlap skip, once-only``."""
    once = "once-only" if entry.once_only else "not once-only"
    return f"catch_up {entry.catch_up}, overlap {entry.overlap}, {once}"
