"""The claim stores the contract suite runs against, and the clock that drives them.

To add a store: write a function that prepares its backing (a file, a key prefix, a
database of its own) and returns an opener, then add a :class:`Backend` to
``BACKENDS``. A store with a server clock sets ``server_clock=True`` and names the
service it needs; the suite then sleeps where it would have advanced the clock, and
runs the cases that need an exact clock only on the stores whose clock it controls.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from ports import free_port
from service_check import require_binary

from beatless.stores import ClaimStore, MemoryStore, Outcome
from beatless.stores.redis.store import RedisStore
from beatless.stores.sqlite import SQLiteStore
from beatless.stores.traffic import TrafficStore

START = 1_800_000_000.0
"""The manual clock's first reading: 2027-01-15T08:00:00Z."""


class ManualClock:
    """A clock the test moves by hand, in whole milliseconds; safe to share by threads.

    It reads half a millisecond past the current one, so that a store's
    ``int(clock() * 1000)`` lands on that millisecond despite float rounding.
    """

    def __init__(self, start: float = START) -> None:
        self._ms = round(start * 1_000)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return (self._ms + 0.5) / 1_000

    def now_ms(self) -> int:
        with self._lock:
            return self._ms

    def advance(self, ms: int) -> None:
        with self._lock:
            self._ms += ms


Opener = Callable[[], ClaimStore]
"""Opens one more client of the same backing store, as another node would."""


class Forgetful:
    """An opener whose backing the test can make lose its memory, as a server restarted
    empty would: ``forget()`` wipes what the test's stores wrote (and nothing else)."""

    def __init__(self, opener: Opener, forget: Callable[[], None]) -> None:
        self._opener = opener
        self.forget = forget

    def __call__(self) -> ClaimStore:
        return self._opener()


@dataclass(frozen=True)
class Backend:
    """How to prepare one kind of claim store for a test.

    ``prepare(tmp_path, clock)`` creates a backing of the test's own and returns an
    opener; every store it opens must see the same claims. ``clock`` is the store's
    clock where the store has none of its own; a server-clock store ignores it.
    """

    name: str
    prepare: Callable[[Path, ManualClock], Opener]
    server_clock: bool = False
    service: tuple[str, str, int] | None = None
    """``(name, host, port)`` of the server the store needs, checked before preparing."""
    sees_foreign: bool = True
    """Whether the store reads another node's claim to tell ``FOREIGN``; a store that
    cannot read it without disturbing it answers ``HELD`` or ``LOST`` instead."""


def _memory(_tmp: Path, clock: ManualClock) -> Opener:
    store = MemoryStore(clock=clock)
    return Forgetful(store.view, store.lose_memory)


def _traffic(_tmp: Path, clock: ManualClock) -> Opener:
    """The memory store that counts each client's traffic (``bench/scale.py``'s): a complete
    store, so it passes the same suite."""
    store = TrafficStore(clock=clock)
    return Forgetful(store.view, store.lose_memory)


def _sqlite(tmp: Path, clock: ManualClock) -> Opener:
    path = tmp / f"claims-{uuid.uuid4().hex[:8]}.db"

    def forget() -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    return Forgetful(lambda: SQLiteStore(path, clock=clock), forget)


REDIS = ("Redis", "127.0.0.1", 6379)


def delete_redis_prefix(prefix: str) -> None:
    """Delete the keys under ``prefix`` (a test's own), and no others, on the shared Redis."""
    import redis

    with redis.Redis(host=REDIS[1], port=REDIS[2]) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
        if keys:
            client.delete(*keys)


class _RedisTestStore(RedisStore):
    """A Redis store that deletes the keys under its own prefix, and no others, on close."""

    def close(self) -> None:
        delete_redis_prefix(self.prefix)
        super().close()


def _redis(_tmp: Path, _clock: ManualClock) -> Opener:
    pytest.importorskip("redis", reason="the redis store needs redis-py")
    prefix = f"beatless-test:{uuid.uuid4().hex}:"
    return Forgetful(
        lambda: _RedisTestStore(f"redis://{REDIS[1]}:{REDIS[2]}/0", prefix=prefix),
        lambda: delete_redis_prefix(prefix),
    )


def _redis_cluster(_tmp: Path, _clock: ManualClock) -> Opener:
    from redis_cluster import cluster_opener  # starts the test cluster at its first use

    return cluster_opener()


POSTGRES = ("PostgreSQL", "127.0.0.1", 5432)
POSTGRES_URL = f"postgresql://{POSTGRES[1]}:{POSTGRES[2]}/test"


def drop_postgres_schema(schema: str) -> None:
    """Drop one schema a test created (and only that one) on the shared server."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _postgres(_tmp: Path, _clock: ManualClock) -> Opener:
    pytest.importorskip(
        "psycopg", reason="the postgres store needs: pip install 'beatless[postgres]'"
    )
    from beatless.stores.postgres.store import PostgresStore

    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"

    class _PostgresTestStore(PostgresStore):
        """A PostgreSQL store that drops the test's own schema, and no other, on close."""

        def close(self) -> None:
            super().close()
            drop_postgres_schema(schema)

    return Forgetful(
        lambda: _PostgresTestStore(POSTGRES_URL, schema=schema),
        lambda: drop_postgres_schema(schema),
    )


NATS = ("NATS", "127.0.0.1", 4222)
NATS_URL = f"nats://{NATS[1]}:{NATS[2]}"


def delete_nats_bucket(bucket: str) -> None:
    """Delete one key-value bucket a test created (and only that one) on the shared server."""
    import asyncio

    import nats

    async def delete() -> None:
        client = await nats.connect(NATS_URL, max_reconnect_attempts=1)
        try:
            await client.request(f"$JS.API.STREAM.DELETE.KV_{bucket}", b"", timeout=5)
            await client.request(f"$JS.API.STREAM.DELETE.NOTES_{bucket}", b"", timeout=5)
            await client.request(f"$JS.API.STREAM.DELETE.KEPT_{bucket}", b"", timeout=5)
        finally:
            await client.close()

    asyncio.run(delete())


def _nats(_tmp: Path, _clock: ManualClock) -> Opener:
    pytest.importorskip("nats", reason="the nats store needs: pip install 'beatless[nats]'")
    from beatless.stores.nats.store import NATSStore

    bucket = f"beatless_test_{uuid.uuid4().hex[:12]}"

    class _NATSTestStore(NATSStore):
        """A NATS store that deletes the test's own bucket, and no other, on close."""

        def close(self) -> None:
            super().close()
            delete_nats_bucket(bucket)

    return Forgetful(
        lambda: _NATSTestStore(NATS_URL, bucket=bucket), lambda: delete_nats_bucket(bucket)
    )


RABBITMQ = ("RabbitMQ", "127.0.0.1", 5672)
RABBITMQ_URL = f"amqp://guest:guest@{RABBITMQ[1]}:{RABBITMQ[2]}/%2F"


def delete_rabbitmq_names(queues: list[str], exchanges: list[str]) -> None:
    """Delete queues and exchanges a test created (and only those) on the shared broker."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = conn.channel()
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)
    finally:
        conn.close()


def _rabbitmq(_tmp: Path, _clock: ManualClock) -> Opener:
    pytest.importorskip("pika", reason="the rabbitmq store needs: pip install 'beatless[rabbitmq]'")
    from beatless.stores.rabbitmq.store import RabbitMQStore

    prefix = f"beatless-test.{uuid.uuid4().hex[:12]}."
    claimed: set[str] = set()

    class _RabbitMQTestStore(RabbitMQStore):
        """A RabbitMQ store that deletes the queues of the firings it claimed, its epoch
        queue and its exchange, and no others, on close."""

        def claim(self, requests, *, node, lease_ms):  # type: ignore[no-untyped-def]
            claimed.update(r.id for r in requests)
            return super().claim(requests, node=node, lease_ms=lease_ms)

        def close(self) -> None:
            super().close()
            forget()

    def forget() -> None:
        queues = [f"{prefix}c.{id_}" for id_ in claimed] + [f"{prefix}epoch", f"{prefix}notes"]
        delete_rabbitmq_names(queues, [f"{prefix}slots"])

    return Forgetful(lambda: _RabbitMQTestStore(RABBITMQ_URL, prefix=prefix), forget)


BACKENDS: list[Backend] = [
    Backend("memory", _memory),
    Backend("traffic", _traffic),
    Backend("sqlite", _sqlite),
    Backend("redis", _redis, server_clock=True, service=REDIS),
    Backend("redis-cluster", _redis_cluster, server_clock=True),
    Backend("postgres", _postgres, server_clock=True, service=POSTGRES),
    Backend("nats", _nats, server_clock=True, service=NATS),
    Backend("rabbitmq", _rabbitmq, server_clock=True, service=RABBITMQ, sees_foreign=False),
]


class StoreFactory:
    """Opens stores of one backend, all sharing its claims and its clock.

    ``advance(ms)`` moves the store's clock: the manual clock where the store uses it,
    a real sleep where the store has a server clock. ``now_ms()`` is the store's time
    as well as the test can know it.
    """

    def __init__(self, backend: Backend, opener: Opener, clock: ManualClock) -> None:
        self.backend = backend
        self.clock = clock
        self._opener = opener
        self._opened: list[ClaimStore] = []

    @property
    def exact_clock(self) -> bool:
        return not self.backend.server_clock

    def __call__(self) -> ClaimStore:
        store = self._opener()
        self._opened.append(store)
        return store

    def now_ms(self) -> int:
        return self.clock.now_ms() if self.exact_clock else int(time.time() * 1_000)

    def lose_memory(self) -> None:
        """Make the backing store lose everything the test's stores wrote, as a server
        restarted empty would; the case is skipped on a backend that cannot."""
        forget = getattr(self._opener, "forget", None)
        if forget is None:
            pytest.skip(f"the {self.backend.name} test backend cannot lose its memory")
        forget()

    def foreign(self, otherwise: Outcome) -> Outcome:
        """``FOREIGN``, or what a store that does not read other nodes' claims answers."""
        return Outcome.FOREIGN if self.backend.sees_foreign else otherwise

    def advance(self, ms: int) -> None:
        if self.exact_clock:
            self.clock.advance(ms)
        else:
            time.sleep(ms / 1_000)

    def close(self) -> None:
        for store in reversed(self._opened):
            store.close()


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free TCP port, with no persistence.

    The test starts and stops it by pid, so it may restart it empty (a Redis that lost
    its memory) or give it a password, and never touches the shared server.
    """

    def __init__(self, directory: Path, *, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            require_binary("redis-server is not installed; this case starts a private server")
        self.binary, self.directory, self.password = binary, directory, password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.directory)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"private redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def _answers(self) -> bool:
        import redis

        try:
            with redis.Redis(port=self.port, password=self.password, socket_timeout=1) as client:
                return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        """Stop the server and start it again on the same port, with no data."""
        self.stop()
        self.start()
