"""The preferred claimer: one claim per firing whatever the fleet size, and no firing missed
when the preferred node freezes, dies, or when the views of the nodes disagree.

The fleets here are simulated in one process (``bench/scale.py``'s ``SimFleet``): real
schedulers and boards on one memory store and one fake clock, so that freezes and deaths
land at exact instants. The same rules are exercised with real processes by the fault
suite (``tests/faults``) and the multi-process tests, where the preferred claimer is on by
default.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beatless import Entry, Every, Schedule
from beatless.fleet._notes import REGISTRY_EVERY_MS, REGISTRY_TTL_MS
from beatless.node._prefer import (
    GRACE_MS,
    LADDER_MS,
    LANE_DELAYS_MS,
    LOOK_SHIFT_MS,
    RUNGS,
    Progress,
    View,
    fits,
    lane_of,
)
from beatless.node.scheduler import Decision
from beatless.schedule import _fanout
from beatless.schedule._fanout import FanOut, Ranking
from beatless.schedule.firing import Firing, claim_request, digest, firing_id, id_from_digest
from beatless.stores import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import WARM_UP_MS, SimFleet, steady_schedule

NODE_NAMES = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12, unique=True)
FIRING_IDS = st.uuids().map(str)


@given(NODE_NAMES, FIRING_IDS)
def test_every_node_of_one_view_ranks_a_firing_the_same_way(names: list[str], fid: str) -> None:
    """Ranks are a permutation of 0..n-1, and the node ranked first ranks itself first."""
    view = View.of(set(names), 0)
    ranks = {name: view.rank(fid, name) for name in names}
    assert sorted(rank for rank, _ in ranks.values()) == list(range(len(names)))
    tops = {top for _, top in ranks.values()}
    assert len(tops) == 1
    (top,) = tops
    assert ranks[top][0] == 0


@given(NODE_NAMES, st.text(min_size=1, max_size=12), FIRING_IDS)
def test_a_node_joining_changes_no_order_between_the_others(
    names: list[str], joining: str, fid: str
) -> None:
    """Rendezvous hashing: adding a node moves others down by at most one rank, and never
    swaps two of them, so the views of nodes that read the registry at different times
    disagree only about the node that joined or left."""
    before = View.of(set(names), 0)
    after = View.of(set(names) | {joining}, 0)
    order_before = sorted(names, key=lambda n: before.rank(fid, n)[0])
    order_after = sorted(after.nodes, key=lambda n: after.rank(fid, n)[0])
    assert [n for n in order_after if n in set(names)] == order_before


def test_a_progress_note_covers_only_its_view_and_span() -> None:
    view = View.of({"a", "b"}, 0)
    other = View.of({"a", "b", "c"}, 0)
    progress = Progress(view.digest, since_ms=1_000, until_ms=5_000)
    assert progress.covers(view, 3_000)
    assert not progress.covers(view, 5_001)
    assert not progress.covers(view, 999)
    assert not progress.covers(other, 3_000)
    assert Progress.from_json(progress.to_json()) == progress
    assert Progress.from_json("not json") is None
    held = Progress(view.digest, 1_000, 5_000, frozenset({"f1"}))
    assert not held.covers(view, 3_000, "f1")  # held by another node's claim: not done
    assert held.covers(view, 3_000, "f2")
    assert Progress.from_json(held.to_json()) == held


def test_the_ladder_rule_is_stated_from_the_registry_timings() -> None:
    assert LADDER_MS == REGISTRY_TTL_MS + 2 * REGISTRY_EVERY_MS + LOOK_SHIFT_MS + 750 == 26_000
    assert (RUNGS - 1) * GRACE_MS + LOOK_SHIFT_MS < LADDER_MS
    assert fits(0, 60_000)
    assert fits(30_000, 60_000)
    assert not fits(40_000, 60_000)


def run(fleet: SimFleet, seconds: float) -> None:
    fleet.run_until(fleet.clock.ms + int(seconds * 1_000))


def test_one_claim_per_firing_at_3_and_10_nodes_and_every_firing_once() -> None:
    for count in (3, 10):
        fleet = SimFleet(steady_schedule(20, 2, 0), count, preferred=True)
        run(fleet, WARM_UP_MS / 1_000)
        fleet.store.reset()
        before = sum(fleet.sent.values())
        measured = fleet.clock.ms
        run(fleet, 60)
        check = fleet.check(measured + 1_000, fleet.clock.ms - 5_000)
        assert (check["missed"], check["duplicates"]) == (0, 0), check
        assert check["expected"] >= 500
        claims = fleet.store.items["claim"]
        sent = sum(fleet.sent.values()) - before
        assert claims <= sent * 1.02, (count, claims, sent)
        claimed = [n.outcomes["won"] for n in fleet.nodes]
        assert min(claimed) > 0, claimed  # the work is split between the nodes


def test_a_wake_claims_its_firings_before_it_decides_those_left_to_other_nodes() -> None:
    """Wakes a second apart meet releases and the lower ranks' looks at earlier firings:
    the claims of the wake go first, the firings delegated to their preferred nodes after
    them."""
    fleet = SimFleet(steady_schedule(20, 1, 0), 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    both = 0
    for _ in range(40):
        fleet.clock.ms += 1_000
        for node in fleet.nodes:
            outcomes = [d.outcome for d in node.scheduler.tick()]
            if "won" in outcomes and "delegated" in outcomes:
                both += 1
                last_won = len(outcomes) - 1 - outcomes[::-1].index("won")
                assert last_won < outcomes.index("delegated"), outcomes
            node.scheduler.board.sync(fleet.clock.ms)
    assert both >= 3


def test_without_the_preferred_claimer_every_node_claims_every_firing() -> None:
    fleet = SimFleet(steady_schedule(20, 2, 0), 3, preferred=False)
    run(fleet, WARM_UP_MS / 1_000)
    fleet.store.reset()
    before = sum(fleet.sent.values())
    run(fleet, 20)
    sent = sum(fleet.sent.values()) - before
    assert sent >= 190
    assert fleet.store.items["claim"] >= 3 * sent * 0.98


def test_a_frozen_preferred_node_loses_nothing_and_the_next_rank_sends_after_the_grace() -> None:
    """Node n0 freezes (no wake, no sync, no record) for 40 s: every firing is still sent
    exactly once; those n0 was preferred for go out within the grace (plus a step and a
    sync) while its record lives, and at once after it has left the registry."""
    fleet = SimFleet(steady_schedule(20, 2, 0), 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    sends: list[tuple[str, int, int]] = []

    def record(decision: Decision) -> None:
        if decision.outcome in ("won", "takeover"):
            sends.append((decision.firing.id, decision.firing.release_ms, decision.lateness_ms))

    for node in fleet.nodes[1:]:
        node.scheduler.on_decision = record
    frozen_at = fleet.clock.ms
    fleet.nodes[0].frozen = True
    run(fleet, 40)
    fleet.nodes[0].frozen = False
    run(fleet, 30)
    check = fleet.check(frozen_at + 1_000, fleet.clock.ms - 5_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check
    during = [late for _, release, late in sends if frozen_at < release < frozen_at + 10_000]
    assert during
    assert max(during) <= 2 * GRACE_MS + 1_000, max(during)
    after = [late for _, release, late in sends if release > frozen_at + LADDER_MS]
    assert after
    assert max(after) <= 200, max(after)


def test_the_preferred_node_and_the_next_two_dying_at_once_lose_nothing() -> None:
    """Five nodes; for each firing, whichever three rank first die together at t: the
    survivors wait for the registry to drop them and then claim, within the ladder."""
    schedule = steady_schedule(20, 2, 0)
    fleet = SimFleet(schedule, 5, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    killed_at = fleet.clock.ms
    for node in fleet.nodes[:3]:
        node.frozen = True  # dead: never wakes, never posts again
    run(fleet, 90)
    check = fleet.check(killed_at + 1_000, fleet.clock.ms - 61_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check
    survivors = fleet.nodes[3:]
    assert all(len(n.scheduler.preference.view.nodes) == 2 for n in survivors)


def test_firings_held_for_a_dead_claimer_are_taken_over_when_their_preferred_node_dies_too() -> (
    None
):
    """A squatter (a node that claimed and died before it sent) holds three coming firings
    pending for 10 s, all preferred to n0; n0 sees them held, then dies before their lease
    runs out. Held is not done: the other nodes take each one over, once."""
    schedule = steady_schedule(4, 2, 0)
    fleet = SimFleet(schedule, 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    preference = fleet.nodes[0].scheduler.preference
    squatted: list[Firing] = []
    for entry in schedule.entries:
        address = schedule.address(entry)
        for occurrence in entry.trigger.after(fleet.clock.ms + 1_000):
            if occurrence > fleet.clock.ms + 20_000:
                break
            firing = Firing.of(entry, None, address, occurrence)
            if preference.ranked(firing.id, firing.release_ms)[2] == "n0":
                squatted.append(firing)
    squatted = sorted(squatted, key=lambda f: f.release_ms)[:3]
    requests = [claim_request(f) for f in squatted]
    assert fleet.store.claim(requests, node="squatter", lease_ms=10_000) == [Outcome.WON] * 3
    run(fleet, (squatted[-1].release_ms + 500 - fleet.clock.ms) / 1_000)
    assert fleet.nodes[0].outcomes["held"] >= 3
    fleet.nodes[0].frozen = True  # dead: never wakes, never posts again

    run(fleet, 40)

    assert [fleet.sent[f.id] for f in squatted] == [1, 1, 1]
    check = fleet.check(squatted[0].release_ms, fleet.clock.ms - 5_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check


def test_an_entry_whose_max_late_cannot_hold_the_ladder_is_claimed_by_every_node() -> None:
    schedule = Schedule(
        [
            Entry(name="tight", task="t.tight", trigger=Every(2), max_late="10s"),
            Entry(name="roomy", task="t.roomy", trigger=Every(2), max_late="60s"),
        ],
        namespace="scale",
    )
    fleet = SimFleet(schedule, 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    fleet.store.reset()
    for node in fleet.nodes:
        node.outcomes.clear()
    run(fleet, 20)
    lost = sum(n.outcomes["lost"] for n in fleet.nodes)
    delegated = sum(n.outcomes["delegated"] for n in fleet.nodes)
    assert lost >= 2 * 9  # every node claims "tight"'s ~10 firings
    assert delegated >= 2 * 9  # "roomy"'s are left to the preferred node


def test_a_fleet_with_a_big_fan_out_still_posts_its_registry_and_splits_the_claims() -> None:
    """An entry of 5,000 tenants: its published entry note stays small (a note over the
    store's limit would stop the board's sync, and with it the registry every preference
    rests on), and the 5,000 firings of one occurrence are claimed once each."""
    entry = Entry(
        name="fan",
        task="t.fan",
        trigger=Every(60),
        tenants=[f"tenant-{i}" for i in range(5_000)],
        jitter="10s",
        max_late="60s",
    )
    fleet = SimFleet(Schedule([entry], namespace="scale"), 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    assert all(len(n.scheduler.preference.view.nodes) == 3 for n in fleet.nodes)
    fleet.store.reset()
    before = sum(fleet.sent.values())
    run(fleet, 60)
    sent = sum(fleet.sent.values()) - before
    assert sent == 5_000
    assert max(fleet.sent.values()) == 1
    assert fleet.store.items["claim"] <= sent * 1.02


def test_beatless_run_turns_the_preferred_claimer_off_with_every_node_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from beatless.cli import _run
    from beatless.cli.command import main

    schedule = tmp_path / "schedule.toml"
    schedule.write_text('[[entry]]\nname = "tick"\ntask = "t.tick"\nevery = "10s"\n')
    seen: list[bool] = []
    monkeypatch.setattr(_run, "run_node", lambda *a, **k: seen.append(k["preferred"]) or 0)
    assert main(["run", str(schedule), "--store", "memory://"]) == 0
    assert main(["run", str(schedule), "--store", "memory://", "--every-node-claims"]) == 0
    assert seen == [True, False]


def test_each_node_comes_first_for_its_share_of_firings() -> None:
    """Over 20,000 firing ids, each of 10 nodes ranks first for 10 % of them, within the
    spread of chance (± 1 %), and second for as many: the work splits evenly."""
    view = View.of({f"node-{i}" for i in range(10)}, 0)
    firsts: Counter[str] = Counter()
    for i in range(20_000):
        fid = firing_id(f"scale/job/{i}", 1_800_000_000_000)
        firsts[view.rank(fid, "node-0")[1]] += 1
    assert len(firsts) == 10
    assert all(1_800 <= n <= 2_200 for n in firsts.values()), firsts


@given(NODE_NAMES, st.data(), st.text(max_size=20), st.integers(0, 2**41))
def test_a_fan_outs_lane_is_the_nodes_rank_capped_at_the_rungs(
    names: list[str], data: st.DataObject, address: str, occurrence_ms: int
) -> None:
    """The lane a fan-out puts a firing in, from its digest's first 64 bits, is the rank
    :meth:`View.rank` gives from its id (capped at ``RUNGS``), for every node and view."""
    view = View.of(set(names), 0)
    me = data.draw(st.sampled_from(view.nodes))
    lane = lane_of(view.salts, view.nodes.index(me))
    d = digest(address, occurrence_ms)
    assert lane(int.from_bytes(d[:8], "big")) == min(view.rank(id_from_digest(d), me)[0], RUNGS)


def fan_out_entry(tenants: int, jitter: str = "4s") -> Entry:
    return Entry(
        name="fan",
        task="t.fan",
        trigger=Every(10),
        tenants=[f"tenant-{i}" for i in range(tenants)],
        jitter=jitter,
        max_late="60s",
    )


def test_a_fan_out_hands_each_lane_out_at_its_rung_and_all_at_the_release_once_unranked() -> None:
    """With a ranking, the firings node b is preferred for come out at their release and
    the others at the release plus their rank's delay (``RUNGS`` and lower together);
    each tenant once. When the view changes, the rest come out at their release."""
    entry = fan_out_entry(3_000)
    names = entry.tenant_list()
    assert names is not None
    view = View.of({"a", "b", "c", "d", "e"}, 0)
    ranking = Ranking(view.digest, lane_of(view.salts, view.nodes.index("b")), LANE_DELAYS_MS)
    occurrence = 1_800_000_000_000
    fan = FanOut(entry, "ns/fan", occurrence, names)
    while not fan.is_prepared:
        fan.prepare(ranking)
    taken: list[tuple[int, Firing]] = []
    now = occurrence
    while fan.remaining:
        now = max(now, fan.next_release_ms())
        taken.extend((now, f) for f in fan.take(now, 500))
    assert sorted(f.tenant for _, f in taken) == sorted(names)
    for at, firing in taken:
        rank = min(view.rank(firing.id, "b")[0], RUNGS)
        assert at == firing.release_ms + LANE_DELAYS_MS[rank]
    assert {min(view.rank(f.id, "b")[0], RUNGS) for _, f in taken} == {0, 1, 2, 3}

    fan = FanOut(entry, "ns/fan", occurrence, names)
    while not fan.is_prepared:
        fan.prepare(ranking)
    first = fan.take(occurrence + 1_000, 10_000)
    assert all(view.rank(f.id, "b")[0] == 0 for f in first)
    fan.unrank()
    rest = fan.take(occurrence + 1_000, 10_000)
    assert {f.tenant for f in first + rest} == {
        f.tenant for _, f in taken if f.release_ms <= occurrence + 1_000
    }
    assert all(f.release_ms <= occurrence + 1_000 for f in rest)


def test_at_a_fan_outs_release_each_node_builds_only_its_own_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three nodes, a fan-out of 3,000 tenants due at one instant: at the instant each
    node builds the firings it is preferred for (about a third), not all 3,000; every
    firing is sent once."""
    firings = 0
    make = _fanout._firing

    def counted(*args: Any) -> Firing:
        nonlocal firings
        firings += 1
        return make(*args)

    monkeypatch.setattr(_fanout, "_firing", counted)
    fleet = SimFleet(Schedule([fan_out_entry(3_000, "0s")], namespace="scale"), 3, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    built: Counter[str] = Counter()
    occurrence = (fleet.clock.ms // 10_000 + 1) * 10_000
    for node in fleet.nodes:

        def count(decision: Decision, name: str = node.scheduler.node) -> None:
            if decision.firing.occurrence_ms == occurrence:
                built[name] += decision.outcome in ("won", "takeover")

        node.scheduler.on_decision = count
    run(fleet, (occurrence - 1_000 - fleet.clock.ms) / 1_000)
    before = sum(fleet.sent.values())
    delegated = [n.outcomes["delegated"] for n in fleet.nodes]
    firings = 0
    run(fleet, 1.5)
    assert firings == 3_000  # 9,000 if every node built every firing
    assert sum(fleet.sent.values()) - before == 3_000
    assert max(fleet.sent.values()) == 1
    assert all(800 <= built[n.scheduler.node] <= 1_200 for n in fleet.nodes), built
    # the others' firings not looked at yet: none delegated within a second of the release
    assert [n.outcomes["delegated"] for n in fleet.nodes] == delegated


@pytest.mark.parametrize("deaths", [1, 3])
def test_a_fan_out_loses_nothing_when_preferred_nodes_die(deaths: int) -> None:
    """Five nodes and a fan-out of 300 tenants every 10 s (jitter 4 s): ``deaths`` of them
    die at once. The firings they were preferred for, which the others hold in later
    lanes, are each sent exactly once, within the ladder."""
    fleet = SimFleet(Schedule([fan_out_entry(300)], namespace="scale"), 5, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    killed_at = fleet.clock.ms
    for node in fleet.nodes[:deaths]:
        node.frozen = True  # dead: never wakes, never posts again
    run(fleet, 90)
    check = fleet.check(killed_at + 1_000, fleet.clock.ms - 61_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check
    assert check["expected"] >= 600


def test_a_preferred_nodes_progress_waits_for_the_firings_a_full_wake_left_for_the_next() -> None:
    """Two nodes and 12,000 firings due at one instant: each node's share (about 6,000)
    is more than one wake hands to the dispatcher (``MAX_BATCH``). After the first wake
    the node's progress must not cover the instant: the rest of its share is not claimed
    yet, and a lower rank that read it as done would leave those firings to a node that
    may die before it claims them."""
    fleet = SimFleet(Schedule([fan_out_entry(12_000, "0s")], namespace="scale"), 2, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    occurrence = (fleet.clock.ms // 10_000 + 1) * 10_000
    run(fleet, (occurrence - 100 - fleet.clock.ms) / 1_000)
    fleet.clock.ms = occurrence
    node = fleet.nodes[0].scheduler
    node.tick()
    until = node.preference.until_ms
    assert until is not None
    assert until < occurrence
    wake = node.next_wake_ms()
    assert wake is not None
    assert wake <= occurrence  # the rest follows at once
