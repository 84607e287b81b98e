"""A bad record is one record: a note in the claim store that does not fit the schema of
its kind (``beatless.fleet._schema``) is skipped, counted once and told once, naming its key,
and never stops the loop, ``status`` or the status page.

The store is shared, so any client (another version, a bug, an operator's ``redis-cli``)
can write a note. Each kind a node or ``status`` reads is written here malformed in every
way we know of (invalid JSON, wrong types, missing fields, huge values), to its reader
alone, into an in-process fleet on a manual clock, and into a running fleet on every
store that keeps notes.
"""

from __future__ import annotations

import http.client
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from service_check import require_service
from stores import BACKENDS, Backend, ManualClock, Opener

from beatless import Entry, Every, Schedule
from beatless.cli._status import print_status
from beatless.fleet._controls import (
    Control,
    audit_kind,
    controls_kind,
    json_text,
    read_audit,
    read_controls,
    read_requests,
    run_now_kind,
)
from beatless.fleet._members import (
    MEMBER,
    Member,
    changes_kind,
    members_kind,
    membership_kind,
    read_members,
)
from beatless.fleet._notes import (
    HistoryItem,
    NodeRecord,
    batch_items,
    entries_kind,
    entry_note,
    history_kind,
    nodes_kind,
    parse_batch,
    read_history,
    read_registry,
)
from beatless.fleet._schema import (
    BATCH_NOTE,
    CONTROL,
    HISTORY_ITEM,
    INSTANT_MAX_MS,
    NAME_LIMIT,
    NODE_RECORD,
    PROGRESS,
    BadNote,
    Collected,
)
from beatless.node._prefer import Preference, Progress, progress_kind
from beatless.node.scheduler import Scheduler
from beatless.ops._page import make_server
from beatless.ops.status import published_entries, render, report
from beatless.schedule.firing import firing_id
from beatless.stores import ClaimStore
from beatless.stores.base import NOTE_VALUE_LIMIT, Note

NS = "bad-records"
ADDRESS = f"{NS}/tick"
START_MS = 1_800_000_000_000
LONG_MS = 600_000


def plan(max_late: str = "40s") -> Schedule:
    """One entry firing every second; with max_late 40 s it fits the preferred claimer's
    ladder, so a node's view of the registry decides who claims."""
    return Schedule(
        [Entry(name="tick", task="tests.tick", trigger=Every(1), max_late=max_late)],
        namespace=NS,
    )


# -- the good note of each kind, and how each is read -----------------------------------


def good_record(node: str = "n9") -> dict[str, Any]:
    record = NodeRecord(
        node=node,
        host="h",
        pid=1,
        version="1",
        framework="standalone",
        store="memory",
        fingerprint=plan().fingerprint,
        tzdata="2025a",
        clock_offset_ms=0,
        last_wake_ms=START_MS,
        posted_ms=START_MS,
        started_ms=START_MS - 1_000,
        loop_alive=True,
        entries=1,
        counters={"won": 1},
    )
    return json.loads(record.to_json())  # type: ignore[no-any-return]


def good_item(occurrence_ms: int = START_MS) -> dict[str, Any]:
    item = HistoryItem(
        id=firing_id(ADDRESS, occurrence_ms),
        entry="tick",
        tenant=None,
        occurrence_ms=occurrence_ms,
        release_ms=occurrence_ms,
        node="n0",
        outcome="won",
        lateness_ms=3,
        at_ms=occurrence_ms + 3,
        coalesced=(occurrence_ms - 2_000, occurrence_ms - 1_000),
    )
    return json.loads(item.to_json())  # type: ignore[no-any-return]


def good_control(action: str = "pause", entry: str = "tick") -> dict[str, Any]:
    control = Control(action, entry, "op", "host", START_MS, until_ms=START_MS + 60_000)
    return asdict(control)


def good_progress() -> dict[str, Any]:
    return json.loads(Progress("abc", START_MS, START_MS + 5_000, frozenset({"x"})).to_json())  # type: ignore[no-any-return]


def good_entry(entry: str = "tick") -> dict[str, Any]:
    schedule = plan()
    return entry_note(schedule, schedule.entry("tick")) | {"entry": entry}


def good_member(node: str = "n9") -> dict[str, Any]:
    member = Member(node, START_MS - 1_000, "1", plan().fingerprint, "2025a", healthy=True)
    return json.loads(member.to_json())  # type: ignore[no-any-return]


def progress_of(notes: dict[str, str], skipped: Collected) -> list[Progress]:
    preference = Preference("me", plan().fingerprint, NS, enabled=True)
    preference.read(notes, skipped)
    return list(preference.progress.values())


KINDS: dict[str, dict[str, Any]] = {
    "members": {
        "kind": members_kind(NS),
        "good": ("n8", good_member("n8")),
        "bad_key": "n9",
        "make": good_member,
        "read": lambda notes, skipped: list(read_members(notes, NS, skipped).values()),
        "number": "started_ms",
        "text": "node",
        "required": "fingerprint",
    },
    "nodes": {
        "kind": nodes_kind(NS),
        "good": ("n8", good_record("n8")),
        "bad_key": "n9",
        "make": good_record,
        "read": lambda notes, skipped: read_registry(notes, NS, skipped),
        "number": "posted_ms",
        "text": "node",
        "required": "fingerprint",
    },
    "history": {
        "kind": history_kind(ADDRESS),
        "good": ("good", good_item()),
        "bad_key": "bad",
        "make": good_item,
        "read": lambda notes, skipped: read_history(ADDRESS, notes, skipped),
        "number": "occurrence_ms",
        "text": "outcome",
        "required": "id",
    },
    "controls": {
        "kind": controls_kind(NS),
        "good": ("tick", good_control()),
        "bad_key": "slow",
        "make": lambda: good_control(entry="slow"),
        "read": lambda notes, skipped: list(read_controls(notes, NS, skipped).values()),
        "number": "until_ms",
        "text": "by",
        "required": "action",
    },
    "run-now": {
        "kind": run_now_kind(NS),
        "good": ("r1", good_control("run-now")),
        "bad_key": "r2",
        "make": lambda: good_control("run-now"),
        "read": lambda notes, skipped: list(read_requests(notes, NS, skipped).values()),
        "number": "at_ms",
        "text": "entry",
        "required": "entry",
    },
    "audit": {
        "kind": audit_kind(NS),
        "good": ("0001", good_control()),
        "bad_key": "0002",
        "make": good_control,
        "read": lambda notes, skipped: read_audit(notes, NS, skipped),
        "number": "at_ms",
        "text": "host",
        "required": "at_ms",
    },
    "progress": {
        "kind": progress_kind(NS),
        "good": ("n1", good_progress()),
        "bad_key": "n2",
        "make": good_progress,
        "read": progress_of,
        "number": "until_ms",
        "text": "view",
        "required": "since_ms",
    },
    "entries": {
        "kind": entries_kind(NS),
        "good": ("tick", good_entry()),
        "bad_key": "slow",
        "make": lambda: good_entry("slow"),
        "read": lambda notes, skipped: published_entries(notes, NS, skipped),
        "number": "jitter_ms",
        "text": "address",
        "required": "entry",
    },
}


def malformed(spec: dict[str, Any]) -> dict[str, str]:
    """A note of the kind of ``spec`` malformed in each way, by what is wrong with it."""
    good: dict[str, Any] = spec["make"]()
    number, text = spec["number"], spec["text"]
    missing = {k: v for k, v in good.items() if k != spec["required"]}
    return {
        "invalid JSON": json_text(good)[:-1],
        "not an object": "[1, 2, 3]",
        "null": "null",
        "empty": "",
        "a string for an integer": json_text({**good, number: "soon"}),
        "a float for an integer": json_text({**good, number: 1.5}),
        "a boolean for an integer": json_text({**good, number: True}),
        "a list for an integer": json_text({**good, number: [1]}),
        "null for a required field": json_text({**good, spec["required"]: None}),
        "a number for a string": json_text({**good, text: 5}),
        "an object for a string": json_text({**good, text: {"a": 1}}),
        "a missing field": json_text(missing),
        "a huge integer": json_text({**good, number: 10**30}),
        "a negative instant": json_text({**good, number: -(10**15)}),
        "an integer of 5,000 digits": json_text(good)[:-1] + f',"{number}":{"9" * 5_000}}}',
        "an infinite number": json_text(good)[:-1] + f',"{number}":1e999}}',
        "a huge string": json_text({**good, text: "x" * (NAME_LIMIT + NOTE_VALUE_LIMIT)}),
        "a huge note": json_text({**good, "padding": "x" * NOTE_VALUE_LIMIT}),
        "deeply nested": "[" * 5_000 + "]" * 5_000,
    }


CASES = [
    pytest.param(name, label, id=f"{name}-{label.replace(' ', '-')}")
    for name, spec in KINDS.items()
    for label in malformed(spec)
]


@pytest.mark.parametrize(("name", "label"), CASES)
def test_a_malformed_note_of_each_kind_is_skipped_and_told_once_naming_its_key(
    name: str, label: str
) -> None:
    spec = KINDS[name]
    good_key, good = spec["good"]
    bad_key = spec["bad_key"]
    notes = {good_key: json_text(good), bad_key: malformed(spec)[label]}
    skipped = Collected()

    read = spec["read"](notes, skipped)

    assert len(read) == 1  # the good note is read, whatever its neighbour holds
    assert [(kind, key) for kind, key, _ in skipped.notes] == [(spec["kind"], bad_key)]
    assert skipped.notes[0][2]  # what was wrong, said


@pytest.mark.parametrize(("name", "label"), CASES)
def test_no_malformed_note_is_made_into_an_object(name: str, label: str) -> None:
    """What a reader builds holds the types its fields declare, or is not built."""
    text = malformed(KINDS[name])[label]
    parsers: list[Callable[[str], object]] = [
        NodeRecord.parse,
        HistoryItem.parse,
        Control.parse,
        Progress.parse,
        Member.parse,
    ]
    for parse in parsers:
        try:
            made = parse(text)
        except BadNote:
            continue
        # A note of another kind may fit (the same field names): its types are right.
        for field, value in asdict(made).items():  # type: ignore[call-overload]
            if field.endswith("_ms") and value is not None:
                assert type(value) is int, (field, value)


def test_a_note_that_fits_its_schema_reads_back_as_written() -> None:
    record = NodeRecord.parse(json_text(good_record()))
    assert json.loads(record.to_json()) == good_record()
    item = HistoryItem.parse(json_text(good_item()))
    assert json.loads(item.to_json()) == good_item()
    assert item.coalesced == (START_MS - 2_000, START_MS - 1_000)
    control = Control.parse(json_text(good_control()))
    assert asdict(control) == good_control()
    progress = Progress.parse(json_text(good_progress()))
    assert progress.held == frozenset({"x"})


def test_each_schema_names_every_field_of_its_object() -> None:
    """A field added to a record must be added to its schema, or its reader would drop it."""
    for schema, kind in (
        (NODE_RECORD, NodeRecord),
        (HISTORY_ITEM, HistoryItem),
        (CONTROL, Control),
        (PROGRESS, Progress),
        (MEMBER, Member),
    ):
        assert set(schema.fields) == set(kind.__dataclass_fields__), schema.name
    assert set(BATCH_NOTE.fields) == {
        "entry",
        "node",
        "occurrence_ms",
        "at_ms",
        "coalesced",
        "items",
    }


def test_fields_a_newer_version_adds_are_ignored_and_missing_optional_ones_defaulted() -> None:
    record = good_record()
    del record["restarts"], record["last_failure"]
    record["a_newer_field"] = {"anything": [1]}

    parsed = NodeRecord.parse(json_text(record))

    assert parsed.restarts == 0
    assert parsed.last_failure is None


BATCH = f"{NS}/fan"


def batch_note(**changes: Any) -> str:
    note = {
        "entry": "fan",
        "node": "n0",
        "occurrence_ms": START_MS,
        "coalesced": None,
        "at_ms": START_MS + 10,
        "items": [["t1", "won", 4], ["t2", "lost", 5]],
    }
    return json_text(note | changes)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(batch_note()[:-1], id="invalid-JSON"),
        pytest.param(batch_note(items=[["t1", "won", "4"]]), id="a-string-lateness"),
        pytest.param(batch_note(items=[["t1", "won"]]), id="a-short-item"),
        pytest.param(batch_note(items="t1"), id="items-not-a-list"),
        pytest.param(batch_note(at_ms="later"), id="a-string-instant"),
        pytest.param(batch_note(items=[["t1", "won", 10**20]]), id="a-huge-lateness"),
        pytest.param(
            batch_note(at_ms=INSTANT_MAX_MS, items=[["t1", "won", -(10**11)]]),
            id="a-lateness-past-the-instants",
        ),
        pytest.param(batch_note(occurrence_ms=None), id="a-null-occurrence"),
        pytest.param(json_text({"entry": "fan"}), id="missing-fields"),
    ],
)
def test_a_malformed_fan_out_batch_note_is_refused_whole(text: str) -> None:
    assert batch_items(BATCH, batch_note())[1].release_ms == START_MS + 5
    with pytest.raises(BadNote):
        parse_batch(BATCH, text)
    assert batch_items(BATCH, text) == []


# -- a fleet on a manual clock --------------------------------------------------------


class Fleet:
    """Nodes on one store and one clock, each wake followed by its board's sync as its
    thread does every second. A wake or a sync that raises is caught and kept, as the
    loop and the board's thread catch them; what the nodes send is kept in ``sent``."""

    def __init__(
        self,
        stores: Callable[[], ClaimStore],
        clock: Callable[[], float],
        count: int = 3,
        *,
        advance: Callable[[int], None],
        max_late: str = "40s",
    ) -> None:
        self.clock = clock
        self.advance = advance
        self.sent: list[str] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.store = stores()
        self.nodes = [self.node(f"n{i}", stores(), max_late) for i in range(count)]

    def node(self, name: str, store: ClaimStore, max_late: str) -> Scheduler:
        def enqueue(firing: Any) -> None:
            with self._lock:
                self.sent.append(firing.id)

        return Scheduler(
            plan(max_late), store=store, clock=self.clock, node=name, enqueue=enqueue, lease="2s"
        )

    def run(self, seconds: float, nodes: list[Scheduler] | None = None) -> None:
        for _ in range(round(seconds * 4)):
            for node in nodes if nodes is not None else self.nodes:
                for step in (node.tick, node.board.sync):
                    try:
                        step()
                    except Exception as exc:  # the loop would log it and go on
                        self.errors.append(exc)
            self.advance(250)

    def status(self) -> dict[str, Any]:
        now = int(self.clock() * 1_000)
        return report(self.store, NS, now_ms=now)


def memory_fleet(count: int = 3, max_late: str = "40s") -> Fleet:
    from beatless.stores import MemoryStore

    clock = ManualClock(START_MS / 1_000)
    store = MemoryStore(clock=clock)
    return Fleet(lambda: store, clock, count, advance=clock.advance, max_late=max_late)


def sent_once(fleet: Fleet, first_ms: int, last_ms: int) -> list[int]:
    """The occurrences of ``tick`` from ``first_ms`` to ``last_ms`` not sent exactly once."""
    counts: dict[str, int] = {}
    for id_ in fleet.sent:
        counts[id_] = counts.get(id_, 0) + 1
    return [
        o for o in range(first_ms, last_ms + 1, 1_000) if counts.get(firing_id(ADDRESS, o), 0) != 1
    ]


def bad_notes(label: str = "") -> list[Note]:
    """One malformed note of each kind a node or ``status`` reads, under keys of their
    own: wrong types (the pause's ``until_ms`` is ``"soon"``) and invalid JSON."""
    tag = label or uuid.uuid4().hex[:6]
    typed = {
        nodes_kind(NS): (f"ghost-{tag}", good_record(f"ghost-{tag}") | {"posted_ms": "soon"}),
        history_kind(ADDRESS): (f"bad-{tag}", good_item() | {"occurrence_ms": "x"}),
        controls_kind(NS): ("tick", good_control() | {"until_ms": "soon"}),
        run_now_kind(NS): (f"req-{tag}", good_control("run-now") | {"at_ms": [1]}),
        audit_kind(NS): (f"9999-{tag}", good_control() | {"by": 7}),
        progress_kind(NS): (f"ghost-{tag}", good_progress() | {"until_ms": "soon"}),
        entries_kind(NS): (f"other-{tag}", good_entry(f"other-{tag}") | {"jitter_ms": "2s"}),
        members_kind(NS): (f"ghost-{tag}", good_member(f"ghost-{tag}") | {"started_ms": "soon"}),
        changes_kind(NS): (f"nonce-{tag}", {"node": f"ghost-{tag}", "member": {"node": 7}}),
    }
    notes = [Note(kind, key, json_text(value), LONG_MS) for kind, (key, value) in typed.items()]
    notes += [
        Note(kind, f"{key}-json", json_text(value)[:-2], LONG_MS)
        for kind, (key, value) in typed.items()
        if kind != controls_kind(NS)  # a control's key is its entry: one of them
    ]
    return notes


NODE_READ = ("members", "changes", "controls", "run-now")
"""The kinds a node reads at every sync (``members`` when their version changed); the
history it reads in its missed-firing sweep, every 30 s. The registry (``nodes``) and
the old progress kind are read by ``status`` alone."""
STATUS_ALONE = (audit_kind(NS), entries_kind(NS), nodes_kind(NS), progress_kind(NS))
"""Kinds a node does not read at every sync: the registry is read by one node at a time,
in turn, to find nodes of an earlier beatless (each node once in the 40 s below)."""


def bump() -> Note:
    """A new membership version: the nodes read the members again."""
    return Note(membership_kind(NS), "version", uuid.uuid4().hex, LONG_MS)


def test_malformed_notes_never_stop_the_loop_and_each_is_counted_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = memory_fleet()
    fleet.run(2)
    begun = START_MS + 3_000
    notes = bad_notes("a")
    fleet.store.post([*notes, bump()])

    with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
        fleet.run(40)  # the registry read 8 times, the history swept once or twice

    assert fleet.errors == []
    assert sent_once(fleet, begun, START_MS + 38_000) == []
    for node in fleet.nodes:
        counts = node.board.skipped.counts
        assert counts == {
            "members": 2,
            "changes": 2,
            "controls": 1,
            "run-now": 2,
            "history": 2,
            "nodes": 2,
        }
        assert node.board.skipped.total == 11
        assert node.stats["tick"].paused == 0  # the pause "until soon" is no pause
    for note in notes:
        if note.kind in STATUS_ALONE:
            continue
        told = [
            r for r in caplog.records if f"note {note.key!r} of kind {note.kind!r}" in r.message
        ]
        assert len(told) == 3, (note.kind, note.key, [r.message for r in told])  # once per node
        assert "delete it" in told[0].message

    status = fleet.status()
    listed = [p for p in status["problems"] if "skipped" in p]
    assert len(listed) == len(notes), listed
    for note in notes:
        assert any(repr(note.key) in p and repr(note.kind) in p for p in listed), note
    assert all(n["counters"]["skipped_notes"] == 11 for n in status["nodes"])
    assert "problems:" in render(status)


def test_the_skipped_notes_are_a_metric_by_kind() -> None:
    pytest.importorskip("prometheus_client", reason="the metrics need the 'metrics' extra")
    from prometheus_client import CollectorRegistry

    from beatless.ops import metrics

    fleet = memory_fleet()
    registry = CollectorRegistry()
    metrics.register(fleet.nodes[0], registry)
    fleet.store.post([*bad_notes("m"), bump()])
    fleet.run(6)

    def sample(kind: str) -> float | None:
        labels = {"namespace": NS, "node": "n0", "kind": kind}
        return registry.get_sample_value("beatless_skipped_notes_total", labels)

    assert [sample(k) for k in ("members", "changes", "controls", "run-now")] == [2, 2, 1, 2]
    metrics.unregister(fleet.nodes[0])


def test_a_mistyped_registry_note_does_not_freeze_the_view_so_dead_nodes_are_dropped() -> None:
    """Four nodes; a registry note and a member note with a string for an instant are
    written; three nodes die. The live node must drop them from its view when their notes
    run out and claim every firing itself: with a view frozen on four nodes, it would
    leave to the dead ones the firings it ranks last for, and they would be missed."""
    fleet = memory_fleet(count=4)
    fleet.run(10)
    fleet.store.post(
        [
            Note(
                nodes_kind(NS),
                "ghost",
                json_text(good_record("ghost") | {"posted_ms": "soon", "last_wake_ms": 1}),
                LONG_MS,
            ),
            Note(
                members_kind(NS),
                "ghost",
                json_text(good_member("ghost") | {"started_ms": "soon"}),
                LONG_MS,
            ),
            bump(),
        ]
    )
    fleet.run(6)
    died_ms = int(fleet.clock() * 1_000)
    live = fleet.nodes[0]

    fleet.run(80, [live])

    assert fleet.errors == []
    assert live.preference.view.nodes == ("n0",)
    assert sent_once(fleet, START_MS + 1_000, died_ms + 75_000) == []
    assert live.stats["tick"].missed == 0


def test_a_pause_until_soon_does_not_drop_the_firings_of_its_wake() -> None:
    fleet = memory_fleet(max_late="5s")
    fleet.run(2)
    fleet.store.post(
        [Note(controls_kind(NS), "tick", json_text(good_control() | {"until_ms": "soon"}), LONG_MS)]
    )

    fleet.run(20)

    assert fleet.errors == []
    assert sent_once(fleet, START_MS + 1_000, START_MS + 20_000) == []
    assert all(n.board.controls == {} for n in fleet.nodes)


# -- a running fleet on every store ---------------------------------------------------


@contextmanager
def backend_opener(backend: Backend, tmp_path: Path, clock: ManualClock) -> Iterator[Opener]:
    if backend.service is not None:
        require_service(*backend.service)
    opener = backend.prepare(tmp_path, clock)
    opened: list[ClaimStore] = []

    def open_one() -> ClaimStore:
        store = opener()
        opened.append(store)
        return store

    try:
        yield open_one
    finally:
        for store in reversed(opened):
            store.close()


def get(url: str) -> tuple[int, str]:
    host, _, path = url.removeprefix("http://").partition("/")
    connection = http.client.HTTPConnection(host, timeout=10)
    try:
        connection.request("GET", "/" + path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(b, id=b.name, marks=[pytest.mark.slow] if b.server_clock else [])
        for b in BACKENDS
    ],
)
def test_each_kind_written_malformed_into_a_running_fleet_on_every_store(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three nodes run; one malformed note of each kind is written into their store. The
    fleet fires every occurrence once, each node counts and warns about what it reads,
    ``beatless status`` lists each note as a problem (exit 1, no traceback) and the page
    answers. Stores with a clock of their own run in real time, the others on a manual
    clock."""
    manual = ManualClock(START_MS / 1_000)
    with backend_opener(backend, tmp_path, manual) as opener:
        if backend.server_clock:
            fleet = Fleet(opener, time.time, advance=lambda ms: time.sleep(ms / 1_000))
        else:
            fleet = Fleet(opener, manual, advance=manual.advance)
        fleet.run(1)
        begun = (int(fleet.clock() * 1_000) // 1_000 + 1) * 1_000
        notes = bad_notes()
        fleet.store.post([*notes, bump()])
        with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
            fleet.run(6)  # one registry read at least
        ended = int(fleet.clock() * 1_000) // 1_000 * 1_000 - 1_000

        assert fleet.errors == []
        assert sent_once(fleet, begun, ended) == []
        for node in fleet.nodes:
            for family in NODE_READ:
                assert node.board.skipped.counts.get(family, 0) >= 1, (family, node.node)
        warned = [r for r in caplog.records if "in the claim store skipped" in r.message]
        # Each node warns once per note it skipped (the registry is read by one node in turn).
        assert len(warned) == sum(node.board.skipped.total for node in fleet.nodes)

        out = StringIO()
        with redirect_stdout(out):
            code = print_status(fleet.store, NS, schedule=None, as_json=False)
        assert code == 1
        for note in notes:
            assert f"note {note.key!r} of kind {note.kind!r} skipped" in out.getvalue(), note

        server = make_server(fleet.status, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            assert get(base + "/")[0] == 200
            code, body = get(base + "/status.json")
            assert code == 200
            assert len([p for p in json.loads(body)["problems"] if "skipped" in p]) == len(notes)
        finally:
            server.shutdown()
            server.server_close()

        if backend.name == "sqlite":  # the command itself, in a process of its own
            path = fleet.store.path  # type: ignore[attr-defined]
            command = ["status", "--store", f"sqlite:///{path}", "--namespace", NS]
            done = subprocess.run(
                [sys.executable, "-m", "beatless", *command],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done.stderr
            assert "Traceback" not in done.stderr
            assert done.stdout.count("skipped:") == len(notes)
