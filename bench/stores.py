"""Every claim store side by side: claims per second, store operations and bytes per claim.

    python bench/stores.py                  # every store whose server answers
    python bench/stores.py --json           # the same figures as one JSON object
    python bench/stores.py --only redis,postgres --seconds 2

For each store, fresh firings are claimed and committed by one client, one firing per
call and then 1,000 per call, each for ``--seconds``; "operations per firing" counts what
the client sent to the server (Redis: commands from ``INFO commandstats``; PostgreSQL:
statements; NATS: requests; RabbitMQ: AMQP methods; SQLite and memory: the store's own
calls, which are transactions on one file and dictionary updates); "bytes per claim" is
what the store keeps for one committed claim, measured on the server where it can say
(Redis ``MEMORY USAGE``, PostgreSQL ``pg_total_relation_size``), else computed and
labelled so. Each store works under a name of its own (a prefix, schema, bucket or
namespace with a random token) and removes what it created.

The stores with a server of their own have their own module (``store_postgres.py``,
``store_nats.py``, ``store_rabbitmq.py``) with a ``measure(url)`` that this one calls;
memory, SQLite and Redis are measured here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from beatless.stores.base import ClaimRequest, ClaimStore

LEASE_MS = 30_000
MEMORY_MS = 80_000
TAG = "0a1b2c3d"
SERVERS = {
    "redis": "redis://127.0.0.1:6379/0",
    "postgres": "postgresql://127.0.0.1:5432/test",
    "nats": "nats://127.0.0.1:4222",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
}
"""The server each store of its own module is measured against, on this machine."""
ORDER = ("memory", "sqlite", "redis", "postgres", "nats", "rabbitmq")


def requests(now_ms: int, n: int) -> list[ClaimRequest]:
    token = uuid.uuid4().hex[:8]
    return [
        ClaimRequest(
            id=str(uuid.uuid4()),
            address=f"bench/e{token}{i}",
            occurrence_ms=now_ms,
            max_late_ms=60_000,
            memory_ms=MEMORY_MS,
            release_ms=now_ms,
            tag=TAG,
        )
        for i in range(n)
    ]


def rate(store: ClaimStore, size: int, seconds: float) -> tuple[float, int]:
    """Fresh firings claimed and committed per second, ``size`` per call; and how many."""
    done, start = 0, time.perf_counter()
    now = store.time_ms()
    while time.perf_counter() - start < seconds:
        batch = requests(now, size)
        store.claim(batch, node="bench", lease_ms=LEASE_MS)
        store.commit([r.id for r in batch], node="bench")
        done += size
    return done / (time.perf_counter() - start), done


def generic(name: str, open_store: Callable[[], ClaimStore], seconds: float) -> dict[str, Any]:
    """Claims per second in batches of 1 and 1,000; two calls (claim, commit) per batch."""
    result: dict[str, Any] = {"store": name}
    with open_store() as store:
        for size in (1, 1_000):
            per_s, _ = rate(store, size, seconds)
            result[f"claims_per_s_batch_{size}"] = round(per_s)
            result[f"ops_per_firing_batch_{size}"] = 2 / size
    result["ops_counted"] = "store calls (claim, commit), each one transaction"
    return result


def measure_memory(seconds: float) -> dict[str, Any]:
    from beatless.stores.memory import MemoryStore

    result = generic("memory", MemoryStore, seconds)
    result.update(bytes_per_claim=None, bytes_measured="one process only: nothing shared")
    return result


def measure_sqlite(seconds: float) -> dict[str, Any]:
    from beatless.stores.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="beatless-bench-") as tmp:
        path = Path(tmp) / "claims.db"
        result = generic("sqlite", lambda: SQLiteStore(path), seconds)
        fresh = Path(tmp) / "size.db"
        with SQLiteStore(fresh) as store:
            empty = fresh.stat().st_size
            batch = requests(store.time_ms(), 10_000)
            store.claim(batch, node="bench", lease_ms=LEASE_MS)
            store.commit([r.id for r in batch], node="bench")
        result.update(
            bytes_per_claim=round((fresh.stat().st_size - empty) / len(batch)),
            bytes_measured="file growth for 10,000 committed claims",
        )
    return result


def measure_redis(url: str, seconds: float) -> dict[str, Any]:
    import redis

    from beatless.stores.redis.store import RedisStore

    prefix = f"beatless-bench:{uuid.uuid4().hex[:10]}:"
    client = redis.Redis.from_url(url)
    result: dict[str, Any] = {"store": "redis", "url": url}
    try:
        with RedisStore(client, prefix=prefix) as store:
            for size in (1, 1_000):
                before = _commands(client)
                per_s, firings = rate(store, size, seconds)
                result[f"claims_per_s_batch_{size}"] = round(per_s)
                result[f"ops_per_firing_batch_{size}"] = (_commands(client) - before) / firings
            result["ops_counted"] = (
                "Redis commands run, inside the claim scripts too (INFO commandstats); "
                "round trips: 2 per batch"
            )
            batch = requests(store.time_ms(), 1_000)
            store.claim(batch, node="bench", lease_ms=LEASE_MS)
            store.commit([r.id for r in batch], node="bench")
            sizes = [client.memory_usage(f"{prefix}claim:{r.id}") or 0 for r in batch[:200]]
            result.update(
                bytes_per_claim=round(sum(sizes) / len(sizes)),
                bytes_measured="on the server: MEMORY USAGE of a committed claim key",
            )
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
        for start in range(0, len(keys), 1_000):
            client.delete(*keys[start : start + 1_000])
        client.close()
    return result


def _commands(client: Any) -> int:
    """Commands the server ran, less the INFO calls that count them."""
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def answers(url: str) -> bool:
    parts = urlsplit(url)
    default = {"redis": 6379, "postgresql": 5432, "nats": 4222, "amqp": 5672}[parts.scheme]
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default), 1):
            return True
    except OSError:
        return False


def measure(name: str, seconds: float) -> dict[str, Any]:
    if name == "memory":
        return measure_memory(seconds)
    if name == "sqlite":
        return measure_sqlite(seconds)
    url = SERVERS[name]
    if not answers(url):
        return {"store": name, "skipped": f"no server at {url}"}
    if name == "redis":
        return measure_redis(url, seconds)
    try:
        module = importlib.import_module(f"store_{name}")
    except ImportError as exc:
        return {"store": name, "skipped": f"cannot import its benchmark ({exc})"}
    result: dict[str, Any] = module.measure(url, seconds=seconds)
    for size in (1, 1_000):  # each module names its operations its own way
        for key in (f"round_trips_per_firing_batch_{size}", f"requests_per_firing_batch_{size}"):
            if key in result and f"ops_per_firing_batch_{size}" not in result:
                result[f"ops_per_firing_batch_{size}"] = result[key]
                result.setdefault("ops_counted", key.split("_per_")[0].replace("_", " "))
    return result


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("claims/s, batches of 1", "claims_per_s_batch_1", "{:,.0f}"),
        ("claims/s, batches of 1,000", "claims_per_s_batch_1000", "{:,.0f}"),
        ("operations per firing, batches of 1", "ops_per_firing_batch_1", "{:.3g}"),
        ("operations per firing, batches of 1,000", "ops_per_firing_batch_1000", "{:.3g}"),
        ("bytes kept per claim", "bytes_per_claim", "{:,.0f}"),
    ]
    names = [r["store"] for r in results]
    width = max(len(label) for label, _, _ in rows) + 2
    lines = ["".ljust(width) + "".join(n.rjust(12) for n in names)]
    for label, key, form in rows:
        cells = []
        for result in results:
            value = result.get(key)
            cells.append(
                ("skipped" if "skipped" in result else "-") if value is None else form.format(value)
            )
        lines.append(label.ljust(width) + "".join(c.rjust(12) for c in cells))
    notes = [f"  {r['store']}: {r['skipped']}" for r in results if "skipped" in r]
    notes += [
        f"  {r['store']} bytes: {r['bytes_measured']}" for r in results if r.get("bytes_measured")
    ]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measured rate")
    parser.add_argument("--only", default=",".join(ORDER), help="comma-separated store names")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    names = [n for n in ORDER if n in args.only.split(",")]
    results = [measure(name, args.seconds) for name in names]
    if args.json:
        print(json.dumps({"seconds": args.seconds, "stores": results}))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
