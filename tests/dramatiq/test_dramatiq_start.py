"""Real ``dramatiq`` command lines with a schedule that has problems, or a claim store
that cannot be used: refuse (exit code 2, the reason said once per process, no traceback)
or consume."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_check import require_service

from beatless.schedule.problems import EXIT_REFUSED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/12"

APP = """
import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

import beatless.dramatiq as bd

NS = os.environ["BT_NS"]
broker = RedisBroker(url=os.environ["BT_REDIS"], namespace=NS)
STORE = os.environ.get("BT_STORE") or os.environ["BT_REDIS"]
broker.add_middleware(
    bd.Beatless(store=STORE, namespace=NS, on_schedule_error=os.environ["BT_MODE"])
)
dramatiq.set_broker(broker)

if not os.environ.get("BT_STORE"):  # with a store of its own, the schedule is sound

    @dramatiq.actor(queue_name=NS, periodic=bd.cron("61 * * * *"))
    def typo():
        pass

    @dramatiq.actor(queue_name=NS, periodic=bd.every("10s", jitter="6s"))
    def wide():
        pass


@dramatiq.actor(queue_name=NS)
def record():
    redis.Redis.from_url(os.environ["BT_REDIS"]).rpush(NS + ":runs", "ran")
"""


@pytest.fixture
def namespace() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    name = f"bl-start-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"*{name}*", count=1_000):
        client.delete(key)
    client.close()


def start(
    tmp_path: Path, namespace: str, mode: str, store: str = ""
) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "bt_dramatiq_app.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "BT_NS": namespace,
        "BT_REDIS": REDIS_URL,
        "BT_MODE": mode,
        "BT_STORE": store,
    }
    log = tmp_path / f"{mode}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "bt_dramatiq_app", "-p", "2", "-t", "1"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait(5)


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_the_dramatiq_command_exits_non_zero_listing_every_problem(
    tmp_path: Path, namespace: str
) -> None:
    process, log = start(tmp_path, namespace, "refuse")
    try:
        process.wait(30)
    finally:
        code = stop(process)
    text = log.read_text(errors="replace")
    assert code == EXIT_REFUSED, text
    assert "beatless: 2 problems in the schedule; this node refuses to start" in text
    assert "Traceback" not in text
    assert "entry 'typo': cron '61 * * * *'" in text
    assert "entry 'wide': jitter 6s must be under half" in text
    assert "Worker process is ready" not in text


def test_in_consume_mode_the_dramatiq_command_runs_tasks_and_schedules_nothing(
    tmp_path: Path, namespace: str
) -> None:
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    process, log = start(tmp_path, namespace, "consume")
    client = redis.Redis.from_url(REDIS_URL)
    sender = RedisBroker(url=REDIS_URL, namespace=namespace)
    try:
        assert wait_for(lambda: "This node schedules nothing" in log.read_text(), 30)
        assert wait_for(lambda: log.read_text().count("Worker process is ready") == 2, 30)
        dramatiq.actor(lambda: None, actor_name="record", queue_name=namespace, broker=sender)
        sender.get_actor("record").send()
        assert wait_for(lambda: client.llen(f"{namespace}:runs") == 1, 15)
    finally:
        code = stop(process)
        sender.close()
        client.close()
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert text.count("This node schedules nothing") == 1, text
    assert "entry 'typo': cron '61 * * * *'" in text
    assert "CRITICAL" not in text, text


REFUSING = "redis://nobody:s3cret@127.0.0.1:6379/12"
"""A user the Redis server does not know: it refuses the credentials at once."""
UNREACHABLE = "redis://:s3cret@127.0.0.1:1/12"


def test_a_store_that_refuses_its_password_stops_the_dramatiq_command_with_one_line(
    tmp_path: Path, namespace: str
) -> None:
    process, log = start(tmp_path, namespace, "refuse", store=REFUSING)
    try:
        process.wait(30)
    finally:
        code = stop(process)
    text = log.read_text(errors="replace")
    assert code == EXIT_REFUSED, text
    said = [line for line in text.splitlines() if "[beatless.dramatiq._middleware]" in line]
    assert said, text
    for line in said:
        assert "[CRITICAL] beatless: this node refuses to start: its claim store cannot be " in line
        assert "redis store redis://nobody:***@127.0.0.1:6379/12: cannot probe: " in line
    assert "s3cret" not in text
    assert "Traceback" not in text
    assert "Worker process is ready" not in text


def test_in_consume_mode_a_store_that_cannot_be_reached_is_one_error_and_workers_consume(
    tmp_path: Path, namespace: str
) -> None:
    process, log = start(tmp_path, namespace, "consume", store=UNREACHABLE)
    try:
        assert wait_for(lambda: log.read_text().count("Worker process is ready") == 2, 30)
        assert wait_for(lambda: "this node schedules nothing" in log.read_text(), 30)
    finally:
        code = stop(process)
    text = log.read_text(errors="replace")
    assert code == 0, text
    (said,) = [line for line in text.splitlines() if "[ERROR]" in line]
    assert (
        "beatless: the claim store cannot be used: redis store redis://:***@127.0.0.1:1/12" in said
    )
    assert "(tried for 5 s)" in said
    assert "s3cret" not in text
    assert "Traceback" not in text
    assert "CRITICAL" not in text
