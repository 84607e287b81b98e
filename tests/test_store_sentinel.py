"""The Redis store through Redis Sentinel: its URL, and a failover it follows.

The URL tests need no server. The failover tests run a private primary, a replica of it
and one sentinel watching them (``redis-server sentinel.conf --sentinel``, from
``tests/faults/redis_server``), each on a port of the test's own, killed by its pid.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis store needs redis-py")
import redis

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from redis_server import RedisSentinel, RedisServer, redis_server_binary, sentinel_group
from service_check import require_binary

from beatless.core.urls import mask_url
from beatless.errors import ConfigError, StoreUnavailable
from beatless.stores import missing_driver, open_store
from beatless.stores.base import ClaimRequest, Outcome
from beatless.stores.redis._sentinel import ASK_EVERY_S, MasterWatch
from beatless.stores.redis._wire import epoch_cause
from beatless.stores.redis.store import RedisStore

NAMESPACE = "sentinel"
SERVICE = "beatless"
LEASE_MS = 10_000
READY_S = 10.0
"""How long the sentinel may take to find the replica, and a failover to complete."""
URL = "redis+sentinel://app:m4ster-pw@s1,s2:26380,[::1]:26381/orders/3"


def request(id_: str, now_ms: int) -> ClaimRequest:
    """A firing released at ``now_ms``, late 60 s after, remembered 120 s."""
    return ClaimRequest(id_, f"{NAMESPACE}/{id_}", now_ms, 60_000, 120_000, now_ms)


# -- the URL ----------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_masters_login() -> None:
    store = open_store(
        f"{URL}?socket_timeout=2&sentinel_password=s3nt-pw&sentinel_username=watch&wait=1",
        namespace=NAMESPACE,
    )
    pool = store.client.connection_pool  # type: ignore[attr-defined]
    assert pool.service_name == "orders"
    master = pool.connection_kwargs
    assert (master["username"], master["password"], master["db"]) == ("app", "m4ster-pw", 3)
    assert (master["socket_timeout"], master["socket_connect_timeout"]) == (2.0, 5.0)
    sentinels = pool.sentinel_manager
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in sentinels.sentinels
    ] == [("s1", 26379), ("s2", 26380), ("::1", 26381)]
    assert sentinels.sentinel_kwargs["password"] == "s3nt-pw"  # noqa: S105 - a test's own
    assert sentinels.sentinel_kwargs["username"] == "watch"
    assert sentinels.sentinel_kwargs["socket_timeout"] == 2.0
    assert "password" not in master.get("sentinel_kwargs", {})
    assert store.wait == 1  # type: ignore[attr-defined]
    store.close()


def test_a_service_name_may_be_percent_encoded_and_the_db_left_out() -> None:
    store = open_store("redis+sentinel://s1/my%20service", namespace=NAMESPACE)
    pool = store.client.connection_pool  # type: ignore[attr-defined]
    assert (pool.service_name, pool.connection_kwargs.get("db", 0)) == ("my service", 0)
    assert "password" not in pool.sentinel_manager.sentinel_kwargs
    store.close()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379/", "names no service"),
        ("redis+sentinel:///orders", "names no sentinel"),
        ("redis+sentinel://s1/orders/x", "the db 'x' must be a number"),
        ("redis+sentinel://s1:99999/orders", "bad node 's1:99999'"),
        ("redis+sentinel://:pw-secret@s1/orders?socket_timeout=abc", "Invalid value"),
    ],
)
def test_a_bad_sentinel_url_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        open_store(url, namespace=NAMESPACE)
    assert "pw-secret" not in str(caught.value)
    if "names no" in says:
        assert "redis+sentinel://[user:password@]host:port[,host:port...]/service_name" in str(
            caught.value
        )


def test_both_passwords_are_masked_wherever_the_url_is_shown() -> None:
    url = f"{URL}?sentinel_password=s3nt/pw&db=3"
    assert mask_url(url) == (
        "redis+sentinel://app:***@s1,s2:26380,[::1]:26381/orders/3?sentinel_password=***&db=3"
    )
    store = open_store(url, namespace=NAMESPACE)
    shown = f"{store!r} {store.facts_name}"  # type: ignore[attr-defined]
    assert "m4ster-pw" not in shown
    assert "s3nt" not in shown
    store.close()
    with pytest.raises(ConfigError) as caught:
        open_store(f"{url}&socket_timeout=s3nt/pw", namespace=NAMESPACE)
    assert "s3nt" not in str(caught.value)


def test_a_master_for_client_passed_in_is_named_by_its_sentinels_and_service() -> None:
    manager = redis.sentinel.Sentinel(
        [("s1", 26379), ("s2", 26380)],
        sentinel_kwargs={"password": "s3nt-pw"},
        password="m-pw",  # noqa: S106 - a test's own
    )
    store = RedisStore(manager.master_for("orders", db=2), namespace=NAMESPACE)
    assert repr(store) == (
        "RedisStore('redis+sentinel://s1:26379,s2:26380/orders/2', prefix='beatless:sentinel:')"
    )
    assert sorted(store._secrets) == ["m-pw", "s3nt-pw"]


def test_the_redis_extra_serves_the_sentinel_store() -> None:
    assert missing_driver("redis+sentinel://s1/orders") is None


class _Pool:
    """A Sentinel connection pool that counts the asking."""

    def __init__(self, *, sentinel: bool) -> None:
        self.sentinel_manager = object() if sentinel else None
        self.is_master = True
        self.asked = 0

    def get_master_address(self) -> tuple[str, int]:
        self.asked += 1
        return ("127.0.0.1", 6379)


class _Client:
    def __init__(self, pool: _Pool) -> None:
        self.connection_pool = pool


def test_the_master_is_asked_for_at_most_once_a_second() -> None:
    now = [100.0]
    pool = _Pool(sentinel=True)
    watch = MasterWatch(_Client(pool), clock=lambda: now[0])
    watch()
    watch()
    assert pool.asked == 1
    now[0] += ASK_EVERY_S - 0.01
    watch()
    assert pool.asked == 1
    now[0] += 0.01
    watch()
    assert pool.asked == 2
    plain = _Pool(sentinel=False)
    MasterWatch(_Client(plain), clock=lambda: now[0])()
    assert plain.asked == 0


# -- a failover -------------------------------------------------------------------------


@dataclass
class Group:
    """A primary, its replica, and a sentinel watching them as :data:`SERVICE`."""

    primary: RedisServer
    replica: RedisServer
    sentinel: RedisSentinel


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    if redis_server_binary() is None:
        require_binary("redis-server is not installed; these tests start private servers")
    with sentinel_group(tmp_path, service=SERVICE, ready_s=READY_S) as servers:
        yield Group(*servers)


def run_id(server: RedisServer) -> str:
    client = redis.Redis(port=server.port, socket_timeout=5)
    try:
        return str(client.info("server")["run_id"])
    finally:
        client.close()


def claim_until_the_epoch_changes(
    store: RedisStore, now_ms: int, *, within_s: float
) -> tuple[Outcome, int]:
    """Claim a new firing (released at ``now_ms``, nobody holds it) every 50 ms until
    a claim finds another epoch than the one ``store`` saw: that claim's outcome, and how
    many claims failed as unavailable before it."""
    seen = store.epoch
    assert seen is not None
    outages = 0
    deadline = time.monotonic() + within_s
    for i in itertools.count():
        try:
            [outcome] = store.claim([request(f"during{i}", now_ms)], node="n0", lease_ms=LEASE_MS)
        except StoreUnavailable:
            outages += 1
        else:
            if store.epoch is not None and store.epoch.token != seen.token:
                return outcome, outages
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    pytest.fail(f"the store did not reach a new master within {within_s} s")


def assert_the_store_reports_the_failover(
    store: RedisStore, promoted: RedisServer, outcome: Outcome, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim that reached ``promoted`` found the failover: its firing, released
    before, is forgotten, not sent; the epoch record says failover; the warning names
    the promoted server's run_id."""
    assert outcome is Outcome.FORGOTTEN
    assert store.server_run_id() == run_id(promoted)
    record = store.client.get(f"beatless:{NAMESPACE}:epoch")
    assert epoch_cause(record.decode()) == "failover"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(run_id(promoted) in w and "failed over" in w for w in warnings), warnings


@pytest.mark.slow  # three private redis-servers and a failover: about 5 s
def test_the_store_follows_a_sentinel_failover_and_finds_the_change_of_identity(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """``SENTINEL FAILOVER`` promotes the replica while the primary is still up: the store
    object reaches the new master within a second of the sentinel naming it (without
    waiting for Sentinel to demote the old one, up to 10 s later), and the claim there
    finds the change of identity, as a promoted replica's."""
    store = RedisStore(group.sentinel.url(), namespace=NAMESPACE)
    now = store.time_ms()
    assert store.claim([request("before", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.server_run_id() == run_id(group.primary)
    assert store.client.wait(1, 5_000) == 1  # the replica has the claim
    assert group.sentinel.ask("FAILOVER", SERVICE)
    sentinel = group.sentinel
    sentinel.wait_until(lambda: sentinel.master_port() == group.replica.port, "", READY_S)
    named = time.monotonic()
    with caplog.at_level(logging.WARNING):
        outcome, _outages = claim_until_the_epoch_changes(store, now, within_s=READY_S)
    assert time.monotonic() - named < ASK_EVERY_S + 1.5, group.sentinel.log()
    assert_the_store_reports_the_failover(store, group.replica, outcome, caplog)
    # The claim made on the old primary came over with the replica: another node sees it
    # held, through a store object of its own.
    other = RedisStore(group.sentinel.url(), namespace=NAMESPACE)
    assert other.claim([request("before", now)], node="n1", lease_ms=LEASE_MS) == [Outcome.HELD]
    other.close()
    store.close()


@pytest.mark.slow  # three private redis-servers, a primary killed: about 8 s
def test_the_store_follows_the_sentinel_to_the_replica_of_a_killed_primary(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """The primary is killed (``SIGKILL``): claims fail as unavailable until the sentinel
    promotes the replica (``down-after-milliseconds`` 2 s, then its failover), then reach
    it and find the change of identity."""
    store = RedisStore(group.sentinel.url(), namespace=NAMESPACE)
    now = store.time_ms()
    assert store.claim([request("before", now)], node="n0", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.client.wait(1, 5_000) == 1
    killed = time.monotonic()
    group.primary.kill()
    with caplog.at_level(logging.WARNING):
        outcome, outages = claim_until_the_epoch_changes(store, now, within_s=3 * READY_S)
    assert outages >= 1
    assert group.sentinel.master_port() == group.replica.port
    assert time.monotonic() - killed < 2 * READY_S, group.sentinel.log()
    assert_the_store_reports_the_failover(store, group.replica, outcome, caplog)
    store.close()
