"""A real scheduler node for multi-process tests: runs a fixed schedule for a while.

Usage: python tests/node_process.py STORE_URL OUT_FILE SECONDS NODE_NAME

Each won firing is appended to OUT_FILE as one JSON line (flushed at once), so a
parent process can count the firings of every node, even one it kills. Once the
scheduler runs, the node writes the instant it started to OUT_FILE + ".started": on a
loaded machine a node can take seconds to import and connect, and what it cannot miss
begins only then.
"""

from __future__ import annotations

import json
import os
import sys
import time

from beatless import Entry, Every, Firing, Schedule
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store

CATCH_UP = os.environ.get("BEATLESS_TEST_CATCH_UP", "latest")
"""The entries' catch-up policy: a test of the policies sets it."""
SCHEDULE = Schedule(
    [
        Entry(name="every-1s", task="tests.one", trigger=Every(1), catch_up=CATCH_UP),
        Entry(name="every-2s", task="tests.two", trigger=Every(2), catch_up=CATCH_UP),
    ],
    namespace="multiprocess",
)


def main() -> None:
    url, out_path, seconds, node = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    with open(out_path, "a", encoding="utf-8") as out:

        def enqueue(firing: Firing) -> None:
            record = {
                "id": firing.id,
                "entry": firing.entry.name,
                "node": node,
                "occurrence_ms": firing.occurrence_ms,
                "at": time.time(),
            }
            out.write(json.dumps(record) + "\n")
            out.flush()

        store = open_store(url, namespace=SCHEDULE.namespace)
        scheduler = Scheduler(SCHEDULE, store=store, enqueue=enqueue, node=node)
        scheduler.start()
        with open(out_path + ".started", "w", encoding="utf-8") as started:
            started.write(repr(time.time()))
        time.sleep(seconds)
        scheduler.stop(timeout=5)
        store.close()


if __name__ == "__main__":
    main()
