"""A RabbitMQ broker that blocks publishing (a memory or disk alarm) is a full store.

The shared broker's watermark is never touched: the broker's ``Connection.Blocked`` and
``Connection.Unblocked`` notices reach the store's real connection through a TCP proxy
(``tests/faults/proxy.py``) that adds them to what the broker sends, between two of its
messages. Everything else is the real broker, under a queue prefix of the test's own
that is deleted afterwards.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pika", reason="the rabbitmq store needs: pip install 'beatless[rabbitmq]'")
sys.path.insert(0, str(Path(__file__).parent / "faults"))
from proxy import Proxy
from service_check import require_service
from stores import RABBITMQ, RABBITMQ_URL, delete_rabbitmq_names

from beatless.errors import StoreFull
from beatless.stores import ClaimRequest, Outcome
from beatless.stores.rabbitmq.store import RabbitMQStore

LEASE_MS = 5_000


def method_frame(class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """An AMQP 0-9-1 method frame on channel 0."""
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"


def blocked(reason: str) -> bytes:
    """``Connection.Blocked`` (class 10, method 60) with its reason, as RabbitMQ sends it."""
    text = reason.encode()
    return method_frame(10, 60, bytes([len(text)]) + text)


UNBLOCKED = method_frame(10, 61)


class Namespace:
    """Stores under a prefix of the test's own; deletes its queues and exchange."""

    def __init__(self) -> None:
        self.prefix = f"beatless-test.{uuid.uuid4().hex[:12]}."
        self.ids: set[str] = set()
        self.stores: list[RabbitMQStore] = []

    def store(self, url: str, **options: object) -> RabbitMQStore:
        store = RabbitMQStore(url, prefix=self.prefix, **options)  # type: ignore[arg-type]
        self.stores.append(store)
        return store

    def request(self) -> ClaimRequest:
        id_ = uuid.uuid4().hex
        self.ids.add(id_)
        now = int(time.time() * 1_000)
        return ClaimRequest(id_, f"full/{id_[:8]}", now, 60_000, 80_000, now)

    def cleanup(self) -> None:
        for store in self.stores:
            store.close()
        queues = [f"{self.prefix}c.{i}" for i in self.ids]
        queues += [f"{self.prefix}epoch", f"{self.prefix}notes"]
        delete_rabbitmq_names(queues, [f"{self.prefix}slots"])


@pytest.fixture
def ns() -> Iterator[Namespace]:
    require_service(*RABBITMQ)
    made = Namespace()
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def link() -> Iterator[Proxy]:
    require_service(*RABBITMQ)
    with Proxy(("127.0.0.1", 5672)) as opened:
        yield opened


def through(link: Proxy) -> str:
    return f"amqp://guest:guest@{link.host}:{link.port}/%2F"


def test_a_blocked_connection_refuses_claims_as_full_and_publishes_nothing(
    ns: Namespace, link: Proxy
) -> None:
    store = ns.store(through(link))
    other = ns.store(RABBITMQ_URL)
    won = ns.request()
    assert store.claim([won], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]

    link.tell_clients(blocked("low on memory"))
    refused = ns.request()
    with pytest.raises(StoreFull, match=r"blocks publishing \(low on memory"):
        store.claim([refused], node="n1", lease_ms=LEASE_MS)
    with pytest.raises(StoreFull):  # the claim stays pending: it is committed again later
        store.commit([won.id], node="n1")
    # Nothing was published: the slot is free for another node.
    assert other.claim([refused], node="n2", lease_ms=LEASE_MS) == [Outcome.WON]

    link.tell_clients(UNBLOCKED)
    assert store.commit([won.id], node="n1") == [True]
    assert store.claim([ns.request()], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]


def claim_blocked(ns: Namespace, link: Proxy, *notices: bytes) -> list[BaseException]:
    """What a claim through ``link`` (timeout 1 s) raised, made while the broker's answers
    are held and the ``notices`` reach the client, 0.2 s apart."""
    store = ns.store(through(link), timeout="1s")
    assert store.claim([ns.request()], node="n1", lease_ms=LEASE_MS) == [Outcome.WON]
    caught: list[BaseException] = []
    held = ns.request()

    def claim() -> None:
        try:
            store.claim([held], node="n1", lease_ms=LEASE_MS)
        except BaseException as exc:
            caught.append(exc)

    link.pause()  # the broker's answers are held: the claim is in flight
    thread = threading.Thread(target=claim)
    thread.start()
    for notice in notices:
        time.sleep(0.2)
        link.tell_clients(notice)
    thread.join(10)
    link.resume()
    return caught


def test_a_connection_blocked_mid_claim_past_the_timeout_is_store_full(
    ns: Namespace, link: Proxy
) -> None:
    caught = claim_blocked(ns, link, blocked("low on memory"))

    assert len(caught) == 1
    assert isinstance(caught[0], StoreFull), caught
    assert "low on memory" in str(caught[0]) or "blocked publishing" in str(caught[0])


def test_a_call_blocked_and_unblocked_before_its_timeout_is_still_store_full(
    ns: Namespace, link: Proxy
) -> None:
    """An alarm that clears just before the call's timeout held the call up all the same:
    the call is refused as full, not as an unreachable broker."""
    caught = claim_blocked(ns, link, blocked("low on memory"), UNBLOCKED)

    assert len(caught) == 1
    assert isinstance(caught[0], StoreFull), caught
    assert "low on memory" in str(caught[0])
