"""Building ahead: while the loop would sleep, a dispatcher that builds its messages
ahead (:attr:`Dispatcher.prepares_ahead`) is handed the firings due within a second, and
takes back at each release what it built. Driven by a fake clock, as the loop runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from test_scheduler import T0, Clock, entry

from beatless import Entry, Every, Firing, Schedule
from beatless.node._ahead import (
    PREPARE_AHEAD_MS,
    PREPARE_CHUNK,
    PREPARE_IDLE_MS,
    PREPARE_STEP,
    PREPARED_STALE_MS,
)
from beatless.node._prefer import (
    GRACE_MS,
    LANE_DELAYS_MS,
    LOOK_SHIFT_MS,
    RUNGS,
    Preference,
    Ranked,
    View,
    lane_of,
)
from beatless.node._timeline import EXPAND_AHEAD_MS, FAN_OUT_STEP_MS
from beatless.node.dispatch import Dispatcher, Wake, decide_claimed
from beatless.node.scheduler import Scheduler
from beatless.schedule._fanout import FanOut, Ranking
from beatless.schedule.firing import claim_request
from beatless.stores.memory import MemoryStore

START_MS = round(T0 * 1_000)


class BuildsAhead(Dispatcher):
    """Claims and sends in memory; records when each firing was built and what each
    send carried. ``fail``: every build ahead raises. ``takes_back``: whether dispatch
    asks for what was built (a dispatcher that sends some other way does not)."""

    prepares_ahead = True

    def __init__(self, clock: Clock, *, fail: bool = False, takes_back: bool = True) -> None:
        self.store = MemoryStore(clock=clock)
        self.clock = clock
        self.fail = fail
        self.takes_back = takes_back
        self.built_at: dict[str, int] = {}
        self.batches: list[int] = []
        self.sent: list[tuple[int, Firing, object]] = []

    def prepare(self, firings: Sequence[Firing], wake: Wake) -> Sequence[object]:
        self.batches.append(len(firings))
        if self.fail:
            raise RuntimeError("the broker's encoder is not loaded yet")
        for firing in firings:
            assert firing.id not in self.built_at, "built twice"
            self.built_at[firing.id] = self.clock.ms
        return [("built", firing.id) for firing in firings]

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        built = [wake.prepared(f) if self.takes_back else None for f in firings]
        requests = [claim_request(f) for f in firings]
        outcomes = self.store.claim(requests, node=wake.node, lease_ms=1_000)
        won = [f.id for f, o in zip(firings, outcomes, strict=True) if o.is_won]
        self.store.commit(won, node=wake.node)
        for firing, outcome, payload in zip(firings, outcomes, built, strict=True):
            if outcome.is_won:
                self.sent.append((self.clock.ms, firing, payload))
            decide_claimed(wake, firing, outcome)


def burst_node(dispatcher: BuildsAhead, clock: Clock, tenants: int) -> Scheduler:
    """A node of one fan-out entry, ``tenants`` firings due at once every 10 s."""
    names = [f"t{i}" for i in range(tenants)]
    schedule = Schedule([entry("burst", trigger=Every(10), tenants=names)])
    return Scheduler(schedule, store=dispatcher, clock=clock)


def run_loop(node: Scheduler, clock: Clock, until_ms: int) -> int:
    """Run ``node`` as :meth:`Scheduler.run` does, the clock moving only while it sleeps;
    the most preparing calls in a row (bounded: a loop that prepares forever fails)."""
    longest = 0
    while clock.ms < until_ms:
        node.tick()
        in_a_row = 0
        while node.prepare_ahead():
            in_a_row += 1
            assert in_a_row < 1_000, "the loop never sleeps"
        longest = max(longest, in_a_row)
        clock.ms += max(1, round(node.sleep_s() * 1_000))
    return longest


def test_firings_due_within_a_second_are_built_while_the_loop_sleeps_and_sent_as_built() -> None:
    clock = Clock()
    tenants = [f"t{i}" for i in range(2_000)]
    schedule = Schedule(
        [
            entry("burst", trigger=Every(10), tenants=tenants, max_late="60s"),
            entry("spread", trigger=Every(10), tenants=tenants[:300], jitter="4s"),
            entry("plain", trigger=Every(5)),
        ]
    )
    dispatcher = BuildsAhead(clock)
    node = Scheduler(schedule, store=dispatcher, clock=clock, node="n1")

    longest = run_loop(node, clock, START_MS + 34_500)

    sent = [(at, f, built) for at, f, built in dispatcher.sent if f.release_ms >= START_MS]
    assert Counter(f.entry.name for _, f, _ in sent) == {
        "burst": 8_000,
        "spread": 1_200,
        "plain": 7,
    }
    assert len({f.id for _, f, _ in dispatcher.sent}) == len(dispatcher.sent)  # each once
    ahead = [(at, f, built) for at, f, built in sent if built is not None]
    for at, firing, built in ahead:
        assert built == ("built", firing.id)
        assert firing.release_ms - PREPARE_AHEAD_MS <= dispatcher.built_at[firing.id]
        assert firing.release_ms <= at  # built early, sent on time
    assert all(0 <= at - f.release_ms <= FAN_OUT_STEP_MS for at, f, _ in sent)
    # The bursts all; of the spread entry, all but those released within PREPARE_IDLE_MS
    # of a wake at a busy time (built when due, as without building ahead).
    built_ahead = Counter(f.entry.name for _, f, _ in ahead)
    assert built_ahead["burst"] == 8_000
    assert built_ahead["plain"] == 7
    assert built_ahead["spread"] >= 0.9 * 1_200
    assert max(dispatcher.batches) <= PREPARE_CHUNK
    assert longest <= 2_000 // PREPARE_CHUNK + 2  # the loop wakes on time in between


def test_a_firing_is_built_a_second_ahead_once_and_not_when_due_within_the_idle_gap() -> None:
    clock = Clock()
    dispatcher = BuildsAhead(clock)
    node = Scheduler(Schedule([entry(trigger=Every(10))]), store=dispatcher, clock=clock)
    clock.ms = START_MS - 1_500
    node.tick()  # the occurrence at START_MS is expanded

    clock.ms = START_MS - PREPARE_IDLE_MS + 1
    assert node.prepare_ahead() is False  # due too soon: the loop only sleeps till then
    assert dispatcher.batches == []
    clock.ms = START_MS
    node.tick()
    assert [b for _, f, b in dispatcher.sent if f.release_ms == START_MS] == [None]

    following = START_MS + 10_000
    clock.ms = following - EXPAND_AHEAD_MS
    node.tick()  # the next occurrence is expanded
    assert node.sleep_s() == pytest.approx((following - PREPARE_AHEAD_MS - clock.ms) / 1_000)
    clock.ms = following - PREPARE_AHEAD_MS - 1
    assert node.prepare_ahead() is False  # not near yet
    clock.ms = following - PREPARE_AHEAD_MS
    assert node.prepare_ahead() is True
    assert node.prepare_ahead() is False  # built once
    assert dispatcher.batches == [1]
    clock.ms = following
    node.tick()
    assert dispatcher.sent[-1][2] == ("built", dispatcher.sent[-1][1].id)


def test_a_slow_build_ahead_stops_in_time_for_the_release_and_leaves_the_rest_for_then() -> None:
    """Building takes 3 ms a firing (a busy machine): 2,000 entries due at one instant are
    built while there is time, and the loop wakes at their release all the same."""
    clock = Clock()

    class Slow(BuildsAhead):
        def prepare(self, firings: Sequence[Firing], wake: Wake) -> Sequence[object]:
            built = super().prepare(firings, wake)
            self.clock.ms += 3 * len(firings)
            return built

    dispatcher = Slow(clock)
    schedule = Schedule([entry(f"e{i}", trigger=Every(10)) for i in range(2_000)])
    node = Scheduler(schedule, store=dispatcher, clock=clock, preferred=False)
    run_loop(node, clock, START_MS + 1_000)

    sent = [(at, f, built) for at, f, built in dispatcher.sent if f.release_ms == START_MS]
    assert len(sent) == 2_000
    assert max(at for at, _, _ in sent) <= START_MS + PREPARE_STEP * 3  # one step late at most
    ahead = sum(1 for _, _, built in sent if built is not None)
    assert 250 <= ahead < 2_000  # what a second held, the rest when due
    assert max(dispatcher.batches) <= PREPARE_STEP


def test_a_dispatcher_without_building_ahead_is_never_asked() -> None:
    clock = Clock()

    class Plain(BuildsAhead):
        prepares_ahead = False

    dispatcher = Plain(clock)
    node = Scheduler(Schedule([entry(trigger=Every(2))]), store=dispatcher, clock=clock)
    run_loop(node, clock, START_MS + 10_000)

    assert dispatcher.batches == []
    assert dispatcher.sent
    assert all(built is None for _, _, built in dispatcher.sent)


def test_a_failed_build_ahead_leaves_the_firings_to_be_built_when_due() -> None:
    clock = Clock()
    dispatcher = BuildsAhead(clock, fail=True)
    node = burst_node(dispatcher, clock, 1_200)

    run_loop(node, clock, START_MS + 21_000)

    sent = [(f, built) for _, f, built in dispatcher.sent if f.release_ms >= START_MS]
    assert len(sent) == 3 * 1_200 == len({f.id for f, _ in sent})
    assert all(built is None for _, built in sent)
    assert sum(dispatcher.batches) == 3 * 1_200  # each firing was tried once, not forever


def test_what_was_built_for_a_firing_not_sent_through_the_dispatcher_is_dropped() -> None:
    clock = Clock()
    dispatcher = BuildsAhead(clock, takes_back=False)
    node = burst_node(dispatcher, clock, 600)

    run_loop(node, clock, START_MS + PREPARED_STALE_MS + 30_000)

    built = len(dispatcher.built_at)
    assert built >= 9 * 600
    # Only what was built within the last PREPARED_STALE_MS (and a second) is still held.
    held = len(node.ahead)
    assert 0 < held <= (PREPARED_STALE_MS // 10_000 + 1) * 600


def test_only_the_nodes_own_share_of_a_ranked_fan_out_is_built_ahead() -> None:
    tenants = [f"tenant-{i}" for i in range(3_000)]
    fan_entry = Entry(
        name="fan", task="t.fan", trigger=Every(10), tenants=tenants, jitter="4s", max_late="60s"
    )
    view = View.of({"a", "b", "c", "d", "e"}, 0)
    ranking = Ranking(view.digest, lane_of(view.salts, view.nodes.index("b")), LANE_DELAYS_MS)
    occurrence = 1_800_000_000_000
    fan = FanOut(fan_entry, "ns/fan", occurrence, tuple(tenants))
    while not fan.is_prepared:
        fan.prepare(ranking)

    staged = fan.stage(occurrence + 4_000, 100_000)

    assert staged
    assert all(view.rank(f.id, "b")[0] == 0 for f in staged)
    assert fan.stage(occurrence + 4_000, 100_000) == []  # each built once
    handed: list[tuple[int, Firing]] = []
    now = occurrence - 1
    while fan.remaining:
        now = max(now + 1, fan.next_release_ms())
        handed.extend((now, f) for f in fan.take(now, 700))
    assert sorted(f.tenant or "" for _, f in handed) == sorted(tenants)
    for at, firing in handed:
        rank = min(view.rank(firing.id, "b")[0], RUNGS)
        assert at == firing.release_ms + LANE_DELAYS_MS[rank]  # staged or not, on time
    assert {f.id for f in staged} <= {f.id for _, f in handed}


def test_staged_firings_of_an_unranked_fan_out_come_out_at_their_release() -> None:
    tenants = [f"tenant-{i}" for i in range(3_000)]
    fan_entry = Entry(name="fan", task="t.fan", trigger=Every(10), tenants=tenants, jitter="4s")
    view = View.of({"a", "b", "c"}, 0)
    ranking = Ranking(view.digest, lane_of(view.salts, view.nodes.index("a")), LANE_DELAYS_MS)
    occurrence = 1_800_000_000_000
    fan = FanOut(fan_entry, "ns/fan", occurrence, tuple(tenants))
    while not fan.is_prepared:
        fan.prepare(ranking)
    staged = fan.stage(occurrence + 2_000, 400)
    assert len(staged) == 400

    fan.unrank()  # the view changed: every lane is handed out at the release
    more = fan.stage(occurrence + 2_000, 100_000)
    taken = fan.take(occurrence + 2_000, 100_000)

    assert {f.id for f in staged + more} == {f.id for f in taken}
    assert all(f.release_ms <= occurrence + 2_000 for f in taken)
    rest = fan.take(occurrence + 4_000, 100_000)
    assert all(f.release_ms > occurrence + 2_000 for f in rest)
    assert sorted(f.tenant or "" for f in taken + rest) == sorted(tenants)
    assert fan.remaining == 0


def split_view(node: Scheduler, me: str, firings: int) -> View:
    """A view of three nodes, ``me`` first of them, under which ``me`` is preferred for
    some of the ``firings`` released at ``START_MS`` and not for the others: over
    ``INSTANT_GROUP`` of them, the instant's groups go each to its own preferred node.
    The names are searched (ranks are hashes), the same on every run."""
    preference = node.preference
    for _ in range(firings):
        preference.count(START_MS)
    schedule = node.schedule
    ids = [Firing.of(e, None, schedule.address(e), START_MS).id for e in schedule.entries]
    for i in range(2, 100):
        preference.view = View.of({me, f"n{i}", f"n{i + 1}"}, 0)
        first = {f for f in ids if preference.ranked(f, START_MS)[1] == 0}
        if 0 < len(first) < len(ids):
            preference._instants.clear()
            return preference.view
    raise AssertionError("no view splits the instant")


def test_with_the_preferred_claimer_a_node_builds_ahead_only_the_firings_it_is_first_for() -> None:
    """150 entries due at one instant (two groups of it, ``INSTANT_GROUP``), three nodes:
    n1 builds ahead the firings of the group it is preferred for, and places the others
    at its rung, so that it does not wake for them at their release."""
    clock = Clock()
    dispatcher = BuildsAhead(clock)
    schedule = Schedule([entry(f"e{i}", trigger=Every(10)) for i in range(150)])
    node = Scheduler(schedule, store=dispatcher, clock=clock, node="n1", preferred=True)
    view = split_view(node, "n1", 150)
    clock.ms = START_MS - EXPAND_AHEAD_MS
    node.tick()

    clock.ms = START_MS - PREPARE_AHEAD_MS
    while node.prepare_ahead():
        pass

    due = [f for at, f in node.timeline.items() if isinstance(f, Firing)]
    later = {at for at, d in node.timeline.items() if type(d).__name__ == "Deferred"}
    first = {f.id for f in due if node.preference.ranked(f.id, f.release_ms)[1] == 0}
    assert 0 < len(due) < 150
    assert len(first) == len(due)  # at its release: only what n1 is first for
    assert later <= {START_MS + GRACE_MS + LOOK_SHIFT_MS, START_MS + 2 * GRACE_MS + LOOK_SHIFT_MS}
    assert len(due) + sum(type(d).__name__ == "Deferred" for _, d in node.timeline.items()) == 150
    assert set(dispatcher.built_at) == first
    assert node.preference.view is view


def test_a_steady_instant_goes_whole_to_one_node() -> None:
    """60 entries due at each instant: under one view, the node preferred for an instant
    is preferred for all 60 of its firings; over ten instants, each of three nodes comes
    first for some."""
    clock = Clock()
    schedule = Schedule([entry(f"e{i}", trigger=Every(10)) for i in range(60)])
    nodes = {
        name: Scheduler(schedule, store=BuildsAhead(clock), clock=clock, node=name, preferred=True)
        for name in ("n1", "n2", "n3")
    }
    firsts: Counter[str] = Counter()
    for instant in range(START_MS, START_MS + 100_000, 10_000):
        ids = [Firing.of(e, None, schedule.address(e), instant).id for e in schedule.entries]
        for node in nodes.values():
            node.preference.view = View.of(set(nodes), 0)
        first = {
            name: {f for f in ids if node.preference.ranked(f, instant)[1] == 0}
            for name, node in nodes.items()
        }
        assert sorted(len(f) for f in first.values()) == [0, 0, 60], first
        firsts.update(name for name, f in first.items() if f)
    assert set(firsts) == set(nodes), firsts


def test_a_firing_ranked_ahead_is_not_ranked_again_at_its_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    dispatcher = BuildsAhead(clock)
    schedule = Schedule([entry(f"e{i}", trigger=Every(10)) for i in range(150)])
    node = Scheduler(schedule, store=dispatcher, clock=clock, node="n1", preferred=True)
    split_view(node, "n1", 150)
    clock.ms = START_MS - EXPAND_AHEAD_MS
    node.tick()
    clock.ms = START_MS - PREPARE_AHEAD_MS
    while node.prepare_ahead():
        pass

    ranked: list[str] = []
    rank = Preference.ranked

    def counted(preference: Preference, firing_id: str, release_ms: int, **kw: bool) -> Ranked:
        ranked.append(firing_id)
        return rank(preference, firing_id, release_ms, **kw)

    monkeypatch.setattr(Preference, "ranked", counted)
    clock.ms = START_MS
    node.tick()
    mine = [f for _, f, _ in dispatcher.sent if f.release_ms == START_MS]
    assert 0 < len(mine) < 150  # its share claimed, the others left to the other two
    assert ranked == []
    node.preference.view = View.of({"n1", "n2"}, 0)  # a node left: ranked afresh
    clock.ms = START_MS + 10_000 - PREPARE_AHEAD_MS
    while node.prepare_ahead():
        pass
    node.preference.view = View.of({"n1", "n2", "n4"}, 0)
    clock.ms = START_MS + 10_000
    node.tick()
    assert len(ranked) >= 150
