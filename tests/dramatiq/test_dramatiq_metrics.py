"""Prometheus metrics of Dramatiq nodes: ``Beatless(metrics=..., metrics_port=...)`` with a
``Worker`` in the test's own process, and under the real ``dramatiq`` command line, whose
scheduler process serves them on a port of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from service_check import require_service
from stores import free_port

pytest.importorskip("prometheus_client", reason="the metrics need the 'metrics' extra")

from prometheus_client import CollectorRegistry
from scrape import won_samples

import beatless.dramatiq as bd
from beatless import ConfigError

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/12"

APP = """
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import beatless.dramatiq as bd

NS = os.environ["BT_NS"]
broker = RedisBroker(url=os.environ["BT_REDIS"], namespace=NS)
broker.add_middleware(
    bd.Beatless(store=os.environ["BT_REDIS"], namespace=NS, metrics_port=int(os.environ["BT_PORT"]))
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=NS, periodic=bd.every("1s"))
def tick():
    pass
"""


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_metrics_options_are_checked_when_the_middleware_is_made() -> None:
    with pytest.raises(ConfigError, match="Beatless: metrics must be a prometheus_client"):
        bd.Beatless(store="memory://", metrics="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Beatless: metrics_port must be a TCP port"):
        bd.Beatless(store="memory://", metrics_port=0)
    assert bd.Beatless(store="memory://", metrics_port=9808).metrics_port == 9808
    assert bd.Beatless(store="memory://", metrics_port=9808).metrics_host == "127.0.0.1"
    assert bd.Beatless(store="memory://", metrics_host="10.0.0.5").metrics_host == "10.0.0.5"
    with pytest.raises(ConfigError, match=r"Beatless: metrics_host must be an address"):
        bd.Beatless(store="memory://", metrics_host=" ")


def test_a_worker_in_your_own_process_exports_its_scheduler_while_it_runs() -> None:
    registry = CollectorRegistry()
    broker = StubBroker()
    broker.add_middleware(bd.Beatless(store="memory://", namespace="unit", metrics=registry))
    dramatiq.actor(lambda: None, actor_name="tick", broker=broker, periodic=bd.every("1s"))
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        (beatless,) = [m for m in broker.middleware if isinstance(m, bd.Beatless)]
        scheduler = beatless._scheduler
        assert scheduler is not None
        labels = {"namespace": "unit", "node": scheduler.node}
        won = {**labels, "entry": "tick", "outcome": "won"}
        assert wait_for(lambda: bool(registry.get_sample_value("beatless_firings_total", won)), 5)
        assert registry.get_sample_value("beatless_loop_alive", labels) == 1
    finally:
        worker.stop()
        broker.close()
    assert registry.get_sample_value("beatless_loop_alive", labels) is None


@pytest.fixture
def namespace() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    name = f"bl-metrics-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"*{name}*", count=1_000):
        client.delete(key)
    client.close()


@pytest.mark.slow
def test_under_the_dramatiq_command_the_scheduler_process_serves_the_metrics_port(
    tmp_path: Path, namespace: str
) -> None:
    port = free_port()
    (tmp_path / "bt_metrics_app.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "BT_NS": namespace,
        "BT_REDIS": REDIS_URL,
        "BT_PORT": str(port),
    }
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "bt_metrics_app", "-p", "2", "-t", "1"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    won: dict[str, float] = {}

    def scraped() -> bool:
        for sample in won_samples(port) or ():
            assert sample.labels["namespace"] == namespace
            won[sample.labels["node"]] = sample.value
        return any(value > 0 for value in won.values())

    try:
        assert wait_for(scraped, 60), (won, log.read_text(errors="replace"))
        assert len(won) == 1  # one scheduler per node, in the fork's scheduler process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait(5)
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert f"beatless metrics on http://127.0.0.1:{port}/metrics" in text
