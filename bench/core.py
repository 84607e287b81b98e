"""Benchmark of the beatless core: 100,000 addresses against the memory store.

    python bench/core.py [--tenants 10000] [--triggers 10] [--hours 1] [--json]

Builds ``triggers`` cron entries of ``tenants`` tenants each (one address per tenant),
all with a 120 s jitter, then measures:

* loading the schedule (entries + ``Schedule``, including the timing-rule checks);
* computing the first releases (``Scheduler`` construction + its first expanding wake);
* resident memory (RSS after each phase, and the process peak);
* one node driven by a fake clock through the simulated hours, stepping the clock and
  waking the scheduler as ``Scheduler.run`` would: CPU per simulated hour, firings per
  hour, CPU per firing, store round trips per wake with due firings;
* the same hours with three nodes sharing one memory store (each firing claimed by
  three, won by one), CPU per node;
* a check, computed independently of beatless (cronsim and sha256 directly), that every
  firing released in the simulated time was won exactly once and none was missed;
* stock ``celery.beat.Scheduler`` over the same 100,000 addresses, when celery is
  importable (see ``bench/celery_beat.py``, run in its own process).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import report
from cronsim import CronSim

from beatless import Cron, Entry, Schedule
from beatless.node.scheduler import Decision, Scheduler
from beatless.stores.base import ClaimRequest, Note, Outcome
from beatless.stores.memory import MemoryStore

NAMESPACE = "bench"
T0 = datetime(2026, 1, 5, tzinfo=UTC)
"""The top of the first simulated hour (a fixed instant, so every run is the same)."""
LEAD_MS = 2_000
"""The clock starts this long before T0, so that the first wake expands the first
occurrence (the loop expands occurrences two seconds before they are due)."""
CELERY_TIMEOUT_S = 150
MB = 1024 * 1024


# -- the schedule --------------------------------------------------------------------


def cron_exprs(triggers: int, period_min: int) -> list[str]:
    """One cron per trigger, every ``period_min`` minutes, shifted by whole minutes."""
    if 60 % period_min or period_min < 5:
        raise SystemExit("--period must divide 60 and be at least 5 (minutes)")
    if not 1 <= triggers <= period_min:
        raise SystemExit(f"--triggers must be 1..{period_min} for distinct minutes")
    minutes = [i * period_min // triggers for i in range(triggers)]
    if period_min == 60:
        return [f"{m} * * * *" for m in minutes]
    return [f"{m}-59/{period_min} * * * *" for m in minutes]


def tenant_names(tenants: int) -> list[str]:
    return [f"t{i:06d}" for i in range(tenants)]


def build_schedule(exprs: Sequence[str], tenants: Sequence[str], jitter_s: int) -> Schedule:
    entries = [
        Entry(
            name=f"job{i}",
            task="bench.touch",
            trigger=Cron(expr),
            jitter=jitter_s,
            max_late=jitter_s + 60,
            tenants=tenants,
        )
        for i, expr in enumerate(exprs)
    ]
    return Schedule(entries, namespace=NAMESPACE)


# -- measuring -----------------------------------------------------------------------


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@dataclass
class Timed:
    wall_s: float = 0.0
    cpu_s: float = 0.0


def timed(fn: Callable[[], Any]) -> tuple[Any, Timed]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, Timed(time.perf_counter() - wall, time.process_time() - cpu)


class Clock:
    """A wall clock that moves only when told to, in whole milliseconds."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1_000


class CountingStore(MemoryStore):
    """The memory store, counting its round trips."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)
        self.claim_calls = 0
        self.commit_calls = 0

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self.claim_calls += 1
        return super().claim(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        self.commit_calls += 1
        return super().commit(ids, node=node, notes=notes)


@dataclass
class Node:
    """One scheduler and what the bench saw it do."""

    scheduler: Scheduler
    cpu_s: float = 0.0
    wakes: int = 0
    wakes_with_due: int = 0
    enqueued: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def wake_until_idle(self, now_ms: int, won: Counter[str]) -> None:
        """Wake as ``Scheduler.run`` does: again at once while something is due now."""
        while True:
            cpu = time.process_time()
            decisions = self.scheduler.tick()
            self.cpu_s += time.process_time() - cpu
            self.wakes += 1
            self.record(decisions, won)
            wake = self.scheduler.next_wake_ms()
            if wake is None or wake > now_ms:
                return

    def record(self, decisions: list[Decision], won: Counter[str]) -> None:
        if decisions:
            self.wakes_with_due += 1
        for decision in decisions:
            self.outcomes[decision.outcome] += 1
            if decision.outcome in ("won", "takeover"):
                won[decision.firing.id] += 1


def make_node(
    schedule: Schedule, store: CountingStore, clock: Clock, name: str
) -> tuple[Node, Timed]:
    """A node whose scheduler is built and woken once at the start; both are timed."""
    node = Node(scheduler=None)  # type: ignore[arg-type]

    def enqueue(_firing: object) -> None:
        node.enqueued += 1

    node.scheduler, cost = timed(
        lambda: Scheduler(schedule, store=store, enqueue=enqueue, clock=clock, node=name)
    )
    return node, cost


def simulate(
    nodes: Sequence[Node], clock: Clock, end_ms: int, step_ms: int, won: Counter[str]
) -> int:
    """Step the clock to ``end_ms``; at each step every node wakes, in a rotating order.

    Returns the time of the last step. The first step is at the clock's current time."""
    step = 0
    while clock.ms <= end_ms:
        for i in range(len(nodes)):
            nodes[(step + i) % len(nodes)].wake_until_idle(clock.ms, won)
        clock.ms += step_ms
        step += 1
    return clock.ms - step_ms


# -- the independent check -----------------------------------------------------------


def occurrences(expr: str, after_ms: int, until_ms: int) -> Iterator[int]:
    """cronsim's occurrences in ``(after_ms, until_ms]``, in UTC epoch milliseconds."""
    start = datetime.fromtimestamp(after_ms / 1_000, UTC)
    for moment in CronSim(expr, start):
        ms = round(moment.timestamp() * 1_000)
        if ms > until_ms:
            return
        if ms > after_ms:
            yield ms


def expected_firings(
    exprs: Sequence[str], tenants: Sequence[str], window_ms: int, after_ms: int, last_ms: int
) -> Iterator[tuple[str, bool]]:
    """Every firing the nodes could have planned: its id, and whether its release
    (occurrence + offset, from the formulas in DESIGN.md) fell by ``last_ms``."""
    for i, expr in enumerate(exprs):
        for occurrence in occurrences(expr, after_ms, last_ms):
            for tenant in tenants:
                raw = f"{NAMESPACE}/job{i}/{tenant}@{occurrence}".encode()
                d = hashlib.sha256(raw).digest()
                offset = (window_ms * (int.from_bytes(d[:8], "big") >> 11)) >> 53
                yield str(uuid.UUID(bytes=d[:16])), occurrence + offset <= last_ms


def check(won: Counter[str], firings: Iterator[tuple[str, bool]]) -> dict[str, Any]:
    """Exactly once: every released firing won once, none twice, nothing else won."""
    expected = accounted = missed = duplicates = 0
    for id_, released in firings:
        if released:
            count = won.get(id_, 0)
            expected += 1
            accounted += count
            missed += count == 0
            duplicates += count > 1
    unexpected = sum(won.values()) - accounted
    return {
        "expected": expected,
        "won": sum(won.values()),
        "missed": missed,
        "duplicates": duplicates,
        "unexpected": unexpected,
        "ok": missed == duplicates == unexpected == 0,
    }


# -- the runs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What every run simulates: the schedule's shape and the simulated time."""

    exprs: list[str]
    tenants: list[str]
    jitter_s: int
    step_ms: int
    start_ms: int
    last_ms: int
    hours: float

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        start = round(T0.timestamp() * 1_000) - LEAD_MS
        steps = round(args.hours * 3_600_000 / args.step_ms)
        return cls(
            exprs=cron_exprs(args.triggers, args.period),
            tenants=tenant_names(args.tenants),
            jitter_s=args.jitter,
            step_ms=args.step_ms,
            start_ms=start,
            last_ms=start + (steps - 1) * args.step_ms,
            hours=steps * args.step_ms / 3_600_000,
        )

    @property
    def max_late_ms(self) -> int:
        return (self.jitter_s + 60) * 1_000

    def check(self, won: Counter[str]) -> dict[str, Any]:
        firings = expected_firings(
            self.exprs,
            self.tenants,
            self.jitter_s * 1_000,
            self.start_ms - self.max_late_ms,
            self.last_ms,
        )
        return check(won, firings)


def load_phase(plan: Plan) -> tuple[Schedule, dict[str, Any], dict[str, float]]:
    memory = {"rss_before_mb": rss_mb()}
    schedule, cost = timed(lambda: build_schedule(plan.exprs, plan.tenants, plan.jitter_s))
    memory["rss_after_load_mb"] = rss_mb()
    memory["peak_after_load_mb"] = peak_rss_mb()
    load = {
        "wall_s": cost.wall_s,
        "cpu_s": cost.cpu_s,
        "addresses": len(plan.tenants) * len(plan.exprs),
    }
    return schedule, load, memory


def one_node(plan: Plan, schedule: Schedule, memory: dict[str, float]) -> dict[str, Any]:
    """The first releases, then one node through the simulated hours."""
    clock = Clock(plan.start_ms)
    store = CountingStore(clock=clock)
    won: Counter[str] = Counter()
    node, build = make_node(schedule, store, clock, "node-1")
    wall = time.perf_counter()
    node.wake_until_idle(clock.ms, won)
    first = {
        "wall_s": build.wall_s + time.perf_counter() - wall,
        "cpu_s": build.cpu_s + node.cpu_s,
        "scheduler_cpu_s": build.cpu_s,
        "first_wake_cpu_s": node.cpu_s,
        "firings_planned": len(plan.tenants)
        * sum(
            any(occurrences(e, plan.start_ms - plan.max_late_ms, plan.start_ms + LEAD_MS))
            for e in plan.exprs
        ),
    }
    memory["rss_after_first_releases_mb"] = rss_mb()
    memory["peak_after_first_releases_mb"] = peak_rss_mb()
    clock.ms += plan.step_ms
    simulate([node], clock, plan.last_ms, plan.step_ms, won)
    memory["peak_after_one_node_mb"] = peak_rss_mb()
    sim = node_figures(plan, node, store)
    sim["check"] = plan.check(won)
    sim["enqueued"] = node.enqueued
    return {"first_releases": first, "one_node": sim}


def node_figures(plan: Plan, node: Node, store: CountingStore) -> dict[str, Any]:
    decided = sum(node.outcomes.values())
    won = node.outcomes["won"] + node.outcomes["takeover"]
    return {
        "node": node.scheduler.node,
        "cpu_s": node.cpu_s,
        "cpu_per_hour_s": node.cpu_s / plan.hours,
        "won": won,
        "decided": decided,
        "firings_per_hour": won / plan.hours,
        "us_per_firing": 1e6 * node.cpu_s / decided if decided else None,
        "outcomes": dict(node.outcomes),
        "wakes": node.wakes,
        "wakes_with_due": node.wakes_with_due,
        "claim_calls": store.claim_calls,
        "commit_calls": store.commit_calls,
    }


def three_nodes(plan: Plan, schedule: Schedule, count: int) -> dict[str, Any]:
    """``count`` nodes on one memory store: each firing claimed by all, won by one."""
    clock = Clock(plan.start_ms)
    store = CountingStore(clock=clock)
    nodes = [make_node(schedule, store, clock, f"node-{i + 1}")[0] for i in range(count)]
    won: Counter[str] = Counter()
    simulate(nodes, clock, plan.last_ms, plan.step_ms, won)
    per_node = [node_figures(plan, node, store) for node in nodes]
    for figures in per_node:
        del figures["claim_calls"], figures["commit_calls"]
    cpu = sum(node.cpu_s for node in nodes)
    firings = sum(won.values())
    return {
        "nodes": per_node,
        "cpu_s": cpu,
        "cpu_per_hour_s": cpu / plan.hours,
        "firings": firings,
        "us_per_firing_all_nodes": 1e6 * cpu / firings if firings else None,
        "claim_calls": store.claim_calls,
        "commit_calls": store.commit_calls,
        "wakes_with_due": sum(node.wakes_with_due for node in nodes),
        "enqueued": sum(node.enqueued for node in nodes),
        "check": plan.check(won),
    }


def celery_beat(plan: Plan) -> dict[str, Any]:
    """Stock celery beat over the same addresses, in a process of its own."""
    command = [sys.executable, str(Path(__file__).with_name("celery_beat.py"))]
    command += ["--tenants", str(len(plan.tenants)), "--jitter", str(plan.jitter_s)]
    for expr in plan.exprs:
        command += ["--cron", expr]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CELERY_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"measured": False, "reason": f"took longer than {CELERY_TIMEOUT_S}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"measured": False, "reason": reason}
    return json.loads(lines[-1])


# -- main ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan.of(args)
    schedule, load, memory = load_phase(plan)
    result: dict[str, Any] = {
        "parameters": {
            "tenants": len(plan.tenants),
            "triggers": plan.exprs,
            "addresses": load["addresses"],
            "jitter_s": plan.jitter_s,
            "max_late_s": plan.max_late_ms // 1_000,
            "simulated_hours": plan.hours,
            "step_ms": plan.step_ms,
            "nodes": args.nodes,
        },
        "load": load,
    }
    result.update(one_node(plan, schedule, memory))
    result["memory"] = memory
    result["three_nodes"] = three_nodes(plan, schedule, args.nodes)
    result["celery_beat"] = (
        celery_beat(plan) if args.celery else {"measured": False, "reason": "--no-celery"}
    )
    result["ok"] = result["one_node"]["check"]["ok"] and result["three_nodes"]["check"]["ok"]
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000, help="tenants per trigger")
    parser.add_argument("--triggers", type=int, default=10, help="cron triggers (entries)")
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours")
    parser.add_argument("--period", type=int, default=60, help="minutes between occurrences")
    parser.add_argument("--jitter", type=int, default=120, help="jitter window, seconds")
    parser.add_argument("--step-ms", type=int, default=250, help="fake clock step")
    parser.add_argument("--nodes", type=int, default=3, help="nodes sharing one store")
    parser.add_argument("--no-celery", dest="celery", action="store_false")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        table = list(report.rows(result))
        width = max(len(name) for name, _ in table)
        for name, value in table:
            print(f"{name:<{width}}  {value}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
