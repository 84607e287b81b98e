"""Live entries on running nodes: commit → applied on every node, and the cost of a change.

    python bench/live.py                      # Redis: 3 and 10 nodes; 10,000 and 100,000 entries
    python bench/live.py --store postgresql://127.0.0.1:5432/test --edits 10 --json
    python bench/live.py --nodes --entries 1000 10000 100000   # the cost of a change only
    python bench/live.py --quick                   # the CI smoke: 3 nodes, 5 edits, 500 entries

**Propagation**: N schedulers (threads of this process, each with its own store client)
run on the store; a writer commits ``--edits`` revisions one after another, each at a
random instant of a node's sync period (a second) after the last was applied, and for each
the time from its commit (store clock) until every node's loop has applied it is taken,
per node: p50 and p99 over all edits and nodes (goal: p99 ≤ 1.5 s, under the 2 s fence).
With ``--runs``, each figure is the median of the runs.

**One change among many**: for each count of ``--entries``, that many live entries are
written in one revision; a node starts on them (its scheduler built and its first wake,
which plans every entry: the start-up time), its view's memory is taken under
``tracemalloc`` (a second read, since ``tracemalloc`` slows what it watches), then one
entry is changed ``CHANGES`` times: the median time the node takes to read that revision
and apply it in a wake (work per change, not per entry: the same at every count).

Every namespace the bench writes is deleted at the end (its kept notes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
import uuid
from datetime import timedelta
from typing import Any

from beatless import Entry, Every, Schedule
from beatless.fleet._notes import SYNC_EVERY_MS
from beatless.live import Live
from beatless.live._ledger import Ledger
from beatless.node._live import LiveView
from beatless.node.scheduler import Scheduler
from beatless.stores import ClaimStore, open_store


def entry(name: str, args: tuple[Any, ...] = ()) -> Entry:
    return Entry(name=name, task="t.job", trigger=Every(timedelta(hours=1)), args=args)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def forget(store: ClaimStore, namespace: str) -> None:
    """Delete the live entries the bench wrote (its revisions and head)."""
    ledger = Ledger(store, namespace)
    for kind in (ledger.revisions_kind, ledger.head_kind):
        keys = list(store.read_kept(kind))
        if keys:
            store.delete_kept(kind, keys)


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
    rng = random.Random(nodes)
    try:
        time.sleep(1.5)
        for n in range(edits):
            time.sleep(rng.uniform(0, SYNC_EVERY_MS / 1_000))  # at any instant of a sync
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
        forget(live.store, namespace)
    return {
        "nodes": nodes,
        "edits": edits,
        "applied_p50_s": round(statistics.median(lags), 3),
        "applied_p99_s": round(pct(lags, 99), 3),
        "applied_max_s": round(max(lags), 3),
    }


CHANGES = 5


def one_change(url: str, entries: int) -> dict[str, Any]:
    namespace = f"benchlive{uuid.uuid4().hex[:8]}"
    store = open_store(url, namespace=namespace)
    live = Live(store, namespace=namespace)
    try:
        began = time.perf_counter()
        live.put_many([entry(f"e{i}") for i in range(entries)])
        written = time.perf_counter() - began
        schedule = Schedule([entry("code")], namespace=namespace)
        began = time.perf_counter()
        node = Scheduler(schedule, store=store, node="n0")
        node.tick()
        start_s = time.perf_counter() - began
        assert len(node.live.live_entries()) == entries
        tracemalloc.start()
        view = LiveView(store, schedule, enabled=True, now_ms=store.time_ms, offset_ms=lambda: 0)
        view.read()
        view.apply()
        memory = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del view
        changes = []
        for n in range(CHANGES):
            live.put(entry("e1", (n,)))
            began = time.perf_counter()
            node.live.read()
            node.tick()
            changes.append(time.perf_counter() - began)
        assert node.live.revision == 1 + CHANGES
    finally:
        forget(store, namespace)
    return {
        "entries": entries,
        "write_all_s": round(written, 3),
        "node_start_s": round(start_s, 3),
        "view_memory_mb": round(memory / 1e6, 1),
        "memory_per_entry_bytes": round(memory / entries),
        "one_change_ms": round(statistics.median(changes) * 1_000, 2),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure of ``runs`` (alike but for their figures): the median over the runs."""
    return {
        key: statistics.median(run[key] for run in runs) if key.endswith(("_s", "_ms")) else value
        for key, value in runs[0].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--nodes", type=int, nargs="*", default=[3, 10])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=1, help="the median of this many runs")
    parser.add_argument("--quick", action="store_true", help="3 nodes, 5 edits, 500 entries")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.edits, args.entries = [3], 5, [100, 500]
    results: dict[str, Any] = {
        "store": args.store.split("://")[0],
        "runs": args.runs,
        "propagation": [
            median_of([propagation(args.store, n, args.edits) for _ in range(args.runs)])
            for n in args.nodes
        ],
        "one_change": [
            median_of([one_change(args.store, n) for _ in range(args.runs)]) for n in args.entries
        ],
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
    print(
        f"{'live entries':>12} | {'written':>9} | {'node start':>10} | {'view memory':>11} | "
        f"{'per entry':>9} | one change"
    )
    for one in results["one_change"]:
        print(
            f"{one['entries']:>12,} | {one['write_all_s']:>7} s | {one['node_start_s']:>8} s | "
            f"{one['view_memory_mb']:>8} MB | {one['memory_per_entry_bytes']:>7} B | "
            f"{one['one_change_ms']} ms"
        )


if __name__ == "__main__":
    main()
