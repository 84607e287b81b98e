"""Fan-out that scales: a million tenants of one entry over a 10-minute window, three nodes.

Three node processes (``--nodes``), each a :class:`~beatless.node.scheduler.Scheduler` started
with ``scheduler.start()`` (its loop and its board thread: registry, history, controls),
share one Redis claim store under a namespace of their own for this run. The schedule is
one entry of ``--tenants`` tenants whose jitter spreads them over ``--window`` seconds;
its occurrence falls ``--lead`` seconds after the start, on the real clock, and
``max_late`` is the window + 90 s. A node's enqueue only appends the won firing's id to a
file of its own. Prints, per node: peak RSS (``ru_maxrss``), RSS just before the
occurrence (fan-out prepared), firings won, late, the longest wait from a release to its
enqueue, CPU; for the fleet: duplicates (ids won twice), misses (firings of the
occurrence never won), ids won that are not of the occurrence, and the memory a node
holds per pending firing. The exit code is 1 unless there were no duplicates, no misses
and nothing late.

    python bench/scale_fanout.py                   # 10**6 tenants, 600 s window (~12 min)
    python bench/scale_fanout.py --quick           # 20,000 tenants, 30 s window (~1 min)
    python bench/scale_fanout.py --tenants 200000 --window 120 --json

Only the keys under ``beatless:{namespace}:`` of this run are written, and they are
deleted at the end; nothing else in the Redis database is touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from beatless import Entry, Every, Firing, Schedule
from beatless.schedule._fanout import FanOut
from beatless.schedule.firing import firing_id

ENTRY = "fan"
DEFAULT_STORE = "redis://127.0.0.1:6379/15"
LATE_MARGIN_S = 90.0
"""``max_late`` is the window plus this: room for a node that falls behind to catch up."""
DRAIN_S = 5.0
"""After the window, nodes run at most this long once every firing was won (the
preferred claimer's lower ranks claim a few seconds after a release)."""
MEASURED_TENANTS = 200_000
"""Tenants of the in-process measurement of the memory per pending firing."""


def tenant_names(count: int) -> Iterator[str]:
    """The tenants: ``tenant-0`` ... (13 characters at a million)."""
    return (f"tenant-{i}" for i in range(count))


def build_schedule(
    namespace: str, tenants: int, window_s: float, occurrence_ms: int
) -> tuple[Schedule, int]:
    """The schedule every node runs, and its occurrence's ``max_late`` in ms. The trigger
    is anchored at the occurrence; its interval keeps the one before out of ``max_late``
    at the start and the jitter under half the gap."""
    max_late_s = window_s + LATE_MARGIN_S
    interval_s = math.ceil(2 * (window_s + max_late_s))
    anchor = datetime.fromtimestamp(occurrence_ms / 1_000, UTC)
    entry = Entry(
        name=ENTRY,
        task="bench.fan",
        trigger=Every(interval_s, anchor),
        jitter=window_s,
        max_late=max_late_s,
        tenants=tuple(tenant_names(tenants)),
    )
    return Schedule([entry], namespace=namespace), entry.max_late_ms


def rss_mb() -> float:
    """This process's resident memory now (Linux ``VmRSS``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- one node ---------------------------------------------------------------------------


def node_main(spec: dict[str, Any]) -> None:
    """One node process: run the scheduler until told to stop, then write its figures."""
    from beatless.node.scheduler import Scheduler
    from beatless.stores import open_store

    rss_start = rss_mb()
    schedule, _ = build_schedule(
        spec["namespace"], spec["tenants"], spec["window_s"], spec["occurrence_ms"]
    )
    store = open_store(spec["store"], namespace=spec["namespace"])
    out = open(spec["ids"], "w", buffering=1 << 20)  # noqa: SIM115 - closed below
    lateness = [0, 0]  # max lateness after release (ms), firings enqueued

    def enqueue(firing: Firing) -> None:
        lateness[0] = max(lateness[0], int(time.time() * 1_000) - firing.release_ms)
        lateness[1] += 1
        out.write(firing.id + "\n")

    scheduler = Scheduler(schedule, store=store, enqueue=enqueue, node=spec["node"])
    rss_loaded = rss_mb()
    scheduler.start()
    stop = Path(spec["stop"])
    rss_before = None
    while not stop.exists():
        time.sleep(0.25)
        out.flush()
        if rss_before is None and time.time() * 1_000 >= spec["occurrence_ms"] - 500:
            rss_before = rss_mb()
    scheduler.stop(timeout=10)
    out.close()
    store.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_end = rss_mb()
    # The kernel's high-water mark lags the current RSS by up to a few pages' accounting:
    # the peak is the larger of it and every sample taken.
    peak = max(peak_rss_mb(), rss_end, rss_before or 0.0, rss_loaded)
    figures = {
        "node": spec["node"],
        "rss_start_mb": round(rss_start, 1),
        "rss_loaded_mb": round(rss_loaded, 1),
        "rss_before_occurrence_mb": None if rss_before is None else round(rss_before, 1),
        "rss_end_mb": round(rss_end, 1),
        "peak_rss_mb": round(peak, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "enqueued": lateness[1],
        "max_lateness_ms": lateness[0],
        "stats": scheduler.stats[ENTRY].as_dict(),
    }
    Path(spec["figures"]).write_text(json.dumps(figures))


# -- the fleet --------------------------------------------------------------------------


def run(
    tenants: int, nodes: int, window_s: float, store_url: str, *, lead_s: float = 20.0
) -> dict[str, Any]:
    """Run one occurrence of ``tenants`` over ``window_s`` on ``nodes`` node processes
    sharing the Redis store at ``store_url``; return the figures (see the module)."""
    import redis

    namespace = f"scale-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(store_url)
    before = _redis_figures(client)
    occurrence_ms = (int(time.time() + lead_s) + 1) * 1_000
    _, max_late_ms = build_schedule(namespace, 1, window_s, occurrence_ms)
    started = time.monotonic()
    try:
        with TemporaryDirectory(prefix="beatless-scale-") as tmp:
            common = {
                "namespace": namespace,
                "tenants": tenants,
                "window_s": window_s,
                "occurrence_ms": occurrence_ms,
                "store": store_url,
            }
            figures = _run_nodes(Path(tmp), common, nodes)
            after = _redis_figures(client)
            check = _check(Path(tmp), namespace, tenants, nodes, occurrence_ms)
    finally:
        removed = _clean(client, namespace)
        client.close()
    late = sum(_late(node) for node in figures)
    return {
        "parameters": {
            "tenants": tenants,
            "nodes": nodes,
            "window_s": window_s,
            "max_late_s": max_late_ms / 1_000,
            "lead_s": lead_s,
            "store": store_url,
            "namespace": namespace,
        },
        "nodes": figures,
        "fleet": {
            **check,
            "late": late,
            "won": sum(n["stats"]["won"] or 0 for n in figures),
            "max_lateness_ms": max(n["max_lateness_ms"] for n in figures),
            "peak_rss_mb": max(n["peak_rss_mb"] for n in figures),
            "cpu_s": round(sum(n["cpu_s"] for n in figures), 1),
            "wall_s": round(time.monotonic() - started, 1),
            "redis_mb": round((after["used_memory"] - before["used_memory"]) / 2**20, 1),
            "redis_cpu_s": round(after["cpu_s"] - before["cpu_s"], 1),
            "keys_removed": removed,
        },
        "memory": pending_memory(min(tenants, MEASURED_TENANTS), window_s),
        "ok": check["duplicates"] == 0 and check["misses"] == 0 and late == 0,
    }


def _run_nodes(tmp: Path, common: dict[str, Any], nodes: int) -> list[dict[str, Any]]:
    """Start the node processes, stop them once every firing is won (or the occurrence
    is late), and read what each wrote."""
    stop = tmp / "stop"
    specs = [
        {
            **common,
            "node": f"node-{k}",
            "ids": str(tmp / f"node-{k}.ids"),
            "figures": str(tmp / f"node-{k}.json"),
            "stop": str(stop),
        }
        for k in range(nodes)
    ]
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--node-child", json.dumps(spec)],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"{spec['node']}.log", "w"),  # noqa: SIM115 - the child owns it
        )
        for spec in specs
    ]
    try:
        files = [Path(s["ids"]) for s in specs]
        _wait_for_the_firings(files, common, children)
        stop.touch()
        for child in children:
            child.wait(timeout=60)
    finally:
        for child in children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
    figures = []
    for spec, child in zip(specs, children, strict=True):
        path = Path(spec["figures"])
        if child.returncode != 0 or not path.exists():
            log = (tmp / f"{spec['node']}.log").read_text()[-2_000:]
            raise RuntimeError(f"{spec['node']} exited {child.returncode}: {log}")
        figures.append(json.loads(path.read_text()))
    return figures


def _wait_for_the_firings(
    files: list[Path], common: dict[str, Any], children: list[subprocess.Popen[bytes]]
) -> None:
    """Until the window is over and the nodes have written an id per tenant between them
    (or the occurrence is late, or a node died)."""
    tenants = common["tenants"]
    window_end = common["occurrence_ms"] / 1_000 + common["window_s"]
    deadline = window_end + LATE_MARGIN_S + 5
    counted = dict.fromkeys(files, 0)
    offsets = dict.fromkeys(files, 0)
    while time.time() < deadline:
        time.sleep(1.0)
        if any(child.poll() is not None for child in children):
            return
        for path in files:
            if path.exists():
                with path.open("rb") as ids:
                    ids.seek(offsets[path])
                    chunk = ids.read()
                counted[path] += chunk.count(b"\n")
                offsets[path] += len(chunk)
        if time.time() >= window_end and sum(counted.values()) >= tenants:
            time.sleep(min(DRAIN_S, max(0.0, deadline - time.time())))
            return


def _check(
    tmp: Path, namespace: str, tenants: int, nodes: int, occurrence_ms: int
) -> dict[str, int]:
    """Duplicates, misses and strays against every firing id of the occurrence, derived
    here from the address rule alone (``sha256(namespace/entry/tenant@occurrence_ms)``)."""
    expected = {firing_id(f"{namespace}/{ENTRY}/{t}", occurrence_ms) for t in tenant_names(tenants)}
    won: set[str] = set()
    duplicates = strays = 0
    for k in range(nodes):
        with (tmp / f"node-{k}.ids").open() as ids:
            for line in ids:
                id_ = line.rstrip("\n")
                if id_ in won:
                    duplicates += 1
                elif id_ in expected:
                    won.add(id_)
                else:
                    strays += 1
    return {
        "expected": len(expected),
        "won_once": len(won),
        "duplicates": duplicates,
        "misses": len(expected) - len(won),
        "strays": strays,
    }


def _late(node: dict[str, Any]) -> int:
    stats = node["stats"]
    return int((stats.get("late_node") or 0) + (stats.get("late_store") or 0))


def pending_memory(tenants: int, window_s: float) -> dict[str, Any]:
    """What a node holds per pending firing of a prepared fan-out (its keys, buckets and
    the fan-out object), and per tenant of the entry's list, measured with tracemalloc
    in this process."""
    tracemalloc.start()
    names = tuple(tenant_names(tenants))
    held_names, _ = tracemalloc.get_traced_memory()
    entry = Entry(
        name=ENTRY,
        task="bench.fan",
        trigger=Every(math.ceil(4 * window_s) + 1),
        jitter=window_s,
        max_late=window_s + LATE_MARGIN_S,
        tenants=names,
    )
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    fan = FanOut(entry, f"bench/{ENTRY}", 1_800_000_000_000, names)
    while not fan.is_prepared:
        fan.prepare()
    fan.next_release_ms()  # the first bucket sorted, as at the first release
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del fan
    return {
        "measured_tenants": tenants,
        "bytes_per_pending_firing": round((held - start) / tenants, 2),
        "peak_bytes_per_firing_while_preparing": round((peak - start) / tenants, 2),
        "bytes_per_tenant_name": round(held_names / tenants, 1),
    }


def _redis_figures(client: Any) -> dict[str, float]:
    memory, cpu = client.info("memory"), client.info("cpu")
    return {
        "used_memory": float(memory["used_memory"]),
        "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
    }


def _clean(client: Any, namespace: str) -> int:
    """Delete this run's keys (and only them): everything under its store prefix."""
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"beatless:{namespace}:*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            removed += client.unlink(*batch)
            batch.clear()
    if batch:
        removed += client.unlink(*batch)
    return int(removed)


# -- the command ------------------------------------------------------------------------


def print_figures(result: dict[str, Any]) -> None:
    p, fleet, memory = result["parameters"], result["fleet"], result["memory"]
    print(
        f"{p['tenants']:,} tenants over a {p['window_s']:g}s window (max_late "
        f"{p['max_late_s']:g}s), {p['nodes']} node processes on {p['store']}"
    )
    print("node     RSS start/loaded/before occ./end/peak (MB)   won      late  max lateness  CPU")
    for node in result["nodes"]:
        rss = "/".join(
            "-" if node[k] is None else f"{node[k]:.0f}"
            for k in (
                "rss_start_mb",
                "rss_loaded_mb",
                "rss_before_occurrence_mb",
                "rss_end_mb",
                "peak_rss_mb",
            )
        )
        stats = node["stats"]
        print(
            f"{node['node']:<8} {rss:<40} {stats['won'] or 0:>8,} {_late(node):>5} "
            f"{node['max_lateness_ms']:>9,} ms  {node['cpu_s']:.0f}s"
        )
        others = {k: v for k, v in stats.items() if v and k not in ("won",) and "lateness" not in k}
        if others:
            print(f"         {others}")
    print(
        f"fleet: {fleet['won_once']:,} of {fleet['expected']:,} won once, "
        f"{fleet['duplicates']} duplicates, {fleet['misses']} misses, {fleet['strays']} "
        f"strays, {fleet['late']} late, max lateness {fleet['max_lateness_ms']:,} ms"
    )
    print(
        f"memory per pending firing: {memory['bytes_per_pending_firing']} bytes "
        f"(peak {memory['peak_bytes_per_firing_while_preparing']} while preparing); "
        f"the entry's list: {memory['bytes_per_tenant_name']} bytes per tenant name "
        f"(measured on {memory['measured_tenants']:,})"
    )
    print(
        f"CPU of the nodes {fleet['cpu_s']:.0f}s, of Redis {fleet['redis_cpu_s']:.0f}s, "
        f"in {fleet['wall_s']:.0f}s; Redis grew {fleet['redis_mb']:.0f} MB "
        f"({fleet['keys_removed']:,} keys removed after)"
    )
    print("ok" if result["ok"] else "NOT OK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--window", type=float, default=600.0, help="jitter window, seconds")
    parser.add_argument("--lead", type=float, help="seconds from the start to the occurrence")
    parser.add_argument("--store", default=DEFAULT_STORE, help="a Redis URL")
    parser.add_argument(
        "--quick", action="store_true", help="20,000 tenants over 30 s: a smoke test"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--node-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node_child:
        node_main(json.loads(args.node_child))
        return 0
    if args.quick:
        args.tenants, args.window = 20_000, 30.0
    lead = args.lead if args.lead is not None else (8.0 if args.quick else 20.0)
    result = run(args.tenants, args.nodes, args.window, args.store, lead_s=lead)
    if args.json:
        print(json.dumps(result))
    else:
        print_figures(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
