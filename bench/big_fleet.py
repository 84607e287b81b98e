"""Benchmark of a big schedule on a fleet: what its nodes cost their Redis, steady.

    python bench/big_fleet.py [--entries 100000] [--nodes 3] [--seconds 150] [--json]

Starts its own ``redis-server`` on a free port (killed by pid at the end) and ``--nodes``
``beatless run`` processes on one schedule of ``--entries`` entries that do not fire in
the window (``0 0 29 2 *``: midnight on the 29th of February), so that what the server
does is the fleet's upkeep alone: each node's sync, the missed-firing sweeps, and the
entries' notes that ``beatless status`` reads. Once every node is ready, it resets the
server's statistics and reads, for ``--seconds`` (more than two minutes, so that each
minute's post of the entries falls in it):

* the server's CPU a second (``INFO cpu``), above its idle floor read before the nodes
  started;
* the entries' notes written a minute: the ``HSET`` calls (``INFO commandstats``, which
  counts those a script runs), less the few of the nodes' own notes, in schedules' worth;
* the longest command the server ran (``SLOWLOG``, from 1 ms): the time every other
  client, the claims of every node among them, waited behind it.

Run it with ``PYTHONPATH`` naming another checkout to measure that checkout's nodes (the
benchmark itself needs only ``redis``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery_redis import Redis  # the private redis-server, beside this file

NEVER = "0 0 29 2 *"
"""A cron expression that does not fire in a benchmark's window (nor until 2028)."""
IDLE_S = 10.0
READY_S = 300.0
SLOW_US = 1_000
OWN_HSETS_PER_NODE_S = 3.0
"""A node's own notes a second, at most (progress, member, alive, registry): taken out of
the ``HSET`` calls before they are counted as entry notes."""


def write_schedule(path: Path, count: int) -> None:
    lines = ['namespace = "big-fleet"', 'timezone = "UTC"', ""]
    for i in range(count):
        lines += ["[[entry]]", f'name = "never-{i:06d}"', f'task = "bench.noop.{i % 97}"']
        lines += [f'cron = "{NEVER}"', ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def start_nodes(count: int, schedule: Path, url: str, folder: Path) -> list[Any]:
    nodes = []
    for i in range(count):
        log = folder / f"node-{i}.log"
        with log.open("wb") as out:
            command = [sys.executable, "-m", "beatless", "run", str(schedule)]
            process = subprocess.Popen(
                [*command, "--store", url, "--node", f"big-{i}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        nodes.append((process, log))
    return nodes


def wait_ready(nodes: list[Any]) -> float:
    began = time.monotonic()
    while not all(" scheduling " in log.read_text(errors="replace") for _, log in nodes):
        if time.monotonic() - began > READY_S or any(p.poll() is not None for p, _ in nodes):
            tail = "\n".join(log.read_text(errors="replace")[-1_500:] for _, log in nodes)
            raise SystemExit(f"a node did not start:\n{tail}")
        time.sleep(0.2)
    return time.monotonic() - began


def stop_nodes(nodes: list[Any]) -> None:
    for process, _ in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    for process, _ in nodes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    schedule = folder / "big_fleet.toml"
    write_schedule(schedule, args.entries)
    redis = Redis.start(folder)
    client = redis.client
    nodes: list[Any] = []
    try:
        idle = redis.idle_cpu_s_per_s(IDLE_S)
        nodes = start_nodes(args.nodes, schedule, redis.url, folder)
        ready_s = wait_ready(nodes)
        time.sleep(args.settle)
        client.config_set("slowlog-log-slower-than", SLOW_US)
        client.config_set("slowlog-max-len", 10_000)
        client.slowlog_reset()
        client.config_resetstat()
        before, began = redis.cpu_s(), time.monotonic()
        time.sleep(args.seconds)
        used, seconds = redis.cpu_s() - before, time.monotonic() - began
        stats = client.info("commandstats")
        slow = client.slowlog_get(10_000)
    finally:
        stop_nodes(nodes)
        redis.stop()
    hsets = int(stats.get("cmdstat_hset", {}).get("calls", 0))
    entry_notes = max(0.0, hsets - OWN_HSETS_PER_NODE_S * args.nodes * seconds)
    longest = max(slow, key=lambda e: e["duration"], default=None)
    return {
        "entries": args.entries,
        "nodes": args.nodes,
        "seconds": round(seconds, 1),
        "ready_s": round(ready_s, 1),
        "redis_idle_cpu_ms_per_s": round(1e3 * idle, 2),
        "redis_cpu_ms_per_s_above_idle": round(1e3 * (used / seconds - idle), 2),
        "hset_calls": hsets,
        "entry_notes_per_minute": round(60 * entry_notes / seconds),
        "schedules_posted_per_minute": round(60 * entry_notes / seconds / args.entries, 2),
        "slow_commands": len(slow),
        "longest_command_ms": round(longest["duration"] / 1e3, 1) if longest else 0.0,
        "longest_command": (
            longest["command"][:60].decode(errors="replace") if longest is not None else ""
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=150.0, help="the measured window")
    parser.add_argument(
        "--settle", type=float, default=20.0, help="seconds after the nodes are ready"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="beatless-big-fleet-") as tmp:
        result = measure(args, Path(tmp))
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['nodes']} nodes, {result['entries']:,} entries, {result['seconds']:.0f} s "
        f"(ready after {result['ready_s']:.0f} s)"
    )
    print(
        f"  server CPU a second above idle   {result['redis_cpu_ms_per_s_above_idle']:.2f} ms "
        f"(idle {result['redis_idle_cpu_ms_per_s']:.2f} ms)"
    )
    print(
        f"  entry notes written a minute     {result['entry_notes_per_minute']:,} "
        f"({result['schedules_posted_per_minute']:.2f} schedules' worth)"
    )
    print(
        f"  longest command                  {result['longest_command_ms']:.1f} ms "
        f"({result['slow_commands']} over {SLOW_US / 1e3:g} ms; {result['longest_command']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
