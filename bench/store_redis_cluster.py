"""Claims per second on a Redis Cluster of three masters, beside one Redis.

    python bench/store_redis_cluster.py             # batches of 10,000, five rounds
    python bench/store_redis_cluster.py --json      # the same figures as one JSON object
    python bench/store_redis_cluster.py --firings 1000 --rounds 3 --redis redis://host:6379/0

The cluster is the benchmark's own: three ``redis-server`` masters with
``--cluster-enabled yes`` on free loopback ports, joined by ``redis-cli --cluster
create`` (the tests' helper, ``tests/redis_cluster.py``), stopped by pid at the end. The
single Redis is ``--redis`` (the local server by default). Each store works under a
prefix of its own, deleted at the end.

For each store, one client claims a batch of ``--firings`` fresh firings in one call,
then commits them in one call, ``--rounds`` times; the figures are the median round's:

* ``claims_per_s``: firings claimed per second by the ``claim`` call alone;
* ``claims_and_commits_per_s``: firings claimed and committed per second.

The first round of each store is a warm-up (connecting, loading the scripts, and on the
cluster reading the 256 bucket epochs) and is not counted. Run on a quiet machine: the
cluster's three servers and the client share its cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from beatless.stores.base import ClaimRequest, ClaimStore

LEASE_MS = 30_000
MEMORY_MS = 80_000
TAG = "0a1b2c3d"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def _requests(now_ms: int, n: int) -> list[ClaimRequest]:
    return [
        ClaimRequest(str(uuid.uuid4()), f"bench/e{k}", now_ms, 60_000, MEMORY_MS, now_ms, TAG)
        for k in range(n)
    ]


def _round(store: ClaimStore, firings: int) -> tuple[float, float]:
    """Seconds to claim a batch of fresh firings, and to claim and commit it."""
    batch = _requests(store.time_ms(), firings)
    began = time.perf_counter()
    outcomes = store.claim(batch, node="bench", lease_ms=LEASE_MS)
    claimed = time.perf_counter()
    kept = store.commit([r.id for r in batch], node="bench")
    done = time.perf_counter()
    if not all(o.is_won for o in outcomes) or not all(kept):
        raise RuntimeError("a fresh firing was not won and committed")
    return claimed - began, done - began


def measure(store: ClaimStore, firings: int, rounds: int) -> dict[str, Any]:
    _round(store, firings)  # warm-up
    times = [_round(store, firings) for _ in range(rounds)]
    claim_s = statistics.median(t for t, _ in times)
    both_s = statistics.median(t for _, t in times)
    return {
        "claims_per_s": round(firings / claim_s),
        "claims_and_commits_per_s": round(firings / both_s),
        "claim_ms": round(claim_s * 1_000, 1),
        "claim_and_commit_ms": round(both_s * 1_000, 1),
    }


def measure_cluster(firings: int, rounds: int) -> dict[str, Any]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        return {"skipped": "redis-server and redis-cli are not on PATH"}
    from redis_cluster import LocalCluster  # the tests' helper

    from beatless.stores.redis.cluster import RedisClusterStore

    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="beatless-bench-cluster-")))
    cluster.start()
    try:
        # The cluster is the benchmark's own and goes with all its keys when stopped.
        store = RedisClusterStore(cluster.url, prefix=_prefix())
        try:
            return {"masters": len(cluster.ports), **measure(store, firings, rounds)}
        finally:
            store.close()
    finally:
        cluster.stop()


def measure_single(url: str, firings: int, rounds: int) -> dict[str, Any]:
    import redis

    from beatless.stores.redis.store import RedisStore

    client = redis.Redis.from_url(url)
    prefix = _prefix()
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        return {"skipped": f"no Redis at {url} ({exc})"}
    try:
        with RedisStore(client, prefix=prefix) as store:
            return {"url": url, **measure(store, firings, rounds)}
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
        for start in range(0, len(keys), 1_000):
            client.delete(*keys[start : start + 1_000])
        client.close()


def _prefix() -> str:
    return f"beatless-bench:{uuid.uuid4().hex[:10]}:"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--firings", type=int, default=10_000, help="firings per batch")
    parser.add_argument("--rounds", type=int, default=5, help="batches measured per store")
    parser.add_argument("--redis", default=DEFAULT_REDIS, help="the single Redis to compare")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = {
        "firings_per_batch": args.firings,
        "rounds": args.rounds,
        "redis_cluster": measure_cluster(args.firings, args.rounds),
        "redis": measure_single(args.redis, args.firings, args.rounds),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"batches of {args.firings:,} fresh firings, one client, median of {args.rounds}")
    for name in ("redis_cluster", "redis"):
        figures = result[name]
        if "skipped" in figures:
            print(f"  {name:<14} skipped: {figures['skipped']}")
            continue
        print(
            f"  {name:<14} claim {figures['claims_per_s']:>9,}/s ({figures['claim_ms']} ms)"
            f"   claim+commit {figures['claims_and_commits_per_s']:>9,}/s"
            f" ({figures['claim_and_commit_ms']} ms)"
        )


if __name__ == "__main__":
    main()
