"""The worker's side of a Dramatiq firing: the run policy each message carries, the keys
that set it, and the middleware's gate (overlap and once-only) on a StubBroker with the
memory store; the two enqueue paths on a real Redis carry the policy too.

The multi-process cases (a worker killed mid-run, overlapping runs across processes,
copies of a message on a real broker) are in ``test_dramatiq_runs_e2e.py``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from dramatiq import Middleware, Worker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, SkipMessage
from service_check import require_service
from stores import ManualClock

import beatless.dramatiq as bd
from beatless import ConfigError, Entry, Every, StoreError
from beatless.dramatiq._atomic import RedisBrokerStore
from beatless.dramatiq._messages import ADDRESS_OPTION
from beatless.node.dispatch import TwoPhase
from beatless.node.runs import RUN_HEADER, RunPolicy
from beatless.schedule.firing import Firing, executed_id, firing_id, run_lease_id
from beatless.stores import MemoryStore
from beatless.stores.base import ClaimRequest, Outcome

REDIS_URL = "redis://127.0.0.1:6379/12"
OTHER_DB_URL = "redis://127.0.0.1:6379/13"
NOW = 1_800_000_000.0
NOW_MS = int(NOW * 1_000)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock)


def stub_broker(store: Any, clock: ManualClock, **options: Any) -> StubBroker:
    stub = StubBroker()
    stub.add_middleware(CurrentMessage())
    stub.add_middleware(bd.Beatless(store=store, namespace="unit", clock=clock, **options))
    return stub


@pytest.fixture
def broker(store: MemoryStore, clock: ManualClock) -> Iterator[StubBroker]:
    stub = stub_broker(store, clock)
    yield stub
    beat(stub).gate.close()
    stub.close()


def beat(broker: dramatiq.Broker) -> bd.Beatless:
    (found,) = [m for m in broker.middleware if isinstance(m, bd.Beatless)]
    return found


def firing_of(entry: Entry, occurrence_ms: int, tenant: str | None = None) -> Firing:
    address = f"unit/{entry.name}" if tenant is None else f"unit/{entry.name}/{tenant}"
    return Firing.of(entry, tenant, address, occurrence_ms)


def work(broker: StubBroker, *, threads: int = 1, queue: str = "default") -> None:
    """Process what the queue holds, with ``threads`` worker threads, then stop."""
    worker = Worker(broker, worker_threads=threads, worker_timeout=20)
    worker.start()
    try:
        broker.join(queue, timeout=10_000, fail_fast=False)
        worker.join()
    finally:
        worker.stop()


# -- what the message carries ----------------------------------------------------------------


def test_every_firings_message_carries_its_run_policy_and_address(broker: StubBroker) -> None:
    actor = dramatiq.actor(lambda tenant=None: None, actor_name="job", broker=broker)
    entry = Entry(
        name="job",
        task="job",
        trigger=Every(60),
        overlap="skip",
        run_lease="40s",
        heartbeat="10s",
        once_only=False,
        max_late="2m",
    )
    firing = firing_of(entry, 1_800_000_040_000, "acme")
    message = bd.message_for(firing, actor, tenant_kwarg="tenant")
    assert message.message_id == firing.id == firing_id("unit/job/acme", 1_800_000_040_000)
    assert message.options[ADDRESS_OPTION] == "unit/job/acme"
    assert message.options[RUN_HEADER] == "v1|skip|40000|10000|0|130000"
    policy = RunPolicy.decode(message.options[RUN_HEADER])
    assert policy == RunPolicy.of_entry(entry)
    assert policy is not None
    assert policy.memory_ms == entry.memory_ms  # jitter + max_late + 10 s
    plain = bd.message_for(
        firing_of(Entry(name="p", task="job", trigger=Every(60)), 0), actor, tenant_kwarg=None
    )
    assert plain.options[RUN_HEADER] == "v1|allow|30000|5000|1|70000"
    decoded = dramatiq.Message.decode(message.encode())
    assert decoded.options[RUN_HEADER] == message.options[RUN_HEADER]


@pytest.fixture
def namespace() -> Iterator[str]:
    """A Redis namespace of this test in databases 12 and 13; its keys go at the end."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    name = f"blruns-{uuid.uuid4().hex[:10]}"
    yield name
    for url in (REDIS_URL, OTHER_DB_URL):
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=f"*{name}*", count=1_000):
            client.delete(key)
        client.close()


@pytest.mark.parametrize(
    ("path", "store"), [("atomic", None), ("two-phase", OTHER_DB_URL)], ids=["atomic", "two-phase"]
)
def test_both_enqueue_paths_on_redis_carry_the_run_policy(
    namespace: str, path: str, store: str | None
) -> None:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=REDIS_URL, namespace=namespace)
    middleware = bd.Beatless(
        store=store, namespace=namespace, overlap="skip", run_lease="12s", heartbeat="4s"
    )
    broker.add_middleware(middleware)
    dramatiq.actor(
        lambda: None,
        actor_name="job",
        broker=broker,
        queue_name=namespace,
        periodic=bd.every("1s", max_late="10s", once_only=False),
    )
    scheduler = middleware.scheduler(broker)
    try:
        if path == "atomic":
            assert isinstance(scheduler.dispatcher, RedisBrokerStore)
        else:
            assert isinstance(scheduler.dispatcher, TwoPhase)
        won = [d.firing for d in scheduler.tick() if d.outcome == "won"]
        assert won, "the scheduler enqueued nothing"
        consumer = broker.consume(namespace, timeout=1_000)
        messages = []
        for message in consumer:
            if message is None:
                break
            consumer.ack(message)
            messages.append(message)
        consumer.close()
    finally:
        middleware.close()
        broker.close()
    (entry,) = scheduler.schedule.entries
    assert [m.message_id for m in messages] == [f.id for f in won]
    for message in messages:
        assert message.options[ADDRESS_OPTION] == f"{namespace}/job"
        assert message.options[RUN_HEADER] == RunPolicy.of_entry(entry).encode()
        assert message.options[RUN_HEADER] == "v1|skip|12000|4000|0|20000"


# -- the keys ------------------------------------------------------------------------------------


def test_run_keys_come_from_the_declaration_or_the_middleware_defaults() -> None:
    stub = StubBroker()
    middleware = bd.Beatless(
        store="memory://",
        namespace="app",
        overlap="skip",
        run_lease="2m",
        heartbeat="20s",
        once_only=False,
        entries=[Entry(name="given", task="a", trigger=Every(60))],
    )
    stub.add_middleware(middleware)
    dramatiq.actor(lambda: None, actor_name="a", broker=stub, periodic=bd.every("1m"))
    dramatiq.actor(
        lambda: None,
        actor_name="b",
        broker=stub,
        periodic=bd.cron(
            "* * * * *", overlap="allow", run_lease="90s", heartbeat="30s", once_only=True
        ),
    )
    by_name = {e.name: e for e in middleware.schedule(stub).entries}
    a, b, given = by_name["a"], by_name["b"], by_name["given"]
    assert (a.overlap, a.run_lease.total_seconds(), a.heartbeat.total_seconds()) == (
        "skip",
        120,
        20,
    )
    assert a.once_only is False
    assert (b.overlap, b.run_lease.total_seconds(), b.heartbeat.total_seconds()) == (
        "allow",
        90,
        30,
    )
    assert b.once_only is True
    # An Entry given to the middleware keeps its own (the Entry defaults).
    assert (given.overlap, given.run_lease.total_seconds(), given.once_only) == ("allow", 30, True)


def test_bad_run_keys_are_reported_at_start_with_every_other_problem() -> None:
    stub = StubBroker()
    middleware = bd.Beatless(store="memory://", namespace="app", heartbeat="20s")
    stub.add_middleware(middleware)
    dramatiq.actor(
        lambda: None, actor_name="word", broker=stub, periodic=bd.every("1m", overlap="buffer_one")
    )
    dramatiq.actor(
        lambda: None, actor_name="unread", broker=stub, periodic=bd.every("1m", run_lease="soon")
    )
    dramatiq.actor(
        lambda: None, actor_name="flag", broker=stub, periodic=bd.every("1m", once_only="yes")
    )
    dramatiq.actor(  # the middleware's heartbeat of 20 s against the default lease of 30 s
        lambda: None, actor_name="beat", broker=stub, periodic=bd.every("1m")
    )
    dramatiq.actor(
        lambda: None,
        actor_name="fine",
        broker=stub,
        periodic=bd.every("1m", run_lease="1m", overlap="skip"),
    )
    problems = middleware.check(stub).problems
    by_entry = {p.split(":")[0]: p for p in problems}
    # Every problem of an entry at once: the three with a bad key also take the
    # middleware's heartbeat of 20 s against the default lease of 30 s.
    assert len(problems) == 7, problems
    heartbeat = "heartbeat 20s must be under half the run_lease 30s"
    assert {p.split(":")[0] for p in problems if heartbeat in p} == {
        "entry 'word'",
        "entry 'unread'",
        "entry 'flag'",
        "entry 'beat'",
    }
    by_entry = {p.split(":")[0]: p for p in problems if heartbeat not in p}
    by_entry["entry 'beat'"] = heartbeat
    assert "overlap 'buffer_one' is not offered" in by_entry["entry 'word'"]
    assert "run_lease" in by_entry["entry 'unread'"]
    assert "cannot read duration 'soon'" in by_entry["entry 'unread'"]
    assert "once_only must be true or false, got 'yes'" in by_entry["entry 'flag'"]
    assert "heartbeat 20s must be under half the run_lease 30s" in by_entry["entry 'beat'"]
    declared = bd.every("1m", overlap="sometimes", heartbeat="-")
    assert len(declared.problems) == 2


def test_bad_middleware_defaults_are_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="overlap must be one of 'allow', 'skip'"):
        bd.Beatless(store="memory://", overlap="queue")
    with pytest.raises(ConfigError, match="Beatless: once_only must be true or false"):
        bd.Beatless(store="memory://", once_only=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="run_lease"):
        bd.Beatless(store="memory://", run_lease="later")
    with pytest.raises(ConfigError, match="Beatless: check_wait: must be zero or more"):
        bd.Beatless(store="memory://", check_wait=-1)


def test_the_check_wait_is_a_middleware_option_the_runs_of_each_process_take(
    broker: StubBroker,
) -> None:
    assert bd.Beatless(store="memory://").check_wait == timedelta(seconds=30)
    waits = bd.Beatless(store="memory://", check_wait="2s")
    assert waits.check_wait == timedelta(seconds=2)
    assert waits.gate.runs(broker).check_wait == timedelta(seconds=2)
    waits.gate.close()


# -- the gate -----------------------------------------------------------------------------------


def recorder(broker: StubBroker, name: str, **options: Any) -> tuple[Any, list[str]]:
    ran: list[str] = []

    def body() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        ran.append(message.message_id)

    return dramatiq.actor(body, actor_name=name, broker=broker, **options), ran


def test_a_copy_of_a_message_runs_once_and_is_counted_duplicate(broker: StubBroker) -> None:
    actor, ran = recorder(broker, "once")
    entry = Entry(name="once", task="once", trigger=Every(60))
    message = bd.message_for(firing_of(entry, 1_800_000_000_000), actor, tenant_kwarg=None)
    for _ in range(3):
        broker.enqueue(message)
    work(broker, threads=3)
    assert ran == [message.message_id]
    assert beat(broker).run_counts == {"run": 1, "duplicate": 2}
    assert beat(broker).gate.runs(broker).active() == 0


def test_a_copy_while_the_run_goes_on_is_refused_and_so_is_one_after_it(
    broker: StubBroker, store: MemoryStore
) -> None:
    release = threading.Event()
    ran: list[str] = []

    def slow() -> None:
        ran.append("x")
        assert release.wait(10)

    actor = dramatiq.actor(slow, actor_name="slow", broker=broker)
    # A short run lease: the copy waits a run_lease and a heartbeat for the first run to
    # lapse before it is refused as a duplicate of a live run.
    entry = Entry(name="slow", task="slow", trigger=Every(60), run_lease=1.5, heartbeat=0.5)
    message = bd.message_for(firing_of(entry, 1_800_000_000_000), actor, tenant_kwarg=None)
    worker = Worker(broker, worker_threads=2, worker_timeout=20)
    worker.start()
    try:
        broker.enqueue(message)
        assert wait_for(lambda: ran == ["x"])
        broker.enqueue(message)  # a redelivery while the first copy runs
        assert wait_for(lambda: beat(broker).run_counts.get("duplicate") == 1)
        release.set()
        broker.join("default", timeout=10_000)
        worker.join()
        broker.enqueue(message)  # a copy after the run ended
        broker.join("default", timeout=10_000)
        worker.join()
    finally:
        release.set()
        worker.stop()
    assert ran == ["x"]
    assert beat(broker).run_counts == {"run": 1, "duplicate": 2}
    executed = ClaimRequest(executed_id(message.message_id), "unit/slow", 0, 10**12, 1_000, 0)
    assert store.claim([executed], node="probe", lease_ms=1_000) == [Outcome.LOST]


def test_with_overlap_skip_a_firing_is_refused_while_a_run_of_its_address_goes_on(
    broker: StubBroker,
) -> None:
    release = threading.Event()
    started: list[str] = []

    def slow() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        started.append(message.message_id)
        assert release.wait(10)

    actor = dramatiq.actor(slow, actor_name="slow", broker=broker)
    entry = Entry(name="slow", task="slow", trigger=Every(60), overlap="skip")
    first, second, third = (
        bd.message_for(firing_of(entry, NOW_MS + i * 60_000), actor, tenant_kwarg=None)
        for i in range(3)
    )
    other = bd.message_for(firing_of(entry.replace(name="other"), NOW_MS), actor, tenant_kwarg=None)
    worker = Worker(broker, worker_threads=3, worker_timeout=20)
    worker.start()
    try:
        broker.enqueue(first)
        assert wait_for(lambda: started == [first.message_id])
        broker.enqueue(second)  # the same address: refused
        assert wait_for(lambda: beat(broker).run_counts.get("skipped_overlap") == 1)
        broker.enqueue(other)  # another address: runs beside it
        assert wait_for(lambda: len(started) == 2)
        release.set()
        broker.join("default", timeout=10_000)
        worker.join()
        broker.enqueue(third)  # the first run ended: the address is free again
        broker.join("default", timeout=10_000)
        worker.join()
    finally:
        release.set()
        worker.stop()
    assert started == [first.message_id, other.message_id, third.message_id]
    assert beat(broker).run_counts == {"run": 3, "skipped_overlap": 1}


def test_a_redelivery_after_the_worker_died_runs_again_once_the_run_lease_lapsed(
    store: MemoryStore, clock: ManualClock
) -> None:
    """Node a starts the run and dies (its heartbeat stops, the run never ends). Within
    the run lease a redelivered copy waits a run_lease and a heartbeat of real time for
    the record to lapse; on this store's clock, stopped, it does not, and the copy is
    refused. Once it lapsed, the copy runs, counted ``rerun``."""
    dead, alive = stub_broker(store, clock), stub_broker(store, clock)
    entry = Entry(name="job", task="job", trigger=Every(60), run_lease="3s", heartbeat="1s")
    actors = [recorder(b, "job") for b in (dead, alive)]
    message = bd.message_for(firing_of(entry, NOW_MS), actors[0][0], tenant_kwarg=None)
    proxy = MessageProxy(message)
    beat(dead).before_process_message(dead, proxy)  # the run starts ...
    beat(dead).gate.close()  # ... and its process is killed: no heartbeat, no end
    clock.advance(2_000)
    alive.enqueue(message)
    work(alive)
    assert beat(alive).run_counts == {"duplicate": 1}
    clock.advance(2_000)
    alive.enqueue(message)
    work(alive)
    assert actors[1][1] == [message.message_id]
    assert beat(alive).run_counts == {"duplicate": 1, "rerun": 1}
    for b in (dead, alive):
        beat(b).gate.close()
        b.close()


def test_a_retry_is_a_new_attempt_and_runs(broker: StubBroker) -> None:
    attempts: list[int] = []

    def flaky() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        attempts.append(message.options.get("retries", 0))
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    actor = dramatiq.actor(
        flaky, actor_name="flaky", broker=broker, max_retries=1, min_backoff=10, max_backoff=10
    )
    entry = Entry(name="flaky", task="flaky", trigger=Every(60), overlap="skip")
    message = bd.message_for(firing_of(entry, NOW_MS), actor, tenant_kwarg=None)
    broker.enqueue(message)
    worker = Worker(broker, worker_threads=1, worker_timeout=20)
    worker.start()
    try:
        assert wait_for(lambda: len(attempts) == 2)
        broker.join("default", timeout=10_000)
        worker.join()
    finally:
        worker.stop()
    assert attempts == [0, 1]
    assert beat(broker).run_counts == {"run": 2}
    assert beat(broker).gate.runs(broker).active() == 0


class SkipAfter(Middleware):
    """A middleware after Beatless that skips every message of one actor."""

    def __init__(self, actor_name: str) -> None:
        self.actor_name = actor_name

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        if message.actor_name == self.actor_name:
            raise SkipMessage("skipped by a later middleware")


def test_a_run_skipped_by_a_later_middleware_is_ended_all_the_same(
    broker: StubBroker, store: MemoryStore
) -> None:
    broker.add_middleware(SkipAfter("skipped"))
    actor, ran = recorder(broker, "skipped")
    entry = Entry(name="skipped", task="skipped", trigger=Every(60), overlap="skip")
    message = bd.message_for(firing_of(entry, NOW_MS), actor, tenant_kwarg=None)
    broker.enqueue(message)
    work(broker)
    assert ran == []
    assert beat(broker).run_counts == {"run": 1}
    assert beat(broker).gate.runs(broker).active() == 0
    assert beat(broker).gate._running == {}
    lease = ClaimRequest(run_lease_id("unit/skipped"), "unit/skipped", NOW_MS, 10**12, 1_000, 0)
    assert store.claim([lease], node="probe", lease_ms=1_000)[0].is_won  # released


def test_a_message_skipped_before_the_gate_starts_no_run(broker: StubBroker) -> None:
    actor, ran = recorder(broker, "old", max_age=1_000)  # AgeLimit skips it before us
    entry = Entry(name="old", task="old", trigger=Every(60))
    message = bd.message_for(firing_of(entry, 1_000), actor, tenant_kwarg=None)
    broker.enqueue(message)
    work(broker)
    assert ran == []
    assert beat(broker).run_counts == {}


def test_messages_beatless_did_not_send_and_unguarded_firings_pass_unchecked(
    broker: StubBroker,
) -> None:
    actor, ran = recorder(broker, "plain")
    actor.send()
    entry = Entry(name="plain", task="plain", trigger=Every(60), once_only=False)
    message = bd.message_for(firing_of(entry, NOW_MS), actor, tenant_kwarg=None)
    broker.enqueue(message)
    broker.enqueue(message)
    work(broker)
    assert len(ran) == 3
    assert beat(broker).run_counts == {}


def test_a_message_without_an_address_option_takes_its_entry_and_tenant(
    broker: StubBroker, store: MemoryStore
) -> None:
    actor, _ = recorder(broker, "fan")
    entry = Entry(name="fan/out", task="fan", trigger=Every(60), overlap="skip")
    full = bd.message_for(firing_of(entry, NOW_MS, "acme"), actor, tenant_kwarg=None)
    older = full.copy(options={ADDRESS_OPTION: None})
    assert beat(broker).gate.address_of(older) == "unit/fan%2Fout/acme"  # type: ignore[arg-type]
    proxy = MessageProxy(older)
    beat(broker).before_process_message(broker, proxy)
    lease = ClaimRequest(
        run_lease_id("unit/fan%2Fout/acme"), "unit/fan%2Fout/acme", NOW_MS, 10**12, 1_000, 0
    )
    assert store.claim([lease], node="probe", lease_ms=1_000) == [Outcome.HELD]
    beat(broker).after_process_message(broker, proxy)
    assert store.claim([lease], node="probe", lease_ms=1_000)[0].is_won


class Unreachable(MemoryStore):
    def claim(self, requests: Any, *, node: str, lease_ms: int) -> list[Outcome]:
        raise StoreError("the store is down")


@pytest.mark.parametrize("reason", ["unreachable", "unopened"])
def test_with_the_store_unreachable_once_only_is_given_up_and_overlap_skip_is_not(
    clock: ManualClock, reason: str
) -> None:
    given = Unreachable(clock=clock) if reason == "unreachable" else "nosuch://nowhere"
    # A store that cannot be opened refuses the node at start; consuming, it runs tasks.
    stub = stub_broker(given, clock, on_schedule_error="consume")
    actor, ran = recorder(stub, "job")
    once = Entry(name="once", task="job", trigger=Every(60))
    skip = Entry(name="skip", task="job", trigger=Every(60), overlap="skip")
    for entry in (once, skip):
        stub.enqueue(bd.message_for(firing_of(entry, NOW_MS), actor, tenant_kwarg=None))
    work(stub)
    assert len(ran) == 1
    assert beat(stub).run_counts == {"unchecked": 1, "skipped_overlap": 1}
    beat(stub).gate.close()
    stub.close()


def test_the_runs_of_a_process_are_opened_once_named_host_pid_and_closed(
    broker: StubBroker, store: MemoryStore
) -> None:
    middleware = beat(broker)
    runs = middleware.gate.runs(broker)
    assert middleware.gate.runs(broker) is runs
    assert runs.node == f"{socket.gethostname()}:{os.getpid()}"
    named = bd.Beatless(store="memory://", node="node-a")
    assert named.gate.runs(broker).node == f"node-a:{os.getpid()}"
    runs.start("f", "unit/x", RunPolicy("allow", 30_000, 5_000, True, 70_000))
    assert middleware.run_counts == {"run": 1}
    middleware.gate.close()
    assert runs._thread is not None
    runs._thread.join(5)
    assert not runs._thread.is_alive()  # the heartbeat thread ended
    assert middleware.run_counts == {"run": 1}  # the counts outlive the close
    again = middleware.gate.runs(broker)
    assert again is not runs
    again.start("g", "unit/x", RunPolicy("allow", 30_000, 5_000, True, 70_000))
    assert middleware.run_counts == {"run": 2}
    named.gate.close()
    # The store given to the middleware is the runs' store, and their close leaves it open.
    request = ClaimRequest("id", "unit/x", NOW_MS, 60_000, 70_000, NOW_MS)
    assert store.claim([request], node="n", lease_ms=1_000) == [Outcome.WON]


def test_the_runs_use_the_store_the_scheduler_claims_in(namespace: str, store: MemoryStore) -> None:
    from dramatiq.brokers.redis import RedisBroker

    from beatless.stores.redis.store import RedisStore

    broker = RedisBroker(url=REDIS_URL, namespace=namespace)
    follows = bd.Beatless(namespace=namespace)
    given = bd.Beatless(store=store, namespace=namespace)
    url = bd.Beatless(store=OTHER_DB_URL, namespace=namespace)
    try:
        own = follows.status_store(broker)
        assert isinstance(own, RedisStore)
        assert own.prefix == f"beatless:{namespace}:"
        assert own.client is broker.client
        assert given.status_store(broker).store is store  # type: ignore[attr-defined]
        opened = url.status_store(broker)
        assert isinstance(opened, RedisStore)
        assert opened.client.connection_pool.connection_kwargs["db"] == 13
        opened.close()
    finally:
        broker.close()


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_overlap_skip_on_the_rabbitmq_store_is_accepted() -> None:
    """The RabbitMQ store renews run leases without a gap: a schedule that skips
    overlapping runs starts on it (its workers enforce the skip)."""
    stub = StubBroker()
    middleware = bd.Beatless(store="amqp://guest:guest@127.0.0.1:5672/%2F", namespace="app")
    stub.add_middleware(middleware)
    dramatiq.actor(
        lambda: None, actor_name="skips", broker=stub, periodic=bd.every("1m", overlap="skip")
    )
    found = middleware.check(stub)
    assert found.problems == ()
    assert found.schedule is not None
    stub.close()
