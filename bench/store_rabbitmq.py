"""Benchmark of the RabbitMQ claim store: claims per second, AMQP methods, broker memory.

    python bench/store_rabbitmq.py [URL] [--json] [--seconds 3]
    # URL: amqp://guest:guest@127.0.0.1:5672/%2F

``measure(url)`` works under a queue prefix of its own (``beatless-bench.{random}.``),
deletes every queue and the exchange it created at the end, and returns:

* ``claims_per_s_batch_1`` / ``claims_per_s_batch_1000``: fresh firings claimed and
  committed by one client, one firing or 1,000 per call, for about ``seconds`` each, with
  durable slots (the default); ``..._transient`` the same with ``durable=false``;
* ``ops_per_firing_batch_1`` / ``_batch_1000``: AMQP methods the client sent per firing
  (publishes, queue declarations, bindings; claim and commit), counted by the store's
  session; ``ops_by_kind_batch_1000`` splits them;
* ``queue_declarations_per_s`` / ``..._parallel``: new classic queues (the slot's
  arguments, durable) declared one at a time on one channel, and 16 at once on 16
  channels: what bounds the store, since every firing creates one slot queue;
* ``bytes_per_claim`` (and ``_transient``): the broker's memory per committed claim still
  remembered, from ``rabbitmq-diagnostics memory_breakdown`` before and after holding
  ``held`` of them (other clients of the broker add noise); when the tool is missing, a
  figure computed from the measured size of one classic queue process, labelled so.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from beatless.stores.base import ClaimRequest
from beatless.stores.rabbitmq.store import _SLOT, RabbitMQStore

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
LEASE_MS = 30_000
MEMORY_MS = 80_000
TAG = "0a1b2c3d"
HELD = 2_000
SETTLE_S = 5.0
COMPUTED_BYTES_PER_QUEUE = 32_000
"""A classic queue process with one binding, measured on RabbitMQ 3.10 (transient)."""


class Bench:
    """One prefix of the benchmark's own: stores under it, and their cleanup."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"beatless-bench.{uuid.uuid4().hex[:10]}."
        self.ids: list[str] = []
        self.queues: list[str] = []

    def store(self, durable: bool) -> RabbitMQStore:
        return RabbitMQStore(self.url, prefix=self.prefix, durable=durable)

    def requests(self, n: int) -> list[ClaimRequest]:
        now = int(time.time() * 1_000)
        batch = []
        for i in range(n):
            id_ = uuid.uuid4().hex
            self.ids.append(id_)
            batch.append(ClaimRequest(id_, f"bench/e{i}", now, 60_000, MEMORY_MS, now, TAG))
        return batch

    def cleanup(self, durable: bool) -> None:
        """Delete what this prefix created; a new prefix for the next variant."""
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = conn.channel()
            names = [f"{self.prefix}c.{i}" for i in self.ids] + [f"{self.prefix}epoch"]
            for name in names + self.queues:
                channel.queue_delete(name)
            channel.exchange_delete(f"{self.prefix}slots")
        finally:
            conn.close()
        self.ids, self.queues = [], []
        self.prefix = f"beatless-bench.{uuid.uuid4().hex[:10]}.{'d' if durable else 't'}."


def rate(
    bench: Bench, durable: bool, size: int, seconds: float
) -> tuple[float, float, dict[str, int]]:
    """Firings claimed and committed per second in batches of ``size``; methods per firing."""
    store = bench.store(durable)
    try:
        store.claim(bench.requests(1), node="warm", lease_ms=LEASE_MS)  # connect, epoch
        before = dict(store._sessions.sent())
        done, started = 0, time.perf_counter()
        while done == 0 or time.perf_counter() - started < seconds:
            batch = bench.requests(size)
            outcomes = store.claim(batch, node="bench", lease_ms=LEASE_MS)
            assert all(o.is_won for o in outcomes), outcomes
            assert all(store.commit([r.id for r in batch], node="bench"))
            done += size
        elapsed = time.perf_counter() - started
        sent = {k: v - before.get(k, 0) for k, v in store._sessions.sent().items()}
    finally:
        store.close()
    return done / elapsed, sum(sent.values()) / done, sent


def declarations(url: str, bench: Bench, n: int = 1_000) -> tuple[float, float]:
    """New slot-like queues declared per second: one at a time, then 16 channels at once."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        args = {**_SLOT, "x-expires": 120_000}
        names = [f"{bench.prefix}q.{uuid.uuid4().hex}" for _ in range(n)]
        bench.queues += names
        started = time.perf_counter()
        for name in names:
            channel.queue_declare(name, durable=True, arguments=args)
        sequential = n / (time.perf_counter() - started)
    finally:
        conn.close()
    store = bench.store(durable=True)
    names = [f"{bench.prefix}q.{uuid.uuid4().hex}" for _ in range(n)]
    bench.queues += names
    a = store._amqp

    def declare(name: str) -> Any:
        yield a.Declare(name, durable=True, arguments=args)

    try:
        with store._sessions.take("declare") as session:
            session.run([declare(names[0])])  # connect
            started = time.perf_counter()
            session.run([declare(name) for name in names[1:]])
            parallel = (n - 1) / (time.perf_counter() - started)
    finally:
        store.close()
    return sequential, parallel


def broker_memory() -> int | None:
    """The broker's total memory in bytes from ``rabbitmq-diagnostics``, or ``None``."""
    tool = shutil.which("rabbitmq-diagnostics")
    if tool is None:
        return None
    try:
        out = subprocess.run(
            [tool, "-q", "memory_breakdown", "--unit", "bytes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = dict(re.findall(r"^\s*(\w+): (\d+)", out, re.MULTILINE))
    keep = [k for k in values if k not in ("total", "allocated_unused", "reserved_unallocated")]
    return sum(int(values[k]) for k in keep) if keep else None


def memory_per_claim(bench: Bench, durable: bool) -> tuple[float, str]:
    """Broker memory per committed claim, once the slot queues are idle (as they are for
    most of the memory they keep a claim: RabbitMQ hibernates an idle queue process)."""
    time.sleep(SETTLE_S)
    before = broker_memory()
    store = bench.store(durable)
    try:
        for _ in range(HELD // 1_000):
            batch = bench.requests(1_000)
            store.claim(batch, node="bench", lease_ms=LEASE_MS)
            store.commit([r.id for r in batch], node="bench")
        time.sleep(SETTLE_S)
        after = broker_memory()
    finally:
        store.close()
    if before is None or after is None:
        return COMPUTED_BYTES_PER_QUEUE, "computed: one classic queue process and its bindings"
    return (after - before) / HELD, (
        f"measured: rabbitmq-diagnostics memory_breakdown, {HELD} committed claims held, "
        f"idle for {SETTLE_S:g}s (queue processes, bindings, messages; other clients add noise)"
    )


def measure(url: str = DEFAULT_URL, *, seconds: float = 3.0) -> dict[str, Any]:
    bench = Bench(url)
    result: dict[str, Any] = {"store": "rabbitmq", "ops_counted": "AMQP methods"}
    try:
        for durable, suffix in ((True, ""), (False, "_transient")):
            per_claim, how = memory_per_claim(bench, durable)
            result[f"bytes_per_claim{suffix}"] = per_claim
            result[f"bytes_measured{suffix}"] = how
            bench.cleanup(durable)
            for size in (1, 1_000):
                per_s, ops, kinds = rate(bench, durable, size, seconds)
                result[f"claims_per_s_batch_{size}{suffix}"] = per_s
                result[f"ops_per_firing_batch_{size}{suffix}"] = ops
                if size == 1_000 and durable:
                    result["ops_by_kind_batch_1000"] = {
                        k: v / max(1, sum(kinds.values())) * ops for k, v in kinds.items()
                    }
            bench.cleanup(durable)
        sequential, parallel = declarations(url, bench)
        result["queue_declarations_per_s"] = sequential
        result["queue_declarations_per_s_parallel"] = parallel
    finally:
        bench.cleanup(True)
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
            print(f"{key:42} {value:,.1f}" if isinstance(value, float) else f"{key:42} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
