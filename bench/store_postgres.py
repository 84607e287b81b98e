"""Benchmark of the PostgreSQL claim store: claims per second, round trips, bytes per claim.

    python bench/store_postgres.py [URL] [--json]      # URL: postgresql://127.0.0.1:5432/test

``measure(url)`` works in a schema of its own (``beatless_bench_{random}``, whatever the
URL names), dropped at the end, and returns:

* ``claims_per_s_batch_1`` / ``claims_per_s_batch_1000``: fresh firings claimed and
  committed by one client, one firing or 1,000 per call, for about ``seconds`` each;
* ``round_trips_per_firing_batch_1`` / ``_batch_1000``: statements the client sent per
  firing (claim and commit; each statement is one round trip), counted on its connection;
* ``claims_per_s_batch_1000_3_clients``: three processes, each a client of its own,
  claiming and committing batches of 1,000 fresh firings at once;
* ``bytes_per_claim``: ``pg_total_relation_size`` of the claims table (rows, primary key,
  expiry index) divided by the committed claims it holds, after ``rows`` of them, as the
  server reports it; ``heap_bytes_per_claim`` and ``index_bytes_per_claim`` split it;
* ``wal_bytes_per_claim``: write-ahead log the server wrote per firing claimed and
  committed in batches of 1,000 (``pg_current_wal_lsn``; other sessions add to it).

Addresses are ``bench/e{i}`` and the task tag eight hex digits, as a real entry's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from beatless.stores.base import ClaimRequest
from beatless.stores.postgres.store import PostgresStore

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"
LEASE_MS = 30_000
MEMORY_MS = 80_000
TAG = "0a1b2c3d"


class _Counting(psycopg.Connection[Any]):
    """A connection that counts the statements sent through it (one round trip each)."""

    statements = 0

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        self.statements += 1
        return super().execute(query, params, **kw)


def _requests(now_ms: int, n: int) -> list[ClaimRequest]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    return [
        ClaimRequest(i, f"bench/e{k}", now_ms, 60_000, MEMORY_MS, now_ms, TAG)
        for k, i in enumerate(ids)
    ]


def _claim_and_commit(store: PostgresStore, batch: list[ClaimRequest]) -> None:
    outcomes = store.claim(batch, node="bench", lease_ms=LEASE_MS)
    if not all(o.is_won for o in outcomes):
        raise RuntimeError(f"a fresh firing was not won: {set(outcomes)}")
    store.commit([r.id for r in batch], node="bench")


def _rate(store: PostgresStore, size: int, seconds: float) -> tuple[float, int, int]:
    """Claims per second, firings and batches done in about ``seconds``."""
    now = store.time_ms()
    done = batches = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        _claim_and_commit(store, _requests(now, size))
        done, batches = done + size, batches + 1
    return done / (time.perf_counter() - started), done, batches


def _client(url: str, schema: str, batches: int, start: Any, out: Any) -> None:
    store = PostgresStore(url, schema=schema)
    now = store.time_ms()
    work = [_requests(now, 1_000) for _ in range(batches)]
    start.wait()
    began = time.perf_counter()
    for batch in work:
        _claim_and_commit(store, batch)
    out.put((began, time.perf_counter()))
    store.close()


def _concurrent(url: str, schema: str, clients: int, batches: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(url, schema, batches, start, out)) for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # let every client connect and build its batches
    start.set()
    spans = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    wall = max(end for _, end in spans) - min(began for began, _ in spans)
    return clients * batches * 1_000 / wall


def _sizes(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int, int]:
    table = f"{sql.Identifier(schema).as_string(conn)}.claims"
    row = conn.execute(
        "SELECT pg_total_relation_size(%s::regclass), pg_relation_size(%s::regclass),"
        " pg_indexes_size(%s::regclass)",
        (table, table, table),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _wal_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def _own_schema(url: str) -> Iterator[str]:
    schema = f"beatless_bench_{uuid.uuid4().hex[:10]}"
    try:
        yield schema
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def measure(url: str = DEFAULT_URL, *, seconds: float = 3.0, rows: int = 20_000) -> dict[str, Any]:
    """Run every measurement against the server at ``url``; see the module docstring."""
    base = url.split("?", 1)[0]
    result: dict[str, Any] = {"store": "postgres", "url": base}
    with _own_schema(base) as schema, _Counting.connect(base, autocommit=True) as counting:
        store = PostgresStore(counting, schema=schema)
        store.probe()
        for size in (1, 1_000):
            before = counting.statements
            rate, firings, _ = _rate(store, size, seconds)
            result[f"claims_per_s_batch_{size}"] = round(rate)
            result[f"round_trips_per_firing_batch_{size}"] = (
                counting.statements - before
            ) / firings
        store.close()
    with _own_schema(base) as schema:
        PostgresStore(base, schema=schema).probe()
        result["claims_per_s_batch_1000_3_clients"] = round(_concurrent(base, schema, 3, 20))
    with _own_schema(base) as schema, psycopg.connect(base, autocommit=True) as conn:
        store = PostgresStore(base, schema=schema)
        store.probe()
        wal_before = _wal_lsn(conn)
        now = store.time_ms()
        for _ in range(rows // 1_000):
            _claim_and_commit(store, _requests(now, 1_000))
        wal = _wal_lsn(conn) - wal_before
        count = len(store)
        total, heap, indexes = _sizes(conn, schema)
        result.update(
            rows=count,
            bytes_per_claim=round(total / count),
            heap_bytes_per_claim=round(heap / count),
            index_bytes_per_claim=round(indexes / count),
            bytes_measured="on the server: pg_total_relation_size of the claims table",
            wal_bytes_per_claim=round(wal / count),
        )
        store.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.url, seconds=args.seconds)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
