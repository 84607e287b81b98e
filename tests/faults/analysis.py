"""What a fault run lost and broke, counted from the nodes' record files.

Every send is judged on the real clock (the records carry ``time.time()``, never a
node's offset clock), against the rule of issue 7: a firing is sent at most once, and
never outside ``[release - 10 s, occurrence + max_late]``.

* **expected**: the firings whose occurrence lies in the run's window, enumerated
  with beatless's own triggers and :class:`~beatless.Firing` (so the ids are the ones
  the nodes derive), and any the test adds (live entries: each occurrence of the
  revision in force at it);
* **duplicates**: firings sent more than once (every send counts, in or out of the
  window); **in flight at a fault** (:func:`in_flight_at_fault`) if the first copy's
  send was under way when a fault struck the node that made it (the two-phase window);
* **misses**: expected firings that no node sent; **excused** if a fault covered the
  firing from its release until it became late, **unreported** if no node made a final
  decision not to send it (late, early, forgotten, ...: ``fault_node.REPORTED_OUTCOMES``)
  and no node's bulk count of late firings of its entry covers it (``None`` when the
  nodes' decisions are not observable);
* **early sends**: a send that began more than 10 s before the firing's release;
* **stale sends**: a send that began after ``occurrence + max_late`` (both give the
  scheduler :data:`CHECK_SLACK_MS`, the moment between its check and the record);
* **worst lateness**: the latest send, after the release and after the occurrence.

:func:`record` appends each report to ``tests/faults/.results.jsonl`` (git-ignored), so
the figures of a run can be copied into the docs.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from beatless import Firing, Schedule
from beatless.core.triggers import Trigger
from beatless.stores.base import STORE_TOLERANCE

TOLERANCE_MS = int(STORE_TOLERANCE.total_seconds() * 1_000)
RESULTS = Path(__file__).with_name(".results.jsonl")
EXCUSE_SLACK_MS = 2_000
"""A fault that began this soon after a firing's release still excuses its miss."""
CHECK_SLACK_MS = 50
"""A send is recorded a moment after the scheduler's own check that it is on time; this
much past a bound is that moment, not a stale or early send."""


@dataclass(frozen=True, slots=True)
class Send:
    """One line of a record file: one message handed to the broker."""

    id: str
    address: str
    entry: str
    occurrence_ms: int
    release_ms: int
    max_late_ms: int
    node: str
    called: float
    """When the scheduler handed the firing over (real clock, seconds)."""
    sent: float
    """When the send finished (real clock, seconds)."""
    committed: float | None = None
    """When the node's commit of it returned, accepted or refused (real clock, seconds);
    ``None`` if no commit of it returned (the node froze, died or lost the store first)."""

    @property
    def called_ms(self) -> int:
        return int(self.called * 1_000)

    @property
    def is_early(self) -> bool:
        return self.called_ms < self.release_ms - TOLERANCE_MS - CHECK_SLACK_MS

    @property
    def is_stale(self) -> bool:
        return self.called_ms > self.occurrence_ms + self.max_late_ms + CHECK_SLACK_MS


@dataclass(frozen=True, slots=True)
class Fault:
    """An interval of real time (seconds) during which a fault was on, its name, and the
    nodes it struck."""

    name: str
    start: float
    end: float
    nodes: tuple[str, ...] = ()
    """The nodes it struck (frozen, killed, their link cut), whatever it was aimed at (a
    node frozen in a poll is frozen whole); empty: every node (the store or the broker)."""

    def struck(self, node: str) -> bool:
        """Whether the fault struck ``node``."""
        return not self.nodes or node in self.nodes

    def excuses(self, firing: Firing) -> bool:
        """The fault held from the firing's release until the firing was late."""
        deadline = firing.occurrence_ms + firing.entry.max_late_ms
        return (
            self.start * 1_000 <= firing.release_ms + EXCUSE_SLACK_MS
            and deadline <= self.end * 1_000 + EXCUSE_SLACK_MS
        )


def read_records(paths: Iterable[Path]) -> tuple[list[Send], int]:
    """The sends in the record files, each with the time its commit returned, and how many
    sends failed (the broker raised)."""
    items, commits, failed = [], {}, 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if "commit" in item:
                for firing_id in item["commit"]:
                    commits.setdefault((item["node"], firing_id), item["at"])
            elif "sent" not in item:
                failed += 1
            else:
                items.append(item)
    fields = [k for k in Send.__slots__ if k != "committed"]
    sends = [
        Send(**{k: item[k] for k in fields}, committed=commits.get((item["node"], item["id"])))
        for item in items
    ]
    return sends, failed


def read_summaries(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The summaries the nodes wrote as they stopped (a node killed writes none)."""
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def expected_firings(schedule: Schedule, start_ms: int, end_ms: int) -> dict[str, Firing]:
    """Every firing of ``schedule`` whose occurrence is in ``[start_ms, end_ms]``, by id."""
    firings: dict[str, Firing] = {}
    for entry in schedule.entries:
        tenants: Sequence[str | None] = entry.tenant_list() or (None,)
        for occurrence in occurrences(entry.trigger, start_ms, end_ms):
            for tenant in tenants:
                address = schedule.address(entry, tenant)
                firing = Firing.of(entry, tenant, address, occurrence)
                firings[firing.id] = firing
    return firings


def occurrences(trigger: Trigger, start_ms: int, end_ms: int) -> Iterator[int]:
    """The trigger's occurrences in ``[start_ms, end_ms]``."""
    for occurrence in trigger.after(start_ms - 1):
        if occurrence > end_ms:
            return
        yield occurrence


@dataclass
class Report:
    """The figures of one scenario; :meth:`line` is what the test prints."""

    scenario: str
    expected: int
    sends: int
    duplicates: int
    in_flight_duplicates: int
    """Duplicates whose first copy was in flight (checked, its commit not returned) when a
    fault struck the node sending it: the residual window the docs name (a send whose
    outcome is unknown); :attr:`in_flight` names them."""
    misses: int
    excused_misses: int
    unreported_misses: int | None
    stale: int
    early: int
    failed_sends: int
    worst_after_release_s: float | None
    worst_after_occurrence_s: float | None
    sends_by_node: dict[str, int]
    window_sends_by_node: dict[str, int]
    outcomes: dict[str, int]
    counters: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)
    in_flight: dict[str, str] = field(default_factory=dict)
    """The duplicates in flight at a fault, by firing id: the node that sent the first
    copy and the fault (:func:`in_flight_at_fault`)."""
    silent_nodes: list[str] = field(default_factory=list)
    """Nodes that wrote no summary: they crashed, or never started."""
    files: str = ""
    """Where the nodes' configs, logs, records and summaries are."""
    wall_s: float | None = None

    def line(self) -> str:
        unreported = "?" if self.unreported_misses is None else self.unreported_misses
        return (
            f"{self.scenario}: expected {self.expected}, sent {self.sends}, "
            f"duplicates {self.duplicates} (in flight at a fault {self.in_flight_duplicates}), "
            f"misses {self.misses} (excused {self.excused_misses}, "
            f"unreported {unreported}), stale sends {self.stale}, early sends {self.early}, "
            f"failed sends {self.failed_sends}, worst lateness "
            f"{_seconds(self.worst_after_release_s)} after release / "
            f"{_seconds(self.worst_after_occurrence_s)} after occurrence; "
            f"sends by node {self.sends_by_node}; node counters {self.counters}"
            + (f"; NO SUMMARY from {self.silent_nodes}" if self.silent_nodes else "")
        )

    def details(self) -> str:
        """The line, then a few examples of each kind of failure."""
        lines = [self.line()]
        for kind, items in self.examples.items():
            lines.extend(f"  {kind}: {item}" for item in items)
        if self.files:
            lines.append(f"  node configs, logs and records: {self.files}")
        return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def analyse(
    scenario: str,
    schedule: Schedule,
    *,
    window_ms: tuple[int, int],
    sends: Sequence[Send],
    failed_sends: int,
    summaries: Sequence[dict[str, Any]],
    faults: Sequence[Fault] = (),
    also_expected: Mapping[str, Firing] | None = None,
    told: Mapping[str, set[str]] | None = None,
) -> Report:
    """Count what the run broke: see the module docstring for each figure;
    ``also_expected``: firings the schedule does not name, by id, expected too; ``told``:
    by node, the firings it said it sent in the two-phase window (its log), if read (see
    :func:`in_flight_at_fault`)."""
    expected = expected_firings(schedule, *window_ms) | dict(also_expected or {})
    copies = Counter(send.id for send in sends)
    in_flight = in_flight_at_fault(sends, faults, told)
    missed = [firing for key, firing in expected.items() if key not in copies]
    stale = [send for send in sends if send.is_stale]
    early = [send for send in sends if send.is_early]
    return Report(
        scenario=scenario,
        expected=len(expected),
        sends=len(sends),
        duplicates=sum(1 for count in copies.values() if count > 1),
        in_flight_duplicates=len(in_flight),
        misses=len(missed),
        excused_misses=sum(1 for f in missed if any(fault.excuses(f) for fault in faults)),
        unreported_misses=_unreported(missed, summaries),
        stale=len(stale),
        early=len(early),
        failed_sends=failed_sends,
        worst_after_release_s=_worst(send.sent * 1_000 - send.release_ms for send in sends),
        worst_after_occurrence_s=_worst(send.sent * 1_000 - send.occurrence_ms for send in sends),
        sends_by_node=dict(sorted(Counter(send.node for send in sends).items())),
        window_sends_by_node=dict(
            sorted(Counter(send.node for send in sends if send.id in expected).items())
        ),
        outcomes=_sum_outcomes(summaries),
        counters=_sum_counters(summaries),
        examples=_examples(
            sends,
            copies,
            missed=missed,
            stale=stale,
            early=early,
            in_flight=in_flight,
            faults=faults,
            told=told,
        ),
        in_flight={
            key: f"first sent by {send.node}, in flight at {fault.name}"
            for key, (send, fault) in in_flight.items()
        },
    )


def in_flight_at_fault(
    sends: Sequence[Send],
    faults: Sequence[Fault],
    told: Mapping[str, set[str]] | None = None,
) -> dict[str, tuple[Send, Fault]]:
    """Firings sent more than once whose first copy (the earliest check) was in flight
    when a fault struck the node that made it, by id, with that copy and the fault.

    In flight: the fault began after the copy's check (``called``) and before its outcome
    reached the store (its commit returned; never, if none did): the node froze, died or
    lost its link between the two (the two-phase window), so its claim could run out
    before its commit and another node take the firing over. What the fault was aimed at
    (a node frozen in a poll) does not matter; whom it struck does: a fault of another
    node, one that began before the check or after the commit returned, or a later copy in
    flight excuses nothing. With ``told`` (by node, the firings its log names as sent in
    the two-phase window), a first copy whose commit returned must be named by its node
    too: a commit that returns finding the firing taken over says so."""
    by_id: defaultdict[str, list[Send]] = defaultdict(list)
    for send in sends:
        by_id[send.id].append(send)
    found: dict[str, tuple[Send, Fault]] = {}
    for key, copies in by_id.items():
        if len(copies) < 2:
            continue
        first = min(copies, key=lambda send: send.called)
        if told is not None and first.committed is not None and key not in told.get(first.node, ()):
            continue
        fault = next(
            (f for f in faults if f.struck(first.node) and first.called < f.start < _landed(first)),
            None,
        )
        if fault is not None:
            found[key] = (first, fault)
    return found


def _landed(send: Send) -> float:
    """When the send's outcome reached the store: its commit returned (never, if none did)."""
    return float("inf") if send.committed is None else max(send.sent, send.committed)


def _worst(lateness_ms: Iterable[float]) -> float | None:
    values = list(lateness_ms)
    return max(values) / 1_000 if values else None


def _unreported(missed: Sequence[Firing], summaries: Sequence[dict[str, Any]]) -> int | None:
    """Missed firings no node reported; ``None`` if the nodes' decisions were not
    observable.

    A firing is reported one by one (a decision: late, early, forgotten, ...) or in bulk:
    a node drops a whole late occurrence with one count and no decision per firing. The
    misses not reported one by one must fit, per entry, in some node's bulk count.
    """
    if not any(summary.get("outcomes") for summary in summaries):
        return None
    reported = {
        firing_id
        for summary in summaries
        for ids in summary.get("reported", {}).values()
        for firing_id in ids
    }
    left = Counter(f.entry.name for f in missed if f.id not in reported)
    bulk = _bulk_late(summaries)
    return sum(max(count - bulk.get(entry, 0), 0) for entry, count in left.items())


def _bulk_late(summaries: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per entry, the most firings one node dropped without a decision for each (one
    WARNING with the count): its ``late_node`` counter less its ``late`` decisions, and
    its ``stale_schedule`` counter less its ``stale_schedule`` decisions."""
    bulk: Counter[str] = Counter()
    for summary in summaries:
        decided = summary.get("outcomes_by_entry", {})
        for entry, stats in summary.get("stats", {}).items():
            if not isinstance(stats, dict):
                continue
            own = decided.get(entry, {})
            dropped = stats.get("late_node", 0) - own.get("late", 0)
            dropped += stats.get("stale_schedule", 0) - own.get("stale_schedule", 0)
            bulk[entry] = max(bulk[entry], dropped)
    return dict(bulk)


def _sum_outcomes(summaries: Sequence[dict[str, Any]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for summary in summaries:
        total.update(summary.get("outcomes", {}))
    return dict(sorted(total.items()))


def _sum_counters(summaries: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The nodes' integer stats (won, lost, late_node, ...) summed over nodes and entries."""
    total: Counter[str] = Counter()
    for summary in summaries:
        for stats in summary.get("stats", {}).values():
            if not isinstance(stats, dict):
                continue
            for key, value in stats.items():
                if isinstance(value, int) and not key.startswith("lateness"):
                    total[key] += value
    return {key: value for key, value in sorted(total.items()) if value}


def _examples(
    sends: Sequence[Send],
    copies: Counter[str],
    *,
    missed: Sequence[Firing],
    stale: Sequence[Send],
    early: Sequence[Send],
    in_flight: Mapping[str, tuple[Send, Fault]],
    faults: Sequence[Fault] = (),
    told: Mapping[str, set[str]] | None = None,
    limit: int = 3,
) -> dict[str, list[str]]:
    """A few of each failure, readable: which firing, which node, when; the duplicates
    not in flight at a fault first."""
    twice = sorted(
        (key for key, count in copies.items() if count > 1), key=lambda key: key in in_flight
    )[:limit]
    by_id: dict[str, list[Send]] = {key: [] for key in twice}
    for send in sends:
        if send.id in by_id:
            by_id[send.id].append(send)
    examples = {
        "duplicate": [
            _describe_copies(copies_, faults, told)
            + (f" (first copy in flight at {in_flight[key][1].name})" if key in in_flight else "")
            for key, copies_ in by_id.items()
        ],
        "stale": [_describe_send(send) for send in stale[:limit]],
        "early": [_describe_send(send) for send in early[:limit]],
        "missed": [
            f"{f.address} occurrence {f.occurrence_ms} release {f.release_ms}"
            for f in missed[:limit]
        ],
    }
    return {kind: items for kind, items in examples.items() if items}


def _describe_send(send: Send) -> str:
    after_occurrence = send.called - send.occurrence_ms / 1_000
    after_release = send.called - send.release_ms / 1_000
    return (
        f"{send.address} @ {send.occurrence_ms} by {send.node}: began {after_occurrence:+.1f}s "
        f"after occurrence, {after_release:+.1f}s after release (max_late "
        f"{send.max_late_ms / 1_000:.0f}s)"
    )


def _describe_copies(
    sends: Sequence[Send],
    faults: Sequence[Fault] = (),
    told: Mapping[str, set[str]] | None = None,
) -> str:
    """Each copy's node, and when (from the occurrence) it was handed over, sent and
    committed, and, where the nodes' logs were read, whether its node told it was sent in
    the two-phase window (its commit found it taken over); then the faults that began
    between the first hand-over and the last commit, whoever they struck: what a reader
    needs to tell the two-phase window."""
    sends = sorted(sends, key=lambda send: send.called)
    first = sends[0]
    zero = first.occurrence_ms / 1_000

    def at(instant: float | None) -> str:
        return "-" if instant is None else f"{instant - zero:+.2f}s"

    def window(send: Send) -> str:
        if told is None:
            return ""
        return ", told taken over" if send.id in told.get(send.node, ()) else ", not told"

    each = ", ".join(
        f"{s.node} (called {at(s.called)}, sent {at(s.sent)}, committed {at(s.committed)}"
        f"{window(s)})"
        for s in sends
    )
    last = max(_landed(send) for send in sends)
    near = [
        f"{f.name} on {','.join(f.nodes) or 'all'} {at(f.start)}..{at(f.end)}"
        for f in faults
        if first.called - 1 < f.start < last + 1
    ]
    return (
        f"{first.address} @ {first.occurrence_ms} sent {len(sends)} times: {each}; "
        f"faults near: {'; '.join(near) or 'none'}"
    )


def record(report: Report, code: str, path: Path = RESULTS) -> None:
    """Append the report to the results file, one JSON object per line, with ``code``:
    which beatless was measured."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    item = {"when": when, "code": code, **asdict(report)}
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(item) + "\n")
