"""An ``unchecked`` run records its once-only record once the store answers again.

A worker cut off from the claim store for longer than its ``check_wait`` gives its
once-only check up and runs the task (``unchecked``); here ``check_wait`` is 0, so the
check is given up after the store's timeout (the wait itself: ``test_runs_wait.py``).
The claim it gave up on may reach the store late, when the link comes back (a link that
held its bytes): then it sits pending under the run's token. The run keeps trying to
claim its record with that same token until the store answers, and holds or commits it
as its own, so that the second copy of the firing (sent by the node that took the firing
over) is refused as a ``duplicate``.

Each server store is reached through the fault suite's TCP proxy (``tests/faults/proxy``)
with a store timeout of 1 s: the first worker's link is paused while its check runs, and
resumed; the second worker reaches the store directly. The shared servers are used, each
under a schema, bucket, key prefix or queue prefix of the test's own, removed afterwards.
SQLite is cut off by a write lock that another connection holds.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from service_check import require_service
from stores import (
    NATS,
    NATS_URL,
    POSTGRES,
    POSTGRES_URL,
    RABBITMQ,
    RABBITMQ_URL,
    REDIS,
    delete_nats_bucket,
    delete_rabbitmq_names,
    drop_postgres_schema,
)
from waiting import wait_for

from beatless.errors import StoreUnavailable
from beatless.node.runs import RunPolicy, Runs
from beatless.schedule.firing import firing_id
from beatless.stores import ClaimRequest, ClaimStore, Outcome
from beatless.stores.base import Note
from beatless.stores.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).parent / "faults"))
try:
    from proxy import Proxy
finally:
    sys.path.pop(0)

LEASE_MS = 3_000
"""Short, so that a second copy that waits for a pending record lapses within the test
(the bug this tests: a record nobody renews, taken over as a ``rerun``)."""
HEARTBEAT_MS = 1_000
MEMORY_MS = 80_000
RECORDED_WITHIN_S = 8.0
"""How long the first worker may take to record its run once the link is back (its
first try may wait for the store's timeout, 1 s, and a reconnection)."""

ONCE_ONLY = RunPolicy("allow", LEASE_MS, HEARTBEAT_MS, True, MEMORY_MS)
NO_WAIT = timedelta(0)
"""The workers' ``check_wait``: a check is given up at its first failure."""


@dataclass
class Linked:
    """A store reached two ways: through a proxy the test pauses, and directly."""

    name: str
    proxy: Proxy
    through: Callable[[], ClaimStore]
    direct: Callable[[], ClaimStore]


Opened = tuple[Callable[[], ClaimStore], Callable[[], ClaimStore], Callable[[], None]]
"""A store's opener through the proxy, its opener direct, and what removes the test's data."""


def _postgres(link: Proxy) -> Opened:
    pytest.importorskip("psycopg", reason="the postgres store needs psycopg")
    from beatless.stores.postgres.store import PostgresStore

    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"
    through = f"postgresql://{link.host}:{link.port}/test?schema={schema}&timeout=1s"
    return (
        lambda: PostgresStore(through),
        lambda: PostgresStore(POSTGRES_URL, schema=schema),
        lambda: drop_postgres_schema(schema),
    )


def _nats(link: Proxy) -> Opened:
    pytest.importorskip("nats", reason="the nats store needs nats-py")
    from beatless.stores.nats.store import NATSStore

    bucket = f"beatless_test_{uuid.uuid4().hex[:12]}"
    return (
        lambda: NATSStore(f"nats://{link.host}:{link.port}", bucket=bucket, timeout=1),
        lambda: NATSStore(NATS_URL, bucket=bucket),
        lambda: delete_nats_bucket(bucket),
    )


def _redis(link: Proxy) -> Opened:
    redis = pytest.importorskip("redis", reason="the redis store needs redis-py")
    from beatless.stores.redis.store import RedisStore

    prefix = f"beatless-test:{uuid.uuid4().hex}:"

    def clean() -> None:
        with redis.Redis(host=REDIS[1], port=REDIS[2]) as client:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
            if keys:
                client.delete(*keys)

    return (
        lambda: RedisStore(f"redis://{link.host}:{link.port}/0", prefix=prefix, socket_timeout=1),
        lambda: RedisStore(f"redis://{REDIS[1]}:{REDIS[2]}/0", prefix=prefix),
        clean,
    )


def _rabbitmq(link: Proxy) -> Opened:
    pytest.importorskip("pika", reason="the rabbitmq store needs pika")
    from beatless.stores.rabbitmq.store import RabbitMQStore

    prefix = f"beatless-test.{uuid.uuid4().hex[:12]}."
    claimed: set[str] = set()

    class Tracked(RabbitMQStore):
        def claim(self, requests, *, node, lease_ms):  # type: ignore[no-untyped-def]
            claimed.update(r.id for r in requests)
            return super().claim(requests, node=node, lease_ms=lease_ms)

    def clean() -> None:
        queues = [f"{prefix}c.{id_}" for id_ in claimed] + [f"{prefix}epoch", f"{prefix}notes"]
        delete_rabbitmq_names(queues, [f"{prefix}slots"])

    through = f"amqp://guest:guest@{link.host}:{link.port}/%2F"
    return (
        lambda: Tracked(through, prefix=prefix, timeout=1),
        lambda: Tracked(RABBITMQ_URL, prefix=prefix),
        clean,
    )


SERVERS = {
    "postgres": (POSTGRES, _postgres),
    "nats": (NATS, _nats),
    "redis": (REDIS, _redis),
    "rabbitmq": (RABBITMQ, _rabbitmq),
}


@pytest.fixture(params=list(SERVERS))
def linked(request: pytest.FixtureRequest) -> Iterator[Linked]:
    service, make = SERVERS[request.param]
    require_service(*service)
    with Proxy((service[1], service[2])) as link:
        through, direct, clean = make(link)
        try:
            yield Linked(request.param, link, through, direct)
        finally:
            link.resume()
            clean()


@pytest.fixture
def workers() -> Iterator[Callable[[str, Callable[[], ClaimStore]], Runs]]:
    made: list[Runs] = []

    def worker(node: str, open_store: Callable[[], ClaimStore]) -> Runs:
        runs = Runs(open_store, node, check_wait=NO_WAIT)
        made.append(runs)
        return runs

    yield worker
    for runs in made:
        runs.close()


def new_firing() -> tuple[str, str]:
    address = f"runs/{uuid.uuid4().hex[:8]}"
    return firing_id(address, 1_800_000_000_000), address


def cut_off(linked: Linked, cut: Runs) -> None:
    """Connect ``cut`` to the store (its offset measured), then pause its link."""
    warm_id, warm_address = new_firing()
    cut.end(cut.start(warm_id, warm_address, ONCE_ONLY))
    linked.proxy.pause()


# -- through a paused link -------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_copy_is_a_duplicate_of_a_first_copy_run_unchecked_and_ended_while_cut_off(
    linked: Linked, workers: Callable[[str, Callable[[], ClaimStore]], Runs]
) -> None:
    cut, other = workers("cut", linked.through), workers("other", linked.direct)
    id_, address = new_firing()
    cut_off(linked, cut)

    first = cut.start(id_, address, ONCE_ONLY)
    assert first.verdict == "unchecked"
    cut.end(first)  # a short task: over before the link is back
    linked.proxy.resume()
    wait_for(lambda: "recorded_late" in cut.counts, RECORDED_WITHIN_S)

    second = other.start(id_, address, ONCE_ONLY)
    assert second.verdict == "duplicate", linked.name
    assert cut.counts == {"run": 1, "unchecked": 1, "recorded_late": 1}
    assert other.counts == {"duplicate": 1}


@pytest.mark.slow
def test_a_first_copy_run_unchecked_holds_its_record_once_the_link_is_back_and_commits_it(
    linked: Linked, workers: Callable[[str, Callable[[], ClaimStore]], Runs]
) -> None:
    cut, other = workers("cut", linked.through), workers("other", linked.direct)
    id_, address = new_firing()
    cut_off(linked, cut)

    first = cut.start(id_, address, ONCE_ONLY)
    assert first.verdict == "unchecked"
    linked.proxy.resume()
    assert wait_for(lambda: cut.active() == 1, RECORDED_WITHIN_S), linked.name

    # Renewed by the heartbeat: the second copy waits a run lease for it, then is refused.
    assert other.start(id_, address, ONCE_ONLY).verdict == "duplicate"
    cut.end(first)
    assert cut.active() == 0
    assert other.start(id_, address, ONCE_ONLY).verdict == "duplicate"
    assert cut.counts == {"run": 1, "unchecked": 1, "recorded_late": 1}


@pytest.mark.slow
def test_a_copy_run_unchecked_while_another_copy_ran_is_counted_and_told_once(
    linked: Linked,
    workers: Callable[[str, Callable[[], ClaimStore]], Runs],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cut, other = workers("cut", linked.through), workers("other", linked.direct)
    id_, address = new_firing()
    cut_off(linked, cut)

    late = cut.start(id_, address, ONCE_ONLY)
    assert late.verdict == "unchecked"
    ran = other.start(id_, address, ONCE_ONLY)
    assert ran.verdict == "run"
    other.end(ran)
    cut.end(late)
    with caplog.at_level(logging.WARNING, logger="beatless.node.runs"):
        linked.proxy.resume()
        assert wait_for(lambda: "ran_twice" in cut.counts, RECORDED_WITHIN_S), linked.name
        time.sleep(2 * HEARTBEAT_MS / 1_000)

    assert cut.counts == {"run": 1, "unchecked": 1, "ran_twice": 1}
    told = [r for r in caplog.records if "was a second copy" in r.getMessage()]
    assert len(told) == 1
    assert id_ in told[0].getMessage()


# -- SQLite, and a store that never answers ----------------------------------------------------


def test_on_sqlite_a_copy_run_unchecked_behind_a_write_lock_is_recorded_once_it_is_released(
    tmp_path: Path,
) -> None:
    path = tmp_path / "claims.db"
    SQLiteStore(path).close()
    cut = Runs(lambda: SQLiteStore(path, busy_timeout=0.1), "cut", check_wait=NO_WAIT)
    other = Runs(lambda: SQLiteStore(path, busy_timeout=0.1), "other", check_wait=NO_WAIT)
    id_, address = new_firing()
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")

    first = cut.start(id_, address, ONCE_ONLY)
    assert first.verdict == "unchecked"
    cut.end(first)
    locker.execute("ROLLBACK")
    locker.close()
    assert wait_for(lambda: "recorded_late" in cut.counts, RECORDED_WITHIN_S)

    assert other.start(id_, address, ONCE_ONLY).verdict == "duplicate"
    cut.close()
    other.close()


class Unreachable(ClaimStore):
    """A store whose every call fails as an unreachable server's does; counts its claims."""

    name = "unreachable"

    def __init__(self) -> None:
        self.claims = 0

    def _fail(self) -> StoreUnavailable:
        return StoreUnavailable("unreachable store: connection refused")

    def time_ms(self) -> int:
        raise self._fail()

    def probe(self) -> None:
        raise self._fail()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self.claims += 1
        raise self._fail()

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        raise self._fail()

    def release(self, ids: Sequence[str], *, node: str) -> None:
        raise self._fail()

    def post(self, notes: Sequence[Note]) -> None:
        raise self._fail()

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        raise self._fail()


def test_the_tries_to_record_an_unchecked_run_stop_once_the_memory_passed_after_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Unreachable()
    runs = Runs(lambda: store, "w", check_wait=NO_WAIT)
    short = RunPolicy("allow", LEASE_MS, HEARTBEAT_MS, True, 1_000)
    id_, address = new_firing()

    with caplog.at_level(logging.WARNING, logger="beatless.node.runs"):
        run = runs.start(id_, address, short)
        assert run.verdict == "unchecked"
        runs.end(run)
        assert wait_for(lambda: "unrecorded" in runs.counts, 5.0)
        tried = store.claims
        time.sleep(1.0)

    assert store.claims == tried  # no more tries
    assert 2 <= tried <= 8  # about one every RECORD_EVERY_S for a second, and the start's
    assert runs.counts == {"unchecked": 1, "unrecorded": 1}
    told = [r for r in caplog.records if "could not be reached to record it" in r.getMessage()]
    assert len(told) == 1
    runs.close()
