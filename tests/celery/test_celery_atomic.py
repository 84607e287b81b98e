"""Atomic claim-and-enqueue for Celery on the Redis transport, against real Redis and a
real ``celery worker``.

The tests use a Redis database of their own (the first empty one of ``CANDIDATE_DBS``),
queue names, exchanges and claim prefixes that carry a random token, and delete only the
keys that carry it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from service_check import require_service

pytest.importorskip("celery")
redis = pytest.importorskip("redis")

from celery import Celery, signals  # noqa: E402
from celery.app.amqp import Broadcast  # noqa: E402
from kombu import entity  # noqa: E402

from beatless.celery._atomic import ATOMIC, TWO_PHASE, CeleryRedisAtomic  # noqa: E402
from beatless.celery._messages import OCCURRENCE_HEADER, send_task_options  # noqa: E402
from beatless.core.triggers import Every  # noqa: E402
from beatless.errors import StoreUnavailable  # noqa: E402
from beatless.fleet._notes import history_kind  # noqa: E402
from beatless.node.dispatch import Dispatcher, Recorder, dispatch_now  # noqa: E402
from beatless.node.runs import RUN_HEADER, RunPolicy  # noqa: E402
from beatless.node.scheduler import Scheduler  # noqa: E402
from beatless.schedule.entry import Entry, Schedule  # noqa: E402
from beatless.schedule.firing import Firing, iso  # noqa: E402
from beatless.stores.redis.store import RedisStore  # noqa: E402

HOST, PORT = "127.0.0.1", 6379
CANDIDATE_DBS = (11, 10, 9, 8)
pytestmark = pytest.mark.xdist_group("celery-atomic")  # one worker picks the database, once
REPO = Path(__file__).resolve().parents[2]
Queue: Any = entity.Queue
Exchange: Any = entity.Exchange
TASK = "beatless_atomic_test.record"
SENT_AT_RANDOM = ("delivery_tag",)
"""Properties kombu draws afresh for every publish."""


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def db() -> Iterator[int]:
    """A Redis database that held no key when this module started."""
    require_service("Redis", HOST, PORT)
    for number in CANDIDATE_DBS:
        client = redis.Redis(host=HOST, port=PORT, db=number)
        try:
            if client.dbsize() == 0:
                yield number
                return
        finally:
            client.close()
    reason = f"no empty Redis database among {CANDIDATE_DBS}"
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires one")
    pytest.skip(reason)


@pytest.fixture
def token(db: int) -> Iterator[str]:
    """A name of this test alone; every key that carries it is deleted at the end."""
    name = f"bta-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis(host=HOST, port=PORT, db=db)
    for key in client.scan_iter(match=f"*{name}*", count=1_000):
        client.delete(key)
    # kombu's shared index of expiring bindings (a queue with x-expires): our members only
    for key in client.scan_iter(match="*_kombu.binding_deadlines", count=1_000):
        client.zrem(key, *[m for m in client.zrange(key, 0, -1) if name.encode() in m] or [b""])
    client.close()


@pytest.fixture
def r(db: int) -> Iterator[Any]:
    client = redis.Redis(host=HOST, port=PORT, db=db)
    yield client
    client.close()


def make_app(db: int, token: str, **conf: Any) -> Any:
    app = Celery(token, broker=f"redis://{HOST}:{PORT}/{db}", set_as_current=False)
    app.conf.update(task_default_queue=token, worker_enable_remote_control=False, **conf)
    return app


def make_atomic(app: Any, db: int, token: str, **options: Any) -> CeleryRedisAtomic:
    store = RedisStore(redis.Redis(host=HOST, port=PORT, db=db), prefix=f"{token}:claims:")
    return CeleryRedisAtomic(app, store, **options)


def firing(name: str, *, options: dict[str, Any] | None = None, late_s: float = 0) -> Firing:
    entry = Entry(
        name=name,
        task=TASK,
        trigger=Every(60),
        args=(1, "two"),
        kwargs={"three": 3},
        options=options or {},
        max_late=60,
    )
    occurrence = round((time.time() - late_s) * 1_000)
    return Firing.of(entry, None, f"{name}@{uuid.uuid4().hex[:6]}", occurrence)


def entries(client: Any, key: str) -> list[dict[str, Any]]:
    """The messages of a queue key, oldest first, decoded from kombu's envelope."""
    return [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]


def close(*atomics: CeleryRedisAtomic) -> None:
    for atomic in atomics:
        atomic.close()
        atomic.store.client.close()


# -- the message is kombu's, field by field --------------------------------------------


def in_an_hour() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


CASES: dict[str, Callable[[str], tuple[dict[str, Any], dict[str, Any], str]]] = {
    # name: token -> (entry options, app conf, queue key the message must land in)
    "default": lambda t: ({}, {}, t),
    "priority 5": lambda t: ({"priority": 5}, {}, f"{t}\x06\x163"),
    "priority 9": lambda t: ({"priority": 9}, {}, f"{t}\x06\x169"),
    "queue option": lambda t: ({"queue": f"{t}-other"}, {}, f"{t}-other"),
    "expires": lambda t: ({"expires": in_an_hour()}, {}, t),
    "headers and routing": lambda t: (
        {"headers": {"x-custom": "yes"}, "routing_key": "ignored", "serializer": "json"},
        {},
        t,
    ),
    "compression": lambda t: ({"compression": "zlib"}, {}, t),
    "direct exchange bindings": lambda t: (
        {"queue": f"{t}-dq", "exchange": f"{t}-dx", "routing_key": f"{t}-rk"},
        {"task_queues": [Queue(f"{t}-dq", Exchange(f"{t}-dx", "direct"), f"{t}-rk")]},
        f"{t}-dq",
    ),
    "task_queues and time limits": lambda t: (
        {"queue": f"{t}-q2", "time_limit": 30, "soft_time_limit": 20},
        {"task_queues": [Queue(f"{t}-q2")], "task_send_sent_event": True},
        f"{t}-q2",
    ),
    "queue with x-expires (a MULTI pipeline)": lambda t: (
        {"queue": f"{t}-xq"},
        {"task_queues": [Queue(f"{t}-xq", expires=600)]},
        f"{t}-xq",
    ),
    "global_keyprefix": lambda t: (
        {"priority": 3},
        {"broker_transport_options": {"global_keyprefix": f"{t}:"}},
        f"{t}:{t}\x06\x163",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_atomic_message_equals_the_one_send_task_pushes(
    case: str, db: int, token: str, r: Any
) -> None:
    options, conf, key = CASES[case](token)
    app = make_app(db, token, **conf)
    atomic = make_atomic(app, db, token)
    try:
        f = firing("equal", options=options)
        assert atomic.route_kind(f.entry)[0] == ATOMIC
        assert dispatch_now(atomic, [f], node="a") == ["won"]
        app.send_task(TASK, f.entry.args, dict(f.entry.kwargs), **send_task_options(f))
    finally:
        close(atomic)
    ours, kombus = entries(r, key)
    assert_same_envelope(ours, kombus)
    assert ours["headers"]["id"] == f.id
    assert ours["headers"][OCCURRENCE_HEADER] == iso(f.occurrence_ms)


@pytest.mark.parametrize("case", list(CASES))
def test_a_message_built_ahead_is_pushed_and_equals_the_one_send_task_pushes(
    case: str, db: int, token: str, r: Any
) -> None:
    """Built a second before its release by :meth:`CeleryRedisAtomic.prepare`, unless it
    depends on the instant it is built (``expires`` here): then it is built when due."""
    options, conf, key = CASES[case](token)
    app = make_app(db, token, **conf)
    atomic = make_atomic(app, db, token)
    try:
        f = firing("ahead", options=options)
        wake = Recorder("a")
        (built,) = atomic.prepare([f], wake)
        assert (built is None) == ("expires" in options)
        if built is not None:
            wake.built[f.id] = built
        atomic.dispatch([f], wake)
        assert wake.outcomes == {f.id: "won"}
        assert wake.built == {}
        app.send_task(TASK, f.entry.args, dict(f.entry.kwargs), **send_task_options(f))
    finally:
        close(atomic)
    ours, kombus = entries(r, key)
    assert_same_envelope(ours, kombus)
    assert ours["headers"]["id"] == f.id


def test_one_template_fills_every_firing_of_an_entry_as_send_task_would(
    db: int, token: str, r: Any
) -> None:
    """The template is made once; firings of other occurrences and tenants, with expiry
    from lateness and task-sent events, still equal ``send_task``'s messages."""
    app = make_app(db, token, task_send_sent_event=True)
    atomic = make_atomic(app, db, token, expires_from_lateness=True)
    first = firing("template", late_s=2)
    entry = first.entry
    others = [
        Firing.of(entry, tenant, f"{first.address}/{tenant}", first.occurrence_ms + step)
        for step, tenant in ((0, "acme"), (-1_000, "globex"), (-7_000, 'a"quoted"\ntenant'))
    ]
    try:
        assert atomic.route_kind(entry)[0] == ATOMIC
        for f in [first, *others]:
            assert dispatch_now(atomic, [f], node="a") == ["won"]
            options = send_task_options(f, expires_from_lateness=True)
            app.send_task(TASK, entry.args, dict(entry.kwargs), **options)
    finally:
        close(atomic)
    pushed = entries(r, token)
    assert len(pushed) == 8
    for ours, kombus in zip(pushed[::2], pushed[1::2], strict=True):
        assert_same_envelope(ours, kombus)
    assert [m["headers"]["id"] for m in pushed[::2]] == [f.id for f in [first, *others]]
    assert len({m["properties"]["delivery_tag"] for m in pushed}) == 8


def test_both_paths_carry_the_entry_run_policy_in_every_message(
    db: int, token: str, r: Any
) -> None:
    """The run policy header is static per entry: the template carries it as
    ``send_task`` wrote it, and the two-phase path (``send_task_options``) writes it for
    every firing; a worker reads the entry's policy from either."""
    app = make_app(db, token)
    atomic = make_atomic(app, db, token)
    entry = Entry(
        name="guarded",
        task=TASK,
        trigger=Every(60),
        overlap="skip",
        run_lease=8,
        heartbeat=3,
        once_only=False,
        options={"headers": {"x-own": "kept"}},
    )
    base = round(time.time() * 1_000)
    firings = [Firing.of(entry, None, f"{token}/guarded", base - n * 1_000) for n in range(2)]
    try:
        assert atomic.route_kind(entry)[0] == ATOMIC
        assert dispatch_now(atomic, firings, node="a") == ["won", "won"]
        two_phase = Firing.of(entry, None, f"{token}/guarded", base - 5_000)
        app.send_task(TASK, entry.args, {}, **send_task_options(two_phase))
    finally:
        close(atomic)
    pushed = entries(r, token)
    assert [m["headers"]["id"] for m in pushed] == [f.id for f in [*firings, two_phase]]
    expected = RunPolicy("skip", 8_000, 3_000, False, 70_000)
    for message in pushed:
        assert RunPolicy.decode(message["headers"][RUN_HEADER]) == expected
        assert message["headers"]["x-own"] == "kept"


def assert_same_envelope(ours: dict[str, Any], kombus: dict[str, Any]) -> None:
    ours_props, kombus_props = dict(ours["properties"]), dict(kombus["properties"])
    for name in SENT_AT_RANDOM:
        assert ours_props.pop(name) != kombus_props.pop(name)
    expiration = ours_props.pop("expiration", None), kombus_props.pop("expiration", None)
    if expiration != (None, None):
        # milliseconds left until ``expires``, computed at each publish
        assert abs(int(expiration[0]) - int(expiration[1])) < 5_000
    assert ours_props == kombus_props
    assert ours["headers"] == kombus["headers"]
    assert set(ours) == set(kombus)
    for field in set(ours) - {"properties", "headers"}:
        assert ours[field] == kombus[field], field
    assert base64.b64decode(ours["body"]) == base64.b64decode(kombus["body"])


def test_sent_event_is_published_for_a_won_firing_only(db: int, token: str, r: Any) -> None:
    # Pub/sub is one namespace for every database of the server: an event exchange of the
    # test's own keeps other tests' Celery events out.
    app = make_app(db, token, task_send_sent_event=True, event_exchange=f"{token}.ev")
    atomic = make_atomic(app, db, token)
    events = r.pubsub()
    events.psubscribe(f"*{token}.ev*")
    try:
        f = firing("sent")
        assert dispatch_now(atomic, [f], node="a") == ["won"]
        assert dispatch_now(atomic, [f], node="b") == ["lost"]
        received = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            message = events.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                received.append(json.loads(message["data"]))
                deadline = min(deadline, time.monotonic() + 0.5)  # a second one would be here
    finally:
        events.close()
        close(atomic)
    assert len(received) == 1
    body = json.loads(base64.b64decode(received[0]["body"]))
    assert body["type"] == "task-sent"
    assert (body["uuid"], body["queue"], body["exchange"]) == (f.id, token, "")


# -- exactly once, late, fallback --------------------------------------------------------


def race(atomics: list[CeleryRedisAtomic], firings: list[Firing]) -> list[list[str]]:
    """Every instance claims the same firings at the same instant, from its own thread."""
    barrier = threading.Barrier(len(atomics))
    results: list[list[str]] = [[] for _ in atomics]

    def run(index: int) -> None:
        barrier.wait()
        results[index] = dispatch_now(atomics[index], firings, node=f"node-{index}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(atomics))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_three_racing_nodes_push_each_message_exactly_once(db: int, token: str, r: Any) -> None:
    atomics = [make_atomic(make_app(db, token), db, token) for _ in range(3)]
    firings = [firing(f"race-{i}", options={"priority": 6 * (i % 2)}) for i in range(300)]
    try:
        results = race(atomics, firings)
    finally:
        close(*atomics)
    for index, f in enumerate(firings):
        outcomes = [result[index] for result in results]
        assert sorted(outcomes) == ["lost", "lost", "won"], (f.id, outcomes)
    pushed = entries(r, token) + entries(r, f"{token}\x06\x166")
    ids = [m["headers"]["id"] for m in pushed]
    assert sorted(ids) == sorted(f.id for f in firings)


def test_three_scheduler_loops_enqueue_every_occurrence_once(db: int, token: str, r: Any) -> None:
    schedule = Schedule(
        [Entry(name=f"every-{n}", task=TASK, trigger=Every(n), max_late=5) for n in (1, 2)],
        namespace=token,
    )
    atomics = [make_atomic(make_app(db, token), db, token) for _ in range(3)]
    assert all(isinstance(a, Dispatcher) for a in atomics)
    decisions: list[Any] = []
    nodes = [
        Scheduler(schedule, store=a, node=f"node-{i}", on_decision=decisions.append)
        for i, a in enumerate(atomics)
    ]
    try:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            for node in nodes:
                node.tick()
            time.sleep(0.02)
    finally:
        close(*atomics)
    won = [d.firing.id for d in decisions if d.outcome in ("won", "takeover")]
    decided = {d.firing.id for d in decisions}
    queued = [m["headers"]["id"] for m in entries(r, token)]
    assert len(decided) >= 3
    assert sorted(won) == sorted(decided) == sorted(queued)
    # Each pushed firing is in its address's history, written by the claim script that
    # pushed it (the boards never synced): the winner, the outcome, the instant.
    kinds = [history_kind(schedule.address(e)) for e in schedule.entries]
    notes = atomics[0].store.read_notes(kinds)
    items = [json.loads(v) for kind in kinds for v in notes[kind].values()]
    by_id = {i["id"]: i for i in items}
    assert sorted(by_id) == sorted(won)
    winners = {d.firing.id: d.node for d in decisions if d.outcome in ("won", "takeover")}
    assert all(by_id[id_]["node"] == node for id_, node in winners.items())
    assert {i["outcome"] for i in items} <= {"won", "takeover"}
    assert all(i["at_ms"] >= i["release_ms"] and i["lateness_ms"] >= 0 for i in items)


def test_late_firing_pushes_nothing(db: int, token: str, r: Any) -> None:
    atomic = make_atomic(make_app(db, token), db, token)
    try:
        outcomes = dispatch_now(atomic, [firing("late", late_s=600)], node="a")
    finally:
        close(atomic)
    assert outcomes == ["late"]
    assert r.llen(token) == 0


def topic_app(db: int, token: str) -> Any:
    queue = Queue(f"{token}-tq", Exchange(f"{token}-tx", type="topic"), routing_key="bt.#")
    return make_app(db, token, task_queues=[queue, Queue(token)])


def test_topic_exchange_falls_back_to_two_phase_and_delivers_once(
    db: int, token: str, r: Any
) -> None:
    atomics = [make_atomic(topic_app(db, token), db, token) for _ in range(3)]
    f = firing("topic", options={"queue": f"{token}-tq", "routing_key": "bt.periodic"})
    try:
        kind, reason = atomics[0].route_kind(f.entry)
        results = race(atomics, [f])
    finally:
        close(*atomics)
    assert (kind, reason) == (TWO_PHASE, f"topic exchange '{token}-tx'")
    outcomes = [result[0] for result in results]
    assert sum(o in ("won", "takeover") for o in outcomes) == 1, outcomes
    assert [m["headers"]["id"] for m in entries(r, f"{token}-tq")] == [f.id]


def test_route_kind_names_the_path_of_each_entry_and_why(db: int, token: str) -> None:
    queues = [
        Queue(token),
        Broadcast(f"{token}-bc"),
        Queue(f"{token}-dq", Exchange(f"{token}-dx"), routing_key="rk"),
    ]
    atomic = make_atomic(make_app(db, token, task_queues=queues), db, token)
    cases: dict[str, dict[str, Any]] = {
        "default": {},
        "broadcast": {"queue": f"{token}-bc"},
        "direct": {"queue": f"{token}-dq", "exchange": f"{token}-dx", "routing_key": "rk"},
        "unbound": {"exchange": f"{token}-none", "routing_key": "rk"},
        "producer": {"producer": None},
    }
    try:
        kinds = {
            name: atomic.route_kind(firing(name, options=o).entry) for name, o in cases.items()
        }
    finally:
        close(atomic)
    assert kinds == {
        "default": (ATOMIC, f"direct routing to queue '{token}'"),
        "broadcast": (TWO_PHASE, f"fanout exchange '{token}-bc'"),
        "direct": (
            ATOMIC,
            f"direct exchange '{token}-dx', routing key 'rk', bound to queue '{token}-dq'",
        ),
        "unbound": (TWO_PHASE, f"exchange '{token}-none' routes key 'rk' to no queue"),
        "producer": (TWO_PHASE, "option 'producer' chooses its own way to publish"),
    }


def test_publish_signals_are_sent_once_per_message_really_sent(db: int, token: str, r: Any) -> None:
    """An app listening to the publish signals sends through ``app.send_task`` at the
    moment of sending, so each signal stands for one message pushed, and no template is
    made behind its back; ``force_two_phase`` does the same whatever the app listens to."""
    plain, forced = make_atomic(make_app(db, token), db, token), None
    one, two = firing("plain"), firing("forced")
    assert plain.route_kind(one.entry)[0] == ATOMIC  # nobody listens yet
    seen: list[str] = []

    def before(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["id"])

    signals.before_task_publish.connect(before, weak=False)
    try:
        forced = make_atomic(make_app(db, token), db, token, force_two_phase=True)
        assert forced.route_kind(two.entry) == (TWO_PHASE, "force_two_phase is set")
        assert plain.route_kind(one.entry) == (
            TWO_PHASE,
            "the app listens to before_task_publish, sent by app.send_task only",
        )
        assert dispatch_now(plain, [one], node="a") == ["won"]
        assert dispatch_now(forced, [two], node="a") == ["won"]
    finally:
        signals.before_task_publish.disconnect(before)
        close(plain, *([forced] if forced else []))
    assert seen == [one.id, two.id]
    assert sorted(m["headers"]["id"] for m in entries(r, token)) == sorted([one.id, two.id])


def test_failed_two_phase_send_releases_the_claim(db: int, token: str, r: Any) -> None:
    def broken(_: Firing) -> None:
        raise ConnectionError("broker down")

    app = make_app(db, token)
    failing = make_atomic(app, db, token, force_two_phase=True, fallback_enqueue=broken)
    working = make_atomic(app, db, token, force_two_phase=True)
    try:
        f = firing("released")
        assert dispatch_now(failing, [f], node="a") == ["enqueue_failed"]
        assert dispatch_now(working, [f], node="b") == ["takeover"]
    finally:
        close(failing, working)
    assert [m["headers"]["id"] for m in entries(r, token)] == [f.id]


def test_firing_whose_message_cannot_be_built_is_isolated_and_released(
    db: int, token: str, r: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(db, token, task_create_missing_queues=False)
    atomic = make_atomic(app, db, token)
    bad, good = firing("bad", options={"queue": f"{token}-missing"}), firing("good")
    try:
        with caplog.at_level(logging.DEBUG, logger="beatless.node.atomic"):
            assert dispatch_now(atomic, [bad, good], node="a") == ["enqueue_failed", "won"]
    finally:
        close(atomic)
    (said,) = [r for r in caplog.records if r.name == "beatless.node.atomic"]
    assert said.levelno == logging.WARNING
    assert said.getMessage().startswith(
        f"firing {bad.id} of entry 'bad': its message cannot be built for the claim script ("
    )
    assert said.getMessage().endswith("); sending it two-phase through app.send_task")
    assert [m["headers"]["id"] for m in entries(r, token)] == [good.id]
    record = r.get(f"{token}:claims:claim:{bad.id}")
    assert b"|committed|" not in (record or b"")  # released: the next claim takes it over


def test_unreachable_broker_raises_store_unavailable(db: int, token: str) -> None:
    app = Celery(token, broker=f"redis://{HOST}:1/{db}", set_as_current=False)
    atomic = make_atomic(app, db, token)
    try:
        with pytest.raises(StoreUnavailable):
            dispatch_now(atomic, [firing("unreachable")], node="a")
    finally:
        close(atomic)


def test_store_on_another_redis_database_goes_two_phase(db: int, token: str, r: Any) -> None:
    app = make_app(db, token)
    other = next(n for n in CANDIDATE_DBS if n != db)
    store = RedisStore(redis.Redis(host=HOST, port=PORT, db=other), prefix=f"{token}:claims:")
    atomic = CeleryRedisAtomic(app, store)
    try:
        kind, reason = atomic.route_kind(firing("elsewhere").entry)
    finally:
        close(atomic)
    assert kind == TWO_PHASE
    assert "is not the broker's Redis" in reason


def test_the_same_server_spelt_another_way_is_recognised(db: int, token: str) -> None:
    """``localhost`` and ``127.0.0.1`` are one server: decided by the server's ``run_id``."""
    app = Celery(token, broker=f"redis://localhost:{PORT}/{db}", set_as_current=False)
    app.conf.update(task_default_queue=token, worker_enable_remote_control=False)
    atomic = make_atomic(app, db, token)  # the store's client says 127.0.0.1
    try:
        assert atomic.route_kind(firing("spelling").entry)[0] == ATOMIC
    finally:
        close(atomic)


# -- a stock worker consumes what the claim script pushed ---------------------------------

WORKER_APP = """
import json, os

import redis
from celery import Celery

app = Celery(os.environ["BT_TOKEN"], broker=os.environ["BT_BROKER"])
app.conf.update(task_default_queue=os.environ["BT_TOKEN"], worker_enable_remote_control=False)
sink = redis.Redis.from_url(os.environ["BT_BROKER"])


@app.task(bind=True, name="{task}")
def record(self, *args, **kwargs):
    sink.rpush(os.environ["BT_TOKEN"] + ":runs", json.dumps({{
        "id": self.request.id,
        "occurrence": getattr(self.request, "beatless_occurrence", None),
        "args": list(args),
        "kwargs": kwargs,
    }}))
"""


@pytest.fixture
def worker(tmp_path: Path, db: int, token: str) -> Iterator[subprocess.Popen[bytes]]:
    """A stock ``celery worker`` (solo pool) on the test's queue, killed by pid at the end."""
    (tmp_path / "bta_worker_app.py").write_text(textwrap.dedent(WORKER_APP.format(task=TASK)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "BT_TOKEN": token,
        "BT_BROKER": f"redis://{HOST}:{PORT}/{db}",
    }
    command = [sys.executable, "-m", "celery", "-A", "bta_worker_app", "worker", "-P", "solo"]
    command += ["-n", f"{token}@%h", "--without-mingle", "--without-gossip", "--without-heartbeat"]
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    log.close()


def test_stock_worker_runs_the_pushed_task_with_firing_id_and_occurrence(
    worker: subprocess.Popen[bytes], db: int, token: str, r: Any, tmp_path: Path
) -> None:
    atomic = make_atomic(make_app(db, token), db, token, expires_from_lateness=True)
    firings = [firing("worker"), firing("worker-priority", options={"priority": 7})]
    try:
        assert dispatch_now(atomic, firings, node="a") == ["won", "won"]
    finally:
        close(atomic)
    deadline = time.monotonic() + 30
    while r.llen(f"{token}:runs") < 2 and time.monotonic() < deadline:
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        time.sleep(0.1)
    runs = {run["id"]: run for run in map(json.loads, r.lrange(f"{token}:runs", 0, -1))}
    assert set(runs) == {f.id for f in firings}, (tmp_path / "worker.log").read_text()
    for f in firings:
        assert runs[f.id]["occurrence"] == iso(f.occurrence_ms)
        assert runs[f.id]["args"] == [1, "two"]
        assert runs[f.id]["kwargs"] == {"three": 3}


def test_a_store_url_spelt_another_way_takes_the_atomic_path_and_one_elsewhere_warns(
    db: int, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Settings leave the decision to the servers: ``localhost`` for the store and
    ``127.0.0.1`` for the broker is atomic; a store on another database is two-phase,
    with a WARNING that one script could have claimed and enqueued."""
    from beatless.celery._schedule import build_scheduler

    schedule = {"tick": {"task": TASK, "schedule": 60.0}}
    paths = {}
    for name, store_db in (("same", db), ("other", next(n for n in CANDIDATE_DBS if n != db))):
        app = make_app(db, token, beat_schedule=schedule, beatless_namespace=f"{token}-{name}")
        app.conf.beatless_store_url = f"redis://localhost:{PORT}/{store_db}"
        with caplog.at_level(logging.WARNING, logger="beatless"):
            scheduler = build_scheduler(app, node=name)
        try:
            paths[name] = scheduler.paths["tick"]
        finally:
            scheduler.close()
    assert paths["same"][0] is True
    assert paths["other"][0] is False
    assert "is not the broker's Redis" in paths["other"][1]
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "go two-phase" in warning.getMessage()
