"""What a Redis Sentinel failover costs a store object that claims through it.

    python bench/store_redis_sentinel.py            # 3 rounds of each failover
    python bench/store_redis_sentinel.py --rounds 5 --json

The servers are the benchmark's own: a primary, a replica and one sentinel
(``down-after-milliseconds`` 2 s, quorum 1), private ``redis-server`` processes on free
loopback ports (the tests' helper, ``tests/faults/redis_server.py``), killed by pid at
the end of each round. A store object opened with the ``redis+sentinel://`` URL claims
a new firing every 50 ms; each round fails over once, either with ``SENTINEL FAILOVER``
(the primary still up) or by killing the primary (``SIGKILL``). Figures, per round:
seconds from the failover's start until the sentinel names the new master, and until
the store object's first claim there (the one that finds the change of identity); the
claims that failed as unavailable meanwhile; and the claims won on the old primary after
the sentinel had named the new one (lost with it: its data is replaced when it rejoins).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "faults")]

from redis_server import sentinel_group  # noqa: E402

from beatless.errors import StoreUnavailable  # noqa: E402
from beatless.stores.base import ClaimRequest  # noqa: E402
from beatless.stores.redis.store import RedisStore  # noqa: E402

SERVICE = "bench"
LEASE_MS = 30_000
LIMIT_S = 30.0


def _round(workdir: Path, kill: bool) -> dict[str, Any]:
    with sentinel_group(workdir, service=SERVICE) as (primary, replica, sentinel):
        store = RedisStore(sentinel.url(), namespace="bench")
        now = store.time_ms()
        store.claim(
            [ClaimRequest("first", "bench/e", now, 60_000, 80_000, now)],
            node="b",
            lease_ms=LEASE_MS,
        )
        seen = store.epoch
        store.client.wait(1, 5_000)  # the replica has the epoch record: a failover, not a loss
        began = time.monotonic()
        if kill:
            primary.kill()
        else:
            sentinel.ask("FAILOVER", SERVICE)
        named_s = None
        unavailable = on_old_after = 0
        for i in itertools.count():
            if named_s is None and sentinel.master_port() == replica.port:
                named_s = time.monotonic() - began
            try:
                request = ClaimRequest(f"f{i}", "bench/e", now, 60_000, 80_000, now)
                store.claim([request], node="b", lease_ms=LEASE_MS)
            except StoreUnavailable:
                unavailable += 1
            else:
                if store.epoch is not None and seen is not None and store.epoch.token != seen.token:
                    break
                on_old_after += named_s is not None
            if time.monotonic() - began > LIMIT_S:
                raise RuntimeError(
                    f"the store did not follow within {LIMIT_S} s:\n{sentinel.log()}"
                )
            time.sleep(0.05)
        followed_s = time.monotonic() - began
        store.close()
    return {
        "named_s": named_s,
        "followed_s": followed_s,
        "unavailable": unavailable,
        "won_on_old_after_named": on_old_after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, kill in (("SENTINEL FAILOVER", False), ("primary killed", True)):
            results[kind] = [_round(Path(tmp) / f"{kill}-{n}", kill) for n in range(args.rounds)]
    if args.json:
        print(json.dumps(results))
        return
    print(
        f"{'failover':<18} {'named s':>8} {'followed s':>11} {'unavailable':>12} {'won on old':>11}"
    )
    for kind, rounds in results.items():
        for r in rounds:
            print(
                f"{kind:<18} {r['named_s']:>8.2f} {r['followed_s']:>11.2f} "
                f"{r['unavailable']:>12} {r['won_on_old_after_named']:>11}"
            )
        gap = statistics.median(r["followed_s"] - r["named_s"] for r in rounds)
        print(f"{kind:<18} median s from named to followed: {gap:.2f}")


if __name__ == "__main__":
    main()
