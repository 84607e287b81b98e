"""``beatless check``: a schedule, a Celery app or a Dramatiq broker against the timing
rules; with ``--store``, the store too (rule 5, its settings, the clock offset)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from beatless.cli._common import EXIT_PROBLEMS, print_table
from beatless.cli.loader import load_schedule
from beatless.core._bulk import paused_collection
from beatless.core.durations import describe
from beatless.core.triggers import tzdata_version
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.entry import Schedule
from beatless.schedule.problems import Checked

if TYPE_CHECKING:
    from beatless.node._clockwatch import Sample
    from beatless.stores.base import StoreFacts


def cmd_check(args: argparse.Namespace) -> int:
    with paused_collection():  # a table of every entry: many objects (see core._bulk)
        return _check(args)


def _check(args: argparse.Namespace) -> int:
    label, found = _checked_target(args)
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if found.schedule is None:
        code = _print_problems(label, found.problems)
        if found.usable is not None:
            count = len(found.usable.entries)
            print(
                f"with on_schedule_error = 'consume', a node schedules the {count} other "
                f"entr{'y' if count == 1 else 'ies'} and leaves out "
                f"{', '.join(map(repr, found.left_out))}",
                file=sys.stderr,
            )
        return code
    schedule = found.schedule
    offset: Sample | None = None
    facts: StoreFacts | None = None
    store_note = ""
    if args.store:
        from beatless.node._clockwatch import measure
        from beatless.stores import open_store

        with open_store(args.store, namespace=schedule.namespace) as store:
            store.probe()
            offset = measure(store, time.time)
            remembers = store.remembers
            errors = schedule.check_store(
                remembers,
                store.name,
                run_leases=store.holds_run_leases,
                lengthen=store.lengthen_memory,
            )
            facts = store.facts()
        refusal = facts.refusal()
        errors += [refusal] if refusal else []
        if errors:
            print_facts(facts)
            return _print_problems(label, errors)
        schedule = schedule.fitted(remembers)  # as a node on this store runs it
        store_note = (
            f", {store.name} store keeps each claim as long as it asks"
            if remembers is None
            else f", {store.name} store remembers {describe(remembers)}"
        )
    addresses = sum(len(e.tenant_list() or (None,)) for e in schedule.entries)
    print(
        f"{label}: sound — {len(schedule.entries)} entries, {addresses} addresses, "
        f"namespace {schedule.namespace!r}, timezone {schedule.timezone}{store_note}"
    )
    print(
        f"  schedule fingerprint {schedule.fingerprint} (equal on every node that runs this "
        f"schedule), tzdata {tzdata_version()}"
    )
    if offset is not None:
        _print_offset(offset)
    if facts is not None:
        print_facts(facts)
    _print_load(schedule)
    print_table(
        ["entry", "trigger", "jitter", "max_late", "catch_up", "overlap", "once", "tenants"],
        [
            [
                e.name,
                e.describe(),
                describe(e.jitter),
                describe(e.max_late),
                e.catch_up,
                e.overlap,
                "yes" if e.once_only else "no",
                str(len(e.tenant_list() or ())),
            ]
            for e in schedule.entries
        ],
    )
    return 0


def print_facts(facts: StoreFacts) -> None:
    """What the store remembers: its settings as a table, each with its verdict."""
    print(f"{facts.store}: {facts.verdict.value}" + (f", {facts.usage}" if facts.usage else ""))
    if facts.facts:
        print_table(
            ["  setting", "value", "verdict", "why"],
            [[f"  {f.name}", f.value, f.verdict.value, f.why] for f in facts.facts],
        )


def _print_problems(label: str, problems: Sequence[str]) -> int:
    print(f"{label}: {len(problems)} problem(s)", file=sys.stderr)
    for problem in problems:
        print(f"  {' '.join(problem.split())}", file=sys.stderr)
    return EXIT_PROBLEMS


def _checked_target(args: argparse.Namespace) -> tuple[str, Checked]:
    """What ``check`` looks at, named for its output, and what collecting found there."""
    given = [bool(args.target), bool(args.celery), bool(args.dramatiq)]
    if sum(given) != 1:
        raise ConfigError("give one of TARGET, --celery APP or --dramatiq BROKER [MODULE ...]")
    if args.celery:
        from beatless.cli._app_check import check_celery

        return args.celery, check_celery(args.celery)
    if args.dramatiq:
        from beatless.cli._app_check import check_dramatiq

        return " ".join(args.dramatiq), check_dramatiq(args.dramatiq[0], args.dramatiq[1:])
    try:
        return args.target, Checked(load_schedule(args.target))
    except ScheduleError as exc:
        return args.target, Checked(None, tuple(exc.errors))


def _print_load(schedule: Schedule) -> None:
    from beatless.schedule.entry import NODE_FIRINGS_PER_S, peak_firings_per_s

    peak, busiest = peak_firings_per_s(schedule)
    if peak > NODE_FIRINGS_PER_S:
        print(
            f"warning: up to {peak:,.0f} firings per second at peak (most from entry "
            f"{busiest!r}); one node claims and sends about {NODE_FIRINGS_PER_S:,} per "
            f"second with a fast broker, fewer with a slow one, and drops what it cannot "
            f"send within max_late: widen the jitter or split the entry",
            file=sys.stderr,
        )


def _print_offset(offset: Sample) -> None:
    from beatless.node._clockwatch import WARN_MS

    print(
        f"clock offset to the store: {offset.offset_ms:+d} ms "
        f"(store minus this host, round trip {offset.round_trip_ms} ms)"
    )
    if abs(offset.offset_ms) > WARN_MS:
        way, acts = ("behind", "late") if offset.offset_ms > 0 else ("ahead of", "early")
        print(
            f"warning: this host's clock is {abs(offset.offset_ms) / 1_000:.1f} s {way} the "
            f"store's (over {WARN_MS / 1_000:g} s): it acts on firings that much {acts}; "
            f"sync its clock (NTP)",
            file=sys.stderr,
        )
