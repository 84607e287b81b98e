"""What ``wait=1`` costs a Redis claim: latency with and without waiting for a replica.

    python bench/store_redis_wait.py               # 2,000 claims of one firing each way
    python bench/store_redis_wait.py --json        # the same figures as one JSON object
    python bench/store_redis_wait.py --claims 500 --batch 100

The servers are the benchmark's own: a primary and a replica (``--replicaof``), private
``redis-server`` processes on free loopback ports (the tests' helper,
``tests/faults/redis_server.py``), stopped by pid at the end. One client claims
``--batch`` fresh firings per call, two-phase (pending, lease 30 s), ``--claims`` times,
then commits each batch, once through a store without ``wait`` and once through one with
``wait=1``; the first 50 calls of each are a warm-up. Figures are wall-clock milliseconds
per ``claim`` call and per ``commit`` call: p50, p99 and the worst. Both servers and the
client share the machine's cores, so the replica's acknowledgement is a loopback round
trip plus its own scheduling: on a busy machine the tail grows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "faults"))

from redis_server import RedisServer

from beatless.stores.base import ClaimRequest
from beatless.stores.redis.store import RedisStore

LEASE_MS = 30_000
WARM_UP = 50


def _batch(now_ms: int, n: int) -> list[ClaimRequest]:
    return [
        ClaimRequest(str(uuid.uuid4()), f"bench/e{k}", now_ms, 60_000, 80_000, now_ms)
        for k in range(n)
    ]


def _measure(store: RedisStore, claims: int, batch: int) -> dict[str, float]:
    claim_ms: list[float] = []
    commit_ms: list[float] = []
    for k in range(claims + WARM_UP):
        requests = _batch(store.time_ms(), batch)
        began = time.perf_counter()
        store.claim(requests, node="bench", lease_ms=LEASE_MS)
        claimed = time.perf_counter()
        store.commit([r.id for r in requests], node="bench")
        done = time.perf_counter()
        if k >= WARM_UP:
            claim_ms.append((claimed - began) * 1_000)
            commit_ms.append((done - claimed) * 1_000)
    return {**_figures("claim", claim_ms), **_figures("commit", commit_ms)}


def _figures(what: str, ms: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(ms, n=100)
    return {
        f"{what}_p50_ms": round(cuts[49], 3),
        f"{what}_p99_ms": round(cuts[98], 3),
        f"{what}_max_ms": round(max(ms), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        primary = RedisServer(Path(workdir) / "primary", "primary").start()
        replica = RedisServer(Path(workdir) / "replica", "replica", replica_of=primary.address)
        try:
            replica.start()
            replica.wait_in_sync()
            result: dict[str, Any] = {"claims": args.claims, "batch": args.batch}
            for wait in (0, 1):
                store = RedisStore(primary.url, namespace=f"bench-{uuid.uuid4().hex}", wait=wait)
                result[f"wait={wait}"] = _measure(store, args.claims, args.batch)
                store.close()
        finally:
            replica.kill()
            primary.kill()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.claims} claims of {args.batch} firing(s), then their commits, per call (ms):")
    for wait in (0, 1):
        f = result[f"wait={wait}"]
        print(
            f"  wait={wait}: claim p50 {f['claim_p50_ms']:.2f} p99 {f['claim_p99_ms']:.2f} "
            f"max {f['claim_max_ms']:.2f}; commit p50 {f['commit_p50_ms']:.2f} "
            f"p99 {f['commit_p99_ms']:.2f} max {f['commit_max_ms']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
