"""The fault scenarios of ``test_faults.py``, on PostgreSQL, NATS and RabbitMQ.

Three real node processes each (``fault_node``). The scenarios that do not need to own
the store's server run on the shared servers of this machine, under names of the test's
own (a schema, a bucket, a queue prefix) that are removed at the end: a frozen node
holding pending claims, every node's link to the store paused through a TCP proxy that
holds the bytes and delivers them late, and skewed node clocks (on the stores with a
clock of their own: the RabbitMQ store judges time on each node's clock, which
docs/stores.md says).

The store restarted empty, three times while the nodes run, needs a store of the test's
own: a private PostgreSQL (``postgres_server``: killed with its children, ``initdb``
again, started on the same port, as a failover to a replica or a restore that lacks the
store's schema), a private ``nats-server -js`` (``nats_server``: killed, its JetStream
store deleted, started on the same port) and a RabbitMQ virtual host of the test's own
(``rabbitmq_vhost``: deleted and made again, as a broker that lost its definitions).
Measured on a 2-core machine, 869 firings expected per run, three runs per store (four
on RabbitMQ), Redis (``test_faults.py``) in the same sessions:

==========  ==========  ====================================  ==========================
store       duplicates  misses, each one reported forgotten   new epoch after the fault
==========  ==========  ====================================  ==========================
PostgreSQL  0           290, 303, 266                         0.6 to 3.1 s
NATS        0           281, 323, 290                         0.3 s
RabbitMQ    0           396, 460, 373, 419                    2.9 to 6.1 s
Redis       0           291, 285                              0.1 s
==========  ==========  ====================================  ==========================

No stale or early send; the latest send ended 7.9 s after its occurrence (max_late
20 s). A store that forgot makes every firing released before its new epoch's start
plus 10 s that nobody holds ``forgotten``, so the longer the store takes to answer
again, the more it misses: deleting a virtual host that holds some hundreds of durable
queues takes RabbitMQ seconds, and its nodes are refused (403, 530) meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import postgres_server
import pytest
from harness import Fleet
from nats_server import NatsServer, nats_server_binary
from proxy import Proxy
from rabbitmq_vhost import Vhost, VhostError, rabbitmqctl_binary
from service_check import require_service
from test_faults import (
    NODES,
    frozen_node_scenario,
    paused_link_scenario,
    restarted_empty_scenario,
    restarted_scenario,
    skewed_clocks_scenario,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]


@dataclass(frozen=True)
class Store:
    """One kind of store on its shared server: a URL of the test's own, and how to
    reach it through a proxy."""

    name: str
    service: tuple[str, str, int]
    url: str

    def through(self, proxy: Proxy) -> str:
        """The same store, through ``proxy``."""
        parts = urlsplit(self.url)
        netloc = parts.netloc.rsplit("@", 1)
        where = f"{proxy.host}:{proxy.port}"
        netloc[-1] = where
        return parts._replace(netloc="@".join(netloc)).geturl()


def postgres(token: str) -> Store:
    return Store(
        "postgres",
        ("PostgreSQL", "127.0.0.1", 5432),
        f"postgresql://127.0.0.1:5432/test?schema=beatless_faults_{token}",
    )


def nats(token: str) -> Store:
    return Store(
        "nats", ("NATS", "127.0.0.1", 4222), f"nats://127.0.0.1:4222/?bucket=faults_{token}"
    )


def rabbitmq(token: str) -> Store:
    url = f"amqp://guest:guest@127.0.0.1:5672/%2F?prefix=beatless.faults.{token}."
    return Store("rabbitmq", ("RabbitMQ", "127.0.0.1", 5672), url)


def remove(store: Store, token: str) -> None:
    """What the store created under the test's names, and nothing else."""
    if store.name == "postgres":
        from stores import drop_postgres_schema

        drop_postgres_schema(f"beatless_faults_{token}")
    elif store.name == "nats":
        from stores import delete_nats_bucket

        delete_nats_bucket(f"faults_{token}")
    else:
        from stores import delete_rabbitmq_names

        prefix = f"beatless.faults.{token}."
        delete_rabbitmq_names(
            [f"{prefix}epoch", f"{prefix}notes"], [f"{prefix}slots"]
        )  # slots expire


def opened(make: Callable[[str], Store]) -> Iterator[Store]:
    token = uuid.uuid4().hex[:10]
    made = make(token)
    require_service(*made.service)
    try:
        yield made
    finally:
        remove(made, token)


@pytest.fixture(params=[postgres, nats, rabbitmq], ids=["postgres", "nats", "rabbitmq"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    yield from opened(request.param)


@pytest.fixture(params=[postgres, nats], ids=["postgres", "nats"])
def clocked_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The stores that judge time on a clock of their own (not RabbitMQ's: it has none
    to offer, and a node's skew is not caught there; docs/stores.md says so)."""
    yield from opened(request.param)


def test_frozen_node_never_sends_its_pending_claims_late(store: Store, fleet: FleetFactory) -> None:
    """Fault: SIGSTOP for 30 s (> max_late 20 s) of the node sending a 100-tenant fan-out
    all due at once (50 ms per send, lease 6 s), three sends in; then SIGCONT. The others
    may take its pending claims over; the thawed node must not send them. Misses allowed
    only if reported."""
    frozen_node_scenario(store.url, fleet, lead_s=10)


def test_paused_store_link_never_makes_a_late_or_second_send(
    store: Store, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    """Fault: every node's link to the store paused for 30 s through a TCP proxy that
    holds the bytes and delivers them late (claims answered, or won, after the client
    gave up). max_late 20 s, lease 10 s, a 50-tenant fan-out every 10 s. Misses allowed
    only where the pause held from release until late, and reported."""
    _, host, port = store.service
    links = [proxy((host, port)) for _ in NODES]
    urls = [store.through(link) for link in links]
    paused_link_scenario(urls, links, 30, fleet, lead_s=10)


def test_skewed_clocks_leave_every_firing_to_the_node_with_the_right_clock(
    clocked_store: Store, fleet: FleetFactory
) -> None:
    """Fault: one node's clock 5 min fast, one 5 min slow (injected), one right. The
    store judges lateness and earliness on its own clock, so the fast node must not send
    early, the slow one must not send late, and the right node sends every firing."""
    skewed_clocks_scenario(clocked_store.url, fleet, lead_s=6)


@dataclass(frozen=True)
class Restartable:
    """A store of the test's own whose memory the test can wipe while the nodes use it:
    ``restart()`` returns once the store answers again, empty."""

    url: str
    restart: Callable[[], None]


def missing(reason: str) -> None:
    """Skip the test; fail it instead with ``BEATLESS_REQUIRE_SERVICES=1`` (as in CI)."""
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


def private_postgres(tmp_path: Path, token: str) -> Iterator[Restartable]:
    """A PostgreSQL cluster of the test's own (see ``postgres_server``): a restart kills
    it, runs ``initdb`` again and starts it on the same port."""
    reason = postgres_server.unavailable()
    if reason is not None:
        missing(f"{reason}; this case starts a private PostgreSQL")
    server = postgres_server.PostgresServer(tmp_path / "postgres")
    try:
        server.start()
        yield Restartable(server.url(f"schema=beatless_faults_{token}"), server.restart)
    finally:
        server.stop()


def private_nats(tmp_path: Path, token: str) -> Iterator[Restartable]:
    """A ``nats-server -js`` of the test's own: a restart kills it, deletes its
    JetStream store and starts it on the same port."""
    if nats_server_binary() is None:
        missing("nats-server is not installed; this case starts a private server")
    server = NatsServer(tmp_path / "nats")
    try:
        server.start()
        yield Restartable(server.url(f"bucket=faults_{token}"), server.restart)
    finally:
        server.kill()


def own_vhost(_tmp_path: Path, token: str) -> Iterator[Restartable]:
    """A virtual host of the test's own on the shared broker: a restart deletes it and
    makes it again, empty (see ``rabbitmq_vhost``)."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    if rabbitmqctl_binary() is None:
        missing("rabbitmqctl is not installed; this case makes a virtual host of its own")
    vhost = Vhost(f"beatless-faults-{token}")
    try:
        try:
            vhost.create()
        except VhostError as exc:
            missing(f"cannot make a virtual host: {exc}")
        yield Restartable(vhost.url(), vhost.restart)
    finally:
        vhost.delete()


@pytest.fixture(
    params=[private_postgres, private_nats, own_vhost], ids=["postgres", "nats", "rabbitmq"]
)
def restartable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Restartable]:
    yield from request.param(tmp_path, uuid.uuid4().hex[:10])


def test_store_restarted_empty_never_makes_a_firing_sent_twice(
    restartable_store: Restartable, fleet: FleetFactory
) -> None:
    """Fault: the store loses everything it held, three times, each 3 s into a fan-out of
    200 tenants (20 ms per send, lease 5 s, max_late 20 s), while firings are held
    pending and others were seen held: a private PostgreSQL killed and initialised again
    (``initdb``), a private NATS killed and restarted without its JetStream store, the
    test's RabbitMQ virtual host deleted and made again. Counted over four occurrences:
    misses (forgotten claims) allowed only if reported."""
    store = restartable_store
    restarted_empty_scenario(store.url, fleet, store.restart, lead_s=10)


def stop_fast(server: postgres_server.PostgresServer) -> None:
    """A fast shutdown (SIGINT to the postmaster, as ``pg_ctl stop -m fast``): every
    session is cut, every commit kept."""
    process = server.process
    assert process is not None
    process.send_signal(signal.SIGINT)
    process.wait(30)


DOWN_S = 2.0
"""How long the restarted PostgreSQL stays down: well inside the 5 s lease."""


@pytest.mark.parametrize("how", ["fast", "kill"])
def test_postgres_restarted_with_its_data_sends_nothing_twice(
    how: str, tmp_path: Path, fleet: FleetFactory
) -> None:
    """Fault: a private PostgreSQL (``synchronous_commit`` on) stopped (a fast shutdown, or
    SIGKILL of the postmaster and its children), left down 2 s, and started again on the
    same data directory, three times, each 3 s into a fan-out of 200 tenants (20 ms per send,
    lease 5 s, max_late 20 s): every connection is cut, mid-call or idle, and nothing
    committed is lost. A commit that failed on the cut connection is made on the new
    one before its lease runs out: nothing is sent twice, nothing is missed."""
    reason = postgres_server.unavailable()
    if reason is not None:
        missing(f"{reason}; this case starts a private PostgreSQL")
    server = postgres_server.PostgresServer(tmp_path / "postgres")
    server.settings = {**server.settings, "synchronous_commit": "on"}

    def restart() -> None:
        if how == "fast":
            stop_fast(server)
        else:
            server.kill()
        time.sleep(DOWN_S)
        server.start()

    try:
        server.start()
        url = server.url(f"schema=beatless_faults_{uuid.uuid4().hex[:10]}")
        report = restarted_scenario(
            url, fleet, restart, lead_s=10, fault="store restarted", misses="none"
        )
        assert report.duplicates == 0, report.details()
    finally:
        server.stop()
