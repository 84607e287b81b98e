"""The two-phase send of a Celery firing ends within its deadline, on real brokers.

A broker that accepts connections and never answers is a TCP listener of the test's own;
a broker that stops answering mid-send is a real Redis or RabbitMQ behind a proxy of the
test's own that stops forwarding. Redis tests use database 13, a key prefix and queue
names of their own and delete only those keys; RabbitMQ tests delete their own queues.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from celery.worker.request import Request
from celery_fixtures import AMQP_URL, REDIS_DB, REDIS_HOST, REDIS_PORT, REDIS_URL
from faulty_brokers import Proxy, Silent
from kombu import Queue
from kombu.exceptions import EncodeError
from service_check import require_service

import beatless.celery
from beatless import Entry, Every
from beatless.celery._schedule import build_scheduler
from beatless.celery._sending import Sender
from beatless.errors import BrokerUnavailable
from beatless.schedule.firing import Firing

TASK = "beatless_sending_test.record"
pytestmark = pytest.mark.serial  # sends must fail within a deadline, or at once

DEADLINE_S = 1.0


@pytest.fixture
def silent() -> Iterator[Silent]:
    listener = Silent()
    yield listener
    listener.close()


# -- helpers ------------------------------------------------------------------------------


def make_app(broker: str, queue: str, **conf: Any) -> Celery:
    app = Celery("sending", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, **conf)

    @app.task(name=TASK, shared=False)
    def record() -> None: ...

    return app


def a_firing(queue: str, occurrence_ms: int = 1_800_000_000_000) -> Firing:
    entry = Entry(name="tick", task=TASK, trigger=Every(60), options={"queue": queue})
    return Firing.of(entry, None, f"sending/tick/{queue}", occurrence_ms)


def received(app: Celery, queue: str, timeout: float = 3.0) -> list[Any]:
    """The messages of ``queue`` as a worker reads them: ``(task.request, name)``."""
    found = []
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(Queue(queue))
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    message = simple.get(timeout=0.2)
                except simple.Empty:
                    if found:
                        break
                    continue
                request = Request(message, app=app, task=app.tasks[TASK])
                found.append((Context(request.request_dict), request.task_name))
                message.ack()
        finally:
            simple.close()
            Queue(queue).bind(connection.default_channel).delete()
    return found


def failure_time(sender: Sender, firing: Firing) -> float:
    began = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever the transport raises
        sender(firing)
    assert not isinstance(caught.value, BrokerUnavailable)
    return time.monotonic() - began


def set_up(sender: Sender, firing: Firing, tries: int = 10) -> None:
    """Send ``firing`` to connect ``sender``, tried again when a step overran its 0.1 s on
    a loaded machine (the sender must have no cooldown): what the test measures comes
    after."""
    for _ in range(tries - 1):
        try:
            sender(firing)
        except Exception:  # noqa: S112 - a set-up send, tried again
            continue
        return
    sender(firing)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A prefix for keys and queue names in Redis db 13; its keys are deleted afterwards."""
    require_service("Redis", REDIS_HOST, REDIS_PORT)
    import redis

    name = f"blsend-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
    for key in client.scan_iter(match=f"*{name}*", count=1_000):
        client.delete(key)
    client.close()


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    """A queue name of this test alone; the queue is deleted afterwards."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    import pika

    name = f"blsend-{uuid.uuid4().hex[:10]}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/"))
    connection.channel().queue_delete(queue=name)
    connection.close()


# -- deadlines ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_a_send_to_a_broker_that_never_answers_fails_within_the_deadline(
    silent: Silent, scheme: str
) -> None:
    url = f"{scheme}://guest:guest@127.0.0.1:{silent.port}/"
    app = make_app(url, "blsend-silent")
    sender = Sender(app, deadline_s=DEADLINE_S)
    try:
        assert failure_time(sender, a_firing("blsend-silent")) < DEADLINE_S + 1
    finally:
        sender.close()


def test_after_a_failed_send_the_next_ones_fail_at_once_until_the_cooldown_ends(
    silent: Silent,
) -> None:
    app = make_app(f"redis://127.0.0.1:{silent.port}/0", "blsend-silent")
    sender = Sender(app, deadline_s=DEADLINE_S, cooldown_s=0.5)
    firing = a_firing("blsend-silent")
    try:
        failure_time(sender, firing)
        began = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="tried again in"):
            sender(firing)
        assert time.monotonic() - began < 0.05
        time.sleep(0.5)
        assert failure_time(sender, firing) < DEADLINE_S + 1  # the broker is tried again
    finally:
        sender.close()


def test_a_message_that_cannot_be_encoded_fails_alone_and_leaves_the_broker_usable(
    redis_prefix: str,
) -> None:
    app = make_app(REDIS_URL, redis_prefix)
    sender = Sender(app, deadline_s=DEADLINE_S)
    entry = Entry(name="bad", task=TASK, trigger=Every(60), args=[object()])
    try:
        with pytest.raises(EncodeError):
            sender(Firing.of(entry, None, "sending/bad", 1_800_000_000_000))
        sender(a_firing(redis_prefix))  # no cooldown: the broker did nothing wrong
    finally:
        sender.close()
    assert len(received(app, redis_prefix)) == 1


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_send_cut_off_after_connecting_warns_that_a_second_copy_may_exist(
    broker: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    if broker == "redis":
        queue = request.getfixturevalue("redis_prefix")
        proxy = Proxy((REDIS_HOST, REDIS_PORT))
        url = f"redis://127.0.0.1:{proxy.port}/{REDIS_DB}"
    else:
        queue = request.getfixturevalue("rabbitmq_queue")
        proxy = Proxy(("127.0.0.1", 5672))
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
    app = make_app(url, queue)
    sender = Sender(app, deadline_s=DEADLINE_S, cooldown_s=0)
    try:
        set_up(sender, a_firing(queue, 1_800_000_000_000))  # connected, declared, sent
        caplog.clear()
        proxy.freeze()
        late = a_firing(queue, 1_800_000_060_000)
        with caplog.at_level(logging.WARNING, logger="beatless.celery._sending"):
            assert failure_time(sender, late) < DEADLINE_S + 1
    finally:
        sender.close()
        proxy.close()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "outcome is unknown" in warning
    assert f"same task id {late.id}" in warning


# -- healthy brokers ----------------------------------------------------------------------


def test_redis_receives_the_firing_with_its_id_as_task_id(redis_prefix: str) -> None:
    conf = {"broker_transport_options": {"global_keyprefix": f"{redis_prefix}:"}}
    app = make_app(REDIS_URL, redis_prefix, **conf)
    sender = Sender(app, deadline_s=DEADLINE_S)
    firing = a_firing(redis_prefix)
    try:
        result = sender(firing)
        own = sender._connection.transport_options
        assert own["socket_timeout"] == own["socket_connect_timeout"] == sender.step_s
        assert own["retry_on_timeout"] is False
        assert own["global_keyprefix"] == f"{redis_prefix}:"  # the app's options are kept
    finally:
        sender.close()
    assert result.id == firing.id
    assert app.conf.broker_transport_options == conf["broker_transport_options"]
    assert "socket_timeout" not in app.connection_for_write().transport_options
    ((context, name),) = received(app, redis_prefix)
    assert name == TASK
    assert context.id == beatless.celery.task_firing_id(context) == firing.id
    assert beatless.celery.occurrence(context) == firing.occurrence


def test_rabbitmq_receives_the_firing_with_its_id_as_task_id(rabbitmq_queue: str) -> None:
    app = make_app(AMQP_URL, rabbitmq_queue)
    sender = Sender(app, deadline_s=DEADLINE_S)
    firing = a_firing(rabbitmq_queue)
    try:
        sender(firing)
        own = sender._connection.transport_options
        assert own["read_timeout"] == own["write_timeout"] == sender.step_s
        assert own["confirm_publish"] is True
        assert sender._connection.connect_timeout == sender.step_s
    finally:
        sender.close()
    assert "confirm_publish" not in app.connection_for_write().transport_options
    ((context, name),) = received(app, rabbitmq_queue)
    assert name == TASK
    assert context.id == beatless.celery.task_firing_id(context) == firing.id
    assert beatless.celery.occurrence(context) == firing.occurrence


def test_a_shorter_timeout_of_the_app_is_kept() -> None:
    options = {"socket_timeout": 0.05, "global_keyprefix": "x:"}
    app = make_app("redis://127.0.0.1:6399/0", "q", broker_transport_options=options)
    sender = Sender(app, deadline_s=DEADLINE_S)
    sender._open()  # no network: kombu connects at the first use
    try:
        own = sender._connection.transport_options
        assert own["socket_timeout"] == 0.05
        assert own["socket_connect_timeout"] == sender.step_s
    finally:
        sender.close()


def test_build_scheduler_sends_two_phase_through_a_sender_on_the_lease_deadline() -> None:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={"tick": {"task": TASK, "schedule": 60.0}},
        beatless_store_url="memory://",
        beatless_lease=10,
    )
    scheduler = build_scheduler(app)
    try:
        assert isinstance(scheduler.sender, Sender)
        assert scheduler.sender.deadline_s == pytest.approx(4.0)  # 0.4 x the lease
    finally:
        scheduler.close()
    assert scheduler.sender._connection is None
