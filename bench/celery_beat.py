"""Stock ``celery.beat.Scheduler`` over the addresses of ``bench/core.py``.

    python bench/celery_beat.py --tenants 10000 --cron '0 * * * *' --cron '6 * * * *' ...

Run by ``bench/core.py`` in a process of its own, so that its memory is measured alone.
Each address becomes one ``beat_schedule`` entry with its own ``crontab`` (as a loop
that generates a schedule writes it) and the tenant as its argument; celery beat has no
jitter. Every ``crontab`` reads a fake clock (its ``nowfun``), which starts, as in
``bench/core.py``, two seconds before the first occurrence. Prints one JSON object: load
time, resident memory, the CPU of the first wake (which computes ``is_due`` of every
entry to fill beat's heap), of a wake with nothing due, and of wakes that each send one
due task (to the in-memory broker), a second after the first occurrence.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

MB = 1024 * 1024
IDLE_WAKES = 3
DUE_WAKES = 20
START = datetime(2026, 1, 5, tzinfo=UTC) - timedelta(seconds=2)


class Clock:
    """What every crontab takes for now; moves only when told to."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def cpu_of(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def beat_schedule(exprs: list[str], tenants: int, clock: Clock) -> dict[str, dict[str, Any]]:
    from celery.schedules import crontab

    schedule = {}
    for i, expr in enumerate(exprs):
        minute, hour, dom, month, dow = expr.split()
        for t in range(tenants):
            tenant = f"t{t:06d}"
            schedule[f"bench/job{i}/{tenant}"] = {
                "task": "bench.touch",
                "schedule": crontab(minute, hour, dow, dom, month, nowfun=clock),
                "args": (tenant,),
            }
    return schedule


def measure(exprs: list[str], tenants: int) -> dict[str, Any]:
    from celery import Celery
    from celery.beat import Scheduler

    app = Celery("bench", broker="memory://", set_as_current=False)
    app.conf.timezone = "UTC"
    clock = Clock(START)
    before = rss_mb()
    schedule, build_wall, build_cpu = cpu_of(lambda: beat_schedule(exprs, tenants, clock))
    app.conf.beat_schedule = schedule
    beat, load_wall, load_cpu = cpu_of(lambda: Scheduler(app, lazy=False))
    after_load = rss_mb()
    _, first_wall, first_cpu = cpu_of(beat.tick)
    idle = [cpu_of(beat.tick)[2] for _ in range(IDLE_WAKES)]
    after_first = rss_mb()
    clock.now = START + timedelta(seconds=3)
    due = [cpu_of(beat.tick) for _ in range(DUE_WAKES)]
    sent = sum(entry.total_run_count for entry in beat.schedule.values())
    return {
        "measured": True,
        "entries": len(beat.schedule),
        "load": {
            "wall_s": build_wall + load_wall,
            "cpu_s": build_cpu + load_cpu,
            "beat_schedule_cpu_s": build_cpu,
            "scheduler_cpu_s": load_cpu,
        },
        "rss_before_mb": before,
        "rss_after_load_mb": after_load,
        "rss_after_first_wake_mb": after_first,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "first_wake_cpu_s": first_cpu,
        "first_wake_wall_s": first_wall,
        "idle_wake_cpu_s": sum(idle) / len(idle),
        "due_wakes": len(due),
        "due_wakes_sent": sent,
        "due_wake_cpu_s": sum(cpu for _, _, cpu in due) / max(sent, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--cron", action="append", required=True)
    parser.add_argument("--jitter", type=int, default=0, help="ignored: beat has no jitter")
    args = parser.parse_args()
    try:
        import celery  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"celery is not importable ({exc}); pip install celery") from None
    print(json.dumps(measure(args.cron, args.tenants)))


if __name__ == "__main__":
    main()
