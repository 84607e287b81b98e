"""The preferred claimer ranks a plain firing by its release instant: at an instant one
node wakes and sends, the others sleep through it and look at their rung; an instant of
more than ``INSTANT_GROUP`` firings (a burst) is split into groups that the fleet shares
out. The rule itself, one scheduler on a fake clock, and simulated fleets (``bench/scale.py``'s
``SimFleet``: real schedulers and boards on one memory store and one fake clock)."""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import T0, Clock, entry

from beatless import Entry, Every, Firing, Schedule
from beatless.node._prefer import GRACE_MS, INSTANT_GROUP, LOOK_SHIFT_MS, View, instant_key
from beatless.node._timeline import EXPAND_AHEAD_MS
from beatless.node.scheduler import Decision, Scheduler
from beatless.stores.memory import MemoryStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import WARM_UP_MS, SimFleet, steady_schedule

START_MS = round(T0 * 1_000)
KEYS = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=60)


@given(st.integers(0, 2**41), st.integers(1, 20_000), KEYS)
def test_an_instants_firings_share_one_key_up_to_a_group_and_split_in_groups_beyond(
    release_ms: int, count: int, keys: list[int]
) -> None:
    got = {key: instant_key(release_ms, key, count) for key in keys}
    groups = math.ceil(count / INSTANT_GROUP)
    if count <= INSTANT_GROUP:
        assert len(set(got.values())) == 1
    else:  # one key per group present, the same for the firings of one group
        assert len(set(got.values())) == len({key % groups for key in keys})
        for key, ranked in got.items():
            assert ranked == instant_key(release_ms, key % groups, count)
    assert instant_key(release_ms, keys[0], count) != instant_key(release_ms + 1, keys[0], count)


def test_a_burst_of_10_000_at_one_instant_is_shared_out_over_three_nodes() -> None:
    """10,000 firings at one instant make 100 groups; each of three nodes is preferred for
    a share of them, none for more than 45 %."""
    view = View.of({"n1", "n2", "n3"}, 0)
    firsts = Counter(
        view.rank_key(instant_key(START_MS, key * 7_919, 10_000), "n1")[1] for key in range(10_000)
    )
    assert set(firsts) == set(view.nodes)
    assert max(firsts.values()) <= 4_500, firsts


def not_preferred_view(node: Scheduler, me: str, firing: Firing) -> View:
    """A view of three nodes under which ``me`` ranks second for ``firing``'s instant (the
    names are searched: ranks are hashes, the same on every run)."""
    for i in range(2, 200):
        node.preference.view = View.of({me, f"n{i}", f"n{i + 1}"}, 0)
        if node.preference.ranked(firing.id, firing.release_ms)[1] == 1:
            return node.preference.view
    raise AssertionError("no view ranks the node second")


def test_a_firing_placed_at_the_rung_is_due_at_its_release_again_when_the_view_changes() -> None:
    """n1 ranks second for an instant: when it expands the firing it places it at its rung
    (3 s and a quarter after the release), so it does not wake at the release. The view
    then changes before the release (the other two nodes left): the firing is due at its
    release again, and n1 sends it then."""
    clock = Clock()
    sent: list[tuple[int, str]] = []
    schedule = Schedule([entry("job", trigger=Every(10))])
    node = Scheduler(
        schedule,
        store=MemoryStore(clock=clock),
        enqueue=lambda firing: sent.append((clock.ms, firing.id)),
        clock=clock,
        node="n1",
        preferred=True,
    )
    job = schedule.entries[0]
    firing = Firing.of(job, None, schedule.address(job), START_MS)
    not_preferred_view(node, "n1", firing)
    clock.ms = START_MS - EXPAND_AHEAD_MS
    node.tick()
    placed = [(at, type(item).__name__) for at, item in node.timeline.items()]
    assert (START_MS + GRACE_MS + LOOK_SHIFT_MS, "Deferred") in placed
    assert node.next_wake_ms() != START_MS

    node.preference.view = View.of({"n1"}, START_MS - 500)  # the others left
    clock.ms = START_MS - 500
    node.tick()
    assert node.next_wake_ms() == START_MS
    clock.ms = START_MS
    node.tick()
    assert [(at, i) for at, i in sent if i == firing.id] == [(START_MS, firing.id)]


def test_in_a_steady_fleet_each_instant_is_sent_by_one_node_and_the_others_sleep_through_it() -> (
    None
):
    """Three nodes, 20 entries every second: over 60 s, the firings of each release
    instant are all sent by one node, the only node with anything due at that instant;
    each node sends some instants, and every firing is sent once."""
    fleet = SimFleet(steady_schedule(20, 1, 0), 3, preferred=True)
    fleet.run_until(fleet.clock.ms + WARM_UP_MS)
    measured = fleet.clock.ms
    senders: defaultdict[int, set[str]] = defaultdict(set)
    due_on: defaultdict[int, set[str]] = defaultdict(set)
    for node in fleet.nodes:

        def record(decision: Decision, name: str = node.scheduler.node) -> None:
            if decision.outcome in ("won", "takeover"):
                senders[decision.firing.release_ms].add(name)

        node.scheduler.on_decision = record
    while fleet.clock.ms < measured + 60_000:
        for node in fleet.nodes:
            for at, item in node.scheduler.timeline.items():
                if isinstance(item, Firing) and at == item.release_ms:
                    due_on[at].add(node.scheduler.node)
        fleet.run_until(fleet.clock.ms + fleet.step_ms)
    instants = [t for t in senders if measured + 2_000 <= t < measured + 58_000]
    assert len(instants) >= 50
    assert all(len(senders[t]) == 1 for t in instants), {t: senders[t] for t in instants}
    assert all(due_on[t] == senders[t] for t in instants)
    assert {n for t in instants for n in senders[t]} == {"n0", "n1", "n2"}
    check = fleet.check(measured + 1_000, fleet.clock.ms - 10_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check


def test_a_burst_of_plain_entries_is_sent_by_every_node_each_firing_once() -> None:
    """1,000 entries due at one instant on three nodes: ten groups, each node sends a
    share of them at the release, every firing once and claimed once."""
    schedule = Schedule(
        [
            Entry(name=f"job{i}", task="tasks.job", trigger=Every(30), max_late="60s")
            for i in range(1_000)
        ],
        namespace="scale",
    )
    fleet = SimFleet(schedule, 3, preferred=True)
    fleet.run_until(fleet.clock.ms + WARM_UP_MS)
    instant = (fleet.clock.ms // 30_000 + 1) * 30_000
    fleet.run_until(instant - 2_000)
    fleet.store.reset()
    won = {node.scheduler.node: node.outcomes["won"] for node in fleet.nodes}
    fleet.run_until(instant + 500)
    shares = [node.outcomes["won"] - won[node.scheduler.node] for node in fleet.nodes]
    assert sum(shares) == 1_000
    assert min(shares) > 0, shares
    assert fleet.store.items["claim"] <= 1_000 * 1.02
    check = fleet.check(instant, instant + 1)
    assert (check["expected"], check["missed"], check["duplicates"]) == (1_000, 0, 0), check
