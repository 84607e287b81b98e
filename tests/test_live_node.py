"""Nodes scheduling live entries (issue 24, item 3): the rules by the nominal occurrence,
driven by a fake clock on the memory store: no sleeping, every send checked."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
from test_scheduler import Clock

from beatless import Entry, Every, Firing, Schedule, StoreUnavailable
from beatless.live import Live
from beatless.live._ledger import PROPAGATION_MS
from beatless.node._live import CONFIRM_MS, LiveView
from beatless.node.scheduler import Scheduler
from beatless.stores.memory import MemoryStore

NS = "live-node"


class Link(MemoryStore):
    """The memory store, whose notes can be cut off from a node while claims go on: the
    node's sync cannot read the live head (a frozen sync, a cut link to the notes)."""

    cut = False

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        if self.cut:
            raise StoreUnavailable("notes link cut")
        return super().read_synced(kinds, kept)


def every(name: str, seconds: int = 10, **kw: Any) -> Entry:
    return Entry(name=name, task="t.job", trigger=Every(timedelta(seconds=seconds)), **kw)


class Node:
    """One scheduler over ``store``, recording what it sent."""

    def __init__(self, store: MemoryStore, clock: Clock, code: Sequence[Entry] = (), **kw: Any):
        self.sent: list[Firing] = []
        self.clock = clock
        self.scheduler = Scheduler(
            Schedule(list(code), namespace=NS),
            store=store,
            enqueue=self.sent.append,
            clock=clock,
            node=f"n{id(self)}",
            **kw,
        )
        self.outcomes: list[tuple[str, str, int]] = []

    def run(self, seconds: float, step_ms: int = 100) -> None:
        for _ in range(round(seconds * 1_000 / step_ms)):
            self.clock.ms += step_ms
            self.scheduler.board.sync()
            for d in self.scheduler.tick():
                self.outcomes.append((d.outcome, d.firing.entry.name, d.firing.occurrence_ms))

    def sends(self, name: str) -> list[tuple[int, tuple[Any, ...]]]:
        return [(f.occurrence_ms, tuple(f.entry.args)) for f in self.sent if f.entry.name == name]


@pytest.fixture
def clock() -> Clock:
    clock = Clock()
    clock.ms -= clock.ms % 10_000 - 1_000  # one second past a slot of 10 s
    return clock


def test_a_live_entry_fires_from_its_fence_and_never_before(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    node = Node(store, clock)
    revision = Live(store, namespace=NS).put(every("report", args=(1,)), effective_in="15s")
    node.run(60)
    occurrences = [o for o, _ in node.sends("report")]
    assert occurrences, "the live entry was scheduled"
    assert min(occurrences) >= revision.fence_ms  # rule 2
    assert occurrences == sorted(set(occurrences))
    assert len(occurrences) >= 4


def test_an_args_change_takes_effect_at_its_fence_exactly_and_keeps_the_ids(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    node = Node(store, clock)
    live = Live(store, namespace=NS)
    live.put(every("report", args=(1,)), effective_in="2s")
    node.run(25)
    fence_at = clock.ms + 10_000 - clock.ms % 10_000  # the next slot, exactly
    edit = live.put(every("report", args=(2,)), at=fence_at)
    assert edit.fence_ms == fence_at
    node.run(40)
    sends = node.sends("report")
    assert all(args == ((1,) if o < fence_at else (2,)) for o, args in sends)  # rules 1, 6
    assert any(o == fence_at and args == (2,) for o, args in sends)
    ids = [f.id for f in node.sent]
    assert len(ids) == len(set(ids))
    # rule 4: an occurrence in both definitions has one id, whichever definition sent it
    firing = next(f for f in node.sent if f.occurrence_ms == fence_at)
    assert firing.id == Firing.of(every("report"), None, f"{NS}/report", fence_at).id


def test_an_edit_inside_a_jitter_window_leaves_the_straddling_occurrence_old(
    clock: Clock,
) -> None:
    store = MemoryStore(clock=clock)
    node = Node(store, clock)
    live = Live(store, namespace=NS)
    jittered = every("wide", seconds=60, jitter="25s", max_late="60s", args=("old",))
    live.put(jittered, effective_in="2s")
    node.run(70)
    # An occurrence whose release falls after the next fence: rule 3 keeps it old.
    start = clock.ms
    occurrence = next(jittered.trigger.after(start + 3_000))
    firing = Firing.of(jittered, None, f"{NS}/wide", occurrence)
    assert firing.offset_ms > 3_000, "pick a slot whose release is after the fence"
    clock.ms = occurrence - 2_500
    node.run(0.1)
    edit = live.put(jittered.replace(args=("new",)), at=occurrence + 1)
    assert occurrence < edit.fence_ms <= firing.release_ms
    node.run(150)
    sends = dict(node.sends("wide"))
    assert sends[occurrence] == ("old",)  # before the fence: the old definition
    assert all(args == ("new",) for o, args in sends.items() if o >= edit.fence_ms)
    assert any(o >= edit.fence_ms for o in sends)


def test_delete_stops_every_occurrence_at_or_after_its_fence_and_re_create_resumes(
    clock: Clock,
) -> None:
    store = MemoryStore(clock=clock)
    node = Node(store, clock)
    live = Live(store, namespace=NS)
    live.put(every("report"), effective_in="2s")
    node.run(30)
    gone = live.delete("report", effective_in="5s")
    node.run(40)
    assert all(o < gone.fence_ms for o, _ in node.sends("report"))  # rule 5
    back = live.put(every("report", args=(3,)), effective_in="2s")
    node.run(30)
    after = [(o, a) for o, a in node.sends("report") if o >= gone.fence_ms]
    assert after
    assert all(o >= back.fence_ms and a == (3,) for o, a in after)
    assert node.scheduler.stats["report"].unscheduled >= 0


def test_a_live_entry_overriding_a_code_name_runs_from_its_fence_and_is_drift(
    clock: Clock,
) -> None:
    store = MemoryStore(clock=clock)
    code = every("report", args=("code",))
    node = Node(store, clock, code=[code])
    node.run(15)
    edit = Live(store, namespace=NS, code=[code]).put(
        every("report", args=("live",)), override=True, effective_in="3s"
    )
    node.run(30)
    sends = node.sends("report")
    assert all(a == ("code",) for o, a in sends if o < edit.fence_ms)
    assert all(a == ("live",) for o, a in sends if o >= edit.fence_ms)
    assert len({o for o, _ in sends}) == len(sends)
    record = node.scheduler.board.node_record(clock.ms)
    assert record.live_overrides == "report"
    assert record.live_revision == 1
    assert record.schedule_fingerprint.startswith(record.fingerprint + "+r1.")


def test_a_node_that_cannot_read_the_head_never_sends_old_values_past_a_fence(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = Link(clock=clock)
    node = Node(store, clock)
    live = Live(store, namespace=NS)  # the writer reads with read_kept: its link is fine
    live.put(every("report", args=(1,)), effective_in="2s")
    node.run(25)
    edit = live.put(every("report", args=(2,)), effective_in="2s")
    store.cut = True  # the node's sync cannot read the head across the fence
    with caplog.at_level(logging.WARNING):
        node.run(90)
    assert "stale_schedule" in caplog.text
    sends = node.sends("report")
    assert all(a == (1,) for o, a in sends)
    assert all(o <= edit.committed_ms for o, _ in sends)  # nothing past the fence, old
    assert not [o for o, _ in sends if o > edit.fence_ms - CONFIRM_MS]
    stale = [o for outcome, _, o in node.outcomes if outcome == "stale_schedule"]
    assert stale, "the occurrences it could not confirm are decided, not lost"
    assert node.scheduler.stats["report"].stale_schedule == len(stale)
    store.cut = False
    node.run(30)
    assert any(a == (2,) for _, a in node.sends("report"))


def test_a_firing_that_waited_for_the_head_until_late_is_stale_schedule_not_late(
    clock: Clock,
) -> None:
    # The head is read again just after the firing's last look in time and before its
    # next one, when it is late: it went late waiting for the head, which is what its
    # decision says (not ``late``, which blames a frozen or overloaded node).
    store = Link(clock=clock)
    node = Node(store, clock)
    Live(store, namespace=NS).put(every("report", max_late="3s"), effective_in="2s")
    node.run(15)
    occurrence = clock.ms + 10_000 - clock.ms % 10_000
    node.run((occurrence - 3_000 - clock.ms) / 1_000)
    store.cut = True
    node.run(6.1)  # to the occurrence + 3.1 s: looked at every 250 ms, the last at + 3 s
    store.cut = False
    node.run(5)
    decided = [outcome for outcome, _, o in node.outcomes if o == occurrence]
    assert decided == ["stale_schedule"]
    assert occurrence not in [o for o, _ in node.sends("report")]


def test_live_off_runs_code_entries_only_and_a_store_that_cannot_keep_notes_says_so(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(clock=clock)
    Live(store, namespace=NS).put(every("report"), effective_in="2s")
    node = Node(store, clock, code=[every("code")], live=False)
    node.run(25)
    assert not node.sends("report")
    assert node.sends("code")

    class Forgetful(MemoryStore):
        keeps_notes = False
        why_not_kept = "its notes live at most a day"

    with caplog.at_level(logging.INFO, logger="beatless.node.scheduler"):
        quiet = Node(Forgetful(clock=clock), clock, code=[every("code")])
    assert not quiet.scheduler.live.enabled
    assert "live entries off" in caplog.text


def test_a_change_costs_one_read_of_its_revision_whatever_the_entries(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    live = Live(store, namespace=NS)
    live.put_many([every(f"e{i}", seconds=3600) for i in range(300)], effective_in="2s")
    node = Node(store, clock)
    node.run(1)
    calls: list[Any] = []
    real = store.read_kept

    def counted(kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        calls.append((kind, keys))
        return real(kind, keys)

    store.read_kept = counted  # type: ignore[method-assign]
    live.put(every("e1", seconds=3600, args=(1,)), effective_in="2s")
    calls.clear()
    node.run(2)
    assert node.scheduler.live.revision == 2
    assert all(keys is not None and len(keys) <= 1 for _, keys in calls)


def test_the_fence_is_never_sooner_than_the_propagation_bound(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    revision = Live(store, namespace=NS).put(every("x"))
    assert revision.fence_ms - revision.committed_ms >= PROPAGATION_MS


def test_a_read_that_finds_a_new_revision_says_so_once() -> None:
    store = MemoryStore()
    live = Live(store, namespace=NS)
    arrivals: list[int] = []
    view = LiveView(
        store,
        Schedule([], namespace=NS),
        enabled=True,
        now_ms=store.time_ms,
        offset_ms=lambda: 0,
        arrived=lambda: arrivals.append(1),
    )
    view.read()
    assert arrivals == []
    live.put(every("live", 3600))
    view.read()
    view.read()  # nothing new: the loop is not woken again
    assert arrivals == [1]


@pytest.mark.serial  # asserts how soon the loop woke
def test_the_loop_applies_a_revision_as_soon_as_the_board_reads_it() -> None:
    store = MemoryStore()
    live = Live(store, namespace=NS)
    scheduler = Scheduler(Schedule([every("code", 3600)], namespace=NS), store=store, node="n")
    scheduler.start()
    try:
        time.sleep(0.3)  # the loop sleeps a second at a time: nothing is due for an hour
        revision = live.put(every("live", 3600))
        scheduler.board.sync()  # a read of the head, as the board's thread makes
        read_s = time.monotonic()
        while scheduler.live.revision < revision.number and time.monotonic() < read_s + 5:
            time.sleep(0.005)
        applied_after_s = time.monotonic() - read_s
    finally:
        scheduler.stop(timeout=5)
    assert scheduler.live.revision == revision.number
    assert applied_after_s < 0.5, "the loop slept on after the board read the revision"


@pytest.mark.parametrize("checked", [True, False], ids=["in-claim-check", "without-it"])
def test_a_node_that_missed_a_revision_is_answered_stale_and_sends_the_new_values(
    clock: Clock, checked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The propagation rule is fooled (the node believes its last read of the head is
    # fresh) and its board's reads are held back: only the claim can tell it that a
    # revision it missed is in force at the occurrence.
    store = MemoryStore(clock=clock)
    if not checked:
        monkeypatch.setattr(MemoryStore, "_fences", lambda self, requests: [None] * len(requests))
    node = Node(store, clock)
    live = Live(store, namespace=NS)
    live.put(every("report", args=(1,)), effective_in="2s")
    node.run(25)
    fence_at = clock.ms + 10_000 - clock.ms % 10_000
    view = node.scheduler.live
    view._read_ms = 2**62  # every occurrence looks confirmed: the loop never reads itself
    edit = live.put(every("report", args=(2,)), at=fence_at)
    outcomes = []
    while clock.ms < fence_at + 5_000:  # the loop wakes; the board never syncs
        clock.ms += 100
        outcomes += [(d.outcome, d.firing.occurrence_ms) for d in node.scheduler.tick()]
    at_fence = [args for o, args in node.sends("report") if o == fence_at]
    if not checked:
        assert at_fence == [(1,)], "without the check, the old values go out past the fence"
        return
    assert at_fence == [(2,)]  # rule 6: re-read, rebuilt and sent under revision 2
    assert ("stale_revision", fence_at) in outcomes
    assert view.revision == edit.number
    assert node.scheduler.stats["report"].stale_revisions == 1
    assert node.scheduler.stats["report"].unscheduled == 1  # the old firing, dropped


def test_claims_carry_the_nodes_live_revision_and_none_with_live_off(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    claims: list[tuple[str, int | None]] = []
    real = store.claim

    def claim(requests, *, node, lease_ms):  # type: ignore[no-untyped-def]
        claims.extend((r.address, r.revision) for r in requests)
        return real(requests, node=node, lease_ms=lease_ms)

    store.claim = claim  # type: ignore[method-assign]
    Live(store, namespace=NS).put(every("report"), effective_in="2s")
    firings = {f"{NS}/code", f"{NS}/report"}
    for live, carried in ((True, {1}), (False, {None})):
        claims.clear()
        Node(store, clock, code=[every("code")], live=live).run(15)
        assert {revision for address, revision in claims if address in firings} == carried


def test_a_node_whose_clock_is_ahead_never_takes_an_old_read_for_a_fresh_one(
    clock: Clock,
) -> None:
    """A node 3 s ahead of the store releases an occurrence 3 s early on the store's
    clock; it claims it only after a read that began, on the store's clock (its own plus
    its measured offset), less than 1.5 s before the occurrence, so it never runs an
    occurrence past a fence under the old definition, its first one included."""
    store = MemoryStore(clock=clock)
    live = Live(store.view(), namespace=NS)
    live.put(every("report", seconds=1, args=(1,)))
    clock.ms += 3_000  # revision 1 in force
    sent: list[Firing] = []
    ahead = Scheduler(
        Schedule([], namespace=NS),
        store=store.view(),
        enqueue=sent.append,
        clock=lambda: clock() + 3,
        node="ahead",
    )
    edit = live.put(every("report", seconds=1, args=(2,)))
    for _ in range(60):
        clock.ms += 100
        ahead.tick()
    late = [(f.occurrence_ms, f.entry.args) for f in sent if f.occurrence_ms >= edit.fence_ms]
    assert late
    assert all(args == (2,) for _, args in late), late


def test_a_read_made_while_a_revision_is_applied_does_not_hold_the_confirmation_back() -> None:
    """The board may read the head while the loop applies a large revision (10,000 entries
    take a while): that read sees the revision neither pending nor applied and reads it
    again. Kept as a gap, it held every later read from confirming the head, so the node
    never claimed a live firing again."""
    now = [1_800_000_000.0]
    store = MemoryStore(clock=lambda: now[0])
    live = Live(store, namespace=NS)
    view = LiveView(
        store,
        Schedule([], namespace=NS),
        enabled=True,
        now_ms=store.time_ms,
        offset_ms=lambda: 0,
        arrived=lambda: None,
    )
    live.put(every("live", 3600))
    view.read()
    applying = view._apply

    def read_meanwhile(revision: Any) -> Any:
        view.read()  # the board's sync, on its own thread, in the middle of the apply
        return applying(revision)

    view._apply = read_meanwhile  # type: ignore[method-assign]
    view.apply()
    view._apply = applying  # type: ignore[method-assign]
    assert view.revision == 1
    now[0] += 5
    view.read()
    view.apply()
    assert view.confirmed_ms == store.time_ms()  # the later read confirms the head
