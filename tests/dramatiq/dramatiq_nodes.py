"""Real ``dramatiq`` CLI nodes of ``integrations/dramatiq_redis`` for end-to-end tests.

Each node is ``python -m dramatiq integrations.dramatiq_redis.app --processes 2
--threads 2``: two worker processes and the beatless supervisor, which forks the node's
scheduler process. Actors append each run to a Redis list; :func:`check_runs` compares
that list with the occurrences every entry should have had.

``python tests/dramatiq/dramatiq_nodes.py LOW_MS HIGH_MS`` prints, as JSON, the firings
the app's schedule (read from the same environment) must produce in that window.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/12"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RUN_S = 60.0
DRAIN_S = 5.0


@dataclass
class Node:
    process: subprocess.Popen[bytes]
    log: Path
    known: set[psutil.Process] = field(default_factory=set)
    """Every process seen in the node's tree, kept as psutil saw it: a kill through it
    checks that the pid is still that process (a pid is reused once its process ended)."""

    def tree(self) -> list[psutil.Process]:
        """The node's processes below its main process (workers, supervisor, scheduler)."""
        try:
            found = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.known |= set(found)
        return found

    def schedulers(self) -> list[psutil.Process]:
        """Scheduler processes: the children of the node's children (of the supervisor)."""
        main = self.process.pid
        return [p for p in self.tree() if _ppid(p) not in (main, None)]

    def workers_and_forks(self) -> list[psutil.Process]:
        return [p for p in self.tree() if _ppid(p) == self.process.pid]


def _ppid(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.NoSuchProcess:
        return None


def environment(namespace: str, broker_url: str, store_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "BEATLESS_DEMO_BROKER": broker_url,
        "BEATLESS_DEMO_STORE": store_url,
        "BEATLESS_DEMO_NAMESPACE": namespace,
        "BEATLESS_DEMO_RECORD": REDIS_URL,
    }


def start_node(env: dict[str, str], log: Path) -> Node:
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dramatiq",
                "integrations.dramatiq_redis.app",
                "--processes",
                "2",
                "--threads",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Node(process, log)


def wait_for_schedulers(nodes: list[Node], timeout: float = 20.0) -> None:
    """Until each node's scheduler process runs its loop (it logged that it is scheduling):
    on a loaded machine that comes seconds after the process is forked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(node.schedulers() and _scheduling(node) for node in nodes):
            return
        time.sleep(0.2)
    raise AssertionError("a node's scheduler process did not start in time")


def _scheduling(node: Node) -> bool:
    text = node.log.read_text(errors="replace") if node.log.exists() else ""
    return re.search(r"\] node \S+ scheduling \d+ entr", text) is not None


def stop_nodes(nodes: list[Node], timeout: float = 15.0) -> None:
    """SIGTERM each node's main process; SIGKILL by pid whatever is left after ``timeout``."""
    for node in nodes:
        node.tree()
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            node.process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
        for process in node.known:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()  # NoSuchProcess if that pid is another process's now


def expected_firings(env: dict[str, str], low_ms: int, high_ms: int) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, __file__, str(low_ms), str(high_ms)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return list(json.loads(out.stdout))


def read_runs(namespace: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [json.loads(raw) for raw in client.lrange(f"{namespace}:runs", 0, -1)]
    finally:
        client.close()


def delete_keys(namespace: str) -> None:
    """Delete the keys this run created: its record, broker namespace and claims."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for pattern in (f"{namespace}:*", f"{namespace}-dramatiq:*", f"beatless:{namespace}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


@dataclass
class Report:
    runs: int
    expected: int
    duplicates: list[tuple[Any, ...]]
    missed: list[tuple[Any, ...]]
    wrong_ids: list[dict[str, Any]]


def check_runs(runs: list[dict[str, Any]], expected: list[dict[str, Any]]) -> Report:
    """Every expected firing ran once; nothing ran twice; each message carried its
    firing id, its occurrence as ``message_timestamp`` and its tenant."""
    key = [(r["entry"], r["tenant"], r["occurrence_ms"]) for r in runs]
    counts = Counter(key)
    ids = Counter(r["message_id"] for r in runs)
    by_key = {(e["entry"], e["tenant"], e["occurrence_ms"]): e for e in expected}
    known = {(e["entry"], e["tenant"], e["occurrence_ms"]): e["id"] for e in expected}
    wrong = [
        r
        for r in runs
        if r["message_timestamp"] != r["occurrence_ms"]
        or known.get((r["entry"], r["tenant"], r["occurrence_ms"]), r["message_id"])
        != r["message_id"]
        or (r["tenant"] is not None and r.get("kwarg_tenant") != r["tenant"])
    ]
    return Report(
        runs=len(runs),
        expected=len(by_key),
        duplicates=[k for k, n in counts.items() if n > 1] + [k for k, n in ids.items() if n > 1],
        missed=sorted(k for k in by_key if k not in counts),
        wrong_ids=wrong,
    )


def _print_expected(low_ms: int, high_ms: int) -> None:
    from beatless.dramatiq._middleware import find
    from beatless.schedule.firing import Firing
    from integrations.dramatiq_redis import app

    schedule = find(app.broker)[0].schedule(app.broker)
    out = []
    for entry in schedule.entries:
        for occurrence in entry.trigger.after(low_ms - 1):
            if occurrence + entry.jitter_ms > high_ms:
                break
            for tenant in entry.tenant_list() or (None,):
                firing = Firing.of(entry, tenant, schedule.address(entry, tenant), occurrence)
                if firing.release_ms <= high_ms:
                    out.append(
                        {"entry": entry.name, "tenant": tenant, "occurrence_ms": occurrence}
                        | {"id": firing.id}
                    )
    print(json.dumps(out))


if __name__ == "__main__":
    _print_expected(int(sys.argv[1]), int(sys.argv[2]))


def delete_store_names(namespace: str) -> None:
    """The RabbitMQ claim store's own names under ``namespace`` (its slot queues expire
    with its memory)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.queue_delete(queue=f"beatless.{namespace}.epoch")
        channel.queue_delete(queue=f"beatless.{namespace}.notes")
        channel.exchange_delete(exchange=f"beatless.{namespace}.slots")
    finally:
        connection.close()
