"""The claim-and-enqueue paths against a real Redis broker and a real RabbitMQ broker."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from service_check import require_service
from stores import ManualClock

import beatless.dramatiq as bd
from beatless import Entry, Every
from beatless.dramatiq._atomic import RedisBrokerStore
from beatless.node.dispatch import Recorder, dispatch_now
from beatless.schedule.firing import Firing
from beatless.stores import MemoryStore
from beatless.stores.redis.store import Ready, RedisStore

REDIS_URL = "redis://127.0.0.1:6379/12"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace of this test's own in Redis db 12; its keys are deleted afterwards."""
    require_service("Redis", "127.0.0.1", 6379)
    name = f"bl-test-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for pattern in (f"{name}*", f"beatless:{name}*"):
        keys = list(client.scan_iter(match=pattern))
        if keys:
            client.delete(*keys)
    client.close()


def redis_broker(namespace: str, store: Any) -> RedisBroker:
    broker = RedisBroker(url=REDIS_URL, namespace=namespace)
    broker.add_middleware(bd.Beatless(store=store, namespace=namespace))
    return broker


def beatless_of(broker: dramatiq.Broker) -> bd.Beatless:
    (found,) = [m for m in broker.middleware if isinstance(m, bd.Beatless)]
    return found


def test_a_store_on_the_brokers_own_redis_claims_and_enqueues_in_one_script(
    namespace: str,
) -> None:
    broker = redis_broker(namespace, REDIS_URL)
    scheduler = beatless_of(broker).scheduler(broker)
    assert isinstance(scheduler.dispatcher, RedisBrokerStore)
    other_db = redis_broker(namespace, "redis://127.0.0.1:6379/11")
    assert isinstance(beatless_of(other_db).scheduler(other_db).store, RedisStore)
    given = RedisStore(redis.Redis.from_url(REDIS_URL), namespace=namespace)
    with_store = redis_broker(namespace, given)
    atomic = beatless_of(with_store).scheduler(with_store).dispatcher
    assert isinstance(atomic, RedisBrokerStore)
    assert atomic.store is given
    beatless_of(with_store).close()  # a store passed in stays open


def test_the_atomic_path_writes_what_redis_broker_enqueue_writes(namespace: str) -> None:
    ours, theirs = f"{namespace}-a", f"{namespace}-b"
    client = redis.Redis.from_url(REDIS_URL)
    entry = Entry(name="greet", task="greet", trigger=Every(60), args=["é ☃ 🎉", 1])
    now_ms = int(client.time()[0]) * 1_000  # the store refuses a claim released far ahead
    firing = Firing.of(entry, None, f"{namespace}/greet", now_ms)
    written = {}
    for name in (ours, theirs):
        broker = redis_broker(name, REDIS_URL)
        actor = dramatiq.actor(lambda *a: None, actor_name="greet", broker=broker, queue_name="q")
        message = bd.message_for(firing, actor, tenant_kwarg=None)
        if name == ours:
            store = RedisBrokerStore(
                broker,
                RedisStore(client, namespace=namespace),
                lambda _, actor=actor: actor,
                tenant_kwarg=None,
            )
            dispatch_now(store, [firing], node="n1")
        else:
            broker.enqueue(message)
        keys = sorted(k.decode().removeprefix(name) for k in client.scan_iter(match=f"{name}:*"))
        (redis_id,) = client.lrange(f"{name}:q", 0, -1)
        data = client.hget(f"{name}:q.msgs", redis_id)
        assert data is not None
        written[name] = (keys, data.replace(redis_id, b"ID"))
    assert written[ours] == written[theirs]
    assert written[ours][0] == [":__heartbeats__", ":q", ":q.msgs"]
    decoded = json.loads(written[ours][1])
    assert decoded["message_id"] == firing.id
    assert decoded["message_timestamp"] == firing.occurrence_ms
    client.close()


def test_messages_built_ahead_are_the_ones_the_script_sends_and_a_failed_build_is_redone(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = redis_broker(namespace, REDIS_URL)
    actor = dramatiq.actor(lambda tenant=None: None, actor_name="t", broker=broker, queue_name="q")
    client = redis.Redis.from_url(REDIS_URL)
    entry = Entry(name="t", task="t", trigger=Every(60), tenants=[f"x{i}" for i in range(30)])
    now_ms = int(client.time()[0]) * 1_000
    firings = [Firing.of(entry, t, f"{namespace}/t/{t}", now_ms) for t in entry.tenant_list() or ()]
    store = RedisBrokerStore(
        broker, RedisStore(client, namespace=namespace), lambda _: actor, tenant_kwarg="tenant"
    )
    assert store.prepares_ahead
    wake = Recorder("n1")
    real = RedisBrokerStore._message
    broken = {firings[3].id}

    def message(self: RedisBrokerStore, firing: Firing) -> Any:
        if firing.id in broken:
            raise ValueError("cannot encode yet")
        return real(self, firing)

    monkeypatch.setattr(RedisBrokerStore, "_message", message)
    built = store.prepare(firings, wake)
    wake.built = {f.id: b for f, b in zip(firings, built, strict=True)}
    assert [b is None for b in built] == [f.id in broken for f in firings]
    broken.clear()
    ahead_ids = {b.message.message_id for b in built if isinstance(b, Ready)}

    store.dispatch(firings, wake)

    assert wake.outcomes == {f.id: "won" for f in firings}
    assert wake.built == {}  # each taken back once
    sent = [
        json.loads(client.hget(f"{namespace}:q.msgs", i) or b"")
        for i in client.lrange(f"{namespace}:q", 0, -1)
    ]
    assert sorted(m["message_id"] for m in sent) == sorted(f.id for f in firings)
    assert ahead_ids == {f.id for f in firings} - {firings[3].id}
    assert {m["kwargs"]["tenant"] for m in sent} == {f.tenant for f in firings}
    client.close()


def test_a_message_that_cannot_be_built_when_due_is_one_warning_and_goes_two_phase(
    namespace: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same rule as Celery's (:class:`~beatless.node.atomic.RedisAtomic`): a WARNING
    naming the entry, at most every ``FAILURE_WARN_S`` per entry (the others at DEBUG),
    and each firing sent through ``broker.enqueue``, where it is Dramatiq's to refuse."""
    broker = redis_broker(namespace, REDIS_URL)
    actor = dramatiq.actor(lambda tenant=None: None, actor_name="t", broker=broker, queue_name="q")
    client = redis.Redis.from_url(REDIS_URL)
    entry = Entry(name="t", task="t", trigger=Every(60), tenants=["a", "b"])
    now_ms = int(client.time()[0]) * 1_000
    firings = [Firing.of(entry, t, f"{namespace}/t/{t}", now_ms) for t in ("a", "b")]
    store = RedisBrokerStore(
        broker, RedisStore(client, namespace=namespace), lambda _: actor, tenant_kwarg="tenant"
    )

    def message(self: RedisBrokerStore, firing: Firing) -> Any:
        raise ValueError("cannot encode")

    monkeypatch.setattr(RedisBrokerStore, "_message", message)
    try:
        with caplog.at_level(logging.DEBUG, logger="beatless.node.atomic"):
            assert dispatch_now(store, firings, node="n1") == ["won", "won"]
        sent = client.lrange(f"{namespace}:q", 0, -1)
    finally:
        client.close()
    assert len(sent) == 2  # through broker.enqueue
    said = [r for r in caplog.records if r.name == "beatless.node.atomic"]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
    assert said[0].getMessage() == (
        f"firing {firings[0].id} of entry 't': its message cannot be built for the claim "
        f"script (cannot encode); sending it two-phase through broker.enqueue"
    )


def test_a_firing_enqueued_atomically_is_lost_to_every_other_node_and_runs_once(
    namespace: str,
) -> None:
    broker = redis_broker(namespace, REDIS_URL)
    ran: list[str] = []

    def greet() -> None:
        ran.append("x")

    actor = dramatiq.actor(greet, broker=broker, queue_name="q")
    entry = Entry(name="greet", task="greet", trigger=Every(60))
    stale = Firing.of(entry, None, f"{namespace}/greet", 60_000)
    client = redis.Redis.from_url(REDIS_URL)
    store = RedisBrokerStore(
        broker, RedisStore(client, namespace=namespace), lambda _: actor, tenant_kwarg=None
    )
    assert dispatch_now(store, [stale], node="a") == ["late"]
    assert client.llen(f"{namespace}:q") == 0
    now = Firing.of(entry, None, f"{namespace}/greet", int(client.time()[0]) * 1000)
    outcomes = [dispatch_now(store, [now], node=node)[0] for node in ("a", "b", "a")]
    assert outcomes == ["won", "lost", "lost"]
    assert client.llen(f"{namespace}:q") == 1
    worker = Worker(broker, worker_timeout=100)
    worker.start()
    try:
        broker.join("q", timeout=10_000)
        worker.join()
    finally:
        worker.stop()
    assert ran == ["x"]
    client.close()


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    name = f"beatless_test_{uuid.uuid4().hex[:10]}"
    yield name
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    for queue in (name, f"{name}.DQ", f"{name}.XQ"):
        channel.queue_delete(queue=queue)
    connection.close()


def test_rabbitmq_with_confirms_takes_the_two_phase_path_through_broker_enqueue(
    rabbitmq_queue: str,
) -> None:
    clock = ManualClock()
    broker = RabbitmqBroker(url=AMQP_URL, confirm_delivery=True)
    store = MemoryStore(clock=clock)
    broker.add_middleware(bd.Beatless(store=store, namespace="rmq", clock=clock))
    dramatiq.actor(
        lambda: None,
        actor_name="nightly",
        broker=broker,
        queue_name=rabbitmq_queue,
        periodic=bd.every("1m"),
    )
    try:
        scheduler = beatless_of(broker).scheduler(broker)
        assert scheduler.store is store
        clock.advance(1_000)
        (decision,) = scheduler.tick()
        assert decision.outcome == "won"
        consumer = broker.consume(rabbitmq_queue, timeout=3_000)
        message = next(consumer)
        assert message is not None
        consumer.ack(message)
        consumer.close()
        assert message.message_id == decision.firing.id
        assert message.message_timestamp == decision.firing.occurrence_ms
        assert bd.occurrence(message) == decision.firing.occurrence
    finally:
        broker.close()


def test_same_redis_asks_the_servers_not_the_spelling() -> None:
    require_service("Redis", "127.0.0.1", 6379)
    from beatless.dramatiq._atomic import same_redis

    local, loopback = redis.Redis(host="localhost", db=12), redis.Redis(host="127.0.0.1", db=12)
    other_db, nowhere = redis.Redis(host="127.0.0.1", db=11), redis.Redis(port=1, db=12)
    try:
        assert same_redis(local, loopback)
        assert not same_redis(loopback, other_db)
        assert not same_redis(loopback, nowhere)  # cannot tell: the safe, two-phase answer
    finally:
        for client in (local, loopback, other_db, nowhere):
            client.close()


def test_a_middleware_that_hooks_before_enqueue_sees_every_firing_sent_once(
    namespace: str,
) -> None:
    """The claim script cannot call ``before_enqueue`` for the winner alone: with such a
    middleware, firings go through ``broker.enqueue``, and the hook sees each exactly once."""
    seen: list[str] = []

    class Stamp(dramatiq.Middleware):
        def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
            seen.append(message.message_id)

    client = redis.Redis.from_url(REDIS_URL)
    broker = RedisBroker(url=REDIS_URL, namespace=namespace)
    broker.add_middleware(Stamp())
    actor = dramatiq.actor(lambda *a: None, actor_name="hooked", broker=broker, queue_name="q")
    entry = Entry(name="hooked", task="hooked", trigger=Every(60))
    now_ms = int(client.time()[0]) * 1_000
    firing = Firing.of(entry, None, f"{namespace}/hooked", now_ms)
    nodes = [
        RedisBrokerStore(
            broker, RedisStore(client, namespace=namespace), lambda _: actor, tenant_kwarg=None
        )
        for _ in range(3)
    ]
    try:
        assert nodes[0].why_two_phase() == "middleware Stamp hooks before_enqueue"
        outcomes = [dispatch_now(node, [firing], node=f"n{i}")[0] for i, node in enumerate(nodes)]
    finally:
        client.close()
    assert outcomes == ["won", "lost", "lost"]
    assert seen == [firing.id]
