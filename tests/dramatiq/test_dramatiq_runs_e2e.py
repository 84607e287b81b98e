"""End to end: the worker's gate (overlap, run leases, once-only) in real ``dramatiq``
CLI nodes of ``runs_app.py`` on the Redis broker, each test under about a minute.

* overlap ``skip``: an actor that runs 7 s on an entry every 2 s never runs twice at
  once, and every occurrence of the window either ran or was counted skipped, with the
  claims in the broker's Redis and in the RabbitMQ store;
* a worker killed mid-run (``kill -9``): the address stays held until ``run_lease``
  after the last heartbeat, then the next firing runs on another node;
* copies of one message (same id and options): the body runs once, each copy is counted
  ``duplicate``.

Keys: the namespace ``bl-runs-*`` of each test in Redis db 12 (broker, records, claims)
and db 13 (the claim store of the two-phase test), and the RabbitMQ store's queues and
exchange under ``beatless.bl-runs-*``; deleted afterwards (its slot queues expire).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from dramatiq_nodes import AMQP_URL, Node, delete_store_names, stop_nodes, wait_for_schedulers
from service_check import require_service

from beatless.schedule.firing import firing_id, run_lease_id

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REDIS_URL = "redis://127.0.0.1:6379/12"
STORE_DB_URL = "redis://127.0.0.1:6379/13"


@pytest.fixture
def namespace() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    name = f"bl-runs-{uuid.uuid4().hex[:10]}"
    yield name
    for url in (REDIS_URL, STORE_DB_URL):
        client = redis.Redis.from_url(url)
        for pattern in (f"{name}:*", f"beatless:{name}:*"):
            keys = list(client.scan_iter(match=pattern, count=1_000))
            if keys:
                client.delete(*keys)
        client.close()


def start_node(
    tmp_path: Path, namespace: str, name: str, processes: int, threads: int, **settings: str
) -> Node:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "BT_NS": namespace,
        "BT_REDIS": REDIS_URL,
        **settings,
    }
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dramatiq",
                "runs_app",
                "--processes",
                str(processes),
                "--threads",
                str(threads),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Node(process, log)


def events(namespace: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [json.loads(raw) for raw in client.lrange(f"{namespace}:events", 0, -1)]
    finally:
        client.close()


def wait_for(predicate: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(step)
    raise AssertionError(f"not within {timeout}s")


def of(rows: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["event"] == event]


def counted(rows: list[dict[str, Any]], verdict: str) -> int:
    """What the worker processes counted: each process's last count of ``verdict``."""
    last: dict[int, int] = {}
    for row in rows:
        last[row["pid"]] = max(last.get(row["pid"], 0), row["counts"].get(verdict, 0))
    return sum(last.values())


SENT_SKIPPED = re.compile(r"firing ([0-9a-f-]{36}) of .* not sent: a run of it is in progress")


@pytest.mark.parametrize("store", ["broker's redis", "rabbitmq"])
def test_overlap_skip_never_runs_twice_at_once_and_counts_every_skipped_occurrence(
    tmp_path: Path, namespace: str, store: str
) -> None:
    """One node, two worker processes of two threads; every 2 s, each run 7 s. Claims in
    the broker's Redis (atomic): the claim script checks the run lease, so an overlapping
    firing is not sent at all (the scheduler logs it); one sent while the run before it
    waited in the queue is refused by the worker that takes it. Claims in the RabbitMQ
    store: the claim does not read the run lease, so every overlapping firing is sent and
    refused by a worker, whose run lease is renewed by heartbeats without a gap."""
    settings = {"BT_EVERY": "2s", "BT_SLEEP": "7", "BT_OVERLAP": "skip"}
    if store == "rabbitmq":
        require_service("RabbitMQ", "127.0.0.1", 5672)
        settings["BT_STORE"] = AMQP_URL
    node = start_node(tmp_path, namespace, "node", 2, 2, **settings)
    try:
        wait_for_schedulers([node])
        low_ms = int(time.time() * 1_000) + 1_000
        time.sleep(32)
        high_ms = int(time.time() * 1_000) - 2_000
    finally:
        stop_nodes([node], timeout=20)
        if store == "rabbitmq":
            delete_store_names(namespace)
    rows = events(namespace)
    address = f"{namespace}/job"
    expected = {firing_id(address, o) for o in range(low_ms + (-low_ms % 2_000), high_ms, 2_000)}
    starts, ends, skipped = of(rows, "start"), of(rows, "end"), of(rows, "skipped")
    ran = [r["id"] for r in starts]
    refused = [r["id"] for r in skipped]
    text = node.log.read_text(errors="replace")
    assert "Traceback" not in text
    not_sent = SENT_SKIPPED.findall(text)
    print(
        f"{namespace}: {len(expected)} occurrences in the window; {len(ran)} runs, "
        f"{len(refused)} refused by the workers (counted skipped_overlap: "
        f"{counted(skipped, 'skipped_overlap')}), {len(not_sent)} not sent by the scheduler; "
        f"worker processes {sorted({r['pid'] for r in starts + skipped})}"
    )
    assert len(expected) >= 13
    assert len(ran) == len(set(ran)), "a firing ran twice"
    assert not set(ran) & set(refused), "a firing both ran and was skipped"
    assert len(refused) == len(set(refused))
    assert counted(skipped, "skipped_overlap") == len(refused), "a skip was not counted"
    assert sum(counted(rows, v) for v in ("duplicate", "unchecked", "rerun")) == 0
    lost = expected - set(ran) - set(refused) - set(not_sent)
    assert not lost, f"occurrences neither run nor counted skipped: {sorted(lost)}"
    assert len(ran) >= 3
    assert len(refused) + len(not_sent) >= 8
    # Never two runs at once: each run starts after the one before it ended.
    end_of = {r["id"]: r["t"] for r in ends}
    runs = sorted(starts, key=lambda r: r["t"])
    for before, after in itertools.pairwise(runs):
        assert before["id"] in end_of, f"{after['id']} started while {before['id']} ran"
        assert after["t"] >= end_of[before["id"]], "two runs overlapped"


def lease_until(client: redis.Redis, key: str) -> int | None:
    """The end of the run lease's record, epoch ms (``v=2|pending|{until}|...``)."""
    raw = client.get(key)
    if raw is None:
        return None
    parts = raw.decode().split("|")
    return int(parts[2]) if parts[1] == "pending" else None


def kill_mid_run(node: Node, namespace: str) -> tuple[dict[str, Any], float, int]:
    """Kill the worker process of the node's first run 3.5 s into it (after its heartbeat
    at 2 s, before the one at 4 s): the run's start record, the instant of the kill, and
    the end of the run lease, epoch ms, read from its record."""
    records = redis.Redis.from_url(STORE_DB_URL)
    key = f"beatless:{namespace}:claim:{run_lease_id(f'{namespace}/job')}"
    try:
        (first,) = wait_for(lambda: of(events(namespace), "start"), 20)
        untils = {lease_until(records, key)}
        while time.time() < first["t"] + 3.5:
            untils.add(lease_until(records, key))
            time.sleep(0.05)
        victim = psutil.Process(first["pid"])
        assert victim.ppid() == node.process.pid  # a worker process of the node
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim.wait(5)
        renewed = sorted(u for u in untils if u is not None)
        assert len(renewed) >= 2, f"the run lease was not renewed: {renewed}"
        until = lease_until(records, key)
        assert until is not None
        assert until >= renewed[-1]
        return first, killed_at, until
    finally:
        records.close()


def test_a_worker_killed_mid_run_holds_its_address_until_the_run_lease_lapses(
    tmp_path: Path, namespace: str
) -> None:
    """run_lease 6 s, heartbeat 2 s, claims two-phase in Redis db 13. Node 1's worker is
    killed with SIGKILL 3.5 s into a run (after its heartbeat at 2 s), node 2 starts: its
    first run starts no earlier than the last heartbeat + run_lease, read from the run
    lease's record; the scheduler itself holds back the firings while the record lives."""
    settings = {
        "BT_EVERY": "2s",
        "BT_SLEEP": "30",
        "BT_OVERLAP": "skip",
        "BT_RUN_LEASE": "6s",
        "BT_HEARTBEAT": "2s",
        "BT_STORE": STORE_DB_URL,
    }
    nodes = [start_node(tmp_path, namespace, "node1", 1, 2, **settings)]
    try:
        wait_for_schedulers(nodes)
        first, killed_at, until = kill_mid_run(nodes[0], namespace)
        began = first["t"]
        last_heartbeat_ms = until - 6_000
        nodes.append(start_node(tmp_path, namespace, "node2", 1, 2, **settings))
        wait_for_schedulers(nodes[1:])

        def next_start() -> list[dict[str, Any]]:
            return [r for r in of(events(namespace), "start") if r["t"] > killed_at]

        (following, *_) = wait_for(next_start, 25)
    finally:
        stop_nodes(nodes, timeout=20)
    rows = events(namespace)
    started_ms = following["t"] * 1_000
    gap_s = (started_ms - last_heartbeat_ms) / 1_000
    refused = [r for r in of(rows, "skipped") if killed_at < r["t"] < following["t"]]
    print(
        f"{namespace}: killed {killed_at - began:.2f}s into the run, "
        f"{(killed_at * 1_000 - last_heartbeat_ms) / 1_000:.2f}s after its last heartbeat; "
        f"next run {gap_s:.3f}s after that heartbeat (run_lease 6s), "
        f"{(started_ms - until) / 1_000:.3f}s after the lease ran out; "
        f"{len(refused)} firings refused by node 2's workers meanwhile "
        f"(counted skipped_overlap: {counted(refused, 'skipped_overlap')})"
    )
    assert following["pid"] != first["pid"]
    assert following["id"] != first["id"]
    assert last_heartbeat_ms <= killed_at * 1_000
    assert started_ms >= until, f"ran {until - started_ms:.0f} ms before the lapse"
    assert gap_s >= 6.0
    assert started_ms <= until + 6_000, "the address stayed held long after the lease lapsed"
    assert counted(refused, "skipped_overlap") == len(refused)


def test_a_copy_of_a_message_runs_once_and_each_copy_is_counted_duplicate(
    tmp_path: Path, namespace: str
) -> None:
    """A copy (same message id, same options) sent while the run goes on, and another
    after it ended: the body runs once; both copies are refused as duplicates (the first
    waits for the run it found held, and is refused when that run ends)."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    node = start_node(tmp_path, namespace, "node", 2, 2, BT_EVERY="20s", BT_SLEEP="3")
    sender = RedisBroker(url=REDIS_URL, namespace=namespace)
    sender.declare_queue(namespace)
    try:
        wait_for_schedulers([node])
        (first,) = wait_for(lambda: of(events(namespace), "start"), 20)
        copy = dramatiq.Message(**first["sent"])
        sender.enqueue(copy)  # while the first copy runs
        sent_during = time.time()
        wait_for(lambda: of(events(namespace), "end"), 10)
        sender.enqueue(copy)  # after it ended

        def refused() -> list[dict[str, Any]]:
            found = [r for r in of(events(namespace), "skipped") if r["id"] == first["id"]]
            return found if len(found) == 2 else []

        copies = wait_for(refused, 10)
    finally:
        stop_nodes([node], timeout=20)
        sender.close()
    rows = events(namespace)
    starts = [r for r in of(rows, "start") if r["id"] == first["id"]]
    print(
        f"{namespace}: firing {first['id']}: {len(starts)} run, {len(copies)} copies refused "
        f"(counted duplicate: {counted(of(rows, 'skipped'), 'duplicate')})"
    )
    assert len(starts) == 1
    ended = of(rows, "end")[0]["t"]
    assert sent_during < ended, "the first copy was not sent while the run went on"
    assert ended <= max(c["t"] for c in copies)
    assert counted(of(rows, "skipped"), "duplicate") == 2
    text = node.log.read_text(errors="replace")
    assert text.count(f"firing {first['id']} of '{namespace}/job' (attempt 0) not run") == 2
