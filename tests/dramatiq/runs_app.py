"""The Dramatiq app of ``test_dramatiq_runs_e2e.py``: one periodic actor that sleeps.

``python -m dramatiq runs_app`` (with ``tests/dramatiq`` on the path). Settings, from the
environment:

``BT_NS``        the beatless namespace, the Redis broker's namespace and the queue name
``BT_REDIS``     the Redis of the broker and of the records
``BT_STORE``     the claim store URL (empty: the broker's own Redis, claim and enqueue atomic)
``BT_EVERY``     the actor's interval; ``BT_SLEEP`` how long each run sleeps, in seconds
``BT_OVERLAP``, ``BT_RUN_LEASE``, ``BT_HEARTBEAT``  the entry's run keys

Each run appends ``start`` (with the message, so that a test can send a copy of it) and
``end`` to the Redis list ``{BT_NS}:events``; each skipped message appends ``skipped``
with the process's :attr:`~beatless.dramatiq.Beatless.run_counts`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq import Middleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

import beatless.dramatiq as bd

NS = os.environ["BT_NS"]
REDIS_URL = os.environ["BT_REDIS"]
SLEEP_S = float(os.environ.get("BT_SLEEP", "0"))

broker = RedisBroker(url=REDIS_URL, namespace=NS)
broker.add_middleware(CurrentMessage())
beat = bd.Beatless(
    store=os.environ.get("BT_STORE") or None,
    namespace=NS,
    max_late="10s",
    lease="5s",
    overlap=os.environ.get("BT_OVERLAP", "allow"),
    run_lease=os.environ.get("BT_RUN_LEASE", "30s"),
    heartbeat=os.environ.get("BT_HEARTBEAT", "5s"),
)
broker.add_middleware(beat)


class RecordSkips(Middleware):
    """After Beatless: its ``after_skip_message`` runs first, with the counts updated."""

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        record("skipped", message)


broker.add_middleware(RecordSkips())
dramatiq.set_broker(broker)

_client: Any = None


def record(event: str, message: Any, **fields: Any) -> None:
    global _client  # noqa: PLW0603 - one client per process, made on first use
    if _client is None:
        _client = redis.Redis.from_url(REDIS_URL)
    row = {
        "event": event,
        "id": message.message_id,
        "t": time.time(),
        "pid": os.getpid(),
        "counts": beat.run_counts,
        **fields,
    }
    _client.rpush(f"{NS}:events", json.dumps(row))


@dramatiq.actor(queue_name=NS, max_retries=0, periodic=bd.every(os.environ["BT_EVERY"]))
def job() -> None:
    message = CurrentMessage.get_current_message()
    record("start", message, sent=message.asdict())  # type: ignore[union-attr]
    time.sleep(SLEEP_S)
    record("end", message)
