"""Claim stores, one module each; drivers are imported only when their store is opened."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from beatless.core._drivers import missing
from beatless.core.urls import ambiguous_user_part, mask_url, scrub
from beatless.errors import BeatlessError, ConfigError, StoreError, StoreUnavailable
from beatless.stores.base import ClaimRecord, ClaimRequest, ClaimStore, Outcome
from beatless.stores.memory import MemoryStore

__all__ = [
    "ClaimRecord",
    "ClaimRequest",
    "ClaimStore",
    "MemoryStore",
    "Outcome",
    "missing_driver",
    "open_store",
    "probed",
]

_DRIVERS = {
    **dict.fromkeys(
        ("redis", "rediss", "unix", "redis+socket", "redis+sentinel"), ("redis", "the redis store")
    ),
    **dict.fromkeys(("redis+cluster", "rediss+cluster"), ("redis", "the redis cluster store")),
    **dict.fromkeys(("postgresql", "postgres"), ("psycopg", "the postgres store")),
    "nats": ("nats", "the nats store"),
    **dict.fromkeys(("amqp", "amqps"), ("pika", "the rabbitmq store")),
}
"""Per URL scheme: the driver module its store imports, and the store's name."""
_REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+socket",
    "redis+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
PROBE_WAIT_S = 5.0
"""How long a node starting tries a store it cannot reach before it gives up."""
PROBE_RETRY_S = 0.25


def missing_driver(url: str) -> str | None:
    """One line naming the extra to install when the driver of the store at ``url`` is not
    installed, else ``None``; imports nothing and connects to nothing (what ``beatless
    check`` asks, so that a node does not find out at start)."""
    found = _DRIVERS.get(urlsplit(url).scheme.lower())
    return None if found is None else missing(*found)


def open_store(url: str, *, namespace: str, **options: Any) -> ClaimStore:
    """Open a claim store from a URL: ``memory://``, ``sqlite:///path/to/file.db``,
    ``redis://host:port/db`` (also ``rediss://``, ``unix:///path/to/redis.sock`` and
    kombu's spelling ``redis+socket:///path``), ``redis+cluster://host:port[,host:port...]``
    (Redis Cluster; also ``rediss+cluster://``),
    ``redis+sentinel://host:26379[,host:port...]/service_name/db`` (Redis Sentinel: the
    master the sentinels name, followed through a failover), ``postgresql://user@host:port/database``
    (also ``postgres://``; ``?schema=`` names the schema, ``beatless`` by default),
    ``nats://host:4222`` (``?bucket=``, ``beatless_{namespace}`` by default),
    ``amqp://user:password@host:5672/vhost`` (also ``amqps://``; RabbitMQ, queues under
    ``beatless.{namespace}.``; ``?durable=false`` for transient ones).

    The one place a URL becomes a store, and the one rule for a fleet's key space: the
    CLI (``run``, ``status``, ``explain``, the controls), the Celery and Dramatiq
    integrations and embedders all open stores here, with the namespace of the schedule
    the store serves, so every one of them addresses the same keys. ``namespace`` is
    required for that reason: it names the key space of a store that keeps namespaces
    apart by key (Redis: ``beatless:{namespace}:``; PostgreSQL: the ``namespace`` column;
    NATS: the bucket ``beatless_{namespace}``; RabbitMQ: ``beatless.{namespace}.``); the
    memory and SQLite stores keep them apart by the address alone, which starts with the
    namespace. ``options`` go to the store's constructor. An error quotes
    the URL masked, and no part of its password.
    """
    if not isinstance(namespace, str) or not namespace:
        raise ConfigError(f"open_store: namespace must be a non-empty string, got {namespace!r}")
    try:
        return _open(url, namespace, options)
    except (ValueError, StoreError) as exc:
        raise _scrubbed(exc, url) from None


def _scrubbed(exc: ValueError | StoreError, url: str) -> BeatlessError:
    """``exc`` with no piece of ``url``'s password in its text: a driver's URL parser may
    quote one as a port, a host or an option."""
    if not isinstance(exc, BeatlessError):
        exc = ConfigError(f"bad store URL {mask_url(url)}: {exc}")
    text = scrub(str(exc), url)
    return exc if text == str(exc) else type(exc)(text)


def _checked_user_part(url: str, scheme: str) -> None:
    """Refuse a URL whose password one driver would read and another would cut: the
    drivers disagree on where its user part ends, so none can be trusted to quote it."""
    if scheme not in ("memory", "sqlite") and ambiguous_user_part(url):
        raise ConfigError(
            f"store URL {mask_url(url)}: an '@' stands after a '/', '?' or '#', so the "
            f"password cannot be told from the host: in the password write '/' as %2F, "
            f"'?' as %3F and '#' as %23 (and an '@' in a path or query as %40)"
        )


def _open(url: str, namespace: str, options: dict[str, Any]) -> ClaimStore:
    scheme = urlsplit(url).scheme.lower()
    _checked_user_part(url, scheme)
    if scheme not in ("memory", "sqlite"):
        options["namespace"] = namespace
    if scheme == "memory":
        return MemoryStore(**options)
    if scheme == "sqlite":
        from beatless.stores.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, **options)
    if scheme in _REDIS_SCHEMES:
        return _open_redis(url, scheme, options)
    if scheme in ("postgresql", "postgres"):
        from beatless.stores.postgres.store import PostgresStore

        return PostgresStore(url, **options)
    if scheme == "nats":
        from beatless.stores.nats.store import NATSStore

        return NATSStore.from_url(url, **options)
    if scheme in ("amqp", "amqps"):
        from beatless.stores.rabbitmq.store import RabbitMQStore

        return RabbitMQStore(url, **options)
    raise ConfigError(
        f"unknown store URL scheme {scheme!r} in {mask_url(url)!r}: use memory://, sqlite:///path, "
        f"redis://host:port/db, redis+cluster://host:port,host:port, "
        f"redis+sentinel://host:26379,host:26379/service_name/db, "
        f"postgresql://user@host:port/database, nats://host:4222 "
        f"or amqp://user:password@host:5672/vhost"
    )


def _open_redis(url: str, scheme: str, options: dict[str, Any]) -> ClaimStore:
    """A Redis store (through Sentinel for ``redis+sentinel://``), or a Redis Cluster
    store for ``redis+cluster://`` and ``rediss+cluster://``."""
    if scheme.endswith("+cluster"):
        from beatless.stores.redis.cluster import RedisClusterStore

        return RedisClusterStore(url, **options)
    from beatless.stores.redis.store import RedisStore

    if scheme == "redis+socket":
        url = "unix" + url[len("redis+socket") :]
    return RedisStore(url, **options)


def probed(store: ClaimStore, *, wait_s: float | None = None) -> ClaimStore:
    """``store`` once its :meth:`~beatless.stores.base.ClaimStore.probe` passed: what a
    node does before it schedules. A store that refuses (credentials, permissions, any
    error but unavailability) fails at once; one that cannot be reached is tried again for
    up to ``wait_s`` seconds (:data:`PROBE_WAIT_S`), then
    :class:`~beatless.errors.StoreUnavailable` says for how long. The errors name the
    store, with its URL masked."""
    wait_s = PROBE_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        try:
            store.probe()
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"{exc} (tried for {wait_s:g} s)") from None
            time.sleep(min(PROBE_RETRY_S, left))
        else:
            return store
