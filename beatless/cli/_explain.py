"""``beatless explain``: how a firing's id, offset and release derive from its entry,
and, with a store, what the fleet did with it and the live revision it ran under.

A live entry (:mod:`beatless.live`) is explained as the revision in force at the
occurrence defines it (rule 1: the latest whose fence is at or before it), read from the
store; the history item of a firing sent under a live definition names its revision."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from beatless.cli._common import EXIT_PROBLEMS, instant_ms, tenant_of
from beatless.cli._fleet import fleet_from_args
from beatless.core.durations import describe
from beatless.core.triggers import occurrence_key
from beatless.errors import StoreError
from beatless.live import Live, codec
from beatless.live.revisions import Revision, in_force, state
from beatless.schedule._window import unscheduled
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import Firing, digest, iso
from beatless.schedule.outcomes import DecisionOutcome

if TYPE_CHECKING:
    from beatless.cli._fleet import Fleet
    from beatless.core.triggers import Trigger
    from beatless.fleet._notes import HistoryItem
    from beatless.stores import ClaimStore


def cmd_explain(args: argparse.Namespace) -> int:
    fleet = fleet_from_args(args)
    schedule = fleet.known_schedule()
    at_ms = instant_ms(args.at, "--at")
    revision, live_entry = live_definition(fleet, schedule, args.entry, at_ms)
    entry = live_entry or schedule.entry(args.entry)
    tenant = tenant_of(entry, args.tenant)
    if next(entry.trigger.after(at_ms - 1), None) != at_ms:
        before, after = (
            previous_occurrence(entry.trigger, at_ms),
            next(entry.trigger.after(at_ms), None),
        )
        print(
            f"{iso(at_ms)} is not an occurrence of entry {entry.name!r} "
            f"({entry.trigger.describe()}); nearest before: "
            f"{iso(before) if before is not None else 'none within 50 years'}, "
            f"nearest after: {iso(after) if after is not None else 'none'}"
        )
        return EXIT_PROBLEMS
    for line in explanation(schedule, entry, tenant, at_ms):
        print(line)
    why_not = unscheduled(entry, at_ms)
    if why_not is not None:
        print(f"{'  scheduled':<13} no: {why_not}; no node claims or sends this firing")
    if revision is not None:
        print(f"{'  revision':<13} {revision_line(revision)}")
    if fleet.has_store:
        with fleet.open() as store:
            print(f"{'  happened':<13} {what_happened(store, schedule, entry, tenant, at_ms)}")
            print(f"{'  claim':<13} {claim_line(store, schedule, entry, tenant, at_ms)}")
    return 0 if why_not is None else EXIT_PROBLEMS


def live_definition(
    fleet: Fleet, schedule: Schedule, name: str, at_ms: int
) -> tuple[Revision | None, Entry | None]:
    """The live revision in force at ``at_ms`` and the entry ``name`` it defines, when the
    fleet's store keeps live entries and one defines it then; else ``(None, None)``."""
    if not fleet.has_store:
        return None, None
    try:
        with fleet.open() as store:
            if not store.keeps_notes:
                return None, None
            revisions = Live(store, namespace=schedule.namespace).revisions()
    except StoreError:
        return None, None  # the store's trouble is told where the history is read
    revision = in_force(revisions, at_ms)
    data = None if revision is None else state(revisions, revision.number).get(name)
    if revision is None or data is None:
        return None, None
    entry = codec.entry_from_json(dict(data))
    bound = Schedule([entry], namespace=schedule.namespace, timezone=schedule.timezone)
    return revision, bound.entries[0]


def revision_line(revision: Revision) -> str:
    """The live revision a firing runs under, as ``explain`` names it."""
    by = f" by {revision.writer}" if revision.writer else ""
    return (
        f"live revision {revision.number}{by} (committed {iso(revision.committed_ms)}, in "
        f"force from {iso(revision.fence_ms)}): the latest whose fence is at or before the "
        f"occurrence"
    )


def claim_line(
    store: ClaimStore, schedule: Schedule, entry: Entry, tenant: str | None, at_ms: int
) -> str:
    """The firing's claim record, as the store still holds it: who claimed it, whether it
    is committed, and the live revision the claim carried, against the history's."""
    if not store.reads_claims:
        return f"not read: the {store.name} store cannot read a claim without disturbing it"
    firing = Firing.of(entry, tenant, schedule.address(entry, tenant), at_ms)
    try:
        record = store.claim_records([firing.id]).get(firing.id)
    except StoreError as exc:
        return f"could not be read: {exc}"
    if record is None:
        return (
            f"not in the store: a claim is remembered {describe(entry.memory_needed)} after "
            "its commit (or never made)"
        )
    state = "committed" if record.committed else f"pending until {iso(record.until_ms)}"
    said = f"by node {record.node}, {state}, "
    said += (
        f"under live revision {record.revision}"
        if record.revision is not None
        else "revision not recorded (a claim without a live revision, or one made by an "
        "earlier beatless)"
    )
    item, _ = _history(store, schedule, firing, at_ms)
    noted = None if item is None else item.revision
    if noted is not None and noted != record.revision:
        said += f"; differs from the history, which names live revision {noted}"
    return said


def _history(
    store: ClaimStore, schedule: Schedule, firing: Firing, at_ms: int
) -> tuple[HistoryItem | None, list[HistoryItem]]:
    """The firing's strongest history item (``None``: none), and the kept items of its
    address (and of its occurrence's batch notes, for a tenant)."""
    from beatless.fleet._notes import (
        HistoryItem,
        batch_items,
        fan_out_history_kind,
        history_kind,
        strongest,
    )

    entry, tenant = firing.entry, firing.tenant
    kinds = [history_kind(firing.address)]
    if tenant is not None:  # a fan-out: the tenant's firing may be in a batch note
        kinds.append(fan_out_history_kind(schedule.address(entry), at_ms))
    read = store.read_logs(kinds)
    notes = read[kinds[0]]
    kept = [i for i in map(HistoryItem.from_json, notes.values()) if i is not None]
    batches = read[kinds[1]].values() if tenant is not None else ()
    for batch in batches:
        kept += batch_items(schedule.address(entry), batch, tenant)
    # Every note of the firing (nodes may disagree: one sent it, one found it paused);
    # the history tells its strongest outcome.
    item = next((i for i in strongest(kept) if i.id == firing.id), None)
    return item, kept


def what_happened(
    store: ClaimStore, schedule: Schedule, entry: Entry, tenant: str | None, at_ms: int
) -> str:
    """What the fleet did with one firing, as its address's history says."""
    from beatless.fleet._notes import HISTORY_KEEP, HISTORY_TTL_MS

    firing = Firing.of(entry, tenant, schedule.address(entry, tenant), at_ms)
    item, kept = _history(store, schedule, firing, at_ms)
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
    where = f"by node {item.node}" + (
        f" under live revision {item.revision}" if item.revision is not None else ""
    )
    late = f"{item.lateness_ms} ms after its release"
    said: dict[str, str] = {
        DecisionOutcome.WON: f"fired: sent {where}, {late}",
        DecisionOutcome.TAKEOVER: f"fired: taken over and sent {where}, {late} (the first "
        "winner did not commit in time)",
        DecisionOutcome.SKIPPED_OVERLAP: f"skipped {where}: a run of the address was in "
        "progress and its overlap policy is 'skip'",
        DecisionOutcome.PAUSED: f"skipped {where}: the entry was paused by an operator",
        DecisionOutcome.MISSED: f"missed: no node claimed it within max_late (found {where})",
        DecisionOutcome.FORGOTTEN: f"not sent {where}: the claim store had lost its memory, "
        "so it may have been sent before that",
    }
    return said.get(item.outcome, f"{item.outcome} {where}")


def explanation(schedule: Schedule, entry: Entry, tenant: str | None, at_ms: int) -> list[str]:
    """Each step from the entry to the release, with the numbers to recompute it by hand."""
    address = schedule.address(entry, tenant)
    key = occurrence_key(entry.trigger, at_ms)
    text = f"{address}@{key}"
    d = digest(address, key)
    firing = Firing.of(entry, tenant, address, at_ms)
    lead53 = int.from_bytes(d[:8], "big") >> 11
    window = entry.jitter_ms
    parts = "namespace/entry" + ("/tenant" if tenant is not None else "")
    steps = [
        ("entry", f"{entry.name!r}: {entry.describe()}, task {entry.task!r}"),
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
