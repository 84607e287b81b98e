"""The two-phase enqueue of a Dramatiq firing ends within its deadline, on real brokers;
and the Redis broker's path needs no ``pika``.

Redis tests use database 12 and a namespace of their own and delete only its keys;
RabbitMQ tests delete their own queues. Brokers that do not answer are the listener and
proxy of ``tests/celery/faulty_brokers.py``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from service_check import require_service

import beatless.dramatiq as bd
from beatless import Entry, Every
from beatless.dramatiq._sending import Sender
from beatless.errors import BrokerUnavailable
from beatless.schedule.firing import Firing

REDIS_URL = "redis://127.0.0.1:6379/12"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
ACTOR = "beatless_sending_test"
pytestmark = pytest.mark.serial  # sends must fail within a deadline, or at once

DEADLINE_S = 1.0
REPO = Path(__file__).resolve().parents[2]


def _faulty_brokers() -> Any:
    path = REPO / "tests" / "celery" / "faulty_brokers.py"
    spec = importlib.util.spec_from_file_location("_beatless_faulty_brokers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


faulty = _faulty_brokers()


@pytest.fixture
def silent() -> Iterator[Any]:
    listener = faulty.Silent()
    yield listener
    listener.close()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A Redis namespace (and queue name) of this test; its keys go at the end."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    name = f"blsend-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"*{name}*", count=1_000):
        client.delete(key)
    client.close()


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    """A queue name of this test; the queue and its delay and dead-letter queues go at the end."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    import pika

    name = f"blsend_{uuid.uuid4().hex[:10]}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    for queue in (name, f"{name}.DQ", f"{name}.XQ"):
        channel.queue_delete(queue=queue)
    connection.close()


def redis_broker(url: str, namespace: str) -> Any:
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(url=url, namespace=namespace)


def rabbitmq_broker(url: str) -> Any:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    return RabbitmqBroker(url=url)


def sender_of(broker: dramatiq.Broker, queue: str, **options: Any) -> Sender:
    dramatiq.actor(lambda: None, actor_name=ACTOR, broker=broker, queue_name=queue)
    return Sender(
        broker, deadline_s=DEADLINE_S, actor_of=broker.get_actor, tenant_kwarg=None, **options
    )


def a_firing(occurrence_ms: int = 1_800_000_000_000) -> Firing:
    entry = Entry(name="tick", task=ACTOR, trigger=Every(60))
    return Firing.of(entry, None, "sending/tick", occurrence_ms)


def failure_time(sender: Sender, firing: Firing) -> float:
    began = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever the client raises
        sender(firing)
    assert not isinstance(caught.value, BrokerUnavailable)
    return time.monotonic() - began


def consumed(broker: dramatiq.Broker, queue: str) -> list[Any]:
    consumer = broker.consume(queue, timeout=1_000)
    messages = []
    try:
        for message in consumer:
            if message is None:
                break
            consumer.ack(message)
            messages.append(message)
    finally:
        consumer.close()
    return messages


# -- deadlines ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_an_enqueue_to_a_broker_that_never_answers_fails_within_the_deadline(
    silent: Any, kind: str
) -> None:
    if kind == "redis":
        broker = redis_broker(f"redis://127.0.0.1:{silent.port}/0", "blsend-silent")
    else:
        broker = rabbitmq_broker(f"amqp://guest:guest@127.0.0.1:{silent.port}/%2F")
    sender = sender_of(broker, "blsend_silent")
    try:
        assert sender.sending is not broker
        assert failure_time(sender, a_firing()) < DEADLINE_S + 1
        with pytest.raises(BrokerUnavailable):
            sender(a_firing())  # within the cooldown: at once
    finally:
        sender.close()
        broker.close()


def test_an_enqueue_cut_off_after_connecting_warns_that_a_second_copy_may_exist(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = faulty.Proxy(("127.0.0.1", 6379))
    broker = redis_broker(f"redis://127.0.0.1:{proxy.port}/12", namespace)
    sender = sender_of(broker, namespace, cooldown_s=0)
    late = a_firing(1_800_000_060_000)
    try:
        sender(a_firing())
        proxy.freeze()
        with caplog.at_level(logging.WARNING, logger="beatless.dramatiq._sending"):
            assert failure_time(sender, late) < DEADLINE_S + 1
    finally:
        sender.close()
        proxy.close()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "outcome is unknown" in warning
    assert f"same message id {late.id}" in warning


def test_a_message_that_cannot_be_encoded_fails_alone_and_leaves_the_broker_usable() -> None:
    broker = StubBroker()
    sender = sender_of(broker, "q")
    entry = Entry(name="bad", task=ACTOR, trigger=Every(60), args=[object()])
    with pytest.raises(TypeError):
        sender(Firing.of(entry, None, "sending/bad", 1_800_000_000_000))
    sender(a_firing())  # no cooldown: the broker did nothing wrong
    assert broker.queues["q"].qsize() == 1


def test_a_broker_beatless_cannot_bound_is_sent_to_as_it_is() -> None:
    broker = StubBroker()
    sender = sender_of(broker, "q")
    firing = a_firing()
    sender(firing)
    assert sender.sending is broker
    assert broker.queues["q"].get_nowait().decode().count(firing.id) == 1


# -- healthy brokers ----------------------------------------------------------------------


def test_redis_receives_the_firing_with_its_id_as_message_id(namespace: str) -> None:
    broker = redis_broker(REDIS_URL, namespace)
    sender = sender_of(broker, namespace)
    firing = a_firing()
    try:
        sender(firing)
        own = sender.sending.client.connection_pool.connection_kwargs
        assert own["socket_timeout"] == own["socket_connect_timeout"] == DEADLINE_S / 4
        assert broker.client.connection_pool.connection_kwargs.get("socket_timeout") is None
        (message,) = consumed(broker, namespace)
    finally:
        sender.close()
        broker.close()
    assert message.message_id == firing.id
    assert bd.occurrence(message) == firing.occurrence


def test_rabbitmq_receives_the_firing_with_its_id_as_message_id(rabbitmq_queue: str) -> None:
    broker = rabbitmq_broker(AMQP_URL)
    sender = sender_of(broker, rabbitmq_queue)
    firing = a_firing()
    try:
        sender(firing)
        assert sender.sending.confirm_delivery is True
        assert broker.confirm_delivery is False  # the broker's own connections are untouched
        own = sender.sending.parameters
        assert own.socket_timeout == own.stack_timeout == own.blocked_connection_timeout
        assert own.stack_timeout < DEADLINE_S / 6  # six attempts, and declaring the queues
        assert own.connection_attempts == 1
        if sys.platform == "linux":
            assert own.tcp_options["TCP_USER_TIMEOUT"] == round(own.stack_timeout * 1_000)
        assert broker.parameters.stack_timeout == 15
        assert broker.parameters.tcp_options is None
        (message,) = consumed(broker, rabbitmq_queue)
    finally:
        sender.close()
        broker.close()
    assert message.message_id == firing.id
    assert bd.occurrence(message) == firing.occurrence


def test_the_middleware_enqueues_two_phase_through_a_sender_on_the_lease_deadline() -> None:
    broker = StubBroker()
    beatless = bd.Beatless(store="memory://", lease=10)
    broker.add_middleware(beatless)
    dramatiq.actor(lambda: None, actor_name=ACTOR, broker=broker, periodic=bd.every("1h"))
    scheduler = beatless.scheduler(broker)
    (sender,) = [o for o in beatless.builder.opened if isinstance(o, Sender)]
    assert scheduler.dispatcher.enqueue is sender
    assert sender.deadline_s == pytest.approx(4.0)  # 0.4 x the lease
    beatless.close()


# -- the Redis broker's path without pika -------------------------------------------------

WITHOUT_PIKA = """
import importlib.abc, json, sys

class NoPika(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pika" or name.startswith("pika."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, NoPika())

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import beatless.dramatiq as bd
from beatless import Entry, Every
from beatless.schedule.firing import Firing

url, namespace = sys.argv[1], sys.argv[2]
broker = RedisBroker(url=url, namespace=namespace)
middleware = bd.Beatless(store=url, namespace=namespace)
broker.add_middleware(middleware)
dramatiq.actor(lambda: None, actor_name="tick", broker=broker, queue_name=namespace,
               periodic=bd.every("1h"))
atomic = type(middleware.scheduler(broker).dispatcher).__name__
sender = middleware.builder.sender(broker)
entry = Entry(name="tick", task="tick", trigger=Every(3600))
sent = sender(Firing.of(entry, None, namespace + "/tick", 1_800_000_000_000)).message_id
middleware.close()
print(json.dumps({"atomic": atomic, "sent": sent,
                  "pika": "pika" in sys.modules,
                  "rabbitmq": "dramatiq.brokers.rabbitmq" in sys.modules}))
"""


def test_the_redis_broker_path_imports_no_pika(namespace: str, tmp_path: Path) -> None:
    script = tmp_path / "without_pika.py"
    script.write_text(textwrap.dedent(WITHOUT_PIKA))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), REDIS_URL, namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["atomic"] == "RedisBrokerStore"
    assert (
        result["sent"]
        == Firing.of(
            Entry(name="tick", task="tick", trigger=Every(3600)),
            None,
            f"{namespace}/tick",
            1_800_000_000_000,
        ).id
    )
    assert result["pika"] is False
    assert result["rabbitmq"] is False
