"""The RabbitMQ claim store against a real broker: what the contract suite cannot see.

The shared broker at 127.0.0.1:5672 is used with a random queue prefix per test, and
only the queues and the exchange under that prefix are deleted afterwards (they expire
anyway). A broker that lost its definitions is simulated by deleting them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pika", reason="the rabbitmq store needs: pip install 'beatless[rabbitmq]'")

import pika
from fleet import assert_the_kill_was_survived, kill_one_of_three
from service_check import require_service
from stores import RABBITMQ, RABBITMQ_URL, delete_rabbitmq_names, free_port

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.node.dispatch import Recorder, TwoPhase
from beatless.node.runs import NEVER_LATE_MS, RUN_RECORD_MEMORY_MS
from beatless.schedule.firing import executed_id, run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import TOLERANCE_MS, Note
from beatless.stores.rabbitmq.store import RabbitMQStore

ROOT = Path(__file__).parent.parent
MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
LEASE_MS = 800
TAG = "5eed7a95"


class Namespace:
    """A queue prefix of the test's own; opens stores under it and deletes, on cleanup,
    the slot of every firing claimed, the epoch queue and the exchange: nothing else."""

    def __init__(self) -> None:
        self.prefix = f"beatless-test.{uuid.uuid4().hex[:12]}."
        self.ids: set[str] = set()
        self.stores: list[RabbitMQStore] = []

    def store(self, **options: object) -> RabbitMQStore:
        store = RabbitMQStore(RABBITMQ_URL, prefix=self.prefix, **options)  # type: ignore[arg-type]
        self.stores.append(store)
        return store

    def firing(self, occurrence_ms: int | None = None, **kw: int) -> ClaimRequest:
        id_ = uuid.uuid4().hex
        self.ids.add(id_)
        occurrence = int(time.time() * 1_000) if occurrence_ms is None else occurrence_ms
        release = kw.get("release_ms", occurrence)
        return ClaimRequest(id_, f"t/{id_[:8]}", occurrence, MAX_LATE_MS, MEMORY_MS, release, TAG)

    def forget_everything(self) -> None:
        """What a broker that lost its definitions looks like to this namespace."""
        queues = [f"{self.prefix}c.{i}" for i in self.ids]
        queues += [f"{self.prefix}epoch", f"{self.prefix}notes"]
        delete_rabbitmq_names(queues, [f"{self.prefix}slots"])

    def cleanup(self) -> None:
        for store in self.stores:
            store.close()
        self.forget_everything()


@pytest.fixture
def ns() -> Iterator[Namespace]:
    require_service(*RABBITMQ)
    space = Namespace()
    yield space
    space.cleanup()


def one(
    store: RabbitMQStore, request: ClaimRequest, node: str, lease_ms: int = LEASE_MS
) -> Outcome:
    (outcome,) = store.claim([request], node=node, lease_ms=lease_ms)
    return outcome


@pytest.fixture
def channel() -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A channel of the shared broker, for looking behind the store's back."""
    require_service(*RABBITMQ)
    conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    yield conn.channel()
    conn.close()


# -- the broker behaviour the design rests on ----------------------------------------------


def test_a_message_got_and_not_acknowledged_leaves_a_full_slot_open_to_another_publish(
    channel: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    # Why no node ever reads another node's claim with basic.get: RabbitMQ counts only
    # ready messages against x-max-length, so the slot takes a second claim meanwhile.
    queue = f"beatless-test.{uuid.uuid4().hex}"
    channel.queue_declare(queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    try:
        channel.basic_publish("", queue, b"first", mandatory=True)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", queue, b"second", mandatory=True)
        method, _props, _body = channel.basic_get(queue)
        channel.basic_publish("", queue, b"third", mandatory=True)  # taken: no NackError
        channel.basic_nack(method.delivery_tag, requeue=True)
        # The requeue is the queue's own work, done after the channel's nack: wait for it.
        counts = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and counts[-1:] != [2]:
            counts.append(channel.queue_declare(queue, passive=True).method.message_count)
            time.sleep(0.02)
        assert counts[-1] == 2, counts
    finally:
        channel.queue_delete(queue)


def test_a_consumer_holding_the_claim_is_counted_by_a_passive_declare(
    channel: pika.adapters.blocking_connection.BlockingChannel,
) -> None:
    # What a renewal rests on: while its old claim is out of the slot, held by a
    # consumer, a claimant's passive declare counts that consumer.
    queue = f"beatless-test.{uuid.uuid4().hex}"
    channel.queue_declare(queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    try:
        channel.basic_publish("", queue, b"first")
        channel.basic_qos(prefetch_count=1)
        got: list[bytes] = []
        channel.basic_consume(queue, lambda _ch, _m, _p, body: got.append(body))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            channel.connection.process_data_events(time_limit=0.05)
        declared = channel.queue_declare(queue, passive=True).method
        assert (got, declared.message_count, declared.consumer_count) == ([b"first"], 0, 1)
    finally:
        channel.queue_delete(queue)


# -- renewals ----------------------------------------------------------------------------------


def test_a_claim_published_while_the_holder_renews_is_taken_back_and_held(
    ns: Namespace, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    # The renewal's gap, held open: a consumer (as a renewal has) has the claim out of
    # the slot, so the slot takes the next publish. The claimant must not win.
    a, b = ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a", lease_ms=5_000) is Outcome.WON
    slot = f"{ns.prefix}c.{request.id}"
    channel.basic_qos(prefetch_count=1)
    got: list[int] = []
    tag = channel.basic_consume(slot, lambda _ch, m, _p, _b: got.append(m.delivery_tag))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.05)
    assert got, "the claim was not delivered to the consumer"

    assert one(b, request, "b") is Outcome.HELD
    assert channel.queue_declare(slot, passive=True).method.message_count == 0  # taken back

    channel.basic_cancel(tag)
    channel.basic_nack(got[0], requeue=True)  # the renewal gave up: its claim is back
    assert one(b, request, "b") is Outcome.HELD
    assert one(a, request, "a", lease_ms=5_000) is Outcome.WON  # a renewal


def test_claims_racing_a_renewing_holder_never_win_and_every_renewal_does(ns: Namespace) -> None:
    # A holder renews its claim back to back (a run lease's heartbeat, made fast), while
    # two other nodes claim the same firing as fast as they can: each of their claims that
    # lands in a renewal's gap must be taken back. Counts every outcome.
    holder, rivals = ns.store(), [ns.store(), ns.store()]
    request = ns.firing()
    assert one(holder, request, "holder", lease_ms=2_000) is Outcome.WON
    stop = threading.Event()
    seen: dict[str, list[Outcome]] = {"holder": [], "rival-0": [], "rival-1": []}

    def rival(i: int) -> None:
        while not stop.is_set():
            seen[f"rival-{i}"].append(one(rivals[i], request, f"rival-{i}", lease_ms=2_000))

    threads = [threading.Thread(target=rival, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            seen["holder"].append(one(holder, request, "holder", lease_ms=2_000))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    renewals, claims = seen["holder"], seen["rival-0"] + seen["rival-1"]
    assert min(len(renewals), len(claims)) >= 20, (len(renewals), len(claims))
    assert set(renewals) == {Outcome.WON}, renewals
    assert set(claims) == {Outcome.HELD}, claims
    assert holder.commit([request.id], node="holder") == [True]


# -- outcomes the contract suite does not reach ---------------------------------------------


def test_a_node_that_saw_a_firing_held_takes_it_over_when_the_lease_runs_out(
    ns: Namespace,
) -> None:
    a, b, c = ns.store(), ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a") is Outcome.WON
    assert one(b, request, "b") is Outcome.HELD

    time.sleep(LEASE_MS / 1_000 + 0.2)

    outcomes = [one(b, request, "b"), one(c, request, "c")]
    assert outcomes == [Outcome.TAKEOVER, Outcome.HELD]
    assert b.commit([request.id], node="b") == [True]
    assert one(a, request, "a") is Outcome.LOST


def test_a_claimant_frozen_past_its_lease_cannot_commit_and_exactly_one_node_took_over(
    ns: Namespace,
) -> None:
    frozen, *others = ns.store(), ns.store(), ns.store(), ns.store()
    request = ns.firing()
    assert one(frozen, request, "frozen") is Outcome.WON

    time.sleep(LEASE_MS / 1_000 + 0.2)  # the claimant is frozen past its lease
    barrier = threading.Barrier(len(others))
    got: dict[str, Outcome] = {}

    def claim(index: int) -> None:
        barrier.wait(timeout=10)
        got[f"n{index}"] = one(others[index], request, f"n{index}")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(others))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert frozen.commit([request.id], node="frozen") == [False]
    assert sorted(o.value for o in got.values()) == ["held", "held", "takeover"]
    (winner,) = [n for n, o in got.items() if o is Outcome.TAKEOVER]
    assert others[int(winner[1:])].commit([request.id], node=winner) == [True]
    assert one(frozen, request, "frozen") is Outcome.LOST


def test_two_phase_node_frozen_mid_send_commits_false_and_one_other_node_sent_it(
    ns: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    # The documented residual: a node frozen after its send and before its commit,
    # longer than its lease. Another node sends the firing again under the same id; the
    # frozen node's commit says so (False, a WARNING), and nobody sends it a third time.
    firing = job_firing(ns)
    sent: list[str] = []
    sending = threading.Event()

    def frozen_send(f: Firing) -> None:
        sent.append("frozen")
        sending.set()
        time.sleep(LEASE_MS / 1_000 + 0.3)

    frozen = TwoPhase(ns.store(), frozen_send, lease=f"{LEASE_MS}ms")
    others = [
        TwoPhase(ns.store(), lambda f, n=n: sent.append(n), lease=f"{LEASE_MS}ms") for n in "bc"
    ]
    caplog.set_level(logging.WARNING, logger="beatless.node.dispatch")
    results: dict[str, list[str]] = {}
    thread = threading.Thread(
        target=lambda: results.__setitem__("frozen", dispatch(frozen, firing, "frozen"))
    )
    thread.start()
    # Once it sends, its claim is made (however long its first connection took), and
    # it runs out while the send goes on.
    assert sending.wait(30)
    time.sleep(LEASE_MS / 1_000 + 0.1)
    results["b"] = dispatch(others[0], firing, "b")
    results["c"] = dispatch(others[1], firing, "c")
    thread.join(timeout=30)

    assert sorted(sent) == ["b", "frozen"]
    assert results["b"] == ["takeover"]
    assert results["c"] == ["lost"]  # b committed before c asked
    assert "claim ran out before commit" in caplog.text


def job_firing(ns: Namespace) -> Firing:
    """A firing of an entry of a namespace of its own; its slot is deleted on cleanup."""
    entry = Entry(name="job", task="tasks.job", trigger=Every(60), max_late="5m")
    schedule = Schedule([entry], namespace=f"rmq{uuid.uuid4().hex[:8]}")
    occurrence = (int(time.time()) // 60) * 60_000
    firing = Firing.of(entry, None, schedule.address(entry), occurrence)
    ns.ids.add(firing.id)
    return firing


def dispatch(dispatcher: TwoPhase, firing: Firing, node: str) -> list[str]:
    recorder = Recorder(node)
    dispatcher.dispatch([firing], recorder)
    return [recorder.outcomes[firing.id]]


def test_a_commit_after_the_lease_ran_out_is_refused_even_if_nobody_took_over(
    ns: Namespace,
) -> None:
    a, b = ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a") is Outcome.WON

    time.sleep(LEASE_MS / 1_000 + 0.1)

    assert a.commit([request.id], node="a") == [False]
    assert one(b, request, "b") is Outcome.TAKEOVER


def test_a_pending_claim_of_this_node_from_another_process_is_held_until_its_lease_ends(
    ns: Namespace,
) -> None:
    # What a node cannot see in RabbitMQ: a claim it made from another process (or
    # whose confirm was lost with a connection) reads as another node's.
    other_process = subprocess.run(
        [sys.executable, "-c", CLAIM_ONE, RABBITMQ_URL, ns.prefix, str(LEASE_MS)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    id_, occurrence = other_process.stdout.split()
    ns.ids.add(id_)
    request = ClaimRequest(
        id_, "t/x", int(occurrence), MAX_LATE_MS, MEMORY_MS, int(occurrence), TAG
    )
    store = ns.store()

    assert one(store, request, "n1") is Outcome.HELD
    time.sleep(LEASE_MS / 1_000 + 0.1)
    assert one(store, request, "n1") is Outcome.TAKEOVER


CLAIM_ONE = """
import sys, time, uuid
from beatless.stores import ClaimRequest
from beatless.stores.rabbitmq.store import RabbitMQStore
url, prefix, lease = sys.argv[1], sys.argv[2], int(sys.argv[3])
now = int(time.time() * 1000)
request = ClaimRequest(uuid.uuid4().hex, "t/x", now, 60000, 80000, now, "5eed7a95")
with RabbitMQStore(url, prefix=prefix) as store:
    assert store.claim([request], node="n1", lease_ms=lease)[0].value == "won"
print(request.id, now)
"""


def test_a_release_frees_the_slot_at_once_and_the_released_claim_cannot_be_committed(
    ns: Namespace,
) -> None:
    a, b = ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a", lease_ms=60_000) is Outcome.WON

    a.release([request.id], node="a")

    assert a.commit([request.id], node="a") == [False]
    assert one(b, request, "b", lease_ms=60_000) is Outcome.TAKEOVER


def test_a_release_that_gets_another_claim_gives_it_back_before_it_returns(
    ns: Namespace,
    channel: pika.adapters.blocking_connection.BlockingChannel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A node whose claim ran out before its release reached the broker (its clock here
    # stands still) gets another node's claim from the slot, and gives it back. Until the
    # broker has it back, the slot is open to a third claim: the message giving it back
    # must be written before the release returns, not at this connection's next call.
    still = time.monotonic()
    a = ns.store(monotonic=lambda: still)
    b, c = ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a", lease_ms=500) is Outcome.WON
    time.sleep(0.7)
    assert one(b, request, "b", lease_ms=60_000) is Outcome.TAKEOVER

    a.release([request.id], node="a")  # no call on a's connection after it

    slot = f"{ns.prefix}c.{request.id}"
    counts = [channel.queue_declare(slot, passive=True).method.message_count]
    deadline = time.monotonic() + 5
    while counts[-1] == 0 and time.monotonic() < deadline:  # the queue's own work
        time.sleep(0.02)
        counts.append(channel.queue_declare(slot, passive=True).method.message_count)
    assert counts[-1] == 1, counts
    assert one(c, request, "c") is Outcome.HELD
    assert "held another claim than ours" in caplog.text


@pytest.mark.serial
def test_a_batch_of_a_thousand_fresh_firings_is_won_in_a_few_round_trips(ns: Namespace) -> None:
    # A thousand queues declared at once: on a broker busy with other tests' queues a
    # round can take over the default 5 s timeout; the whole must still take under 30 s.
    store = ns.store(timeout="20s")
    requests = [ns.firing() for _ in range(1_000)]
    started = time.monotonic()
    outcomes = store.claim(requests, node="a", lease_ms=60_000)
    assert outcomes == [Outcome.WON] * 1_000
    assert store.commit([r.id for r in requests], node="a") == [True] * 1_000
    assert time.monotonic() - started < 30
    assert ns.store().claim(requests[:10], node="b", lease_ms=60_000) == [Outcome.LOST] * 10


def test_transient_slots_work_the_same(ns: Namespace) -> None:
    a, b = ns.store(durable=False), ns.store(durable=False)
    request = ns.firing()
    assert one(a, request, "a") is Outcome.WON
    assert one(b, request, "b") is Outcome.HELD
    assert a.commit([request.id], node="a") == [True]
    assert one(b, request, "b") is Outcome.LOST


def test_nodes_that_disagree_on_durable_get_an_error_that_says_so(ns: Namespace) -> None:
    assert one(ns.store(), ns.firing(), "a") is Outcome.WON

    with pytest.raises(StoreError, match="durable="):
        one(ns.store(durable=False), ns.firing(), "b")


# -- the worker's run records (beatless.node.runs) -----------------------------------------------


def record(
    ns: Namespace, id_: str, address: str, memory_ms: int = RUN_RECORD_MEMORY_MS
) -> ClaimRequest:
    """A worker's claim of one of its run records, made now, as ``beatless.node.runs`` makes it."""
    ns.ids.add(id_)
    now = int(time.time() * 1_000)
    return ClaimRequest(id_, address, now, NEVER_LATE_MS, memory_ms, now)


def test_run_records_renew_hold_commit_and_release_as_claims_with_leases_of_seconds(
    ns: Namespace,
) -> None:
    lease = 2_000
    a, b = ns.store(), ns.store()
    address = f"t/{uuid.uuid4().hex[:8]}"
    run = run_lease_id(address)
    # (a) The holder's heartbeats win again, each lease running from its heartbeat.
    assert one(a, record(ns, run, address), "a#1", lease) is Outcome.WON
    for _ in range(2):
        time.sleep(0.8)
        assert one(a, record(ns, run, address), "a#1", lease) is Outcome.WON
    # (b) Past the first lease's end, inside the renewed one: another run is held off.
    time.sleep(0.8)
    assert one(b, record(ns, run, address), "b#1", lease) is Outcome.HELD
    # Past the renewed lease, with no heartbeat: taken over.
    time.sleep(1.5)
    assert one(b, record(ns, run, address), "b#1", lease) is Outcome.TAKEOVER
    assert a.commit([run], node="a#1") == [False]
    # (d) Released: free again at once.
    b.release([run], node="b#1")
    assert one(a, record(ns, run, address), "a#2", lease) is Outcome.TAKEOVER
    # (c) A once-only record committed: every later copy of the firing loses it.
    executed = executed_id(uuid.uuid4().hex)
    assert one(a, record(ns, executed, address, MEMORY_MS), "a#2", lease) is Outcome.WON
    assert one(b, record(ns, executed, address, MEMORY_MS), "b#2", lease) is Outcome.HELD
    assert a.commit([executed], node="a#2") == [True]
    assert one(b, record(ns, executed, address, MEMORY_MS), "b#3", lease) is Outcome.LOST


def test_the_store_does_not_check_run_leases_and_never_answers_overlap(ns: Namespace) -> None:
    worker, store = ns.store(), ns.store()
    assert store.checks_overlap is False
    assert store.holds_run_leases is True  # renewed without a gap: the workers enforce it
    request = ns.firing()
    run = record(ns, run_lease_id(request.address), request.address)
    assert one(worker, run, "worker", 60_000) is Outcome.WON

    skipping = dataclasses.replace(request, run_id=run.id)
    assert one(store, skipping, "a") is Outcome.WON


# -- the epoch: a broker that lost its definitions -------------------------------------------


def test_a_broker_that_lost_its_definitions_gets_a_new_epoch_and_old_firings_are_forgotten(
    ns: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    shift = [0.0]
    a = ns.store(clock=lambda: time.time() + shift[0])
    before = ns.firing()
    assert one(a, before, "a") is Outcome.WON
    assert a.commit([before.id], node="a") == [True]
    old = a.epoch
    assert old is not None

    ns.forget_everything()
    caplog.set_level(logging.WARNING, logger="beatless.stores.rabbitmq.store")
    outcomes = a.claim([before, ns.firing()], node="a", lease_ms=LEASE_MS)

    # Released before the new epoch's start + 10 s and held by nobody: they may have
    # been sent before the loss, so they are written committed and not sent again.
    assert outcomes == [Outcome.FORGOTTEN, Outcome.FORGOTTEN]
    assert a.epoch is not None
    assert a.epoch.token != old.token
    assert "lost its memory" in caplog.text
    assert one(ns.store(), before, "b") is Outcome.LOST
    # A firing released after that horizon is claimed as usual.
    shift[0] = (TOLERANCE_MS + 1_000) / 1_000
    later = ns.firing(int(a.time_ms()))
    assert one(a, later, "a") is Outcome.WON


def test_store_objects_agree_on_the_epoch_and_a_commit_first_adopts_it(ns: Namespace) -> None:
    a, b = ns.store(), ns.store()
    request = ns.firing()
    assert one(a, request, "a") is Outcome.WON
    assert b.commit([request.id], node="a") == [True]  # same process, same node: its claim
    assert b.epoch == a.epoch


# -- URLs, errors, probe -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:5672/", "unknown URL scheme"),
        ("amqp:///vhost", "names no host"),
        ("amqp://guest:s3cret@127.0.0.1/?durable=maybe", "durable must be true or false"),
        ("amqp://guest:s3cret@127.0.0.1/?channels=0", "channels must be 1 to 256"),
        ("amqp://guest:s3cret@127.0.0.1/?nonsense=1", "bad URL"),
        ("amqp://guest:s3cret@127.0.0.1/?timeout=0", "timeout must be positive"),
    ],
)
def test_a_bad_url_is_refused_with_its_password_masked(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        RabbitMQStore(url)
    assert "s3cret" not in str(caught.value)


def test_a_prefix_that_makes_queue_names_too_long_is_refused() -> None:
    with pytest.raises(ConfigError, match="prefix"):
        RabbitMQStore("amqp://127.0.0.1/", namespace="n" * 200)


def test_repr_and_errors_never_show_the_password() -> None:
    url = f"amqp://guest:s3cret-pass@127.0.0.1:{free_port()}/%2F?timeout=2s"
    store = open_store(url, namespace="masked")
    assert "s3cret" not in repr(store)
    with pytest.raises(StoreUnavailable) as caught:
        store.probe()
    assert "s3cret" not in str(caught.value)
    assert "***" in str(caught.value)
    store.close()


def test_a_wrong_password_is_a_store_error_that_says_to_check_it() -> None:
    require_service(*RABBITMQ)
    store = RabbitMQStore("amqp://guest:wrong-pass@127.0.0.1:5672/%2F")
    with pytest.raises(StoreError, match="user name and password") as caught:
        store.probe()
    assert not isinstance(caught.value, StoreUnavailable)
    assert "wrong-pass" not in str(caught.value)


def test_an_unknown_virtual_host_is_a_store_error_that_names_it() -> None:
    require_service(*RABBITMQ)
    store = RabbitMQStore(f"amqp://guest:guest@127.0.0.1:5672/no-such-{uuid.uuid4().hex[:6]}")
    with pytest.raises(StoreError, match="virtual host"):
        store.probe()


def test_probe_passes_on_a_healthy_broker_and_a_closed_store_refuses_calls(ns: Namespace) -> None:
    store = ns.store()
    store.probe()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.probe()


def test_a_lost_connection_is_opened_again_at_the_next_call(ns: Namespace) -> None:
    store = ns.store()
    request = ns.firing()
    assert one(store, request, "a") is Outcome.WON
    for session in store._sessions.idle:
        session.close()  # as if the broker had closed an idle connection

    assert store.commit([request.id], node="a") == [True]
    assert one(ns.store(), request, "b") is Outcome.LOST


def test_open_store_reads_the_namespace_and_the_options_of_the_url() -> None:
    store = open_store("amqp://127.0.0.1/?durable=false&channels=4", namespace="shop")
    assert isinstance(store, RabbitMQStore)
    assert store.prefix == "beatless.shop."
    assert store.durable is False
    store.close()


# -- real node processes, one killed -------------------------------------------------------------


@pytest.mark.slow
def test_three_node_processes_with_one_killed_win_every_occurrence_exactly_once(
    ns: Namespace, tmp_path: Path
) -> None:
    """Three nodes for 48 s, n2 killed with SIGKILL after 8 s in the middle of its work,
    and a squatter holding three coming firings pending, killed too: the survivors take
    those over once the lease runs out. Nothing is sent twice, nothing is missed in the
    window both survivors covered."""
    url = f"{RABBITMQ_URL}?prefix={ns.prefix}"
    run = kill_one_of_three(url, tmp_path, seconds=48, kill_at_s=8, squatter=True)
    ns.ids.update(run.squatted)
    ns.ids.update(str(f["id"]) for f in run.firings)
    assert_the_kill_was_survived(run)


@pytest.mark.serial
def test_claims_and_commits_never_wait_for_a_notes_read(ns: Namespace) -> None:
    """A read of the notes stream can wait (a first read of a long stream, a stream being
    created): it has a connection and a lock of its own, so a claim whose lease is running
    is not held up by it. Here a read is made to take 2 s."""
    store = ns.store()
    store.post([Note("k", "n", "v", 60_000)])
    reading = threading.Event()
    slow_catch_up = store._catch_up

    def catch_up() -> bool:
        reading.set()
        time.sleep(2)
        return slow_catch_up()

    store._catch_up = catch_up  # type: ignore[method-assign]
    reader = threading.Thread(target=store.read_notes, args=(["k"],))
    reader.start()
    assert reading.wait(10)
    began = time.monotonic()
    request = ns.firing()
    assert one(store, request, "a") is Outcome.WON
    assert store.commit([request.id], node="a") == [True]
    took = time.monotonic() - began
    reader.join(10)

    assert took < 1.0, f"claim and commit took {took:.2f}s behind a notes read"


def slowed(store: RabbitMQStore, request: ClaimRequest, seconds: float) -> threading.Event:
    """Make the claims of ``request`` through ``store`` take ``seconds`` more (a node's
    missed-firing sweep claiming thousands of markers, on a loaded broker); the event is
    set once such a claim is under way."""
    under_way = threading.Event()
    claim_batch = store._claim_batch

    def slow_claim_batch(*args: Any, **kwargs: Any) -> list[Outcome]:
        if any(r.id == request.id for r in args[0]):
            under_way.set()
            time.sleep(seconds)
        return claim_batch(*args, **kwargs)

    store._claim_batch = slow_claim_batch  # type: ignore[method-assign]
    return under_way


@pytest.mark.serial
def test_a_commit_never_waits_for_a_long_claim_of_another_thread(ns: Namespace) -> None:
    """A node's board claims from a thread of its own (missed markers) through the same
    store object as its loop: a commit made meanwhile, whose lease is running, is not
    held up by that claim. Here the other claim is made to take 3 s."""
    store = ns.store()
    request, marker = ns.firing(), ns.firing()
    under_way = slowed(store, marker, 3.0)
    assert one(store, request, "a", lease_ms=1_000) is Outcome.WON
    sweep = threading.Thread(target=one, args=(store, marker, "a", 30_000))
    sweep.start()
    assert under_way.wait(10)
    began = time.monotonic()
    committed = store.commit([request.id], node="a")
    took = time.monotonic() - began
    sweep.join(10)

    assert committed == [True], f"the commit took {took:.2f}s, past its 1 s lease"


@pytest.mark.serial
def test_a_sent_firing_is_committed_in_time_while_another_thread_of_its_node_claims(
    ns: Namespace,
) -> None:
    # The duplicate of a loaded run: a node won and sent a firing, then its board took
    # the store for a long claim; its commit waited for that claim past the lease, and
    # another node took the firing over and sent it too.
    firing = job_firing(ns)
    store, marker = ns.store(), ns.firing()
    under_way = slowed(store, marker, 3 * LEASE_MS / 1_000)
    sent: list[str] = []
    sweep = threading.Thread(target=one, args=(store, marker, "a", 30_000))

    def send(f: Firing) -> None:
        sent.append("a")
        sweep.start()  # the board takes the store between the send and the commit
        assert under_way.wait(10)

    a = TwoPhase(store, send, lease=f"{LEASE_MS}ms")
    b = TwoPhase(ns.store(), lambda f: sent.append("b"), lease=f"{LEASE_MS}ms")
    results: dict[str, list[str]] = {}
    node_a = threading.Thread(target=lambda: results.__setitem__("a", dispatch(a, firing, "a")))
    node_a.start()
    assert under_way.wait(30)
    time.sleep(LEASE_MS / 1_000 + 0.2)  # a's claim has run out: b may take over
    results["b"] = dispatch(b, firing, "b")
    node_a.join(10)
    sweep.join(10)

    assert sent == ["a"]
    assert results == {"a": ["won"], "b": ["lost"]}
