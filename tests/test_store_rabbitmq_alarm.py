"""A real RabbitMQ memory alarm, on a private node of this module's own (never the
shared broker on 5672): ``rabbitmqctl set_vm_memory_high_watermark absolute 1`` makes the
node block every connection that publishes, as a broker out of memory does, and putting
the watermark back clears it. The RabbitMQ store refuses claims as full meanwhile; two
nodes claiming through it send no firing twice, send none they did not claim, report
every firing they could not judge, and say once a minute what is full.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_check import require_binary

pytest.importorskip("pika", reason="the rabbitmq store needs: pip install 'beatless[rabbitmq]'")
sys.path.insert(0, str(Path(__file__).parent / "faults"))
from rabbitmq_server import RabbitMQServer, rabbitmq_server_binary

from beatless import Entry, Every, Schedule
from beatless.errors import StoreFull
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import Firing, claim_request
from beatless.stores import ClaimRequest, Outcome
from beatless.stores._claims import judging
from beatless.stores.rabbitmq.store import RabbitMQStore

TIMEOUT = "1s"
"""The store's timeout: a call blocked by the alarm is refused as full after it."""
ALARM_S = 5.0
"""How long the alarm of the two-node test lasts, on the broker's own timer."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQServer]:
    if rabbitmq_server_binary() is None:
        require_binary("rabbitmq-server is not installed")
    node = RabbitMQServer(tmp_path_factory.mktemp("rabbitmq"))
    try:
        node.start()
    except (RuntimeError, OSError) as exc:  # the binary is there and the node did not start
        node.kill()
        reason = f"a private RabbitMQ node could not start: {exc}"
        if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield node
    finally:
        node.kill()


@pytest.fixture
def alarm(broker: RabbitMQServer) -> Iterator[RabbitMQServer]:
    """The broker, its alarm cleared at the end whatever the test did."""
    try:
        yield broker
    finally:
        broker.clear_alarm()


def test_a_real_memory_alarm_refuses_claims_as_full_and_publishes_nothing(
    alarm: RabbitMQServer,
) -> None:
    prefix = "alarm-store."
    with (
        RabbitMQStore(alarm.url, prefix=prefix, timeout=TIMEOUT) as store,
        RabbitMQStore(alarm.url, prefix=prefix, timeout=TIMEOUT) as judge,
    ):
        firing = _request(store, "a")
        assert store.claim([firing], node="n1", lease_ms=60_000) == [Outcome.WON]
        alarm.raise_alarm()
        refused = _request(store, "b")
        with pytest.raises(StoreFull, match=r"blocked publishing \(low on memory"):
            store.claim([refused], node="n1", lease_ms=60_000)
        # A judging claim is refused too (reading the epoch publishes): the node asks
        # again at its next wakes, and the broker answers once the alarm is cleared.
        with pytest.raises(StoreFull):
            judge.claim([judging(firing)], node="n2", lease_ms=5_000)
        alarm.clear_alarm()
        assert judge.claim([judging(firing)], node="n2", lease_ms=5_000) == [Outcome.HELD]
        assert store.commit([firing.id], node="n1") == [True]
        # What the blocked call published may reach its slot once the alarm clears: a
        # pending claim of n1, which nobody sends; never a second winner.
        assert judge.claim([refused], node="n2", lease_ms=5_000)[0] in (
            Outcome.WON,
            Outcome.HELD,
        )


def _request(store: RabbitMQStore, name: str) -> ClaimRequest:
    now = store.time_ms()
    return ClaimRequest(f"{name}-{now}", f"alarm/{name}", now, 60_000, 80_000, now)


class Fleet:
    """Two nodes of one entry a second, claiming through the private broker."""

    def __init__(self, url: str) -> None:
        schedule = Schedule(
            [Entry(name="beat", task="tasks.t", trigger=Every(1), jitter="0s", max_late="2s")]
        )
        self.sent: list[Firing] = []
        self.decided: list[Decision] = []
        self.lock = threading.Lock()
        self.stores = [RabbitMQStore(url, namespace="alarm-fleet") for _ in range(2)]
        self.nodes = [
            Scheduler(
                schedule,
                store=store,
                node=f"n{i}",
                enqueue=self.enqueue,
                on_decision=self.on_decision,
                lease="1s",
            )
            for i, store in enumerate(self.stores)
        ]

    def enqueue(self, firing: Firing) -> None:
        with self.lock:
            self.sent.append(firing)

    def on_decision(self, decision: Decision) -> None:
        with self.lock:
            self.decided.append(decision)

    def run(self, alarm: RabbitMQServer) -> tuple[float, float, float]:
        """3 s as usual, 5 s under the alarm, 5 s after: when it began, the earliest the
        alarm may have been raised and the latest it may have been cleared. The broker
        clears it 5 s after raising it (``raise_alarm_for``): a ``rabbitmqctl`` of its
        own to clear it would take 4 to 10 s more on a loaded machine, an alarm of 10 to
        20 s, not 5."""
        try:
            began = time.time()
            for node in self.nodes:
                node.start()
            time.sleep(3.0)
            full_from = time.time()  # raised at some instant of the call
            alarm.raise_alarm_for(ALARM_S)
            full_until = time.time() + ALARM_S  # cleared by then
            time.sleep(max(full_until - time.time(), 0.0))
            time.sleep(5.0)
        finally:
            for node in self.nodes:
                node.stop(timeout=10)
            for store in self.stores:
                store.close()
        return began, full_from, full_until


@pytest.mark.slow
def test_two_nodes_under_a_real_memory_alarm_send_nothing_twice_and_report_every_miss(
    alarm: RabbitMQServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{alarm.url}?timeout={TIMEOUT}"
    fleet = Fleet(url)
    with caplog.at_level(logging.WARNING):
        began, full_from, full_until = fleet.run(alarm)

    sends = Counter(f.id for f in fleet.sent)
    assert sends, "nothing was sent"
    assert max(sends.values()) == 1, [i for i, n in sends.items() if n > 1]
    missed = {d.firing.id for d in fleet.decided if d.outcome == "missed"}
    assert missed, "no firing was reported missed while the broker blocked publishing"
    assert not missed & set(sends)
    # Every firing of a whole second in the run is sent once or reported missed.
    window = {
        d.firing.id: d.firing.occurrence_ms
        for d in fleet.decided
        if began + 1 <= d.firing.occurrence_ms / 1_000 <= full_until + 0.5
    }
    assert len(window) >= int(full_until - began) - 1
    unreported = sorted(o for i, o in window.items() if i not in sends and i not in missed)
    assert unreported == []
    assert all(o / 1_000 >= full_from - 1.5 for i, o in window.items() if i in missed)
    assert sum(node.stats["beat"].missed for node in fleet.nodes) >= len(missed)
    assert sum(node.stats["beat"].store_full for node in fleet.nodes) > 0
    # Nothing unclaimed was sent: the broker holds a claim of every sent firing still
    # in its memory (jitter + max_late + 10 s = 12 s; the older ones have expired).
    recent = {f.id: f for f in fleet.sent if f.occurrence_ms / 1_000 > time.time() - 9}
    assert recent
    with RabbitMQStore(url, namespace="alarm-fleet") as judge:
        answers = judge.claim(
            [judging(claim_request(f)) for f in recent.values()], node="judge", lease_ms=1_000
        )
    assert set(answers) <= {Outcome.LOST, Outcome.HELD}, Counter(answers)
    _assert_told_once_a_minute(caplog)


def _assert_told_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """Each node said what is full, at WARNING, once in the minute for its claims (the
    registry's sync has a WARNING of its own)."""
    told = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "blocked publishing" in r.getMessage()
    ]
    assert told, "no WARNING said the broker blocks publishing"
    assert all("low on memory" in t for t in told), told
    for node in ("n0", "n1"):
        claims = [t for t in told if t.startswith(f"node {node}: ") and t.endswith("until late")]
        assert len(claims) <= 1, claims
