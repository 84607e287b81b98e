"""The ``beatless`` command: next, check, explain, run and demo.

Exit codes: 0 success; 1 when ``check`` finds problems or ``explain`` is asked about an
instant that is not an occurrence; 2 for input beatless cannot use (an unreadable file,
an unknown key, a bad expression, a bad time) and for a store that refuses the
credentials or cannot be reached, always as one line on stderr.
Environment variables (``BEATLESS_STORE``, ``BEATLESS_NODE``) are read here only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, NoReturn

from beatless._version import __version__
from beatless.cli import schedule_command
from beatless.cli.loader import load_schedule, parse_instant
from beatless.core.durations import describe, to_ms
from beatless.core.triggers import tzdata_version
from beatless.errors import BeatlessError, ConfigError, ScheduleError, StoreUnavailable
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import Firing, digest, from_datetime, iso
from beatless.schedule.problems import Checked

if TYPE_CHECKING:
    from beatless.core.triggers import Trigger
    from beatless.node._clockwatch import Sample
    from beatless.stores import ClaimStore
    from beatless.stores.base import StoreFacts

EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2

STORE_WAIT_S = 5.0
"""How long ``run`` keeps trying a store it cannot reach at start before it gives up."""
STORE_RETRY_S = 0.25


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one statement per option
    parser = _Parser(
        prog="beatless",
        description="Periodic tasks with no beat process and no leader.",
    )
    parser.add_argument("--version", action="version", version=f"beatless {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    target_help = "a TOML schedule file, or module:attribute naming a Schedule or list of Entry"

    nxt = commands.add_parser("next", help="list the coming firings, sorted by release")
    nxt.add_argument("schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)")
    _fleet_source(nxt, target_help)
    nxt.add_argument("--entry", metavar="NAME", help="only this entry")
    nxt.add_argument(
        "--tenant", metavar="T", help="only this tenant of the fan-out entry --entry names"
    )
    nxt.add_argument(
        "--count",
        type=int,
        default=5,
        metavar="N",
        help="firings per entry (5); a fan-out entry's N released first, over all its tenants",
    )
    nxt.add_argument("--after", metavar="ISO", help="an ISO 8601 instant (default: now)")
    nxt.add_argument("--json", action="store_true", help="one JSON object per line")

    check = commands.add_parser("check", help="validate entries and timing rules")
    check.add_argument("target", metavar="TARGET", nargs="?", help=target_help)
    framework = check.add_mutually_exclusive_group()
    framework.add_argument(
        "--celery",
        metavar="APP",
        help="check a Celery app's beat_schedule and beatless settings, named as for "
        "celery -A (proj.celery:app, or proj.celery with an app attribute)",
    )
    framework.add_argument(
        "--dramatiq",
        nargs="+",
        metavar="BROKER",
        help="check the Beatless middleware of a Dramatiq broker, named as for the dramatiq "
        "command: BROKER [MODULE ...] (proj.broker:broker, or a module using the global "
        "broker, then the modules that declare actors)",
    )
    check.add_argument(
        "--store",
        metavar="URL",
        help="also connect to this store: probe it, check rule 5, measure the clock offset",
    )

    explain = commands.add_parser(
        "explain",
        help="derive a firing's id, offset and release; with a store, say what happened to it",
    )
    explain.add_argument(
        "schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)"
    )
    explain.add_argument("entry", metavar="ENTRY", help="the entry's name")
    _fleet_source(explain, target_help)
    explain.add_argument("--at", required=True, metavar="ISO", help="the occurrence")
    explain.add_argument("--tenant", metavar="T", help="the tenant, for a fan-out entry")

    run = commands.add_parser("run", help="run a standalone node with a logging enqueue")
    run.add_argument("target", metavar="TARGET", help=target_help)
    run.add_argument("--store", metavar="URL", help="claim store URL (env BEATLESS_STORE)")
    run.add_argument("--node", metavar="NAME", help="node name (env BEATLESS_NODE)")
    run.add_argument(
        "--every-node-claims",
        action="store_true",
        help="claim every firing on this node, instead of leaving each to the node of the "
        "registry preferred for it (more store work; for comparison and debugging)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs beatless[metrics])",
    )
    run.add_argument(
        "--metrics-host",
        metavar="ADDR",
        help="the address the metrics port listens on (127.0.0.1; 0.0.0.0 for every interface)",
    )

    schedule_command.add_parser(commands, _fleet_source)
    status = commands.add_parser(
        "status", help="what the fleet did and does, read from the claim store"
    )
    status.add_argument(
        "schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)"
    )
    _fleet_source(status, target_help)
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument(
        "--serve", type=int, metavar="PORT", help="serve a read-only status page on this port"
    )
    status.add_argument(
        "--host", default="127.0.0.1", help="the address the page listens on (127.0.0.1)"
    )
    status.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the page answers to besides localhost and IP addresses (repeatable)",
    )

    pause = commands.add_parser("pause", help="pause an entry on every node, through the store")
    _fleet_source(pause, target_help)
    pause.add_argument("entry", metavar="ENTRY", help="the entry's name")
    pause.add_argument(
        "--until", metavar="WHEN", help="an ISO 8601 instant or a duration (2h); default: resume"
    )
    resume = commands.add_parser("resume", help="resume a paused entry on every node")
    _fleet_source(resume, target_help)
    resume.add_argument("entry", metavar="ENTRY", help="the entry's name")
    run_now = commands.add_parser("run-now", help="one manual firing of an entry, sent once")
    _fleet_source(run_now, target_help)
    run_now.add_argument("entry", metavar="ENTRY", help="the entry's name")
    run_now.add_argument("--tenant", metavar="T", help="one tenant of a fan-out entry")

    demo = commands.add_parser("demo", help="race local nodes on a claim store (SQLite default)")
    demo.add_argument("--nodes", type=int, default=3, help="node processes (3)")
    demo.add_argument("--seconds", type=float, default=30.0, help="how long to run (30)")
    demo.add_argument("--json", action="store_true", help="JSON lines; summary last")
    demo.add_argument(
        "--store", metavar="URL", help="race on this claim store (default: a temporary SQLite file)"
    )
    return parser


def _fleet_source(parser: argparse.ArgumentParser, target_help: str) -> None:
    """The options that name a fleet's schedule, store and namespace, shared by every
    command that reads or steers a fleet (status, the controls, next, explain)."""
    parser.add_argument(
        "--schedule",
        dest="target",
        metavar="TARGET",
        help=f"{target_help} (its namespace and entries)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--celery", metavar="APP", help="take the store and namespace from a Celery app"
    )
    source.add_argument(
        "--dramatiq",
        nargs="+",
        metavar="BROKER",
        help="take the store and namespace from a Dramatiq broker's Beatless middleware",
    )
    parser.add_argument("--store", metavar="URL", help="claim store URL (env BEATLESS_STORE)")
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help="the fleet's namespace (with --store alone: beatless_namespace of a Celery app, "
        "Beatless(namespace=...) of Dramatiq, a schedule's namespace)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # so module:attribute targets resolve like python -m
    handlers = {"next": cmd_next, "check": cmd_check, "explain": cmd_explain}
    handlers.update(run=cmd_run, demo=cmd_demo, status=cmd_status)
    handlers["schedule"] = partial(schedule_command.cmd_schedule, fleet_from_args)
    handlers.update({"pause": cmd_control, "resume": cmd_control, "run-now": cmd_control})
    try:
        return handlers[args.command](args)
    except BeatlessError as exc:
        print(f"beatless {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away, as with `beatless next ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _one_line(exc: BeatlessError) -> str:
    return " ".join(str(exc).split())


# -- next -------------------------------------------------------------------------------


def cmd_next(args: argparse.Namespace) -> int:
    schedule = fleet_from_args(args).known_schedule()
    if args.count < 1:
        raise ConfigError(f"--count must be at least 1, got {args.count}")
    after_ms = _instant_ms(args.after, "--after") if args.after else _now_ms()
    if args.tenant is not None and not args.entry:
        raise ConfigError("--tenant needs --entry: name the fan-out entry the tenant is one of")
    entries = [schedule.entry(args.entry)] if args.entry else list(schedule.entries)
    tenant = _tenant(entries[0], args.tenant) if args.tenant is not None else None
    firings = sorted(
        upcoming(schedule, entries, after_ms, args.count, tenant=tenant),
        key=lambda f: (f.release_ms, f.address),
    )
    if args.json:
        for firing in firings:
            print(json.dumps(firing_json(firing)))
    else:
        _print_table(
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
    return 0


def upcoming(
    schedule: Schedule,
    entries: Sequence[Entry],
    after_ms: int,
    count: int,
    *,
    tenant: str | None = None,
) -> Iterator[Firing]:
    """The next ``count`` firings of each entry whose occurrence is after ``after_ms``,
    in release order: for a fan-out entry, the ``count`` released first among all its
    tenants (with ``tenant``, that tenant's next ``count``).

    A fan-out's earliest releases depend on every tenant's offset: each tenant costs one
    SHA-256, streamed through a heap of ``count`` (:func:`beatless.schedule._fanout.earliest`),
    and only the firings printed are built. Its occurrences never interleave (the jitter
    is under half the shortest gap), so the first occurrence that has ``count`` tenants
    is the only one computed.
    """
    cache: dict[Trigger, list[int]] = {}
    for entry in entries:
        occurrences = cache.get(entry.trigger)
        if occurrences is None:
            occurrences = cache[entry.trigger] = list(islice(entry.trigger.after(after_ms), count))
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


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# -- check ------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    label, found = _checked_target(args)
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if found.schedule is None:
        return _print_problems(label, found.problems)
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
    _print_table(
        ["entry", "trigger", "jitter", "max_late", "catch_up", "overlap", "once", "tenants"],
        [
            [
                e.name,
                e.trigger.describe(),
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
        _print_table(
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


# -- explain ----------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    fleet = fleet_from_args(args)
    schedule = fleet.known_schedule()
    entry = schedule.entry(args.entry)
    at_ms = _instant_ms(args.at, "--at")
    tenant = _tenant(entry, args.tenant)
    if next(entry.trigger.after(at_ms - 1)) != at_ms:
        before, after = previous_occurrence(entry.trigger, at_ms), next(entry.trigger.after(at_ms))
        print(
            f"{iso(at_ms)} is not an occurrence of entry {entry.name!r} "
            f"({entry.trigger.describe()}); nearest before: "
            f"{iso(before) if before is not None else 'none within 50 years'}, "
            f"nearest after: {iso(after)}"
        )
        return EXIT_PROBLEMS
    for line in explanation(schedule, entry, tenant, at_ms):
        print(line)
    if fleet.has_store:
        with fleet.open() as store:
            print(f"{'  happened':<13} {what_happened(store, schedule, entry, tenant, at_ms)}")
    return 0


def what_happened(
    store: ClaimStore, schedule: Schedule, entry: Entry, tenant: str | None, at_ms: int
) -> str:
    """What the fleet did with one firing, as its address's history says."""
    from beatless.fleet._notes import (
        HISTORY_KEEP,
        HISTORY_TTL_MS,
        HistoryItem,
        batch_items,
        fan_out_history_kind,
        history_kind,
        strongest,
    )

    firing = Firing.of(entry, tenant, schedule.address(entry, tenant), at_ms)
    kinds = [history_kind(firing.address)]
    if tenant is not None:  # a fan-out: the tenant's firing may be in a batch note
        kinds.append(fan_out_history_kind(schedule.address(entry), at_ms))
    read = store.read_notes(kinds)
    notes = read[kinds[0]]
    kept = [i for i in map(HistoryItem.from_json, notes.values()) if i is not None]
    batches = read[kinds[1]].values() if tenant is not None else ()
    for batch in batches:
        kept += batch_items(schedule.address(entry), batch, tenant)
    # Every note of the firing (nodes may disagree: one sent it, one found it paused);
    # the history tells its strongest outcome.
    item = next((i for i in strongest(kept) if i.id == firing.id), None)
    into = [i for i in kept if i.covers(at_ms)]
    if item is None and into:
        return (
            f"coalesced: catch_up {entry.catch_up!r} left it unclaimed when a node started, "
            f"and sent the firing of {iso(into[0].occurrence_ms)} for it (by node "
            f"{into[0].node})"
        )
    if item is None:
        coalesced = (
            f"; a node that started after it with catch_up {entry.catch_up!r} leaves it "
            "unclaimed (coalesced into a later occurrence) without a record"
            if entry.catch_up != "all"
            else ""
        )
        return (
            f"not in the history: no node recorded sending, skipping or missing it (each "
            f"address keeps its last {HISTORY_KEEP} firings, none older than "
            f"{HISTORY_TTL_MS // 3_600_000} h){coalesced}"
        )
    where = f"by node {item.node}"
    said = {
        "won": f"fired: sent {where}, {item.lateness_ms} ms after its release",
        "takeover": f"fired: taken over and sent {where}, {item.lateness_ms} ms after its "
        "release (the first winner did not commit in time)",
        "skipped_overlap": f"skipped {where}: a run of the address was in progress and its "
        "overlap policy is 'skip'",
        "paused": f"skipped {where}: the entry was paused by an operator",
        "missed": f"missed: no node claimed it within max_late (found {where})",
        "forgotten": f"not sent {where}: the claim store had lost its memory, so it may "
        "have been sent before that",
    }
    return said.get(item.outcome, f"{item.outcome} {where}")


def explanation(schedule: Schedule, entry: Entry, tenant: str | None, at_ms: int) -> list[str]:
    """Each step from the entry to the release, with the numbers to recompute it by hand."""
    address = schedule.address(entry, tenant)
    text = f"{address}@{at_ms}"
    d = digest(address, at_ms)
    firing = Firing.of(entry, tenant, address, at_ms)
    lead53 = int.from_bytes(d[:8], "big") >> 11
    window = entry.jitter_ms
    parts = "namespace/entry" + ("/tenant" if tenant is not None else "")
    steps = [
        ("entry", f"{entry.name!r}: {entry.trigger.describe()}, task {entry.task!r}"),
        ("1 address", f"{address}    ({parts})"),
        ("2 occurrence", f"{iso(at_ms)} = {at_ms} ms since the Unix epoch"),
        ("3 input", f'"{text}"    (address "@" occurrence_ms, encoded as UTF-8)'),
        ("4 digest", f"sha256(input) = {d.hex()}"),
        ("5 id", f"first 16 bytes of the digest as a UUID = {firing.id}"),
        ("6 lead53", f"first 8 bytes 0x{d[:8].hex()} as a big-endian integer >> 11 = {lead53}"),
        (
            "7 offset_ms",
            f"(window_ms × lead53) >> 53 = ({window} × {lead53}) >> 53 = {firing.offset_ms}"
            f"    (jitter {describe(entry.jitter)})",
        ),
        (
            "8 release",
            f"occurrence_ms + offset_ms = {at_ms} + {firing.offset_ms} = {firing.release_ms}"
            f" = {iso(firing.release_ms)}",
        ),
        (
            "  late after",
            f"occurrence + max_late {describe(entry.max_late)} = "
            f"{iso(at_ms + entry.max_late_ms)}: no node enqueues it past that",
        ),
        ("  catch_up", _catch_up_line(entry)),
        ("  overlap", _overlap_line(entry)),
        ("  once_only", _once_only_line(entry)),
    ]
    return [f"{label:<13} {value}" for label, value in steps]


def _catch_up_line(entry: Entry) -> str:
    """What a node that starts after this occurrence does with it."""
    said = {
        "latest": "claimed only if it is the most recent occurrence before the node's start",
        "all": "claimed while not late",
        "none": "not claimed",
    }
    return f"{entry.catch_up!r}: by a node that starts after it, {said[entry.catch_up]}"


def _overlap_line(entry: Entry) -> str:
    """What this firing does if a run of its address is still in progress."""
    if entry.overlap == "allow":
        return "'allow': sent even if a run of this address is still in progress"
    return (
        f"'skip': not sent (counted skipped_overlap) while a run of this address holds its "
        f"run lease ({describe(entry.run_lease)}, renewed every {describe(entry.heartbeat)}; "
        f"a killed worker frees it {describe(entry.run_lease)} after its last heartbeat)"
    )


def _once_only_line(entry: Entry) -> str:
    if not entry.once_only:
        return "off: a second copy of this firing in the broker runs too"
    return (
        f"on: a second copy of this firing is refused by the worker (counted duplicate) "
        f"while the first runs and for {describe(entry.memory_needed)} after it ends"
    )


def previous_occurrence(trigger: Trigger, at_ms: int) -> int | None:
    """The last occurrence before ``at_ms``, searched in windows growing 8× up to 50 years."""
    window = 1_000
    while window <= 50 * 366 * 86_400_000:
        last = None
        for occurrence in trigger.after(at_ms - window - 1):
            if occurrence >= at_ms:
                break
            last = occurrence
        if last is not None:
            return last
        window *= 8
    return None


def _tenant(entry: Entry, tenant: str | None) -> str | None:
    tenants = entry.tenant_list()
    if tenants is None:
        if tenant is not None:
            raise ConfigError(f"entry {entry.name!r} has no tenants; drop --tenant")
        return None
    if tenant is None or tenant not in tenants:
        shown = ", ".join(tenants[:5]) + (", …" if len(tenants) > 5 else "")
        what = "pass --tenant" if tenant is None else f"{tenant!r} is not one of them"
        raise ConfigError(
            f"entry {entry.name!r} fans out to {len(tenants)} tenants ({shown}); {what}"
        )
    return tenant


# -- run and demo -----------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    store = args.store or os.environ.get("BEATLESS_STORE")
    if not store:
        raise ConfigError("give --store URL or set BEATLESS_STORE (e.g. sqlite:///beatless.db)")
    node = args.node or os.environ.get("BEATLESS_NODE") or None
    schedule = load_schedule(args.target)
    return run_node(
        schedule,
        store_url=store,
        node=node,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        preferred=not args.every_node_claims,
    )


def run_node(
    schedule: Schedule,
    *,
    store_url: str,
    node: str | None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    preferred: bool = True,
) -> int:
    """Run one node until SIGINT or SIGTERM, logging each firing's decision; with
    ``metrics_port``, serve its Prometheus metrics there, on ``metrics_host`` (127.0.0.1
    unless given; a port taken is an error)."""
    from beatless.node.scheduler import Scheduler
    from beatless.ops import metrics

    if metrics_host is not None and metrics_port is None:
        raise ConfigError("--metrics-host needs --metrics-port: give the port to serve on")
    if metrics_port is not None:
        metrics.metrics_port(metrics_port, "--metrics-port")  # prometheus-client, a port
        metrics_host = metrics.metrics_host(metrics_host or metrics.DEFAULT_ADDR, "--metrics-host")

    with open_probed(store_url, namespace=schedule.namespace) as store:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)  # run shows each one
        scheduler = Scheduler(  # checks rule 5 on the store
            schedule, store=store, node=node, preferred=preferred
        )
        if metrics_port is not None:
            metrics.register(scheduler)
            metrics.serve(metrics_port, addr=metrics_host or metrics.DEFAULT_ADDR)
        stopping = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopping.set())
        thread = scheduler.start()
        while thread.is_alive() and not stopping.wait(0.5):
            pass
        scheduler.stop(timeout=10)
    return 0 if stopping.is_set() else EXIT_PROBLEMS


def open_probed(url: str, *, namespace: str, wait_s: float = STORE_WAIT_S) -> ClaimStore:
    """Open the store at ``url`` for ``namespace`` and probe it before anything else.

    A store that refuses the credentials (or any error but unavailability) fails at
    once; one that cannot be reached is tried again for up to ``wait_s`` seconds, then
    :class:`~beatless.errors.StoreUnavailable` says for how long it was tried.
    """
    from beatless.stores import open_store

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _probed(open_store(url, namespace=namespace))
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"{exc} (tried for {wait_s:g} s)") from None
            time.sleep(min(STORE_RETRY_S, left))


def _probed(store: ClaimStore) -> ClaimStore:
    try:
        store.probe()
    except BaseException:
        store.close()
        raise
    return store


# -- status -----------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    fleet = fleet_from_args(args)
    with fleet.open() as store:
        if args.serve is not None:
            return serve_status(
                store,
                fleet.namespace,
                fleet.schedule,
                args.host,
                args.serve,
                allow_hosts=args.allow_host,
            )
        return print_status(store, fleet.namespace, schedule=fleet.schedule, as_json=args.json)


def serve_status(
    store: ClaimStore,
    namespace: str,
    schedule: Schedule | None,
    host: str,
    port: int,
    *,
    allow_hosts: Sequence[str] = (),
) -> int:
    """Serve the read-only status page of ``namespace`` until SIGINT or SIGTERM."""
    from beatless.ops._page import serve
    from beatless.ops.status import report

    serve(
        lambda: report(store, namespace, schedule=schedule, now_ms=_now_ms()),
        host=host,
        port=port,
        allow_hosts=allow_hosts,
    )
    return 0


def print_status(
    store: ClaimStore, namespace: str, *, schedule: Schedule | None, as_json: bool
) -> int:
    """Print the status of ``namespace``; 0 when healthy, 1 with problems."""
    from beatless.ops.status import render, report

    status = report(store, namespace, schedule=schedule, now_ms=_now_ms())
    print(json.dumps(status, indent=2) if as_json else render(status))
    return EXIT_PROBLEMS if status["problems"] else 0


def cmd_control(args: argparse.Namespace) -> int:
    """``pause``, ``resume`` and ``run-now``: one control note and its audit record."""
    from beatless.fleet._controls import set_control
    from beatless.ops.status import known_entries

    fleet = fleet_from_args(args)
    namespace = fleet.namespace
    with fleet.open() as store:
        entries = known_entries(store, namespace, fleet.schedule)
        if args.entry not in entries:
            raise ConfigError(
                f"no entry named {args.entry!r} in namespace {namespace!r}"
                + (
                    f"; its entries: {', '.join(sorted(entries))}"
                    if entries
                    else " (no node has published its entries: give --schedule)"
                )
            )
        tenant = getattr(args, "tenant", None)
        tenants = entries[args.entry]
        if tenant is not None and tenants is not None and tenant not in tenants:
            raise ConfigError(f"entry {args.entry!r} has no tenant {tenant!r}")
        until_ms = _until_ms(args.until, store.time_ms()) if getattr(args, "until", None) else None
        control = set_control(
            store, namespace, args.command, args.entry, until_ms=until_ms, tenant=tenant
        )
    said = {
        "pause": "paused" + (f" until {iso(until_ms)}" if until_ms else " until resumed"),
        "resume": "resumed",
        "run-now": "queued for one manual firing" + (f" of tenant {tenant!r}" if tenant else ""),
    }[args.command]
    print(
        f"entry {args.entry!r} of namespace {namespace!r} {said} (by {control.by} on "
        f"{control.host} at {iso(control.at_ms)}); every node honours it within a second"
    )
    return 0


def _until_ms(text: str, now_ms: int) -> int:
    """``--until``: an ISO 8601 instant, or a duration from now; in the future."""
    from beatless.core.durations import as_timedelta

    try:
        until = now_ms + to_ms(as_timedelta(text, name="--until"))
    except ConfigError:
        until = from_datetime(parse_instant(text, what="--until"))
    if until <= now_ms:
        raise ConfigError(f"--until {text!r} is not in the future")
    return until


# -- a fleet: the namespace, the schedule and the store a command addresses --------------


@dataclass(frozen=True)
class Fleet:
    """What a command addresses: a namespace, its schedule when known, and how to open its
    claim store, always by :func:`~beatless.stores.open_store` with that namespace (or by
    the integration, which opens it the same way), so every command and every node of
    the fleet address the same keys."""

    namespace: str
    schedule: Schedule | None
    opener: Callable[[], ClaimStore] | None
    """``None`` when no store is named."""

    @property
    def has_store(self) -> bool:
        return self.opener is not None

    def open(self) -> ClaimStore:
        if self.opener is None:
            raise ConfigError(
                "give --store URL (or BEATLESS_STORE), --celery APP or --dramatiq BROKER: "
                "this command reads the fleet's claim store"
            )
        return self.opener()

    def known_schedule(self) -> Schedule:
        """The schedule, else the entries the fleet's nodes publish in its store."""
        if self.schedule is not None:
            return self.schedule
        with self.open() as store:
            return published_schedule(store, self.namespace)


def fleet_from_args(args: argparse.Namespace) -> Fleet:
    """The fleet named by TARGET (or ``--schedule``), ``--celery``, ``--dramatiq`` or
    ``--store`` with ``--namespace``: one of the first three, or the store alone.

    The namespace is the schedule's or the app's: a ``--namespace`` that differs is
    refused rather than followed, so no command writes where no node reads."""
    url = args.store or os.environ.get("BEATLESS_STORE") or None
    target = args.target or getattr(args, "schedule", None)
    if sum(map(bool, (target, args.celery, args.dramatiq))) > 1:
        raise ConfigError("give one of TARGET, --celery APP or --dramatiq BROKER, not two")
    if args.celery:
        fleet = celery_fleet(_load_celery(args.celery), url)
    elif args.dramatiq:
        fleet = _dramatiq_fleet(args.dramatiq, url)
    elif target:
        schedule = load_schedule(target)
        fleet = Fleet(schedule.namespace, schedule, _opener(url, schedule.namespace))
    elif not url:
        raise ConfigError(
            "give TARGET, --celery APP, --dramatiq BROKER, or --store URL (or BEATLESS_STORE) "
            "with --namespace NS"
        )
    elif not args.namespace:
        raise ConfigError(
            "give --namespace NS with --store: the fleet's namespace (beatless_namespace of a "
            "Celery app, Beatless(namespace=...) of Dramatiq, a schedule's namespace)"
        )
    else:
        return Fleet(args.namespace, None, _opener(url, args.namespace))
    if args.namespace and args.namespace != fleet.namespace:
        raise ConfigError(
            f"--namespace {args.namespace!r} is not the fleet's namespace {fleet.namespace!r}: "
            "drop --namespace"
        )
    return fleet


def _opener(url: str | None, namespace: str) -> Callable[[], ClaimStore] | None:
    from beatless.stores import open_store

    return None if url is None else partial(open_store, url, namespace=namespace)


def _load_celery(name: str) -> Any:
    from beatless.cli._app_check import load_celery

    return load_celery(name)


def celery_fleet(app: Any, url: str | None = None) -> Fleet:
    """A Celery app's fleet: its namespace, its schedule (``None`` with problems) and its
    claim store (``beatless_store_url``, or ``url``)."""
    from beatless.celery.schedule import check_app, open_claim_store
    from beatless.celery.settings import CelerySettings

    settings = CelerySettings.from_app(app)
    schedule = check_app(app, settings).schedule
    return Fleet(settings.namespace, schedule, partial(open_claim_store, settings, url))


def _dramatiq_fleet(names: Sequence[str], url: str | None) -> Fleet:
    """A Dramatiq broker's fleet, from its Beatless middleware."""
    from beatless.cli._app_check import load_dramatiq

    broker, middleware = load_dramatiq(names[0], names[1:])
    schedule = middleware.check(broker).schedule
    namespace = middleware.address_namespace
    if url:
        return Fleet(namespace, schedule, _opener(url, namespace))
    return Fleet(namespace, schedule, partial(middleware.status_store, broker))


def published_schedule(store: ClaimStore, namespace: str) -> Schedule:
    """The schedule as the live nodes of ``namespace`` publish it in ``store``: each
    entry's task, trigger, jitter, max_late, catch_up, overlap and listed tenants (a
    fan-out's first 20). What is not published (arguments, run leases, once_only) takes
    its default; ``check`` with the schedule itself tells those."""
    from beatless.fleet._notes import entries_kind, trigger_of

    kind = entries_kind(namespace)
    entries = []
    for text in store.read_notes([kind])[kind].values():
        try:
            note = json.loads(text)
            trigger = trigger_of(note["trigger"])
            tenants = note.get("tenants")
            if trigger is None:
                continue
            entries.append(
                Entry(
                    name=note["entry"],
                    task=note["task"],
                    trigger=trigger,
                    jitter=timedelta(milliseconds=int(note["jitter_ms"])),
                    max_late=timedelta(milliseconds=int(note["max_late_ms"])),
                    tenants=None
                    if tenants is None
                    else tenants
                    if isinstance(tenants, list)
                    else (),
                    catch_up=note.get("catch_up", "latest"),
                    overlap=note.get("overlap", "allow"),
                )
            )
        except (ValueError, KeyError, TypeError, BeatlessError):
            continue  # a note this version cannot read: the entry is left out
    if not entries:
        raise ConfigError(
            f"no node of namespace {namespace!r} has published its entries in this store "
            "(is the namespace right, and a node running?): give TARGET, --celery APP or "
            "--dramatiq BROKER"
        )
    print(
        f"note: the entries of namespace {namespace!r} as its nodes publish them in the store",
        file=sys.stderr,
    )
    return Schedule(sorted(entries, key=lambda e: e.name), namespace=namespace)


def cmd_demo(args: argparse.Namespace) -> int:
    from beatless.cli.demo import run_demo

    return run_demo(nodes=args.nodes, seconds=args.seconds, as_json=args.json, store=args.store)


def _instant_ms(text: str, what: str) -> int:
    return from_datetime(parse_instant(text, what=what))


def _now_ms() -> int:
    return from_datetime(datetime.now(UTC))
