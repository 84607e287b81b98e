"""The preferred claimer under faults: real node processes on a private Redis, each firing
claimed first by the node its id ranks first, and that node frozen or killed.

The entries here leave room for the ladder (``max_late`` 60 s, jitter at most 4 s), so
the preferred claimer is on for them; the other fault scenarios' entries mostly have a
``max_late`` of 20 s, under the ladder, and are claimed by every node. Each scenario
counts duplicates, stale and early sends and misses as the rest of the suite does, and
asserts no miss at all: the next rank claims after its grace, and the rest once the
registry has dropped the dead.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from analysis import Report
from harness import Fleet, next_whole_second, sleep_until
from redis_server import RedisServer
from test_faults import GRACE_S, NODES, assert_clean, every, fanout, schedule

from beatless.node._prefer import GRACE_MS, LADDER_MS

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.serial]  # bounds lateness

ServerFactory = Callable[[str], RedisServer]
FleetFactory = Callable[[dict[str, Any]], Fleet]

SETTLE_S = 12
"""The nodes have posted their records and read everyone's (every 5 s) by then."""
STEP_S = 1.5
"""A send may follow its rung by up to a wake, a store round trip and a loaded machine."""


def roomy_schedule(anchor: int) -> dict[str, Any]:
    return schedule(anchor, every("tick", 1, 60), fanout(10, jitter_s=4, max_late_s=60, tenants=30))


def worst_lateness_s(run: Fleet, window_s: tuple[float, float]) -> float:
    """The latest send after its release, of the firings whose occurrence is in the window
    (the report's worst counts the start's catch-up sends too)."""
    low, high = (int(t * 1_000) for t in window_s)
    return max(
        s["sent"] - s["release_ms"] / 1_000
        for name in run.names
        for s in run.sends_of(name)
        if low <= s["occurrence_ms"] < high
    )


def assert_split(report: Report) -> None:
    """The preferred claimer was on: nodes left firings to others instead of claiming.

    Without it no node delegates anything. With it each firing whose preferred node
    lives is delegated by the others once their rung finds its progress; a frozen or
    killed node's counters are lost, and a firing whose preferred node is dead is claimed
    by the others (won, lost), so the count falls near the window's firings (1.08 of
    them in the simulated killed-node case, 0.94-1.26 in real runs): at least half of
    them shows the split without resting on how fast the notes travelled."""
    assert 2 * report.counters.get("delegated", 0) >= report.expected, report.line()


def assert_no_miss_after_kill(report: Report, killed: list[str]) -> None:
    """0 misses, 0 stale and early sends; duplicates only in flight at the kill (a send
    whose commit the kill cut off); the killed nodes are the only ones without a summary."""
    assert report.misses == 0, report.details()
    assert report.stale == 0, report.details()
    assert report.early == 0, report.details()
    assert report.duplicates == report.in_flight_duplicates <= len(killed), report.details()
    assert sorted(report.silent_nodes) == sorted(killed), report.details()


def run_scenario(
    redis_server: ServerFactory,
    fleet: FleetFactory,
    nodes: list[dict[str, Any]],
    seconds: int,
    fault: Callable[[Fleet], None],
) -> tuple[Fleet, int]:
    """``nodes`` on a private Redis for ``seconds`` after the anchor, ``fault`` injected
    8.5 s after it: the registry has settled, and no firing is released then (the ticks
    are released on whole seconds, the fan-out's in [0, 4) and [10, 14) s), so the fault
    catches no claim pending, which only the lease's end (30 s) would free and which
    this suite does not time (``test_faults.py`` does). Returns the fleet, ended, and the
    anchor."""
    store = redis_server("store")
    anchor = next_whole_second(SETTLE_S)
    run = fleet(roomy_schedule(anchor))
    until = anchor + seconds + GRACE_S
    run.start({"store": store.url, "until": until}, nodes)
    sleep_until(anchor + 8.5)
    fault(run)
    run.wait(timeout=until - time.time() + 30)
    return run, anchor


def kill(*names: str) -> Callable[[Fleet], None]:
    def fault(run: Fleet) -> None:
        killed_at = time.time()
        for name in names:
            os.kill(run.pid(name), signal.SIGKILL)
        run.fault(f"{', '.join(names)} killed", killed_at, killed_at)

    return fault


def freeze_n1_for_30s(run: Fleet) -> None:
    run.freeze("n1")
    frozen = time.time()  # after the signal: a send begun before it is in flight at the fault
    time.sleep(30)
    run.thaw("n1")
    run.fault("n1 frozen", frozen, time.time())


def test_a_frozen_preferred_node_misses_nothing_the_next_rank_sends_after_its_grace(
    redis_server: ServerFactory, fleet: FleetFactory
) -> None:
    """Fault: SIGSTOP of one of three nodes for 30 s (over the registry's 15 s TTL), then
    SIGCONT. The firings it was preferred for are sent by the next rank after the 3 s
    grace while its record lives, and by a live node at their release once the registry
    dropped it; it sends nothing stale when thawed. 0 misses."""
    run, anchor = run_scenario(redis_server, fleet, NODES, 60, freeze_n1_for_30s)
    report = run.report((anchor, anchor + 50))
    assert_clean(report, misses="none")
    assert_split(report)
    worst = worst_lateness_s(run, (anchor, anchor + 50))
    assert worst <= GRACE_MS / 1_000 + STEP_S, report.line()


def test_a_killed_preferred_node_misses_nothing(
    redis_server: ServerFactory, fleet: FleetFactory
) -> None:
    """Fault: SIGKILL of one of three nodes: what it was preferred for is sent by the
    next rank after the grace until its record runs out, then at the release. 0 misses."""
    run, anchor = run_scenario(redis_server, fleet, NODES, 50, kill("n2"))
    report = run.report((anchor, anchor + 40))
    assert_no_miss_after_kill(report, ["n2"])
    assert_split(report)
    worst = worst_lateness_s(run, (anchor, anchor + 40))
    assert worst <= GRACE_MS / 1_000 + STEP_S, report.line()


def test_three_of_five_nodes_killed_at_once_miss_nothing_within_the_ladder(
    redis_server: ServerFactory, fleet: FleetFactory
) -> None:
    """Fault: SIGKILL of three of five nodes at one instant, so that for many firings the
    nodes ranked 0, 1 and 2 are all dead and the survivors, ranked 3 and 4, may claim only
    once the registry has dropped the dead: every firing is still sent, within
    ``LADDER_MS`` of its release (26 s, inside max_late 60 s). 0 misses."""
    nodes = [{"node": f"n{i}"} for i in range(5)]
    run, anchor = run_scenario(redis_server, fleet, nodes, 60, kill("n0", "n1", "n2"))
    report = run.report((anchor, anchor + 50))
    assert_no_miss_after_kill(report, ["n0", "n1", "n2"])
    worst = worst_lateness_s(run, (anchor, anchor + 50))
    assert worst <= LADDER_MS / 1_000 + STEP_S, report.line()
    assert worst > 2 * GRACE_MS / 1_000, "no firing waited for the registry: no low rank tested"
