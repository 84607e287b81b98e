"""Benchmark of the NATS JetStream claim store: claims per second, requests, bytes per claim.

    python bench/store_nats.py [URL] [--json]      # URL: nats://127.0.0.1:4222

``measure(url)`` works in a bucket of its own (``beatless_bench_{random}``, whatever the
URL names), deleted at the end, and returns:

* ``claims_per_s_batch_1`` / ``claims_per_s_batch_1000``: fresh firings claimed and
  committed by one client, one firing or 1,000 per call, for about ``seconds`` each;
* ``requests_per_firing_batch_1`` / ``_batch_1000``: requests the client sent per firing
  (claim and commit), counted on its connection; every request is a server command with
  its own reply, but those of one call are sent together, so a call waits for
  ``round_trips_per_call`` replies in turn (the clock and the bucket's info, then the
  writes);
* ``requests_per_firing_lost``: what a second node pays for each firing of a batch of
  1,000 that the first holds (a refused create and a read), and
  ``claims_per_s_lost_batch_1000`` how fast it learns it;
* ``claims_per_s_batch_1000_3_clients``: three processes, each a client of its own,
  claiming and committing batches of 1,000 fresh firings at once in the same bucket;
* ``clock_read_ms``: the median time of :meth:`~beatless.stores.nats.store.NATSStore.time_ms`
  (a write and the stream's info: two round trips), which every call pays once;
* ``bytes_per_claim``: the bucket's stream bytes (``STREAM.INFO`` ``state.bytes``:
  subject, headers and value of each message, as the server counts them) divided by the
  committed claims it holds, after ``claims`` of them. The server's index of subjects
  and its file blocks, which also hold the deleted earlier revisions until compacted or
  expired, are not in it.

Addresses are ``bench/e{i}`` and the task tag eight hex digits, as a real entry's; ids
are 64 hex digits, as real firing ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from beatless.stores.base import ClaimRequest, Outcome
from beatless.stores.nats.store import NATSStore

DEFAULT_URL = "nats://127.0.0.1:4222"
LEASE_MS = 30_000
MEMORY_MS = 80_000
TAG = "0a1b2c3d"


def _requests(now_ms: int, n: int) -> list[ClaimRequest]:
    return [
        ClaimRequest(secrets.token_hex(32), f"bench/e{k}", now_ms, 60_000, MEMORY_MS, now_ms, TAG)
        for k in range(n)
    ]


def _claim_and_commit(store: NATSStore, batch: list[ClaimRequest]) -> None:
    outcomes = store.claim(batch, node="bench", lease_ms=LEASE_MS)
    if not all(o.is_won for o in outcomes):
        raise RuntimeError(f"a fresh firing was not won: {set(outcomes)}")
    if not all(store.commit([r.id for r in batch], node="bench")):
        raise RuntimeError("a claim just won could not be committed")


def _rate(store: NATSStore, size: int, seconds: float) -> tuple[float, float]:
    """Claims per second and requests per firing, over about ``seconds``."""
    now = store.time_ms()
    done, sent = 0, store.requests
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        _claim_and_commit(store, _requests(now, size))
        done += size
    rate = done / (time.perf_counter() - started)
    return rate, (store.requests - sent) / done


def _lost(url: str, bucket: str) -> tuple[float, float]:
    """A second node claiming 1,000 firings the first holds: claims per second, requests each."""
    first, second = NATSStore(url, bucket=bucket), NATSStore(url, bucket=bucket)
    batch = _requests(first.time_ms(), 1_000)
    first.claim(batch, node="first", lease_ms=LEASE_MS)
    second.time_ms()
    sent = second.requests
    started = time.perf_counter()
    outcomes = second.claim(batch, node="second", lease_ms=LEASE_MS)
    took = time.perf_counter() - started
    if set(outcomes) != {Outcome.HELD}:
        raise RuntimeError(f"the second node did not see the first's claims: {set(outcomes)}")
    requests = (second.requests - sent) / len(batch)
    first.close()
    second.close()
    return len(batch) / took, requests


def _client(url: str, bucket: str, batches: int, start: Any, out: Any) -> None:
    store = NATSStore(url, bucket=bucket)
    now = store.time_ms()
    work = [_requests(now, 1_000) for _ in range(batches)]
    start.wait()
    began = time.perf_counter()
    for batch in work:
        _claim_and_commit(store, batch)
    out.put((began, time.perf_counter()))
    store.close()


def _concurrent(url: str, bucket: str, clients: int, batches: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(url, bucket, batches, start, out)) for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # let every client connect and build its batches
    start.set()
    spans: list[tuple[float, float]] = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    wall = max(end for _, end in spans) - min(began for began, _ in spans)
    return clients * batches * 1_000 / wall


def _admin(url: str, subject: str) -> dict[str, Any]:
    import nats

    async def run() -> dict[str, Any]:
        client = await nats.connect(url, max_reconnect_attempts=1)
        try:
            reply = await client.request(subject, b"", timeout=10)
        finally:
            await client.close()
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    return asyncio.run(run())


def _bytes_per_claim(url: str, bucket: str, claims: int) -> dict[str, float]:
    store = NATSStore(url, bucket=bucket)
    now = store.time_ms()
    for start in range(0, claims, 1_000):
        _claim_and_commit(store, _requests(now, min(1_000, claims - start)))
    state = _admin(url, f"$JS.API.STREAM.INFO.KV_{bucket}")["state"]
    store.close()
    # The bucket also holds the clock key and what the earlier measures left.
    return {"bytes_per_claim": state["bytes"] / state["messages"], "messages": state["messages"]}


def measure(
    url: str = DEFAULT_URL, *, seconds: float = 3.0, claims: int = 10_000
) -> dict[str, Any]:
    """The figures in the module docstring, in a bucket of the benchmark's own."""
    bucket = f"beatless_bench_{secrets.token_hex(6)}"
    store = NATSStore(url, bucket=bucket)
    try:
        reads = []
        for _ in range(50):
            began = time.perf_counter()
            store.time_ms()
            reads.append((time.perf_counter() - began) * 1_000)
        one, requests_one = _rate(store, 1, seconds)
        thousand, requests_thousand = _rate(store, 1_000, seconds)
        lost_rate, lost_requests = _lost(url, bucket)
        three = _concurrent(url, bucket, clients=3, batches=5)
        sizes = _bytes_per_claim(url, f"{bucket}_size", claims)
    finally:
        store.close()
        _admin(url, f"$JS.API.STREAM.DELETE.KV_{bucket}")
        _admin(url, f"$JS.API.STREAM.DELETE.KV_{bucket}_size")
    return {
        "store": "nats",
        "claims_per_s_batch_1": round(one),
        "claims_per_s_batch_1000": round(thousand),
        "claims_per_s_batch_1000_3_clients": round(three),
        "requests_per_firing_batch_1": round(requests_one, 3),
        "requests_per_firing_batch_1000": round(requests_thousand, 3),
        "round_trips_per_call": 3,
        "requests_per_firing_lost": round(lost_requests, 3),
        "claims_per_s_lost_batch_1000": round(lost_rate),
        "clock_read_ms": round(statistics.median(reads), 3),
        "bytes_per_claim": round(sizes["bytes_per_claim"], 1),
        "bytes_measured": "on the server: STREAM.INFO state.bytes / messages",
        "claims_for_bytes": claims,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    figures = measure(args.url)
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key:36} {value}")


if __name__ == "__main__":
    main()
