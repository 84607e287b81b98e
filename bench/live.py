"""Live entries on running nodes: commit → applied on every node, and the cost of a change.

    python bench/live.py                           # Redis, 3 and 10 nodes, 10,000 entries
    python bench/live.py --store postgresql://127.0.0.1:5432/test --edits 10 --json

**Propagation**: N schedulers (threads of this process, each with its own store client)
run on the store; a writer commits ``--edits`` revisions one after another, and for each
the time from its commit (store clock) until every node's loop has applied it is taken,
per node: p50 and p99 over all edits and nodes (goal: p99 ≤ 1.5 s, under the 2 s fence).

**One change among many**: ``--entries`` live entries are written in one revision; a node's
view reads them (start-up: time and memory), then one entry is changed: the time a node
takes to read and apply that revision (work per change, not per entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
import uuid
from datetime import timedelta
from typing import Any

from beatless import Entry, Every, Schedule
from beatless.live import Live
from beatless.node._live import LiveView
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store


def entry(name: str, args: tuple[Any, ...] = ()) -> Entry:
    return Entry(name=name, task="t.job", trigger=Every(timedelta(hours=1)), args=args)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def propagation(url: str, nodes: int, edits: int) -> dict[str, Any]:
    namespace = f"benchlive{uuid.uuid4().hex[:8]}"
    schedule = Schedule([entry("code")], namespace=namespace)
    fleet = [
        Scheduler(schedule, store=open_store(url, namespace=namespace), node=f"n{i}")
        for i in range(nodes)
    ]
    for node in fleet:
        node.start()
    live = Live(open_store(url, namespace=namespace), namespace=namespace)
    lags: list[float] = []
    try:
        time.sleep(1.5)
        for n in range(edits):
            revision = live.put(entry("live", (n,)))
            pending = set(range(nodes))
            while pending:
                now = live.store.time_ms()
                for i in list(pending):
                    if fleet[i].live.revision >= revision.number:
                        lags.append((now - revision.committed_ms) / 1_000)
                        pending.discard(i)
                time.sleep(0.005)
    finally:
        for node in fleet:
            node.stop(timeout=5)
    return {
        "nodes": nodes,
        "edits": edits,
        "applied_p50_s": round(statistics.median(lags), 3),
        "applied_p99_s": round(pct(lags, 99), 3),
        "applied_max_s": round(max(lags), 3),
    }


def one_change(url: str, entries: int) -> dict[str, Any]:
    namespace = f"benchlive{uuid.uuid4().hex[:8]}"
    store = open_store(url, namespace=namespace)
    live = Live(store, namespace=namespace)
    began = time.perf_counter()
    live.put_many([entry(f"e{i}") for i in range(entries)])
    written = time.perf_counter() - began
    schedule = Schedule([], namespace=namespace)
    tracemalloc.start()
    began = time.perf_counter()
    view = LiveView(store, schedule, enabled=True, now_ms=store.time_ms, offset_ms=lambda: 0)
    view.read()
    view.apply()
    start_s = time.perf_counter() - began
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    live.put(entry("e1", (1,)))
    began = time.perf_counter()
    view.read()
    fresh = view.apply()
    change_s = time.perf_counter() - began
    assert view.revision == 2
    assert len(fresh) == 1
    return {
        "entries": entries,
        "write_all_s": round(written, 3),
        "node_start_s": round(start_s, 3),
        "node_memory_mb": round(memory / 1e6, 1),
        "memory_per_entry_bytes": round(memory / entries),
        "one_change_ms": round(change_s * 1_000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "store": args.store.split("://")[0],
        "propagation": [propagation(args.store, n, args.edits) for n in args.nodes],
        "one_change": one_change(args.store, args.entries),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for row in results["propagation"]:
        print(
            f"{results['store']}: {row['nodes']} nodes, {row['edits']} edits: commit → applied "
            f"p50 {row['applied_p50_s']} s, p99 {row['applied_p99_s']} s, "
            f"max {row['applied_max_s']} s"
        )
    one = results["one_change"]
    print(
        f"{one['entries']} live entries: written in {one['write_all_s']} s; a node reads them "
        f"in {one['node_start_s']} s, {one['node_memory_mb']} MB "
        f"({one['memory_per_entry_bytes']} B per entry); one change read and applied in "
        f"{one['one_change_ms']} ms"
    )


if __name__ == "__main__":
    main()
