"""What a fleet is doing, read from its claim store: ``beatless status``.

Everything comes from the store's notes (:mod:`beatless.fleet._notes`): the live nodes of the
registry, the entries the nodes publish (or the schedule given), and each address's
history. The report is one mapping with the keys ``nodes``, ``entries`` and
``problems``; it is healthy when ``problems`` is empty.

A firing is **missed** when its occurrence + max_late + jitter + the store's tolerance
has passed and no node wrote it into the history: no node claimed it in time. The
status counts, each once, the missed firings of the last hour that the nodes counted
(their missed-count notes, :class:`~beatless.fleet._notes.MissedRecord`, kept for the hour
whatever the history still holds), those the history records missed, and the
occurrences of the last hour newer than the oldest firing the history still holds that
it does not hold (so a fresh fleet, whose history is empty, has missed nothing).

Each firing is shown once, with its strongest outcome
(:func:`~beatless.fleet._notes.strongest`).

On a store that keeps live entries (:mod:`beatless.live`), ``live`` is the fleet's last
revision (its number, fence, commit, writer and note) and the nodes still on an older
one; a node that stays behind a revision committed over ``BEHIND_MS`` ago is a problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from itertools import islice
from typing import Any

from beatless.core._logtext import ERROR_LIMIT, LIMIT, shown
from beatless.core.triggers import Trigger
from beatless.fleet._controls import (
    Control,
    audit_kind,
    controls_kind,
    read_audit,
    read_controls,
    read_requests,
    run_now_kind,
)
from beatless.fleet._members import Change, changes_kind, members_kind, read_members
from beatless.fleet._missed import (
    HOUR_MS,
    EntryView,
    entry_views,
    history_items,
    missed_occurrences,
)
from beatless.fleet._notes import (
    REGISTRY_EVERY_MS,
    HistoryItem,
    NodeRecord,
    drift,
    entries_kind,
    history_kind,
    missed_kind,
    nodes_kind,
    progress_kind,
    read_missed,
    read_registry,
)
from beatless.fleet._schema import ENTRY_NOTE, PROGRESS, Collected, Skipped, parse_each
from beatless.live._ledger import Ledger
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import iso, offset_ms
from beatless.stores.base import ClaimStore

NEXT_COUNT = 3
BEHIND_MS = 3 * REGISTRY_EVERY_MS
"""A node whose record still shows an older live revision this long after the last one's
commit is a problem (a record is posted every ``REGISTRY_EVERY_MS``; a node applies a
revision within a sync of its commit)."""


def published_entries(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None
) -> list[EntryView]:
    """The entries the nodes of ``namespace`` publish: of the notes that fit their schema
    (the others are told to ``skipped``)."""
    kind = entries_kind(namespace)
    views = parse_each(kind, notes, lambda text: EntryView.of(ENTRY_NOTE.load(text)), skipped)
    return sorted((view for _, view in views), key=lambda v: v.name)


def known_entries(
    store: ClaimStore, namespace: str, schedule: Schedule | None
) -> dict[str, tuple[str, ...] | None]:
    """The entries of ``namespace`` with their listed tenants: the schedule's, else those
    the nodes publish (whose tenants are not checked: ``None``)."""
    if schedule is not None:
        return {
            e.name: None if e.tenants is None else (e.tenant_list() or ()) for e in schedule.entries
        }
    kind = entries_kind(namespace)
    return {v.name: None for v in published_entries(store.read_notes([kind])[kind], namespace)}


def _read_for_problems(
    notes: Mapping[str, Mapping[str, str]],
    kinds: Sequence[str],
    namespace: str,
    skipped: Collected,
) -> None:
    """Read the run-now requests, the progress, member and change notes (``kinds``, in
    that order) only to tell ``skipped`` those that do not fit their schema."""
    requests, progress, members, changes = kinds
    read_requests(notes[requests], namespace, skipped)
    dict(parse_each(progress, notes[progress], PROGRESS.load, skipped))
    read_members(notes[members], namespace, skipped)
    dict(parse_each(changes, notes[changes], Change.parse, skipped))


def report(
    store: ClaimStore,
    namespace: str,
    *,
    schedule: Schedule | None = None,
    now_ms: int,
    next_count: int = NEXT_COUNT,
) -> dict[str, Any]:
    """The status of ``namespace`` in ``store`` at ``now_ms``: ``nodes``, ``entries``,
    ``problems``. Raises :class:`~beatless.errors.StoreError` when the store fails."""
    kinds = [nodes_kind(namespace), entries_kind(namespace)]
    kinds += [controls_kind(namespace), audit_kind(namespace)]
    kinds += [run_now_kind(namespace), progress_kind(namespace)]  # read for their problems
    kinds += [members_kind(namespace), changes_kind(namespace)]
    notes = store.read_notes(kinds)
    skipped = Collected()
    _read_for_problems(notes, kinds[4:], namespace, skipped)
    controls = read_controls(notes[kinds[2]], namespace, skipped)
    records = sorted(read_registry(notes[kinds[0]], namespace, skipped), key=lambda r: r.node)
    if schedule is not None:
        views = entry_views(schedule)
    else:
        views = published_entries(notes[kinds[1]], namespace, skipped)
    audit = read_audit(notes[kinds[3]], namespace, skipped)
    wanted = [history_kind(address) for view in views for address, _ in view.addresses()]
    wanted += [missed_kind(view.address) for view in views if view.fan_out is None]
    history = store.read_logs(wanted) if wanted else {}

    problems: list[str] = []
    if not records:
        problems.append(f"no live node in namespace {namespace!r}: no registry record is current")
    for record in records:
        trouble = record.health()
        if trouble:
            problems.append(f"node {record.node}: {trouble}")
        window = record.counters.get("two_phase_window", 0)
        if window:
            problems.append(
                f"node {record.node}: {window} firing(s) sent in the two-phase window (their "
                "commit failed until their lease ran out, and another node claimed them): a "
                "second copy of each may have reached the broker under the same message id, "
                "which the workers' once-only check refuses; the node's WARNING lines name them"
            )
        if (record.store_verdict or "").startswith("refuse"):
            problems.append(f"node {record.node}: claims stopped, store {record.store_verdict}")
        failed = record.last_failure_ms
        if failed is not None and now_ms - failed <= HOUR_MS:
            problems.append(
                f"node {record.node}: its scheduler process died at {iso(failed)} "
                f"({record.last_failure}) and was restarted; {record.restarts} restart(s) "
                "since the node started"
            )
    problems.extend(drift(records))
    live = live_report(store, namespace, records)
    problems.extend(live_problems(live, now_ms))
    if schedule is not None:
        others = sorted({r.fingerprint for r in records} - {schedule.fingerprint})
        if others:
            problems.append(
                f"the schedule given has fingerprint {schedule.fingerprint}; live nodes run "
                f"{', '.join(others)}"
            )
    entries = []
    coming = Coming(now_ms, next_count)
    for view in views:
        items = history_items(view, history, skipped)
        kind = missed_kind(view.address)
        counted = read_missed(kind, history.get(kind, {}), skipped)
        summary = _entry(view, items, now_ms, coming, controls.get(view.name), counted=counted)
        if summary["missed"]:
            problems.append(
                f"entry {view.name}: {summary['missed']} missed firing(s) in the last hour, "
                f"the last at {summary['missed_last']}"
            )
        entries.append(summary)
    problems.extend(skipped_problems(skipped.notes))
    return {
        "namespace": namespace,
        "at": iso(now_ms),
        "nodes": [_node(r, now_ms) for r in records],
        "entries": entries,
        "problems": problems,
        "audit": [_control(c) for c in audit],
        "live": live,
    }


def live_report(
    store: ClaimStore, namespace: str, records: Sequence[NodeRecord]
) -> dict[str, Any] | None:
    """The fleet's last live revision and the nodes on an older one; ``None`` when the
    store keeps no live entries or none was ever written."""
    if not store.keeps_notes:
        return None
    ledger = Ledger(store, namespace)
    head = ledger.latest()
    if head == 0:
        return None
    revision = ledger.read([head])[0]
    behind = [
        {"node": r.node, "revision": r.live_revision}
        for r in records
        if r.live_revision is not None and r.live_revision < head
    ]
    return {
        "revision": head,
        "hash": revision.hash[:12],
        "committed": iso(revision.committed_ms),
        "committed_ms": revision.committed_ms,
        "fence": iso(revision.fence_ms),
        "fence_ms": revision.fence_ms,
        "writer": revision.writer,
        "host": revision.host,
        "note": revision.note,
        "changes": len(revision.changes),
        "behind": behind,
    }


def live_problems(live: Mapping[str, Any] | None, now_ms: int) -> list[str]:
    """The nodes still on an older live revision ``BEHIND_MS`` after the last commit."""
    if live is None or now_ms - live["committed_ms"] < BEHIND_MS:
        return []
    return [
        f"node {b['node']}: runs live revision {b['revision']}, the fleet's is "
        f"{live['revision']} (committed {live['committed']}, in force from {live['fence']}): "
        "it has not read it (cut off from the store's notes, or frozen?)"
        for b in live["behind"]
    ]


SKIPPED_LISTED = 20
"""Of the notes skipped for not fitting their schema, ``status`` lists this many."""


def skipped_problems(skipped: Sequence[tuple[str, str, str]]) -> list[str]:
    """The problems of the notes skipped (kind, key, reason): one each, up to
    ``SKIPPED_LISTED``, then how many more."""
    problems = [
        f"note {shown(key)} of kind {shown(kind)} skipped: "
        f"{shown(reason, quoted=False, limit=ERROR_LIMIT)}; "
        "delete it, or let its writer post it again"
        for kind, key, reason in skipped[:SKIPPED_LISTED]
    ]
    if len(skipped) > SKIPPED_LISTED:
        problems.append(
            f"{len(skipped) - SKIPPED_LISTED} more note(s) skipped for not fitting their schema"
        )
    return problems


def _node(record: NodeRecord, now_ms: int) -> dict[str, Any]:
    trouble = record.health()
    return {
        "node": record.node,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "framework": record.framework,
        "store": record.store,
        "fingerprint": record.fingerprint,
        "tzdata": record.tzdata,
        "ephem": record.ephem,
        "clock_offset_ms": record.clock_offset_ms,
        "last_wake": None if record.last_wake_ms is None else iso(record.last_wake_ms),
        "last_seen_s": round((now_ms - record.posted_ms) / 1_000, 1),
        "started": iso(record.started_ms),
        "healthy": trouble is None,
        "health": trouble or "ok",
        "counters": record.counters,
        "restarts": record.restarts,
        "last_failure": record.last_failure,
        "last_failure_at": None if record.last_failure_ms is None else iso(record.last_failure_ms),
        "store_verdict": record.store_verdict,
        "live_revision": record.live_revision,
        "live_hash": record.live_hash,
        "live_lag_ms": record.live_lag_ms,
        "live_overrides": record.live_overrides,
    }


class Coming:
    """The next occurrences of each trigger after ``now_ms``, computed once per trigger:
    the entries of a big schedule share their triggers (a tenant per entry, one cron)."""

    def __init__(self, now_ms: int, count: int) -> None:
        self.now_ms, self.count = now_ms, count
        self._known: dict[Trigger, tuple[int, ...]] = {}

    def of(self, trigger: Trigger) -> tuple[int, ...]:
        try:
            return self._known[trigger]
        except KeyError:
            pass
        except TypeError:  # a trigger that is not a value: computed each time
            return tuple(islice(trigger.after(self.now_ms), self.count))
        found = self._known[trigger] = tuple(islice(trigger.after(self.now_ms), self.count))
        return found


def _entry(
    view: EntryView,
    items: Sequence[HistoryItem],
    now_ms: int,
    coming: Coming,
    control: Control | None,
    *,
    counted: Set[int],
) -> dict[str, Any]:
    missed = missed_occurrences(view, items, now_ms, counted)
    last = items[-1] if items else None
    counts: dict[str, int] = {}
    for item in items:
        counts[item.outcome] = counts.get(item.outcome, 0) + 1
    return {
        "entry": view.name,
        "address": view.address,
        "trigger": view.describe,
        "fan_out": view.fan_out,
        "last": None if last is None else _item(last),
        "recent": [_item(i) for i in items[-10:]],
        "timeline": [_item(i) for i in items if i.occurrence_ms >= now_ms - HOUR_MS],
        "next": _next(view, coming),
        "paused": control is not None and control.pauses(now_ms),
        "control": None if control is None else _control(control),
        "counts": counts,
        "missed": len(missed),
        "missed_last": iso(max(missed)) if missed else None,
    }


def _control(control: Control) -> dict[str, Any]:
    return {
        "action": control.action,
        "entry": control.entry,
        "tenant": control.tenant,
        "by": control.by,
        "host": control.host,
        "at": iso(control.at_ms),
        "until": None if control.until_ms is None else iso(control.until_ms),
    }


def _item(item: HistoryItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "occurrence_ms": item.occurrence_ms,
        "tenant": item.tenant,
        "occurrence": iso(item.occurrence_ms),
        "release": iso(item.release_ms),
        "node": item.node,
        "outcome": item.outcome,
        "lateness_ms": item.lateness_ms,
        "manual": item.manual,
    }


def _next(view: EntryView, coming: Coming) -> list[dict[str, Any]]:
    """The coming occurrences with their release. A fan-out's tenants each have an offset
    of their own: its ``offset_ms`` is ``None``, and they are released from ``release``
    over ``window_ms``, up to ``release_last``."""
    if view.trigger is None or not view.enabled:
        return []
    upcoming = []
    for occurrence in coming.of(view.trigger):
        if view.fan_out:
            upcoming.append(
                {
                    "occurrence": iso(occurrence),
                    "offset_ms": None,
                    "window_ms": view.jitter_ms,
                    "release": iso(occurrence),
                    "release_last": iso(occurrence + view.jitter_ms),
                }
            )
            continue
        offset = offset_ms(view.address, view.key(occurrence), view.jitter_ms)
        upcoming.append(
            {
                "occurrence": iso(occurrence),
                "offset_ms": offset,
                "window_ms": view.jitter_ms,
                "release": iso(occurrence + offset),
            }
        )
    return upcoming


def _release_text(upcoming: dict[str, Any]) -> str:
    """One coming release as ``status`` prints it; a fan-out's, as the span its tenants
    are released over."""
    if upcoming["offset_ms"] is not None or not upcoming["window_ms"]:
        return str(upcoming["release"])
    return f"{upcoming['release']} to {upcoming['release_last']} (each tenant at its offset)"


def render(status: Mapping[str, Any]) -> str:
    """The report as text for a terminal. Every value read from the store (names,
    tenants, hosts, health, problems) is written as a log line writes it: escaped, so
    that none can start a line of its own or drive the terminal, and names cut."""
    e = _text
    lines = [f"namespace {e(status['namespace'])} at {e(status['at'])}", "", "nodes:"]
    for node in status["nodes"]:
        offset = node["clock_offset_ms"]
        lines.append(
            f"  {e(node['node'])}  {e(node['framework'])} on {e(node['host'])} pid "
            f"{e(node['pid'])}  beatless {e(node['version'])}  schedule "
            f"{e(node['fingerprint'])}  tzdata {e(node['tzdata'])}"
            + (f"  ephem {e(node['ephem'])}" if node.get("ephem") else "")
            + "  offset "
            f"{'?' if offset is None else f'{offset:+d}ms'}  last wake "
            f"{e(node['last_wake'] or 'never')}  {e(node['health'], LONG)}"
            + (f"  store {e(node['store_verdict'])}" if node.get("store_verdict") else "")
            + (f"  two-phase window {e(window)}" if (window := _window(node)) else "")
        )
    if not status["nodes"]:
        lines.append("  (none live)")
    if status.get("live"):
        lines += ["", *_live_lines(status["live"], status["nodes"])]
    lines += ["", "entries:"]
    for entry in status["entries"]:
        last = entry["last"]
        told = (
            "never fired (in the history kept)"
            if last is None
            else f"last {e(last['outcome'])} {e(last['occurrence'])} on {e(last['node'])} "
            f"({e(last['lateness_ms'])}ms after release)"
        )
        upcoming = ", ".join(e(_release_text(n)) for n in entry["next"]) or "unknown"
        lines.append(f"  {e(entry['entry'])}  {e(entry['trigger'])}")
        lines.append(f"    {told}; missed in the last hour: {e(entry['missed'])}")
        lines.append(f"    next releases: {upcoming}")
        control = entry["control"]
        if entry["paused"]:
            until = f" until {e(control['until'])}" if control["until"] else " until resumed"
            lines.append(f"    PAUSED{until}, by {e(control['by'])} on {e(control['host'])}")
    if status["audit"]:
        lines += ["", "recent controls:"]
        lines += [
            f"  {e(c['at'])}  {e(c['action'])} {e(c['entry'])}"
            + (f" until {e(c['until'])}" if c["until"] else "")
            + (f" tenant {e(c['tenant'])}" if c["tenant"] else "")
            + f"  by {e(c['by'])} on {e(c['host'])}"
            for c in status["audit"][-5:]
        ]
    lines += ["", "problems:" if status["problems"] else "no problems"]
    lines += [f"  - {e(p, LONG)}" for p in status["problems"]]
    return "\n".join(lines)


def _live_lines(live: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The live schedule as ``status`` prints it: its revision, and where each node is."""
    e = _text
    by = f" by {e(live['writer'])}" if live["writer"] else ""
    note = f" ({e(live['note'], LONG)})" if live["note"] else ""
    lines = [
        f"live schedule: revision {e(live['revision'])}{by}{note}, committed "
        f"{e(live['committed'])}, in force from {e(live['fence'])}"
    ]
    for node in nodes:
        if node.get("live_revision") is None:
            continue
        lag = node.get("live_lag_ms")
        applied = "" if lag is None else f", applied {lag / 1_000:.1f} s after its commit"
        where = "current" if node["live_revision"] >= live["revision"] else "BEHIND"
        lines.append(
            f"  {e(node['node'])}  revision {e(node['live_revision'])} ({where}){applied}"
            + (f"  overrides {e(node['live_overrides'])}" if node.get("live_overrides") else "")
        )
    return lines


def _window(node: Mapping[str, Any]) -> int:
    """The node's ``two_phase_window`` counter, 0 when it has none."""
    counters = node.get("counters") or {}
    return int(counters.get("two_phase_window", 0) or 0)


LONG = 10_000
"""Characters of a sentence of the report (a health, a problem) kept in text output; a
name is cut at :data:`beatless.core._logtext.LIMIT`."""


def _text(value: object, limit: int = LIMIT) -> str:
    """``value`` as the text output shows it: on one line, escaped, cut at ``limit``."""
    return shown(value, quoted=False, limit=limit)
