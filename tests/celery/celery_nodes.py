"""Real ``celery`` processes of ``integrations/celery_redis`` for the end-to-end tests.

Each process runs ``python -m celery -A integrations.celery_redis.app ...`` in a session
of its own, so that it and its pool children are stopped (or killed) by process group.
The example's tasks append each run, as it starts, to the Redis list ``{namespace}:runs``.

Imported by a worker (``--include celery_nodes``, with ``BEATLESS_E2E_RECEIPTS`` set),
this module also notes every task message the worker's main process receives from the
broker, with kombu's ``delivery_tag`` (unique per message pushed), in ``{namespace}:received``.

The firings each entry must produce are computed here from the triggers, the address
and the id formula of DESIGN.md, without beatless: :data:`ENTRIES` restates the
example's schedule, and a test checks that it matches ``BEAT_SCHEDULE``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
REDIS_URL = "redis://127.0.0.1:6379/10"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
PIKA_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
"""The same server and vhost ``/``, as pika spells it."""
APP = "integrations.celery_redis.app"
READY = "beatless node "
"""The start-up line of a node's scheduler (``build_scheduler``), once per node."""

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")


@dataclass(frozen=True)
class Expected:
    """One entry of the example's schedule, restated: task, period, jitter, tenants."""

    task: str
    period_ms: int
    jitter_ms: int = 0
    tenants: tuple[str, ...] = ()


ENTRIES: dict[str, Expected] = {
    "tick-1s": Expected("demo.tick", 1_000),
    "tick-1s-args": Expected("demo.tick", 1_000),
    "work-2s": Expected("demo.work", 2_000),
    "work-2s-priority": Expected("demo.work", 2_000),
    "work-3s": Expected("demo.work", 3_000),
    "report-5s": Expected("demo.report", 5_000),
    "report-5s-jittered": Expected("demo.report", 5_000, 2_000),
    "report-10s-expiring": Expected("demo.report", 10_000),
    # crontab() in UTC: second 0 of every minute.
    "minutely": Expected("demo.report", 60_000),
    "minutely-jittered": Expected("demo.report", 60_000, 3_000),
    "sync-tenants-5s": Expected("demo.sync_tenant", 5_000, 2_000, TENANTS),
}
MAX_JITTER_MS = max(e.jitter_ms for e in ENTRIES.values())


@dataclass(frozen=True)
class Firing:
    entry: str
    tenant: str | None
    occurrence_ms: int
    id: str
    release_ms: int
    task: str


def firing_id(address: str, occurrence_ms: int) -> tuple[str, int]:
    """``(id, lead53)``: sha256 of ``address@occurrence_ms`` as a UUID, and its lead bits."""
    digest = hashlib.sha256(f"{address}@{occurrence_ms}".encode()).digest()
    h = digest[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}", int.from_bytes(
        digest[:8], "big"
    ) >> 11


def expected_firings(namespace: str, low_ms: int, high_ms: int) -> list[Firing]:
    """Every firing whose occurrence falls in ``[low_ms, high_ms]``."""
    out = []
    for name, entry in ENTRIES.items():
        first = -(-low_ms // entry.period_ms) * entry.period_ms
        for occurrence in range(first, high_ms + 1, entry.period_ms):
            for tenant in entry.tenants or (None,):
                address = f"{namespace}/{name}" + (f"/{tenant}" if tenant else "")
                fid, lead53 = firing_id(address, occurrence)
                release = occurrence + ((entry.jitter_ms * lead53) >> 53)
                out.append(Firing(name, tenant, occurrence, fid, release, entry.task))
    return out


# -- processes ------------------------------------------------------------------------


def environment(namespace: str, broker: str, store: str | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "BEATLESS_DEMO_BROKER": broker,
        "BEATLESS_DEMO_NAMESPACE": namespace,
        "BEATLESS_DEMO_RECORD": REDIS_URL,
        "BEATLESS_DEMO_MAX_LATE": "15s",
    }
    env.pop("BEATLESS_DEMO_STORE", None)
    if store:
        env["BEATLESS_DEMO_STORE"] = store
    return env


@dataclass
class Node:
    """One ``celery`` command in its own session; stopped by its process group."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    killed_at: float | None = field(default=None)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def is_ready(self) -> bool:
        return READY in self.text()

    def kill(self) -> None:
        """SIGKILL the node's whole process group, at once: no shutdown of any kind."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.killed_at = time.time()

    def stop(self, deadline: float) -> None:
        """Warm shutdown (SIGTERM to the main process) until ``deadline``, then SIGKILL the
        process group whatever is left. Nothing for a node killed already: its group is
        gone, and its number may be another process's group by now."""
        if self.killed_at is not None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


def start(name: str, args: list[str], env: dict[str, str], logs: Path) -> Node:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Node(name, process, log)


def worker_args(name: str, *extra: str) -> list[str]:
    return [
        "worker",
        "-n",
        f"{name}@%h",
        "-c",
        "1",
        "-l",
        "INFO",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
        *extra,
    ]


def beat_args() -> list[str]:
    return ["beat", "-S", "beatless.celery:BeatScheduler", "-l", "INFO"]


def stop_all(nodes: Iterable[Node], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for node in nodes:
        if node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(signal.SIGTERM)
    for node in nodes:
        node.stop(deadline)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# -- what ran, what was received, what is still in the broker -----------------------------


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def read_list(key: str) -> list[dict[str, Any]]:
    client = redis_client()
    try:
        return [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    finally:
        client.close()


def left_in_redis_broker(namespace: str) -> list[dict[str, Any]]:
    """Task messages still in the Redis broker: in the queue's lists (every priority step)
    and in kombu's ``unacked`` hash (delivered to a worker, never acknowledged). Each as
    ``{"id", "delivery_tag", "where"}``."""
    client = redis_client()
    found = []
    try:
        for key in client.scan_iter(match=f"{namespace}:{namespace}*", count=1_000):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                found.append(_message(json.loads(raw), key.decode()))
        for _tag, raw in client.hgetall(f"{namespace}:unacked").items():
            payload = json.loads(raw)[0]
            found.append(_message(payload, "unacked"))
    finally:
        client.close()
    return found


def _message(payload: dict[str, Any], where: str) -> dict[str, Any]:
    return {
        "id": payload["headers"]["id"],
        "delivery_tag": payload["properties"]["delivery_tag"],
        "where": where,
    }


def delete_keys(namespace: str) -> None:
    """Delete what one run created in db 10: its records, its broker keys, its claims."""
    client = redis_client()
    try:
        for pattern in (f"{namespace}:*", f"beatless:{namespace}:*"):
            keys = list(client.scan_iter(match=pattern, count=1_000))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def delete_rabbitmq(namespace: str) -> None:
    """Delete the queue and exchange of one run (both named after the namespace)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(PIKA_URL))
    try:
        channel = connection.channel()
        channel.queue_delete(queue=namespace)
        channel.exchange_delete(exchange=namespace)
        # the RabbitMQ claim store's own names (its slot queues expire with its memory)
        channel.queue_delete(queue=f"beatless.{namespace}.epoch")
        channel.queue_delete(queue=f"beatless.{namespace}.notes")
        channel.exchange_delete(exchange=f"beatless.{namespace}.slots")
    finally:
        connection.close()


# -- judging ----------------------------------------------------------------------------


@dataclass
class Report:
    expected: int
    runs: int
    duplicates: list[str]
    missed: list[tuple[str, str | None, int]]
    wrong: list[dict[str, Any]]
    entries: Counter[str]

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.expected} firings expected in the window, {self.runs} records, "
            f"{len(self.duplicates)} duplicates, {len(self.missed)} missed, "
            f"{len(self.wrong)} wrong"
        )


def judge(records: list[dict[str, Any]], expected: list[Firing], key: str = "id") -> Report:
    """Each expected firing appears exactly once in ``records`` (by task id), with its
    occurrence, task and tenant; no task id appears twice anywhere, in the window or not."""
    counts = Counter(r[key] for r in records)
    by_id = {r[key]: r for r in records}
    missed, wrong = [], []
    for firing in expected:
        record = by_id.get(firing.id)
        if record is None:
            missed.append((firing.entry, firing.tenant, firing.occurrence_ms))
        elif "task" in record and (
            record["task"] != firing.task
            or record["occurrence_ms"] != firing.occurrence_ms
            or record["tenant"] != firing.tenant
            or record["firing_id"] != firing.id
        ):
            wrong.append(record)
    return Report(
        expected=len(expected),
        runs=len(records),
        duplicates=sorted(i for i, n in counts.items() if n > 1),
        missed=missed,
        wrong=wrong,
        entries=Counter(f.entry for f in expected),
    )


# -- the receipt probe (imported by a worker with --include celery_nodes) --------------


def _connect_receipts() -> None:
    from celery.signals import task_received

    namespace = os.environ["BEATLESS_DEMO_NAMESPACE"]
    client = redis_client()

    @task_received.connect(weak=False)
    def note(request: Any = None, **_: Any) -> None:
        client.rpush(
            f"{namespace}:received",
            json.dumps(
                {
                    "id": request.id,
                    "delivery_tag": request.message.delivery_tag,
                    "redelivered": bool(request.message.delivery_info.get("redelivered")),
                    "worker": request.hostname,
                    "at": time.time(),
                }
            ),
        )


if os.environ.get("BEATLESS_E2E_RECEIPTS") == "1":
    _connect_receipts()
