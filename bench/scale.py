"""Store work and CPU per node as the fleet grows: every node claiming every firing, and the
preferred claimer, side by side in one run; then a burst of firings due at one instant.

    python bench/scale.py                      # 3, 10 and 50 nodes, both ways, and the burst
    python bench/scale.py --nodes 3 10 --minutes 2 --no-burst --json
    python bench/scale.py --traffic 10 100 1000 --seconds 30   # each node's store traffic
    python bench/scale.py --traffic 10 100 1000 --churn 5     # ... as nodes join and leave

**Fleet** (in one process, so that 50 nodes fit on a laptop): N schedulers share one
memory store and one fake clock, stepped every ``--step-ms``; each wakes as
``Scheduler.run`` does and syncs its board (registry, progress, controls) every simulated
second, as its board thread would. The schedule is ``--entries`` entries of
``Every(--every)`` with a jitter of ``--jitter`` seconds. The counts are taken after a
warm-up in which every node has read the registry; the check covers every firing released
after it.

**Traffic** (``--traffic``): the same simulated fleet at the sizes given, each node on a
view of its own of a store that counts its round trips and bytes each way
(:class:`~beatless.stores.traffic.TrafficStore`): per node per second, and per firing.

**Burst** (real processes): N node processes on Redis (``--redis``) and one fan-out entry
of ``--burst`` tenants with no jitter, so that all its firings are due at one instant;
``atomic``: Dramatiq on its ``RedisBroker``, one script claims and pushes (messages built
ahead of the instant); ``two-phase``: the Redis store and an enqueue that pushes each won
firing with one ``RPUSH``. The figure is how long after that instant the last one was
enqueued. Beside the two-phase runs, the same processes push the same number of items with
the same ``RPUSH`` and no scheduler at all: the floor the enqueue alone sets on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beatless import Entry, Every, Schedule
from beatless.fleet._notes import SYNC_EVERY_MS
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import Firing
from beatless.stores import ClaimRequest, Outcome
from beatless.stores.base import Note
from beatless.stores.traffic import Traffic, TrafficStore

ROOT = Path(__file__).resolve().parent.parent
START_MS = 1_800_000_000_000
WARM_UP_MS = 20_000
"""Long enough for every node to post its record and read everyone's (every 5 s)."""


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return (self.ms + 0.5) / 1_000


class CountingStore(TrafficStore):
    """The memory store, counting the firings each call carried and the calls of all its
    views together; each view (one node's) counts its own traffic too
    (:class:`~beatless.stores.traffic.Traffic`)."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)
        self.items: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self.calls["claim"] += 1
        self.items["claim"] += len(requests)
        return super().claim(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        self.calls["commit"] += 1
        self.items["commit"] += len(ids)
        return super().commit(ids, node=node, notes=notes)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        self.calls["release"] += 1
        self.items["release"] += len(ids)
        super().release(ids, node=node)

    def post(self, notes: Sequence[Note]) -> None:
        self.calls["post"] += 1
        super().post(notes)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        self.calls["read_notes"] += 1
        return super().read_notes(kinds)

    def reset(self) -> None:
        self.items.clear()
        self.calls.clear()
        for traffic in self.traffics:
            traffic.reset()


@dataclass
class SimNode:
    """One scheduler of a simulated fleet."""

    scheduler: Scheduler
    cpu_s: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    frozen: bool = False
    synced_ms: int | None = None
    traffic: Traffic = field(default_factory=Traffic)
    """This node's store traffic (its own view of the fleet's store)."""

    def wake(self, now_ms: int, sent: Counter[str]) -> None:
        """Wake until nothing is due now, and sync the board when a second has passed."""
        if self.frozen:
            return
        cpu = time.process_time()
        while True:
            for decision in self.scheduler.tick():
                self.record(decision, sent)
            wake = self.scheduler.next_wake_ms()
            if wake is None or wake > now_ms:
                break
        if self.synced_ms is None or now_ms - self.synced_ms >= SYNC_EVERY_MS:
            self.synced_ms = now_ms
            self.scheduler.board.sync(now_ms)
        self.cpu_s += time.process_time() - cpu

    def record(self, decision: Decision, sent: Counter[str]) -> None:
        self.outcomes[decision.outcome] += 1
        if decision.outcome in ("won", "takeover"):
            sent[decision.firing.id] += 1


@dataclass
class SimFleet:
    """``nodes`` schedulers on one counting memory store and one fake clock."""

    schedule: Schedule
    count: int
    preferred: bool
    step_ms: int = 100
    clock: Clock = field(default_factory=lambda: Clock(START_MS))
    sent: Counter[str] = field(default_factory=Counter)
    releases: dict[str, int] = field(default_factory=dict)
    store: CountingStore = field(init=False)
    nodes: list[SimNode] = field(init=False)

    def __post_init__(self) -> None:
        self.store = CountingStore(clock=self.clock)
        self.nodes = [self.node(f"n{i}") for i in range(self.count)]

    def node(self, name: str) -> SimNode:
        def enqueue(firing: Any) -> None:
            self.releases[firing.id] = firing.release_ms

        store = self.store.view()
        scheduler = Scheduler(
            self.schedule,
            store=store,
            enqueue=enqueue,
            clock=self.clock,
            node=name,
            preferred=self.preferred,
        )
        return SimNode(scheduler, traffic=store.traffic)

    def run_until(self, end_ms: int) -> None:
        step = 0
        while self.clock.ms <= end_ms:
            for i in range(len(self.nodes)):
                self.nodes[(step + i) % len(self.nodes)].wake(self.clock.ms, self.sent)
            self.clock.ms += self.step_ms
            step += 1

    def check(self, after_ms: int, until_ms: int) -> dict[str, int]:
        """Every firing of the schedule released in [after_ms, until_ms): sent once?"""
        expected = set()
        for entry in self.schedule.entries:
            tenants = entry.tenant_list() or [None]
            addresses = [(t, self.schedule.address(entry, t)) for t in tenants]
            for occurrence in entry.trigger.after(after_ms - entry.max_late_ms - 1):
                if occurrence >= until_ms:
                    break
                for tenant, address in addresses:
                    firing = Firing.of(entry, tenant, address, occurrence)
                    if after_ms <= firing.release_ms < until_ms:
                        expected.add(firing.id)
        sent = {i for i in self.sent if i in expected}
        return {
            "expected": len(expected),
            "sent": len(sent),
            "missed": len(expected - sent),
            "duplicates": sum(1 for i in expected if self.sent[i] > 1),
        }


def steady_schedule(entries: int, every_s: int, jitter_s: int) -> Schedule:
    return Schedule(
        [
            Entry(
                name=f"job{i}",
                task="tasks.job",
                trigger=Every(every_s),
                jitter=f"{jitter_s}s",
                max_late="60s",
            )
            for i in range(entries)
        ],
        namespace="scale",
    )


def fleet_figures(
    schedule: Schedule, count: int, preferred: bool, minutes: float
) -> dict[str, Any]:
    """One simulated run: warm up, count, check."""
    fleet = SimFleet(schedule, count, preferred)
    fleet.run_until(START_MS + WARM_UP_MS)
    fleet.store.reset()
    for node in fleet.nodes:
        node.cpu_s = 0.0
        node.outcomes.clear()
    measured_from = fleet.clock.ms
    end = measured_from + int(minutes * 60_000)
    fleet.run_until(end)
    check = fleet.check(measured_from + 1_000, end - 61_000)
    firings = sum(
        fleet.nodes[i].outcomes["won"] + fleet.nodes[i].outcomes["takeover"] for i in range(count)
    )
    items, calls = fleet.store.items, fleet.store.calls
    per = max(firings, 1)
    seconds = (end - measured_from) / 1_000
    cpu = [n.cpu_s for n in fleet.nodes]
    return {
        "nodes": count,
        "mode": "preferred" if preferred else "every node",
        "firings": firings,
        "claims_per_firing": round(items["claim"] / per, 3),
        "store_ops_per_firing": round(
            (items["claim"] + items["commit"] + items["release"]) / per, 3
        ),
        "claim_calls_per_firing": round(calls["claim"] / per, 3),
        "board_calls_per_node_s": round((calls["post"] + calls["read_notes"]) / count / seconds, 2),
        "cpu_per_node_s": round(sum(cpu) / count, 3),
        "cpu_us_per_firing_per_node": round(sum(cpu) / count / per * 1e6, 1),
        "cpu_us_per_firing_fleet": round(sum(cpu) / per * 1e6, 1),
        "outcomes": dict(sum((n.outcomes for n in fleet.nodes), Counter())),
        "check": check,
    }


def traffic_figures(
    schedule: Schedule,
    count: int,
    seconds: float,
    step_ms: int = 250,
    churn_s: float | None = None,
) -> dict[str, Any]:
    """Each node's store traffic in a simulated fleet of ``count`` (preferred claimer on):
    round trips and bytes each way, per node per second and per firing, after a warm-up
    in which every node has joined and read the members.

    ``churn_s``: every that many seconds of the window one node leaves (it stops: its
    notes run out) and a new one joins; the figures are then those of the nodes that
    stayed throughout, what a join and a leave cost the rest of the fleet."""
    fleet = SimFleet(schedule, count, True, step_ms=step_ms)
    fleet.run_until(START_MS + WARM_UP_MS)
    fleet.store.reset()
    for node in fleet.nodes:
        node.outcomes.clear()
    measured_from = fleet.clock.ms
    end = measured_from + int(seconds * 1_000)
    changes = 0
    if churn_s:
        every_ms = int(churn_s * 1_000)
        while fleet.clock.ms + every_ms <= end and changes < count:
            fleet.run_until(fleet.clock.ms + every_ms)
            fleet.nodes[changes].frozen = True
            fleet.nodes.append(fleet.node(f"joined{changes}"))
            changes += 1
    fleet.run_until(end)
    elapsed = (fleet.clock.ms - measured_from) / 1_000
    firings = sum(n.outcomes["won"] + n.outcomes["takeover"] for n in fleet.nodes)
    stayed = fleet.nodes[changes:count]
    traffic = [n.traffic for n in stayed]
    count = len(stayed)
    trips = [t.round_trips / elapsed for t in traffic]
    read = [t.received / elapsed for t in traffic]
    sent = [t.sent / elapsed for t in traffic]
    calls: Counter[str] = sum((t.calls for t in traffic), Counter())
    per_firing = max(firings, 1) / elapsed  # firings per second, fleet-wide
    return {
        "nodes": count,
        "seconds": elapsed,
        "firings": firings,
        "round_trips_per_node_s": round(sum(trips) / count, 2),
        "round_trips_per_node_s_max": round(max(trips), 2),
        "bytes_in_per_node_s": round(sum(read) / count),
        "bytes_in_per_node_s_max": round(max(read)),
        "bytes_out_per_node_s": round(sum(sent) / count),
        "round_trips_per_node_per_firing": round(sum(trips) / count / per_firing, 3),
        "bytes_per_node_per_firing": round((sum(read) + sum(sent)) / count / per_firing),
        "calls_per_node_s": {k: round(v / count / elapsed, 2) for k, v in sorted(calls.items())},
        "bytes_per_node_s": {
            k: round(v / count / elapsed)
            for k, v in sorted(sum((t.bytes for t in traffic), Counter()).items())
        },
        "views": sorted({len(n.scheduler.preference.view.nodes) for n in stayed}),
        "joins_and_leaves": changes,
    }


def traffic_report(rows: list[dict[str, Any]], p: dict[str, Any]) -> None:
    print(
        f"traffic per node: {p['entries']} entries every {p['every_s']}s, jitter "
        f"{p['jitter_s']}s ({p['firings_per_s']} firings/s fleet-wide), preferred claimer"
        + (
            f"; one node leaves and one joins every {p['churn_s']}s (figures: the nodes "
            "that stayed)"
            if p.get("churn_s")
            else ""
        )
    )
    print(
        f"{'nodes':>5} {'firings':>7} {'rt/node/s':>9} {'(max)':>6} {'B in/node/s':>11} "
        f"{'(max)':>7} {'B out/node/s':>12} {'rt/node/f':>9} {'B/node/f':>8}"
    )
    for r in rows:
        print(
            f"{r['nodes']:>5} {r['firings']:>7} {r['round_trips_per_node_s']:>9} "
            f"{r['round_trips_per_node_s_max']:>6} {r['bytes_in_per_node_s']:>11} "
            f"{r['bytes_in_per_node_s_max']:>7} {r['bytes_out_per_node_s']:>12} "
            f"{r['round_trips_per_node_per_firing']:>9} {r['bytes_per_node_per_firing']:>8}"
        )


# -- the burst, with real processes on Redis -------------------------------------------

BURST_NODE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import redis
from datetime import UTC, datetime
from beatless import Entry, Every, Schedule
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store

_, root, url, namespace, node, tenants, at_s, until_s, preferred, path = sys.argv
anchor = datetime.fromtimestamp(int(at_s), UTC)
entry = Entry(name="burst", task="burst", trigger=Every(3600, anchor=anchor),
              tenants=[f"t{i}" for i in range(int(tenants))], max_late="60s")
if path == "atomic":  # Dramatiq on its RedisBroker: one script claims and pushes
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    import beatless.dramatiq as bd

    broker = RedisBroker(url=url, namespace=namespace)
    beat = bd.Beatless(store=url, namespace=namespace, entries=[entry], node=node,
                       preferred_claimer=preferred == "1")
    broker.add_middleware(beat)
    dramatiq.actor(lambda tenant=None: None, actor_name="burst", queue_name="burst",
                   broker=broker)
    scheduler = beat.scheduler(broker)
else:  # two-phase: claim, send (one RPUSH per firing, as a broker client would), commit
    client = redis.Redis.from_url(url)
    key = f"{namespace}:sent"

    def enqueue(firing):
        client.rpush(key, firing.id)

    schedule = Schedule([entry], namespace=namespace)
    store = open_store(url, namespace=namespace)
    scheduler = Scheduler(schedule, store=store, enqueue=enqueue, node=node,
                          preferred=preferred == "1")
scheduler.start()
time.sleep(max(0.0, float(at_s) - 1 - time.time()))
cpu = time.process_time()
time.sleep(max(0.0, float(until_s) - time.time()))
cpu = time.process_time() - cpu
scheduler.stop(timeout=5)
stats = scheduler.stats["burst"]
print(json.dumps({"cpu_s": cpu, "won": stats.won, "lost": stats.lost,
                  "delegated": stats.delegated, "view": len(scheduler.preference.view.nodes)}))
"""
BURST_LEAD_S = 14
"""The nodes start this long before the instant: time to start and to read the registry."""

FLOOR_NODE = """
import sys, time
import redis

_, url, key, count, at_s = sys.argv
client = redis.Redis.from_url(url)
client.ping()
item = "0" * 64  # a firing id's length
time.sleep(max(0.0, float(at_s) - time.time()))
for _ in range(int(count)):
    client.rpush(key, item)
"""


def floor(url: str, count: int, items: int) -> dict[str, Any]:
    """``count`` processes push ``items`` between them with one ``RPUSH`` each, starting at
    one instant, with no scheduler: what the two-phase burst's enqueue costs on its own."""
    import redis

    key = f"scale-{uuid.uuid4().hex[:8]}:floor"
    at = time.time() + 2 + 0.1 * count
    client = redis.Redis.from_url(url)
    shares = [items // count + (1 if i < items % count else 0) for i in range(count)]
    processes = [
        subprocess.Popen([sys.executable, "-c", FLOOR_NODE, url, key, str(share), str(at)])
        for share in shares
    ]
    try:
        done_at = _watch(client, key, items, at, at + 30)
        for process in processes:
            process.wait(timeout=max(1.0, at + 30 - time.time()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        client.delete(key)
    return {
        "nodes": count,
        "items": items,
        "last_pushed_after_s": None if done_at is None else round(done_at - at, 3),
    }


def burst(
    url: str, count: int, tenants: int, preferred: bool, path: str, *, lead_s: int = BURST_LEAD_S
) -> dict[str, Any]:
    """``count`` node processes; ``tenants`` firings due at one instant, ``lead_s`` after
    the start. The queue's length is watched from here, so the time the last
    firing reached the broker is known within a few milliseconds."""
    import redis

    namespace = f"scale-{uuid.uuid4().hex[:8]}"
    at = int(time.time()) + lead_s
    until = at + 10
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [url, namespace, "", str(tenants), str(at), str(until), str(int(preferred)), path]
    queue = f"{namespace}:burst" if path == "atomic" else f"{namespace}:sent"
    client = redis.Redis.from_url(url)
    processes = []
    try:
        for i in range(count):
            args[2] = f"b{i}"
            command = [sys.executable, "-c", BURST_NODE, str(ROOT), *args]
            processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE))
        done_at = _watch(client, queue, tenants, at, until)
        outputs = [p.communicate(timeout=until - time.time() + 60)[0] for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    ids = Counter(i.decode() for i in client.lrange(queue, 0, -1))
    _forget(client, namespace)
    nodes = [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs if out.strip()]
    return {
        "nodes": count,
        "path": path,
        "mode": "preferred" if preferred else "every node",
        "firings": tenants,
        "sent": len(ids),
        "duplicates": sum(1 for n in ids.values() if n > 1),
        "missed": tenants - len(ids),
        "last_sent_after_s": None if done_at is None else round(done_at - at, 3),
        "won_per_node": [n["won"] for n in nodes],
        "claims_per_firing": round(sum(n["won"] + n["lost"] for n in nodes) / tenants, 2),
        "cpu_per_node_s": [round(n["cpu_s"], 3) for n in nodes],
        "exit_codes": [p.returncode for p in processes],
    }


def _watch(client: Any, queue: str, count: int, at: float, until: float) -> float | None:
    """When the list ``queue`` first held ``count`` items (polled every 2 ms)."""
    sleep_until = at - 0.5
    time.sleep(max(0.0, sleep_until - time.time()))
    while time.time() < until:
        if client.llen(queue) >= count:
            return time.time()
        time.sleep(0.002)
    return None


def _forget(client: Any, namespace: str) -> None:
    """Delete the keys this run's namespace left (claims live ~70 s otherwise)."""
    for key in client.scan_iter(match=f"*{namespace}*", count=1_000):
        client.delete(key)


# -- the report ------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    schedule = steady_schedule(args.entries, args.every, args.jitter)
    if args.traffic:
        rows = [
            traffic_figures(schedule, count, args.seconds, args.step_ms, args.churn)
            for count in args.traffic
        ]
        return {"parameters": _parameters(args), "traffic": rows, "ok": True}
    fleet = [
        fleet_figures(schedule, count, preferred, args.minutes)
        for count in args.nodes
        for preferred in (False, True)
    ]
    result: dict[str, Any] = {"parameters": _parameters(args), "fleet": fleet}
    if not args.no_burst:
        result["burst"] = [
            burst(args.redis, count, args.burst, preferred, path)
            for path in args.burst_path
            for count in args.burst_nodes
            for preferred in (False, True)
        ]
        if "two-phase" in args.burst_path:
            result["floor"] = [floor(args.redis, count, args.burst) for count in args.burst_nodes]
    result["ok"] = all(
        r["check"]["missed"] == 0 and r["check"]["duplicates"] == 0 for r in fleet
    ) and all(b["missed"] == 0 and b["duplicates"] == 0 for b in result.get("burst", []))
    return result


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "entries": args.entries,
        "every_s": args.every,
        "jitter_s": args.jitter,
        "minutes": args.minutes,
        "firings_per_s": round(args.entries / args.every, 2),
        "churn_s": args.churn,
    }


def report(result: dict[str, Any]) -> None:
    p = result["parameters"]
    if "traffic" in result:
        traffic_report(result["traffic"], p)
        return
    print(
        f"fleet: {p['entries']} entries every {p['every_s']}s, jitter {p['jitter_s']}s "
        f"({p['firings_per_s']} firings/s), {p['minutes']} simulated minutes after warm-up"
    )
    print(
        f"{'nodes':>5} {'mode':<10} {'firings':>7} {'claims/f':>8} {'ops/f':>6} "
        f"{'board/node/s':>12} {'CPU/node s':>10} {'us/f/node':>9} {'missed':>6} {'dup':>4}"
    )
    for r in result["fleet"]:
        print(
            f"{r['nodes']:>5} {r['mode']:<10} {r['firings']:>7} {r['claims_per_firing']:>8} "
            f"{r['store_ops_per_firing']:>6} {r['board_calls_per_node_s']:>12} "
            f"{r['cpu_per_node_s']:>10} {r['cpu_us_per_firing_per_node']:>9} "
            f"{r['check']['missed']:>6} {r['check']['duplicates']:>4}"
        )
    for b in result.get("burst", []):
        print(
            f"burst: {b['firings']} firings at one instant, {b['nodes']} node processes, "
            f"{b['path']}, {b['mode']}: last enqueued {b['last_sent_after_s']}s after the "
            f"instant, {b['claims_per_firing']} claims per firing; "
            f"sent {b['sent']}, missed {b['missed']}, duplicates {b['duplicates']}; won per "
            f"node {b['won_per_node']}, CPU per node over the burst {b['cpu_per_node_s']}s"
        )
    for f in result.get("floor", []):
        print(
            f"floor: the two-phase enqueue alone, {f['items']} RPUSH from {f['nodes']} "
            f"processes at one instant, no scheduler: last pushed {f['last_pushed_after_s']}s "
            f"after the instant"
        )
    print("ok" if result["ok"] else "FAILED: a firing missed or sent twice")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 10, 50])
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--every", type=int, default=10, help="seconds between occurrences")
    parser.add_argument("--jitter", type=int, default=4, help="jitter window in seconds")
    parser.add_argument("--minutes", type=float, default=5, help="simulated minutes measured")
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument(
        "--traffic",
        type=int,
        nargs="+",
        metavar="NODES",
        help="only each node's store traffic, at these fleet sizes (e.g. 10 100 1000)",
    )
    parser.add_argument("--seconds", type=float, default=30, help="simulated seconds measured")
    parser.add_argument(
        "--churn",
        type=float,
        metavar="SECONDS",
        help="with --traffic: one node leaves and one joins every SECONDS of the window; "
        "the figures are those of the nodes that stayed",
    )
    parser.add_argument("--step-ms", type=int, default=250, help="simulated clock step")
    parser.add_argument("--burst", type=int, default=10_000, help="firings due at one instant")
    parser.add_argument("--burst-nodes", type=int, nargs="+", default=[3, 10])
    parser.add_argument(
        "--burst-path", nargs="+", choices=["atomic", "two-phase"], default=["atomic", "two-phase"]
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
