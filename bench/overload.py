"""A node given more than it can do: a fan-out of many tenants every minute, one node.

The node must degrade, never spiral: what it cannot send within ``max_late`` is dropped
in bulk (one WARNING per occurrence, with the count) and the next occurrences stay on
time. Prints, per occurrence: firings sent, dropped as late, and the lateness of the
sends after their release; then the node's counters, its peak RSS and CPU.

    python bench/overload.py                                  # 10**6 tenants, memory store
    python bench/overload.py --store redis://127.0.0.1:6379/15 --tenants 200000
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
import uuid
from collections import Counter, defaultdict

from beatless import Entry, Every, Firing, Schedule
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=60, help="seconds between occurrences")
    parser.add_argument("--jitter", default="29s")
    parser.add_argument("--max-late", default="60s")
    parser.add_argument("--seconds", type=float, default=200)
    parser.add_argument("--store", default="memory://")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")

    entry = Entry(
        name="fan",
        task="tasks.report",
        trigger=Every(args.every),
        jitter=args.jitter,
        max_late=args.max_late,
        tenants=[f"tenant-{i}" for i in range(args.tenants)],
    )
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    store = open_store(args.store, namespace=namespace)
    sent: Counter[int] = Counter()
    lateness: dict[int, list[int]] = defaultdict(list)

    def enqueue(firing: Firing) -> None:
        sent[firing.occurrence_ms] += 1
        lateness[firing.occurrence_ms].append(round(time.time() * 1_000) - firing.release_ms)

    node = Scheduler(Schedule([entry], namespace=namespace), store=store, enqueue=enqueue)
    started, cpu = time.time(), time.process_time()
    while time.time() - started < args.seconds:
        node.tick()
        time.sleep(node.sleep_s())
    report(node, sent, lateness, args, started=started, cpu=cpu)
    store.close()


def report(
    node: Scheduler,
    sent: Counter[int],
    lateness: dict[int, list[int]],
    args: argparse.Namespace,
    *,
    started: float,
    cpu: float,
) -> None:
    print(
        f"{args.tenants:,} tenants every {args.every}s, jitter {args.jitter}, "
        f"max_late {args.max_late}, store {args.store}, {args.seconds:.0f}s"
    )
    print("occurrence               sent   lateness p50 / p99 / max (ms)")
    for occurrence in sorted(sent):
        ms = sorted(lateness[occurrence])
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, len(ms) * 99 // 100)]
        stamp = time.strftime("%H:%M:%S", time.gmtime(occurrence / 1_000))
        print(f"{stamp} {'':12} {sent[occurrence]:>9,}   {p50:>6} / {p99:>6} / {ms[-1]:>6}")
    stats = node.stats["fan"].as_dict()
    print("counters:", {k: v for k, v in stats.items() if v})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak RSS {rss:.0f} MB; CPU {time.process_time() - cpu:.1f}s in "
        f"{time.time() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
