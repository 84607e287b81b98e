"""The django-celery-beat bridge: its work per poll among many rows, and a fleet of real
workers on those rows while one changes every second.

    python bench/django_bridge.py                         # SQLite, 1,000 and 10,000 rows
    python bench/django_bridge.py --postgres --rows 1000 10000
    python bench/django_bridge.py --quick                 # 500 rows: a smoke run
    python bench/django_bridge.py --fleet --rows 10000 --seconds 600   # two Celery workers

For each count of ``--rows``: that many ``PeriodicTask`` rows (interval rows, created in
bulk) in a Django database of its own (SQLite in a temporary file, or a schema of its own
on the PostgreSQL server of ``--postgres-url``, dropped at the end), published by a
:class:`~beatless.django.Bridge` into a memory claim store, then timed (medians of
``--repeat``):

* **first poll**: every row read, mapped and written as one revision (a node's first);
* **idle poll**: the three markers read, nothing changed (every second on one node);
* **one edit**: one row changed through ``save()``, then the poll that reads and
  publishes it (the work of one change: the goal is that it does not grow with rows);
* **full pass**: every row read and compared, nothing changed (every 60 s on one node).

It prints one line per count, and ``--json`` the figures as JSON.

**Fleet** (``--fleet``): ``--rows`` rows that do not fire during the run (a yearly
crontab) and ``TICKS`` rows that fire every second, in one database, scheduled by two
``celery worker`` nodes with the bridge on (Redis broker and claim store, database 15, a
prefix of the run's own, deleted at the end). Once every tick row has run, one tick row's
arguments are changed through ``save()`` every second (at a random instant of it) for
``--seconds``. Printed: the
nodes' start-up (from the workers' start to every tick row's first run), each edit's
delay until its first run under the new arguments (by occurrence), the lateness of every
tick run while the edits go on (the task's start minus its occurrence), the tick
occurrences missed or run twice, and when each edit took effect (its revision's fence,
read from the store). To explain the slow ones, each worker records every poll (node,
start, end, rows read, complete or not, the revision written, stale); printed: the
polls' durations, the 1-minute load average during the edits, and for each edit in
force more than ``SLOW_S`` after the median, every poll between its save and its
revision's commit, with the fence lead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

POSTGRES_URL = "postgresql://127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/15"
TICKS = 5
"""Rows of the fleet run that fire every second."""
SETTINGS = """
import json, os
SECRET_KEY = "bench"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_celery_beat"]
DATABASES = {"default": json.loads(os.environ["BENCH_DJANGO_DB"])}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""
APP = """
import json, os, time
import redis
from celery import Celery
import beatless.celery
import beatless.django

PREFIX = os.environ["BENCH_PREFIX"]
app = Celery(PREFIX)
app.conf.update(
    broker_url=os.environ["BENCH_BROKER"],
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    task_default_queue=PREFIX,
    worker_enable_remote_control=False,
    beatless_namespace=PREFIX,
    beatless_django=True,
)
beatless.celery.install(app)
_runs = redis.Redis.from_url(os.environ["BENCH_BROKER"])


_poll = beatless.django.Bridge.poll


def _timed_poll(self, *, full=False):
    began = time.time()
    result = _poll(self, full=full)
    _runs.rpush(PREFIX + ":polls", json.dumps({
        "node": os.getpid(), "began": began, "ended": time.time(), "asked_full": full,
        "read": result.read if result else 0, "complete": bool(result and result.complete),
        "revision": result.revision.number if result and result.revision else None,
        "stale": bool(result and result.stale),
    }))
    return result


beatless.django.Bridge.poll = _timed_poll


@app.task(bind=True, name="bench.tick")
def tick(self, *args):
    occurrence = beatless.celery.occurrence(self.request)
    _runs.rpush(PREFIX + ":runs", json.dumps({
        "id": self.request.id, "at": time.time(), "args": list(args),
        "occurrence": occurrence.timestamp() if occurrence else None,
        "name": getattr(self.request, "periodic_task_name", None),
    }))
"""


def setup_django(postgres: bool, schema: str, folder: Path) -> dict[str, Any]:
    import django
    from django.conf import settings

    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(folder / "rows.db"),
    }
    if postgres:
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "OPTIONS": {"options": f"-c search_path={schema}"},
        }
    settings.configure(
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django.contrib.contenttypes", "django_celery_beat"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return database


def schema_sql(verb: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL(verb).format(sql.Identifier(schema)))


def timed(action: Callable[[], Any]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def measure(rows: int, repeat: int) -> dict[str, Any]:
    from celery import Celery
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    from beatless.celery._settings import CelerySettings
    from beatless.django import Bridge, DjangoRows
    from beatless.live import Live
    from beatless.stores.memory import MemoryStore

    PeriodicTask.objects.all().delete()
    every = IntervalSchedule.objects.get_or_create(every=60, period="seconds")[0]
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"row-{i}", task="proj.report", interval=every, args=f"[{i}]")
        for i in range(rows)
    )
    PeriodicTasks.update_changed()
    app = Celery("bench", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url="memory://")
    live = Live(MemoryStore(), namespace="bench", owner="django", writer="bench")
    bridge = Bridge(live, DjangoRows(), CelerySettings.from_app(app))
    first = timed(bridge.poll)
    idle = [timed(bridge.poll) for _ in range(repeat)]
    edits = []
    for n in range(repeat):
        row = PeriodicTask.objects.get(name=f"row-{n % rows}")
        row.args = f"[{n}, {rows}]"
        row.save()
        edits.append(timed(bridge.poll))
    full = [timed(lambda: bridge.poll(full=True)) for _ in range(max(1, repeat // 4))]
    assert len(live.state()) == rows
    return {
        "rows": rows,
        "first_poll_s": round(first, 3),
        "idle_poll_ms": round(statistics.median(idle) * 1_000, 2),
        "one_edit_ms": round(statistics.median(edits) * 1_000, 2),
        "full_pass_s": round(statistics.median(full), 3),
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def fleet(rows: int, seconds: int, database: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Two workers on ``rows`` quiet rows and ``TICKS`` tick rows; one tick edited a second."""
    import redis
    from django_celery_beat.models import (
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
    )

    PeriodicTask.objects.all().delete()
    yearly = CrontabSchedule.objects.create(minute="0", hour="0", day_of_month="1",
                                            month_of_year="1")  # fmt: skip
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"quiet-{i}", task="bench.tick", crontab=yearly) for i in range(rows)
    )
    second = IntervalSchedule.objects.create(every=1, period="seconds")
    for i in range(TICKS):
        PeriodicTask.objects.create(name=f"tick-{i}", task="bench.tick", interval=second,
                                    args="[0]")  # fmt: skip
    PeriodicTasks.update_changed()
    prefix = f"bench-dj-{uuid.uuid4().hex[:8]}"
    (folder / "bench_dj_settings.py").write_text(SETTINGS)
    (folder / "bench_dj_app.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(Path(__file__).resolve().parents[1])]),
        "DJANGO_SETTINGS_MODULE": "bench_dj_settings",
        "BENCH_DJANGO_DB": json.dumps(database),
        "BENCH_PREFIX": prefix,
        "BENCH_BROKER": REDIS_URL,
    }
    client = redis.Redis.from_url(REDIS_URL)
    level = os.environ.get("BENCH_LOG", "WARNING")
    processes = []
    began = time.time()
    try:
        for name in ("n1", "n2"):
            with (folder / f"{name}.log").open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "celery", "-A", "bench_dj_app", "worker", "-n",
                         f"{name}@%h", "-P", "threads", "-c", "4", "-l", level,
                         "--without-mingle", "--without-gossip", "--without-heartbeat"],
                        cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip

        def runs() -> list[dict[str, Any]]:
            return [json.loads(r) for r in client.lrange(f"{prefix}:runs", 0, -1)]

        deadline = time.time() + 300
        while len({r["name"] for r in runs()}) < TICKS and time.time() < deadline:
            time.sleep(0.2)
        started = time.time() - began
        edits: list[tuple[str, int, float]] = []
        load: list[float] = []
        first = time.time()
        for n in range(1, seconds + 1):
            time.sleep(max(0.0, first + n + random.random() * 0.9 - time.time()))
            row = PeriodicTask.objects.get(name=f"tick-{n % TICKS}")
            row.args = f"[{n}]"
            row.save()
            edits.append((row.name, n, time.time()))
            load.append(os.getloadavg()[0])
        time.sleep(6)
        done = runs()
        polls = [json.loads(p) for p in client.lrange(f"{prefix}:polls", 0, -1)]
        fences = fences_of(prefix)
        nodes = {process.pid: name for process, name in zip(processes, ("n1", "n2"), strict=True)}
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for key in client.scan_iter(match=f"*{prefix}*", count=1_000):
            client.delete(key)
        client.close()
    found = measure_fleet(edits, done, first, seconds, fences)
    found["load_1m"] = [round(min(load), 1), round(statistics.median(load), 1), round(max(load), 1)]
    found["slow"] = slow_edits(edits, fences, polls, nodes)
    found["polls"] = poll_figures(polls, first)
    return {"rows": rows, "seconds": seconds, "start_up_s": round(started, 2), **found}


class Put(NamedTuple):
    """A revision that put one tick row's edited arguments."""

    fence: float
    committed: float
    number: int


def fences_of(prefix: str) -> dict[tuple[str, int], list[Put]]:
    """The revisions that put each tick edit (by row and value), oldest first: the first
    one's fence is when the edit took effect."""
    from beatless.live import Live
    from beatless.stores import open_store

    store = open_store(REDIS_URL, namespace=prefix)
    try:
        fences: dict[tuple[str, int], list[Put]] = {}
        for revision in Live(store, namespace=prefix).revisions():
            for change in revision.changes:
                args = (change.entry or {}).get("args") or [None]
                fences.setdefault((change.name, args[0]), []).append(
                    Put(revision.fence_ms / 1_000, revision.committed_ms / 1_000, revision.number)
                )
        return fences
    finally:
        store.close()


SLOW_S = 1.0
"""An edit is slow when it is in force this much later than the median edit."""


def slow_edits(
    edits: list[tuple[str, int, float]],
    fences: dict[tuple[str, int], list[Put]],
    polls: list[dict[str, Any]],
    nodes: dict[int, str],
) -> list[str]:
    """One line per slow edit: when it took effect, and every poll that ran (on either
    node) between the save and the revision that published it."""
    delays = {(n, v): fences[(n, v)][0].fence - at for n, v, at in edits if (n, v) in fences}
    usual = percentile(list(delays.values()), 0.5)
    lines = []
    for name, value, at in edits:
        if (name, value) not in fences or delays[(name, value)] < usual + SLOW_S:
            lines.append(f"{name}={value}: never published") if (
                name,
                value,
            ) not in fences else None
            continue
        put = fences[(name, value)][0]
        seen = [
            f"{nodes.get(p['node'], p['node'])} {p['began'] - at:+.2f}..{p['ended'] - at:+.2f} s"
            f"{' full' if p['complete'] else ''} read {p['read']}"
            f"{' -> r' + str(p['revision']) if p['revision'] else ''}"
            f"{' stale' if p['stale'] else ''}"
            for p in polls
            if p["ended"] > at - 1 and p["began"] < put.committed
        ]
        lines.append(
            f"{name}={value}: saved, in force +{put.fence - at:.2f} s (r{put.number} committed "
            f"+{put.committed - at:.2f} s, fence lead {put.fence - put.committed:.2f} s; "
            f"put by {len(fences[(name, value)])} revisions); polls: " + "; ".join(seen)
        )
    return lines


def poll_figures(polls: list[dict[str, Any]], first: float) -> dict[str, Any]:
    """How long the polls of the edit phase took, partial and complete (every row read)."""
    during = [p for p in polls if p["began"] >= first]
    partial = [p["ended"] - p["began"] for p in during if not p["complete"]]
    complete = [p["ended"] - p["began"] for p in during if p["complete"]]
    return {
        "partial_p50_ms": round(percentile(partial, 0.5) * 1_000, 1),
        "partial_max_ms": round(max(partial, default=float("nan")) * 1_000, 1),
        "complete": len(complete),
        "complete_asked": sum(1 for p in during if p["asked_full"]),
        "complete_p50_s": round(percentile(complete, 0.5), 2),
        "complete_max_s": round(max(complete, default=float("nan")), 2),
        "stale": sum(1 for p in during if p["stale"]),
        "seconds_polled": len(during),
    }


def measure_fleet(
    edits: list[tuple[str, int, float]],
    done: list[dict[str, Any]],
    first: float,
    seconds: int,
    fences: dict[tuple[str, int], list[Put]],
) -> dict[str, Any]:
    """The figures of a fleet run from the edits made, the runs recorded and the fences."""
    in_force = [fences[(n, v)][0].fence - at for n, v, at in edits if (n, v) in fences]
    delays = []
    for name, value, at in edits:
        under = [r["occurrence"] for r in done if r["name"] == name and r["args"] == [value]]
        if under:
            delays.append(min(under) - at)
    lateness = [r["at"] - r["occurrence"] for r in done if (r["occurrence"] or 0) >= first]
    window = range(int(first) + 1, int(first) + seconds)
    sent = [(r["name"], r["occurrence"]) for r in done]
    expected = {(f"tick-{i}", float(s)) for i in range(TICKS) for s in window}
    return {
        "edits": len(edits),
        "edit_to_fence_p50_s": round(percentile(in_force, 0.5), 2),
        "edit_to_fence_p99_s": round(percentile(in_force, 0.99), 2),
        "edit_to_fence_max_s": round(max(in_force, default=float("nan")), 2),
        "edits_seen": len(delays),
        "edit_to_first_run_p50_s": round(percentile(delays, 0.5), 2),
        "edit_to_first_run_p99_s": round(percentile(delays, 0.99), 2),
        "lateness_p50_ms": round(percentile(lateness, 0.5) * 1_000, 1),
        "lateness_p99_ms": round(percentile(lateness, 0.99) * 1_000, 1),
        "missed": len(expected - set(sent)),
        "twice": len(sent) - len(set(sent)),
        "put_again": sum(1 for n, v, _ in edits if len(fences.get((n, v), ())) > 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--quick", action="store_true", help="500 rows, 5 repeats")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fleet", action="store_true", help="two Celery workers on the rows")
    parser.add_argument("--seconds", type=int, default=120, help="--fleet: how long to edit")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat = [500], 5
    schema = f"beatless_bench_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as folder:
        if args.postgres:
            schema_sql("CREATE SCHEMA {}", schema)
        try:
            database = setup_django(args.postgres, schema, Path(folder))
            if args.fleet:
                results = [fleet(rows, args.seconds, database, Path(folder)) for rows in args.rows]
            else:
                results = [measure(rows, args.repeat) for rows in args.rows]
        finally:
            if args.postgres:
                from django.db import connections

                connections.close_all()
                schema_sql("DROP SCHEMA IF EXISTS {} CASCADE", schema)
    where = "PostgreSQL" if args.postgres else "SQLite"
    for found in results if args.fleet else []:
        print(
            f"{where} fleet, {found['rows']:,} rows, {found['seconds']} s: start-up "
            f"{found['start_up_s']} s; edit -> in force (fence) p50 "
            f"{found['edit_to_fence_p50_s']} s, p99 {found['edit_to_fence_p99_s']} s, max "
            f"{found['edit_to_fence_max_s']} s; edit -> "
            f"first run under it p50 "
            f"{found['edit_to_first_run_p50_s']} s, p99 {found['edit_to_first_run_p99_s']} s "
            f"({found['edits_seen']}/{found['edits']} edits seen); tick lateness p50 "
            f"{found['lateness_p50_ms']} ms, p99 {found['lateness_p99_ms']} ms; missed "
            f"{found['missed']}, run twice {found['twice']}; load (1 min) min/median/max "
            f"{found['load_1m']}; edits put by more than one revision {found['put_again']}"
        )
        print(f"  polls: {found['polls']}")
        for line in found["slow"]:
            print(f"  slow edit {line}")
    for found in [] if args.fleet else results:
        print(
            f"{where} {found['rows']:>7,} rows: first poll {found['first_poll_s']} s, idle poll "
            f"{found['idle_poll_ms']} ms, one edit {found['one_edit_ms']} ms, full pass "
            f"{found['full_pass_s']} s"
        )
    if args.json:
        print(json.dumps({"database": where, "results": results}))


if __name__ == "__main__":
    main()
