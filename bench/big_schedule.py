"""Benchmark of a big schedule: ``beatless check``, a node's start-up and ``beatless status``.

    python bench/big_schedule.py [--entries 100000] [--kinds cron,every] [--json]

Writes a TOML schedule file of ``entries`` cron entries and one of ``entries`` interval
entries (a fixed seed, so every run writes the same files), then, for each file, in a
process of its own:

* ``check``: ``python -m beatless check FILE`` as a user runs it;
* ``node``: a node starting on that file: loading it, building the
  :class:`~beatless.node.scheduler.Scheduler` on the memory store (or the SQLite one,
  ``--store sqlite``) and its first wake;
* ``status``: ``python -m beatless status --store sqlite:///FILE --namespace big`` as an
  operator runs it, on an SQLite store where a node has posted the entries' notes (not
  measured: posting them, in a process of its own); it exits 1 when it lists problems.
  ``status json``: the same with ``--json``. Not part of the goal below.

Each line gives the wall time of the whole process (interpreter start and imports
included) and its peak resident memory (``ru_maxrss`` of that child alone, read with
``os.wait4``). The node's line also splits its time into loading, building and the first
wake.

The cron expressions vary as real schedules do: minute and hour fields with single
values, lists, ranges and steps, days of the week and of the month, and a few zones
(some entries name their own, the rest take the file's). Many entries share an
expression, as tenants of one job do; the number of distinct (expression, zone) pairs is
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

ZONES = ("Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "UTC")
SEED = 26
KB = 1024
LIMIT_S = 10.0
LIMIT_MB = 300.0


# -- the schedules -------------------------------------------------------------------


def cron_expression(rng: random.Random) -> str:
    """One five-field expression whose occurrences are at least five minutes apart."""
    minute = rng.choice(
        [
            str(rng.randrange(60)),
            f"{(m := rng.randrange(30))},{m + 30}",
            f"*/{rng.choice((5, 10, 15, 20, 30))}",
            f"{rng.randrange(5)}-59/{rng.choice((10, 15))}",
            ",".join(str(m) for m in sorted(rng.sample(range(0, 60, 5), 3))),
        ]
    )
    hour = rng.choice(
        ["*", str(rng.randrange(24)), "8-18", "9-17/2", f"*/{rng.choice((2, 3, 4, 6))}", "0,12"]
    )
    day = rng.choice(["*"] * 8 + ["1", "1,15", "L", "15W"])
    weekday = rng.choice(["*"] * 4 + ["1-5", "MON-FRI", "0,6", "1", "SAT", "2#1", "5L"])
    if day != "*" and weekday != "*":
        weekday = "*"
    month = rng.choice(["*"] * 9 + ["1-6", "*/3"])
    return f"{minute} {hour} {day} {month} {weekday}"


def cron_tables(count: int, rng: random.Random) -> list[str]:
    """``count`` cron entries, 30% of them with one of 50 common expressions."""
    common = [cron_expression(rng) for _ in range(50)]
    lines = []
    for i in range(count):
        expr = rng.choice(common) if rng.random() < 0.3 else cron_expression(rng)
        lines += ["[[entry]]", f'name = "cron-{i}"', f'task = "jobs.task{i % 97}"']
        lines.append(f'cron = "{expr}"')
        if rng.random() < 0.4:
            lines.append(f'timezone = "{rng.choice(ZONES)}"')
        lines += [f'jitter = "{rng.choice((0, 5, 30, 60))}s"', f"args = [{i}]", ""]
    return lines


def every_tables(count: int, rng: random.Random) -> list[str]:
    """``count`` interval entries, from ten seconds to a day, some with an anchor."""
    lines = []
    for i in range(count):
        interval = rng.choice(("10s", "30s", "1m", "5m", "15m", "1h", "6h", "1d"))
        lines += ["[[entry]]", f'name = "every-{i}"', f'task = "jobs.task{i % 97}"']
        lines.append(f'every = "{interval}"')
        if rng.random() < 0.2:
            lines.append(f'anchor = "2026-01-01T00:{rng.randrange(60):02d}:00Z"')
        lines += [f'jitter = "{rng.choice((0, 1, 2))}s"', f"args = [{i}]", ""]
    return lines


def write_schedule(path: Path, kind: str, count: int) -> None:
    rng = random.Random(f"{SEED}-{kind}-{count}")
    tables = cron_tables(count, rng) if kind == "cron" else every_tables(count, rng)
    head = ['namespace = "big"', 'timezone = "Europe/Berlin"', 'max_late = "2m"', ""]
    path.write_text("\n".join(head + tables), encoding="utf-8")


def distinct_triggers(path: str) -> None:
    """Run in a child: print how many distinct triggers the file's entries name (read in
    the bench, the file would grow it, which its later children count: see ``TAIL``)."""
    import tomli

    data = tomli.loads(Path(path).read_text(encoding="utf-8"))
    keys = ("cron", "every", "anchor", "timezone")
    print(len({tuple(t.get(k) for k in keys) for t in data["entry"]}))


# -- the measured processes ----------------------------------------------------------


def node_start(path: str, store_kind: str) -> None:
    """Run in the child: start a node on ``path``, print its phases as JSON."""
    started = time.perf_counter()
    from beatless.cli.loader import load_schedule
    from beatless.node.scheduler import Scheduler
    from beatless.stores.base import ClaimStore
    from beatless.stores.memory import MemoryStore
    from beatless.stores.sqlite import SQLiteStore

    imported = time.perf_counter()
    schedule = load_schedule(path)
    loaded = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        store: ClaimStore = (
            MemoryStore() if store_kind == "memory" else SQLiteStore(Path(folder) / "claims.db")
        )
        node = Scheduler(schedule, store=store, enqueue=lambda firing: None, node="bench")
        built = time.perf_counter()
        node.tick()
        woke = time.perf_counter()
        store.close()
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "load_s": loaded - imported,
                "build_s": built - loaded,
                "first_wake_s": woke - built,
                "next_wake_ms": node.next_wake_ms(),
            }
        )
    )


def post_entries(path: str, database: str) -> None:
    """Run in the child: a node on ``path`` posts its entries' notes to the SQLite store
    at ``database`` (its first sync and as many more as the post takes)."""
    from beatless.cli.loader import load_schedule
    from beatless.node.scheduler import Scheduler
    from beatless.stores.sqlite import SQLiteStore

    store = SQLiteStore(database)
    node = Scheduler(load_schedule(path), store=store, enqueue=lambda firing: None, node="bench")
    node.tick()
    node.board.sync()
    while node.board.entries.pending:
        node.board.sync()
    store.close()


def run_child(command: list[str]) -> dict[str, Any]:
    """``command`` in a child whose usage is read with ``wait4`` (``Popen`` would reap it
    first), with its output kept in files."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        pid = os.posix_spawn(
            command[0],
            command,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
            ],
        )
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - started
        lines = _tail(out).strip().splitlines()
        errors = _tail(err).strip().splitlines()
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / KB, 1),
        "last_line": lines[-1] if lines else "",
        "stderr": errors[-3:],
    }


TAIL = 65_536
"""How much of a child's output is read: its last lines. ``status --json`` prints 90 MB
for 100,000 entries; read whole here, it would grow this process by some 400 MB, and every
child spawned after would count that as its own peak (``posix_spawn`` shares this
process's memory until ``exec``, and Linux keeps that memory's peak in the child's
``ru_maxrss``)."""


def _tail(file: IO[bytes]) -> str:
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - TAIL))
    return file.read().decode(errors="replace")


def measure(path: Path, store_kind: str) -> dict[str, Any]:
    check = run_child([sys.executable, "-m", "beatless", "check", str(path)])
    node = run_child([sys.executable, __file__, "--node-start", str(path), "--store", store_kind])
    phases = json.loads(node["last_line"]) if node["exit"] == 0 else {}
    fields = ("exit", "wall_s", "cpu_s", "peak_rss_mb", "stderr")
    with tempfile.TemporaryDirectory() as folder:
        database = str(Path(folder) / "claims.db")
        posted = run_child([sys.executable, __file__, "--post-entries", str(path), database])
        command = [sys.executable, "-m", "beatless", "status", "--store"]
        command += [f"sqlite:///{database}", "--namespace", "big"]
        status = run_child(command)
        status_json = run_child([*command, "--json"])
    if posted["exit"] != 0:
        status = status_json = posted
    return {
        "check": {k: check[k] for k in fields},
        "node": {k: node[k] for k in fields}
        | {k: round(v, 2) for k, v in phases.items() if k.endswith("_s")},
        "status": {k: status[k] for k in fields},
        "status_json": {k: status_json[k] for k in fields},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000, help="entries of each kind")
    parser.add_argument("--kinds", default="cron,every", help="cron, every or cron,every")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", metavar="DIR", help="write the TOML files here and keep them")
    parser.add_argument("--node-start", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--post-entries", nargs=2, metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--distinct-triggers", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node_start:
        node_start(args.node_start, args.store)
        return 0
    if args.post_entries:
        post_entries(*args.post_entries)
        return 0
    if args.distinct_triggers:
        distinct_triggers(args.distinct_triggers)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    result: dict[str, Any] = {"entries": args.entries, "store": args.store, "kinds": {}}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for kind in kinds:
            path = folder / f"big_{kind}_{args.entries}.toml"
            write_schedule(path, kind, args.entries)
            figures = measure(path, args.store)
            counted = run_child([sys.executable, __file__, "--distinct-triggers", str(path)])
            figures["distinct_triggers"] = int(counted["last_line"])
            result["kinds"][kind] = figures
            if not args.json:
                _print(kind, args.entries, figures)
    ok = all(
        part["exit"] == 0 and part["wall_s"] <= LIMIT_S and part["peak_rss_mb"] <= LIMIT_MB
        for figures in result["kinds"].values()
        for part in (figures["check"], figures["node"])
    )
    result["within_goal"] = ok
    if args.json:
        print(json.dumps(result))
    else:
        verdict = "met" if ok else "not met (wall time, see CPU on a busy machine)"
        print(f"goal ({LIMIT_S:g} s and {LIMIT_MB:g} MB a line): {verdict}")
    return 0


def _print(kind: str, entries: int, figures: dict[str, Any]) -> None:
    check, node = figures["check"], figures["node"]
    print(f"{entries:,} {kind} entries ({figures['distinct_triggers']:,} distinct triggers)")
    print(
        f"  check:      {check['wall_s']:7.2f} s (CPU {check['cpu_s']:6.2f} s)  "
        f"peak RSS {check['peak_rss_mb']:6.1f} MB"
    )
    print(
        f"  node start: {node['wall_s']:7.2f} s (CPU {node['cpu_s']:6.2f} s)  "
        f"peak RSS {node['peak_rss_mb']:6.1f} MB"
        f"  (load {node.get('load_s', '?')} s, build {node.get('build_s', '?')} s, "
        f"first wake {node.get('first_wake_s', '?')} s)"
    )
    for label, status in (
        ("status:     ", figures["status"]),
        ("status json:", figures["status_json"]),
    ):
        print(
            f"  {label}{status['wall_s']:7.2f} s (CPU {status['cpu_s']:6.2f} s)  "
            f"peak RSS {status['peak_rss_mb']:6.1f} MB  (exit {status['exit']})"
        )
    for part in (check, node):
        if part["exit"] != 0:
            print(f"  exit {part['exit']}: {' | '.join(part['stderr'])}")


if __name__ == "__main__":
    raise SystemExit(main())
