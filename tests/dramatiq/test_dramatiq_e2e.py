"""End to end: two ``dramatiq`` CLI nodes of the example app, for a minute each.

Every occurrence of 11 entries (one of them a 5-tenant fan-out with jitter) must run
exactly once, none missed: on the Redis broker (claim and enqueue in one script), on
RabbitMQ with Redis as claim store (two-phase), and with one node's scheduler killed.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dramatiq_nodes import (
    AMQP_URL,
    DRAIN_S,
    REDIS_URL,
    RUN_S,
    Node,
    check_runs,
    delete_keys,
    delete_store_names,
    environment,
    expected_firings,
    read_runs,
    start_node,
    stop_nodes,
    wait_for_schedulers,
)
from service_check import require_service

pytestmark = pytest.mark.slow


@pytest.fixture
def namespace() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    name = f"bl-e2e-{uuid.uuid4().hex[:10]}"
    yield name
    delete_keys(name)


def run_two_nodes(
    tmp_path: Path, env: dict[str, str], during: list[tuple[float, object]] | None = None
) -> tuple[list[Node], int, int]:
    """Run two nodes; call each ``(at_s, action)`` at its time after their start. The
    window checked is ``RUN_S`` less 4 s, from 2 s after the start or, on a loaded machine
    where the schedulers take longer, from when both run their loops."""
    started = time.time()
    nodes = [start_node(env, tmp_path / f"node{i}.log") for i in range(2)]
    try:
        wait_for_schedulers(nodes)
        low = max(started + 2, time.time())
        for at, action in during or []:
            time.sleep(max(started + at - time.time(), 0))
            action(nodes)  # type: ignore[operator]
        high = low + RUN_S - 4
        time.sleep(max(high + 2 - time.time(), 0))
        time.sleep(DRAIN_S)
    finally:
        stop_nodes(nodes)
    return nodes, int(low * 1000), int(high * 1000)


def assert_exactly_once(namespace: str, env: dict[str, str], low: int, high: int) -> None:
    runs = read_runs(namespace)
    expected = expected_firings(env, low, high)
    report = check_runs(runs, expected)
    print(
        f"{namespace}: {report.runs} runs, {report.expected} expected firings in the window, "
        f"{len(report.duplicates)} duplicates, {len(report.missed)} missed"
    )
    assert report.expected >= 180, "the window is too short: the machine is too slow"
    assert not report.duplicates, f"ran more than once: {report.duplicates[:10]}"
    assert not report.missed, f"never ran: {report.missed[:10]}"
    assert not report.wrong_ids, f"messages with a wrong id or timestamp: {report.wrong_ids[:3]}"
    assert {r["entry"] for r in runs} >= {e["entry"] for e in expected}


def logs(nodes: list[Node]) -> str:
    return "\n".join(node.log.read_text(errors="replace") for node in nodes)


def test_two_cli_nodes_on_the_redis_broker_run_every_occurrence_exactly_once(
    tmp_path: Path, namespace: str
) -> None:
    env = environment(namespace, REDIS_URL, REDIS_URL)
    nodes, low, high = run_two_nodes(tmp_path, env)
    assert_exactly_once(namespace, env, low, high)
    text = logs(nodes)
    assert text.count("claim and enqueue in one script on the broker's Redis") == 2
    assert "Traceback" not in text


def test_two_cli_nodes_on_rabbitmq_with_a_redis_claim_store_run_every_occurrence_once(
    tmp_path: Path, namespace: str
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    env = environment(namespace, AMQP_URL, REDIS_URL)
    try:
        nodes, low, high = run_two_nodes(tmp_path, env)
    finally:
        delete_queues(namespace)
    assert_exactly_once(namespace, env, low, high)
    text = logs(nodes)
    assert text.count("two-phase claim and enqueue") == 2
    assert "Traceback" not in text


def test_two_cli_nodes_on_rabbitmq_alone_survive_a_killed_scheduler(
    tmp_path: Path, namespace: str
) -> None:
    """RabbitMQ broker and no store given: the claim store follows the broker (the
    RabbitMQ store), so no Redis is involved in scheduling (the test's actors record
    their runs in Redis). At 20 s node 0's scheduler process is killed with SIGKILL (its
    supervisor starts another); the lease is 5 s, so a claim it held pending is taken
    over within the 10 s max_late."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    env = {**environment(namespace, AMQP_URL, ""), "BEATLESS_DEMO_LEASE": "5s"}
    killed: list[int] = []

    def kill_scheduler(nodes: list[Node]) -> None:
        (victim,) = nodes[0].schedulers()
        killed.append(victim.pid)
        victim.send_signal(signal.SIGKILL)

    try:
        nodes, low, high = run_two_nodes(tmp_path, env, [(20.0, kill_scheduler)])
    finally:
        delete_queues(namespace)
        delete_store_names(namespace)
    assert killed, "the scheduler was not killed"
    assert_exactly_once(namespace, env, low, high)
    text = logs(nodes)
    assert "two-phase claim and enqueue through RabbitMQStore(" in text
    assert "beatless scheduler process died (killed by SIGKILL)" in text


def test_killing_one_nodes_scheduler_leaves_every_occurrence_running_exactly_once(
    tmp_path: Path, namespace: str
) -> None:
    """At 20 s node 0's scheduler process is killed (its supervisor starts another);
    at 38 s its supervisor and scheduler both are (nothing restarts them): node 1
    schedules alone, node 0's workers keep working."""
    env = environment(namespace, REDIS_URL, REDIS_URL)
    seen: dict[str, object] = {}

    def kill_scheduler(nodes: list[Node]) -> None:
        (victim,) = nodes[0].schedulers()
        seen["first"] = victim.pid
        victim.send_signal(signal.SIGKILL)

    def kill_supervisor_and_scheduler(nodes: list[Node]) -> None:
        (scheduler,) = nodes[0].schedulers()
        seen["restarted"] = scheduler.pid
        supervisor = scheduler.parent()
        assert supervisor is not None
        for process in (supervisor, scheduler):
            process.send_signal(signal.SIGKILL)
        seen["killed_at"] = time.time()
        seen["workers"] = {p.pid for p in nodes[0].workers_and_forks()} - {supervisor.pid}

    nodes, low, high = run_two_nodes(
        tmp_path, env, [(20.0, kill_scheduler), (38.0, kill_supervisor_and_scheduler)]
    )
    assert seen["restarted"] != seen["first"], "the supervisor did not restart the scheduler"
    assert_exactly_once(namespace, env, low, high)
    late_runs = [r for r in read_runs(namespace) if r["ran_at"] > float(seen["killed_at"]) + 3]  # type: ignore[arg-type]
    assert {r["pid"] for r in late_runs} & seen["workers"], "node 0's workers stopped working"  # type: ignore[operator]
    assert "beatless scheduler process died (killed by SIGKILL)" in logs(nodes)


def delete_queues(namespace: str) -> None:
    """Delete the RabbitMQ queues of this run (the app names them after the namespace)."""
    import pika

    queue = "beatless_" + "".join(c if c.isalnum() else "_" for c in namespace)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel.queue_delete(queue=name)
    finally:
        connection.close()
