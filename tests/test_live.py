"""Live entries in the store (``beatless.live``): revisions, the API, on every store.

Each test uses a namespace of its own. RabbitMQ cannot keep a note without an end: it
refuses live entries with its reason."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stores import ManualClock, StoreFactory

from beatless.core.triggers import Cron, Every
from beatless.errors import ConfigError, ScheduleError, StaleRevision, StoreError
from beatless.live import Live, entry_to_json
from beatless.live.revisions import canonical_json
from beatless.schedule.entry import Entry, canonical
from beatless.stores.base import NOTE_VALUE_LIMIT, ClaimStore, KeptNote
from beatless.stores.memory import MemoryStore
from beatless.stores.sqlite import SQLiteStore

HALF_PAST = datetime(1970, 1, 1, 0, 30, tzinfo=UTC)


def live(factory: StoreFactory, namespace: str | None = None, **kw: object) -> Live:
    store = factory()
    if not store.keeps_notes:
        with pytest.raises(ConfigError, match="its notes live at most 24 hours"):
            Live(store, namespace="x")
        pytest.skip(f"the {store.name} store refuses live entries (asserted)")
    return Live(store, namespace=namespace or f"live-{uuid.uuid4().hex[:8]}", **kw)  # type: ignore[arg-type]


def report(name: str = "report", **changes: object) -> Entry:
    entry = Entry(name=name, task="app.report", trigger=Cron("0 4 * * *", "UTC"), args=(1,))
    return entry.replace(**changes) if changes else entry


def test_a_put_is_revision_1_read_back_by_another_client(store_factory: StoreFactory) -> None:
    writer = live(store_factory, writer="alice", host="desk")
    reader = Live(store_factory(), namespace=writer.namespace)

    revision = writer.put(report(), note="first")

    assert (revision.number, revision.writer, revision.host, revision.note) == (
        1,
        "alice",
        "desk",
        "first",
    )
    assert revision.fence_ms == revision.committed_ms + 2_000
    assert reader.head() == 1
    got = reader.get("report")
    assert got is not None
    assert entry_to_json(got) == entry_to_json(report())
    assert [e.name for e in reader.list()] == ["report"]
    assert reader.history("report") == [revision]


def test_edits_deletes_history_and_revert(store_factory: StoreFactory) -> None:
    api = live(store_factory)
    api.put(report())
    api.put_many([report(args=(2,)), report("other")])
    api.delete("report")

    assert api.head() == 3
    assert [e.name for e in api.list()] == ["other"]
    assert [r.number for r in api.history("report")] == [1, 2, 3]
    assert [r.number for r in api.history("other")] == [2]

    reverted = api.revert(2)
    assert reverted.number == 4
    assert reverted.note == "revert to 2"
    assert api.state() == api.state(2)
    got = api.get("report")
    assert got is not None
    assert got.args == (2,)
    with pytest.raises(ConfigError, match="no live entry 'gone'"):
        api.delete("gone")


def test_a_stale_base_revision_is_refused_naming_the_current_one(
    store_factory: StoreFactory,
) -> None:
    api = live(store_factory)
    api.put(report())
    api.put(report(args=(5,)), if_revision=1)

    with pytest.raises(
        StaleRevision, match="based on revision 1, but the current revision is 2"
    ) as stale:
        api.put(report(args=(6,)), if_revision=1)
    assert stale.value.current == 2
    assert api.head() == 2


def test_a_name_the_code_owns_is_refused_unless_overridden(store_factory: StoreFactory) -> None:
    api = live(store_factory, code=[report()])
    with pytest.raises(ScheduleError, match="owned by the code schedule"):
        api.put(report())
    revision = api.put(report(), override=True)
    assert revision.changes[0].override


def test_fences_follow_effective_in_and_at_and_never_go_back(store_factory: StoreFactory) -> None:
    api = live(store_factory)
    late = api.put(report(), effective_in="1h")
    assert late.fence_ms == late.committed_ms + 3_600_000
    sooner = api.put(report(args=(2,)), effective_in="2s")
    assert sooner.fence_ms == late.fence_ms  # a fence is at least its predecessor's
    with pytest.raises(ConfigError, match="propagation bound"):
        api.put(report(), effective_in=0)
    with pytest.raises(ConfigError, match="propagation bound"):
        api.put(report(), at=api.store.time_ms() + 500)
    at = api.store.time_ms() + 7_200_000
    assert api.put(report(args=(3,)), at=at).fence_ms == at
    with pytest.raises(ConfigError, match="never retroactive"):
        api.put(report(), at=api.store.time_ms() - 60_000)


def test_a_batch_over_one_note_is_split_and_read_back_whole(store_factory: StoreFactory) -> None:
    api = live(store_factory)
    big = [
        report(f"e{i}", kwargs={"pad": "x" * 2_000}) for i in range(3 * NOTE_VALUE_LIMIT // 2_000)
    ]
    revision = api.put_many(big)

    reader = Live(api.store, namespace=api.namespace)
    assert reader.history()[0].hash == revision.hash
    assert len(reader.list()) == len(big)


def test_a_split_batch_builds_all_but_its_first_note_before_its_commit_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The work that grows with a batch (its JSON, hash and notes) is done before the
    writer reads the store's clock: after it, only the first note is built, so 100,000
    entries fit in the 250 ms a writer has from its commit instant to its write."""
    store = MemoryStore()
    api = Live(store, namespace="split")
    events: list[str] = []  # "clock", or the key of a note built
    time_ms = store.time_ms

    def reading_the_clock() -> int:
        events.append("clock")
        return time_ms()

    class Recorded(KeptNote):
        def __post_init__(self) -> None:
            super().__post_init__()
            events.append(self.key)

    monkeypatch.setattr(store, "time_ms", reading_the_clock)
    monkeypatch.setattr("beatless.live._ledger.KeptNote", Recorded)
    big = [
        report(f"e{i}", kwargs={"pad": "x" * 2_000}) for i in range(4 * NOTE_VALUE_LIMIT // 2_000)
    ]

    api.put_many(big)

    assert len(store.read_kept(api._ledger.revisions_kind)) > 3  # split
    first = events.index("1")
    assert events[first - 1] == "clock"  # the commit instant, then only the first note
    assert "1.3" in events[:first]
    assert len(Live(store, namespace="split").list()) == len(big)


def test_a_write_just_after_the_store_lost_its_memory_is_refused_and_burns_no_number() -> None:
    """Within the store's tolerance after a restart empty, a revision number may have
    been claimed before it: the writer is refused, and the number stays free. (Claimed
    as a firing is, it was written committed with no revision, and every later write was
    answered ``lost`` for the 30 days the store remembers it.)"""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    api = Live(store.view(), namespace="restart")
    api.put(report(args=(1,)))
    clock.advance(60_000)
    store.lose_memory()  # the kept notes, the revisions, stay

    with pytest.raises(StoreError, match="lost its memory"):
        api.put(report(args=(2,)))
    clock.advance(11_000)
    revision = api.put(report(args=(3,)))

    assert revision.number == 2
    assert [r.number for r in Live(store.view(), namespace="restart").revisions()] == [1, 2]


def test_a_writer_too_slow_between_its_clock_read_and_its_write_writes_nothing_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer stalled 300 ms (a pause of its process) after it read the store's clock
    for its commit instant is over its 250 ms: it releases its number, writes nothing, and
    the same ``put`` claims the number again and lands it, so a loaded machine costs
    time, not an error."""
    store = MemoryStore()
    api = Live(store, namespace="slow")
    api.put(report(args=(1,)))
    stalls = [0.3]  # the next clock read after a won claim stalls once
    claimed: list[int] = []
    time_ms, claim_held_off = store.time_ms, store.claim_held_off

    def stalled_clock() -> int:
        now = time_ms()
        if claimed and stalls:
            time.sleep(stalls.pop())
        return now

    def counted_claim(requests: Any, **how: Any) -> Any:
        claimed.append(len(requests))
        return claim_held_off(requests, **how)

    monkeypatch.setattr(store, "time_ms", stalled_clock)
    monkeypatch.setattr(store, "claim_held_off", counted_claim)
    revision = api.put(report(args=(2,)))

    assert not stalls  # the stall happened
    assert len(claimed) == 2  # number 2, released, then claimed again
    assert revision.number == 2
    assert [r.number for r in api.revisions()] == [1, 2]
    assert api.get("report").args == (2,)


def test_two_editors_never_both_win_a_revision_number(store_factory: StoreFactory) -> None:
    namespace = f"race-{uuid.uuid4().hex[:8]}"
    first = live(store_factory, namespace)
    editors = [first] + [Live(store_factory(), namespace=namespace) for _ in range(3)]
    numbers: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def edit(api: Live, index: int) -> None:
        for round_ in range(3):
            try:
                revision = api.put(report(f"n{index}", args=(round_,)))
            except Exception as exc:  # said below, with the numbers won
                with lock:
                    errors.append(f"editor {index}, round {round_}: {exc!r}")
                return
            with lock:
                numbers.append(revision.number)

    threads = [threading.Thread(target=edit, args=(api, i)) for i, api in enumerate(editors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors, errors
    assert sorted(numbers) == list(range(1, 13))
    assert [r.number for r in first.history()] == list(range(1, 13))
    assert {e.name: e.args for e in first.list()} == {f"n{i}": (2,) for i in range(4)}


def _edit_in_process(path: str, namespace: str, index: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    api = Live(SQLiteStore(path), namespace=namespace)
    out.put([api.put(report(f"p{index}", args=(r,))).number for r in range(5)])


def test_editors_in_processes_never_both_win_a_revision_number(tmp_path: Path) -> None:
    path, namespace = str(tmp_path / "live.db"), "procs"
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    procs = [
        multiprocessing.Process(target=_edit_in_process, args=(path, namespace, i, out))
        for i in range(3)
    ]
    for proc in procs:
        proc.start()
    numbers = [n for _ in procs for n in out.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=30)

    assert sorted(numbers) == list(range(1, 16))
    assert Live(SQLiteStore(path), namespace=namespace).head() == 15


def test_a_plan_lists_added_removed_moved_changed_and_straddling_firings(
    store_factory: StoreFactory,
) -> None:
    api = live(store_factory)
    api.put_many(
        [
            Entry(
                name="hourly",
                task="t",
                trigger=Every(timedelta(hours=1)),
                jitter="10m",
                max_late="20m",
            ),
            Entry(name="gone", task="t", trigger=Every(timedelta(hours=6))),
            Entry(name="args", task="t", trigger=Every(timedelta(hours=12))),
        ]
    )
    start = 1_800_000_000_000 - 60_000  # one minute before a whole hour
    wanted = [
        Entry(
            name="hourly",
            task="t",
            trigger=Every(timedelta(hours=1), HALF_PAST),
            jitter="10m",
            max_late="20m",
        ),
        Entry(name="args", task="t", trigger=Every(timedelta(hours=12)), args=(1,)),
        Entry(name="new", task="t", trigger=Every(timedelta(days=1))),
    ]
    plan = api.plan(wanted, window="1d", start_ms=start, effective_in=0)
    again = api.plan(wanted, window="1d", start_ms=start, effective_in=0)

    assert plan == again  # deterministic
    assert {c.name for c in plan.changes} == {"hourly", "args", "new", "gone"}
    assert {name for name, _ in plan.removed} >= {"gone"}
    assert [name for name, _ in plan.added] == ["new"]
    assert {name for name, _, _ in plan.moved} == {"hourly"}
    assert plan.changed == ("args",)
    assert all(o < plan.fence_ms <= r for _, o, r in plan.straddling)

    applied = api.apply(plan)
    assert applied is not None
    assert applied.number == 2
    assert sorted(e.name for e in api.list()) == ["args", "hourly", "new"]
    with pytest.raises(StaleRevision):
        api.apply(plan)


def test_a_store_that_cannot_keep_notes_refuses_live_entries(store_factory: StoreFactory) -> None:
    store: ClaimStore = store_factory()
    if store.keeps_notes:
        return
    with pytest.raises(ConfigError, match="cannot hold live entries; use one of"):
        Live(store, namespace="x")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_json_values)
def test_the_fast_canonical_text_of_json_is_the_schedules_canonical_text(value: object) -> None:
    assert canonical_json(value) == canonical(value)


def test_keys_that_sort_apart_bare_and_quoted_keep_the_canonical_order() -> None:
    value = {"a": 1, "a b": 2, "a!": 3, "é": 4, "z": [{"x\\": 5, "x": 6}]}

    assert canonical_json(value) == canonical(value)
    assert canonical_json(value) != json.dumps(value, sort_keys=True, separators=(",", ":"))
