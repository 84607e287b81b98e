"""Real Celery apps, brokers and worker processes for the Celery integration tests.

Redis tests use database 13 and a key prefix of their own (``global_keyprefix`` for
kombu, the namespace for claims) and delete only the keys under that prefix. RabbitMQ
tests declare queues of their own and delete them.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery_fixtures import AMQP_URL, REDIS_DB, REDIS_HOST, REDIS_PORT, REDIS_URL
from celery_process import CeleryProcess
from service_check import require_service

REPO = Path(__file__).resolve().parents[2]

APP_MODULE = '''
"""A Celery app for the beatless tests, configured from BT_* environment variables."""

import importlib.util
import json
import logging
import os

import signal
import time

import redis
from celery import Celery
from celery.signals import task_postrun

import beatless.celery

PREFIX = os.environ["BT_PREFIX"]
app = Celery(PREFIX)
app.conf.update(
    broker_url=os.environ["BT_BROKER"],
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    task_default_queue=PREFIX,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=True,
    beat_schedule=json.loads(os.environ["BT_SCHEDULE"]),
    beatless_namespace=PREFIX,
)
app.conf.update(json.loads(os.environ.get("BT_CONF", "{}")))
if os.environ.get("BT_INSTALL") == "1":
    beatless.celery.install(app)

logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)  # the tests read who won
_runs = redis.Redis.from_url(os.environ["BT_RECORD"])


BEATLESS_HEADERS = (
    "beatless_run", "beatless_address", "beatless_occurrence", "beatless_offset_ms"
)


def _note(self, key, **fields):
    _runs.rpush(PREFIX + ":" + key, json.dumps({
        "id": self.request.id,
        "at": time.time(),
        "pid": os.getpid(),
        "hostname": self.request.hostname,
        "retries": self.request.retries,
        "redelivered": bool((self.request.delivery_info or {}).get("redelivered")),
        "headers": {h: getattr(self.request, h, None) for h in BEATLESS_HEADERS},
        **fields,
    }))


@app.task(bind=True, name="beatless_test.sleepy")
def sleepy(self, seconds):
    """Notes its start and its end (in ``:starts`` and ``:ends``), sleeping between."""
    _note(self, "starts")
    try:
        time.sleep(seconds)
    finally:
        _note(self, "ends")


@app.task(bind=True, name="beatless_test.finish_then_die", acks_late=True)
def finish_then_die(self):
    """Notes its start; after its run has ended, the first run kills its whole worker
    (process group) before the message is acknowledged (see ``_die`` below)."""
    _note(self, "starts")


@task_postrun.connect
def _die(sender=None, **_):
    if sender is not None and sender.name == "beatless_test.finish_then_die":
        if _runs.set(PREFIX + ":died", "1", nx=True):
            os.killpg(os.getpgrp(), signal.SIGKILL)


@app.task(bind=True, name="beatless_test.record")
def record(self, *args):
    occurrence = beatless.celery.occurrence(self.request)
    _runs.rpush(PREFIX + ":runs", json.dumps({
        "id": self.request.id,
        "firing_id": beatless.celery.task_firing_id(self.request),
        "occurrence": occurrence.isoformat() if occurrence else None,
        "header": getattr(self.request, "beatless_occurrence", None),
        "address": getattr(self.request, "beatless_address", None),
        "args": list(args),
        "pid": os.getpid(),
        "hostname": self.request.hostname,
    }))
'''


@pytest.fixture
def require() -> Any:
    """``require_service`` of tests/conftest.py, for tests in this directory."""
    return require_service


@pytest.fixture
def rabbitmq() -> str:
    """The RabbitMQ URL, once the server answers."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    return AMQP_URL


@pytest.fixture
def redis_client() -> Iterator[Any]:
    """A client of database 13; the test deletes what it creates under its prefix."""
    require_service("Redis", REDIS_HOST, REDIS_PORT)
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
    yield client
    client.close()


@pytest.fixture
def prefix(redis_client: Any) -> Iterator[str]:
    """A key prefix, namespace and queue name of this test alone; its keys go at the end."""
    name = f"bltest-{uuid.uuid4().hex[:10]}"
    yield name
    for key in redis_client.scan_iter(match=f"*{name}*", count=1_000):
        redis_client.delete(key)


class CeleryProject:
    """An app module in a temporary directory, and the processes started on it."""

    def __init__(self, tmp_path: Path, prefix: str, broker: str) -> None:
        self.dir = tmp_path
        self.prefix = prefix
        (tmp_path / "bt_app.py").write_text(textwrap.dedent(APP_MODULE))
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
            "BT_PREFIX": prefix,
            "BT_BROKER": broker,
            "BT_RECORD": REDIS_URL,
            "BT_SCHEDULE": "{}",
        }
        self.processes: list[CeleryProcess] = []

    def configure(self, schedule: dict[str, Any], **conf: Any) -> None:
        self.env["BT_SCHEDULE"] = json.dumps(schedule)
        self.env["BT_CONF"] = json.dumps(conf)

    def start(self, name: str, *args: str, install: bool = False) -> CeleryProcess:
        env = {**self.env, "BT_INSTALL": "1" if install else "0"}
        process = CeleryProcess(["-A", "bt_app", *args], self.dir / f"{name}.log")
        self.processes.append(process.start(env, self.dir))
        return process

    def worker(self, name: str, *args: str, install: bool = False) -> CeleryProcess:
        return self.start(
            name,
            "worker",
            "-n",
            f"{name}@%h",
            "-l",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            *args,
            install=install,
        )

    def stop_all(self) -> None:
        for process in self.processes:
            process.stop()

    def runs(self, redis_client: Any) -> list[dict[str, Any]]:
        """What the ``beatless_test.record`` task recorded, in the order it ran."""
        return [json.loads(r) for r in redis_client.lrange(f"{self.prefix}:runs", 0, -1)]

    @staticmethod
    def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())


@pytest.fixture
def project(tmp_path: Path, prefix: str) -> Iterator[CeleryProject]:
    """A Celery project on the test's own Redis prefix; its processes are killed at the end."""
    project = CeleryProject(tmp_path, prefix, f"{REDIS_URL}")
    yield project
    for process in project.processes:
        process.kill()
