"""The claim store's memory under an operator's week: a Redis that evicts, and one that fills.

Three real node processes each (``fault_node``, two-phase, lease 5 s, max_late 10 s:
entries every 1 and 2 s and a 30-tenant fan-out every 10 s), against a private
``redis-server`` whose memory another client uses (``pressure``: a cache writing keys
of its own beside the claims):

* an evicting ``maxmemory-policy`` set before the fleet starts: every node refuses to
  start, with one line naming the policy and the fix;
* the same set with ``CONFIG SET`` under the running fleet while the other client
  writes (``allkeys-lru`` with ``maxmemory 3mb`` at 1 MB/s; ``volatile-ttl`` with
  ``maxmemory 8mb`` at 300 KB/s), then set back to ``noeviction``: the nodes stop
  claiming within a sync, every firing they could not claim is reported, and nothing
  is sent twice, before or after the claims resume;
* ``noeviction`` with ``maxmemory 8mb``, filled to its limit by the other client and
  kept full for 12 s, then drained: claims and commits are refused as full, nothing is
  sent twice, every firing not judged is reported missed, and each node says at
  WARNING what is full and how full.

Each counts duplicates, misses reported and unreported, stale and early sends as the
rest of the suite does (``analysis``), in under a minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import CODE_ROOT, Fleet, next_whole_second, sleep_until
from pressure import Writer
from redis_server import RedisServer
from test_faults import GRACE_S, NODES, assert_clean, every, fanout, schedule

pytestmark = [pytest.mark.slow, pytest.mark.faults]

ServerFactory = Callable[[str], RedisServer]
FleetFactory = Callable[[dict[str, Any]], Fleet]

MIB = 1024 * 1024
MAX_LATE_S = 10
COMMON = {"send_delay_s": 0.01, "lease_s": 5}
FIX = "CONFIG SET maxmemory-policy noeviction"
RUN = "import sys; from beatless.cli.command import main; sys.exit(main(sys.argv[1:]))"
"""``beatless run`` as the console script runs it, with the beatless under test."""
STOP_WITHIN_S = 2.0
"""Claims stop within a sync (1 s) and a wake of the loop; the rest is a loaded machine."""


def week_schedule(anchor: int) -> dict[str, Any]:
    """Entries every 1 and 2 s and a 30-tenant fan-out every 10 s (jitter 3 s)."""
    return schedule(
        anchor,
        every("tick", 1, MAX_LATE_S),
        every("tock", 2, MAX_LATE_S),
        fanout(10, jitter_s=3, max_late_s=MAX_LATE_S, tenants=30),
    )


@pytest.fixture
def writers() -> Iterator[Callable[[int, int], Writer]]:
    """Makes :class:`Writer` clients; stops and closes them all at the end."""
    made: list[Writer] = []

    def make(port: int, rate: int) -> Writer:
        writer = Writer(port, rate)
        made.append(writer)
        return writer

    try:
        yield make
    finally:
        for writer in made:
            writer.close()


def admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=2)


def node_log(run: Fleet, name: str) -> str:
    return (run.workdir / f"{name}.log").read_text(errors="replace")


def log_lines(run: Fleet, needle: str) -> dict[str, list[str]]:
    """Per node, the lines of its log that contain ``needle``."""
    return {
        name: [line for line in node_log(run, name).splitlines() if needle in line]
        for name in run.names
    }


def test_an_evicting_redis_is_refused_at_start_by_every_node(
    redis_server: ServerFactory, fleet: FleetFactory, tmp_path: Path
) -> None:
    """Fault: the claim store's Redis has ``maxmemory 3mb`` and ``allkeys-lru`` before
    the fleet starts. Every node (the suite's nodes, and ``beatless run`` as an operator
    starts one) exits at start without claiming or sending anything, and says why in
    one line naming the policy and the fix."""
    store = redis_server("store")
    with admin(store) as client:
        client.config_set("maxmemory", "3mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
    anchor = next_whole_second(3)
    run = fleet(week_schedule(anchor))
    run.start({"store": store.url, **COMMON, "until": anchor + 20}, NODES)
    for process in run.processes:
        process.wait(30)

    assert [p.returncode for p in run.processes] == [1] * len(NODES)
    for name, lines in log_lines(run, "beatless.errors.StoreRefused: ").items():
        assert len(lines) == 1, (name, node_log(run, name)[-2_000:])
        assert "maxmemory-policy allkeys-lru:" in lines[0]
        assert FIX in lines[0]
        assert run.sends_of(name) == []
    assert not any(run.summary_path(n).exists() for n in run.names)

    target = tmp_path / "schedule.toml"
    target.write_text('[[entry]]\nname = "beat"\ntask = "tasks.t"\nevery = "1s"\n')
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", RUN, "run", str(target), "--store", store.url],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(CODE_ROOT)},
        check=False,
    )
    print(f"beatless run refused in {time.monotonic() - started:.1f}s: {done.stderr.strip()}")
    assert done.returncode == 2, done
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("beatless run: error: redis store redis://127.0.0.1:")
    assert "maxmemory-policy allkeys-lru:" in errors[0]
    assert FIX in errors[0]


@dataclass(frozen=True)
class Eviction:
    """An evicting policy set under the fleet, and the other client's pressure."""

    policy: str
    maxmemory_mib: int
    rate: int
    """Bytes a second the other client writes."""


@pytest.mark.parametrize(
    "eviction",
    [Eviction("allkeys-lru", 3, 1_000_000), Eviction("volatile-ttl", 8, 300_000)],
    ids=["allkeys-lru-3mb", "volatile-ttl-8mb"],
)
def test_an_evicting_policy_set_under_a_running_fleet_stops_claims_and_sends_nothing_twice(
    eviction: Eviction,
    redis_server: ServerFactory,
    fleet: FleetFactory,
    writers: Callable[[int, int], Writer],
) -> None:
    """Fault: another client fills Redis to 1 MiB under ``maxmemory_mib`` with keys of
    its own (with a TTL: a cache); 8 s into the run, ``CONFIG SET maxmemory`` and
    ``maxmemory-policy`` (``allkeys-lru`` 3 MiB, ``volatile-ttl`` 8 MiB) while it writes
    ``rate`` bytes a second (1 MB/s, 300 KB/s), so that Redis evicts within seconds;
    10 s later the policy is set back to ``noeviction`` (no limit) and the writer stops.
    The nodes must stop claiming within a sync (no send begun later until the fix),
    report every firing they could not claim, send nothing twice (a claim evicted before
    the nodes noticed must not be won again once claims resume), and resume."""
    policy = eviction.policy
    store = redis_server("store")
    anchor = next_whole_second(6)
    run = fleet(week_schedule(anchor))
    until = anchor + 28 + MAX_LATE_S + GRACE_S
    run.start({"store": store.url, **COMMON, "until": until}, NODES)
    writer = writers(store.port, eviction.rate)
    writer.fill(used=(eviction.maxmemory_mib - 1) * MIB)
    with admin(store) as client:
        sleep_until(anchor + 8)
        changed = time.time()
        client.config_set("maxmemory", f"{eviction.maxmemory_mib}mb")
        client.config_set("maxmemory-policy", policy)
        writer.start()
        time.sleep(10)
        evicted = int(client.info("stats")["evicted_keys"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "0")
        fixed = time.time()
        writer.stop()
    print(f"{policy}: {evicted} keys evicted, {writer.written} written by the other client")
    run.fault(f"maxmemory-policy {policy}", changed, fixed)
    run.wait(timeout=until - time.time() + 30)
    report = run.report((anchor, anchor + 28))

    assert_clean(report, misses="reported")
    assert evicted > 0, "Redis evicted nothing: the scenario did not put it under pressure"
    during = [
        send
        for name in run.names
        for send in run.sends_of(name)
        if changed + STOP_WITHIN_S <= send["called"] <= fixed
    ]
    assert during == [], f"{len(during)} sends while the policy evicted: {during[:3]}"
    stopped = log_lines(run, "claims stopped")
    assert all(stopped.values()), stopped
    assert all(f"maxmemory-policy {policy}" in lines[0] for lines in stopped.values())
    assert report.counters.get("store_refused", 0) > 0, report.details()
    assert report.outcomes.get("missed", 0) > 0, report.details()
    after = [s for n in run.names for s in run.sends_of(n) if s["called"] > fixed + STOP_WITHIN_S]
    assert after, "claims never resumed after the policy was fixed"


def test_a_full_redis_refuses_claims_sends_nothing_twice_and_says_how_full(
    redis_server: ServerFactory, fleet: FleetFactory, writers: Callable[[int, int], Writer]
) -> None:
    """Fault: ``maxmemory 8mb`` under ``noeviction``; 8 s into the run another client
    fills Redis until it refuses writes and keeps it full (300 KB/s) for 12 s, then
    deletes its keys. Claims and commits are refused as full: nothing is sent twice
    (a sent firing's claim is committed without room, not taken over), every firing no
    claim could judge is reported missed, and each node says at WARNING what is full
    and how full."""
    store = redis_server("store")
    with admin(store) as client:
        client.config_set("maxmemory", "8mb")
        client.config_set("maxmemory-policy", "noeviction")
    anchor = next_whole_second(6)
    run = fleet(week_schedule(anchor))
    until = anchor + 30 + MAX_LATE_S + GRACE_S
    run.start({"store": store.url, **COMMON, "until": until}, NODES)
    writer = writers(store.port, 300_000)
    sleep_until(anchor + 8)
    filled = time.time()
    writer.fill()
    writer.start()
    print(f"filled in {time.time() - filled:.1f}s: used_memory {writer.used()}")
    sleep_until(anchor + 20)
    writer.stop()
    writer.drain()
    drained = time.time()
    print(f"drained: used_memory {writer.used()}; {writer.refused} writes refused as full")
    run.fault("redis full", filled, drained)
    run.wait(timeout=until - time.time() + 30)
    report = run.report((anchor, anchor + 30))

    assert_clean(report, misses="reported")
    assert report.counters.get("store_full", 0) > 0, report.details()
    full = log_lines(run, "Redis is full and refuses writes")
    said = [lines[0] for lines in full.values() if lines]
    assert said, "no node said that Redis is full"
    assert all(" WARNING " in line and "of maxmemory 8.0 MiB" in line for line in said), said
    after = [s for n in run.names for s in run.sends_of(n) if s["called"] > drained + 2]
    assert after, "claims never resumed after the memory was freed"
