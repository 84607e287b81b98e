"""A Dramatiq app whose periodic actors run on every node with no scheduler process.

Run two or more nodes of it; each occurrence runs exactly once::

    dramatiq integrations.dramatiq_redis.app --processes 2 --threads 2

Settings (read here, at the app's edge):

``BEATLESS_DEMO_BROKER``
    ``redis://host:port/db`` (the default, ``redis://127.0.0.1:6379/0``) for Dramatiq's
    ``RedisBroker``, or ``amqp://user:password@host:port/`` for its ``RabbitmqBroker``
    (publisher confirms on).
``BEATLESS_DEMO_STORE``
    The claim store. Unset, it follows the broker: the broker's own Redis (claim and
    enqueue in one script), or the broker's own RabbitMQ (the RabbitMQ store).
``BEATLESS_DEMO_LEASE``
    The pending lease of the two-phase path (``30s``).
``BEATLESS_DEMO_NAMESPACE``
    The beatless namespace (``demo``); the Redis broker's namespace and the queue name
    derive from it, so several copies can share one server.
``BEATLESS_DEMO_RECORD``
    A Redis URL: each run is appended to the list ``{namespace}:runs`` there as one
    JSON object (the end-to-end tests read it). Unset: runs are only logged.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

import beatless.dramatiq as bd
from beatless import Entry, Every

logger = logging.getLogger(__name__)

BROKER_URL = os.environ.get("BEATLESS_DEMO_BROKER", "redis://127.0.0.1:6379/0")
NAMESPACE = os.environ.get("BEATLESS_DEMO_NAMESPACE", "demo")
STORE_URL = os.environ.get("BEATLESS_DEMO_STORE") or None
RECORD_URL = os.environ.get("BEATLESS_DEMO_RECORD")
QUEUE = "beatless_" + "".join(c if c.isalnum() else "_" for c in NAMESPACE)
TENANTS = ["acme", "globex", "initech", "umbrella", "hooli"]

if BROKER_URL.startswith("amqp"):
    broker: dramatiq.Broker = RabbitmqBroker(url=BROKER_URL, confirm_delivery=True)
else:
    broker = RedisBroker(url=BROKER_URL, namespace=f"{NAMESPACE}-dramatiq")  # type: ignore[no-untyped-call]
broker.add_middleware(CurrentMessage())
broker.add_middleware(
    bd.Beatless(
        store=STORE_URL,
        namespace=NAMESPACE,
        max_late="10s",
        lease=os.environ.get("BEATLESS_DEMO_LEASE", "30s"),
        # An entry declared beside the middleware rather than on the actor.
        entries=[
            Entry(
                name="heartbeat-7s",
                task="heartbeat",
                trigger=Every(7),
                kwargs={"n": 7},
                max_late=10,
            ),
        ],
    )
)
dramatiq.set_broker(broker)

_recorder: Any = None


def record(kind: str, **fields: Any) -> None:
    """Note one run: which firing (from the message) ran, in which process."""
    global _recorder  # noqa: PLW0603 - one client per process, made on first use
    message = CurrentMessage.get_current_message()
    if message is None:
        raise RuntimeError("record() runs inside an actor, with CurrentMessage installed")
    when = bd.occurrence()
    row = {
        "kind": kind,
        "entry": message.options.get(bd.ENTRY_OPTION),
        "tenant": bd.tenant(),
        "occurrence_ms": None if when is None else int(when.timestamp() * 1000),
        "message_id": message.message_id,
        "message_timestamp": message.message_timestamp,
        "pid": os.getpid(),
        "ran_at": time.time(),
        **fields,
    }
    if RECORD_URL is None:
        logger.info("ran %s", row)
        return
    if _recorder is None:
        import redis

        _recorder = redis.Redis.from_url(RECORD_URL)
    _recorder.rpush(f"{NAMESPACE}:runs", json.dumps(row))


@dramatiq.actor(queue_name=QUEUE, periodic=bd.every("1s"))
def tick() -> None:
    record("tick")


@dramatiq.actor(queue_name=QUEUE, periodic=bd.every("2s", args=(2,)))
def every_two(n: int) -> None:
    record("every_two", n=n)


@dramatiq.actor(queue_name=QUEUE, periodic=bd.every("3s", kwargs={"size": 3}))
def every_three(size: int) -> None:
    record("every_three", size=size)


@dramatiq.actor(queue_name=QUEUE, periodic=bd.every("10s", jitter="4s"))
def every_ten_jittered() -> None:
    record("every_ten_jittered")


@dramatiq.actor(queue_name=QUEUE, periodic=bd.cron("*/4 * * * * *"))
def cron_four() -> None:
    record("cron_four")


@dramatiq.actor(queue_name=QUEUE, periodic=bd.cron("*/6 * * * * *", jitter="2s"))
def cron_six_jittered() -> None:
    record("cron_six_jittered")


@dramatiq.actor(queue_name=QUEUE, periodic=bd.cron("* * * * *", jitter="5s"))
def every_minute() -> None:
    record("every_minute")


@dramatiq.actor(
    queue_name=QUEUE,
    periodic=[bd.every("5s", name="sync-5s"), bd.every("15s", name="sync-15s", jitter="3s")],
)
def sync() -> None:
    record("sync")


@dramatiq.actor(queue_name=QUEUE, periodic=bd.every("5s", tenants=TENANTS, jitter="2s"))
def per_tenant(tenant: str) -> None:
    record("per_tenant", kwarg_tenant=tenant)


@dramatiq.actor(queue_name=QUEUE)
def heartbeat(n: int) -> None:
    record("heartbeat", n=n)
