"""The client of a Redis store reached through Redis Sentinel (``redis+sentinel://``).

``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db][?options]``
names the sentinels (port 26379 when left out), the service (the name given to
``sentinel monitor``) and the database (0 when left out). The user part and the query
options are the Redis master's, as in a ``redis://`` URL; ``sentinel_password=`` (and
``sentinel_username=``) are the sentinels' own (``requirepass`` in their
``sentinel.conf``), as kombu's ``sentinel_kwargs`` are.

The client is redis-py's ``Sentinel(...).master_for(service_name)``: each connection
asks the sentinels for the master's address as it connects, and a connection whose
server answers a write ``READONLY`` (a master demoted to a replica) is closed and
made again, to the master the sentinels name now. A master that Sentinel replaced
while it was still up keeps answering as a master until Sentinel reconfigures it (up
to 10 s later, Sentinel's ``INFO`` period): :class:`MasterWatch` asks the sentinels at
most once a second, before the store's commands, and closes the idle connections to a
master they no longer name, so that a store object does not keep writing there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from beatless.core.urls import scrub
from beatless.errors import ConfigError
from beatless.stores.redis._buckets import host_port, netloc

if TYPE_CHECKING:
    import redis as redis_module

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
"""The sentinels' port when a URL leaves it out (Sentinel's own default)."""
SENTINEL_OPTIONS = {"sentinel_password": "password", "sentinel_username": "username"}
"""The query options of a ``redis+sentinel://`` URL that are the sentinels', not the
master's: what each is to a sentinel connection."""
ASK_EVERY_S = 1.0
"""How often, at most, a store object asks the sentinels where the master is, beyond
the asking each new connection does."""
FORM = "redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]"
_STORE = "redis sentinel store"


def sentinel_client(
    driver: ModuleType, url: str, socket_timeout_s: float, retry: Any, where: str
) -> redis_module.Redis:
    """A client of the master of the service that ``url`` names: commands go to the
    master the sentinels name, each connection asking them as it connects."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    sentinels = [
        host_port(node, where, default=DEFAULT_PORT, store=_STORE)
        for node in hosts.split(",")
        if node.strip()
    ]
    service, _, db = parts.path.strip("/").partition("/")
    if not sentinels or not service:
        missing = "sentinel" if not sentinels else "service"
        raise ConfigError(f"{_STORE}: {where} names no {missing}: write {FORM}")
    if db and not db.isdigit():
        raise ConfigError(f"{_STORE}: {where}: the db {db!r} must be a number: write {FORM}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    master = urlunsplit(
        (
            "redis",
            f"{userinfo}{at}localhost",
            f"/{db}",
            urlencode([(k, v) for k, v in query if k not in SENTINEL_OPTIONS]),
            "",
        )
    )
    try:
        options: dict[str, Any] = driver.connection.parse_url(master)
    except ValueError as exc:
        raise ConfigError(f"{_STORE}: bad URL {where}: {scrub(str(exc), url)}") from None
    del options["host"]
    options.setdefault("socket_timeout", socket_timeout_s)
    options.setdefault("socket_connect_timeout", socket_timeout_s)
    own = {SENTINEL_OPTIONS[k]: v for k, v in query if k in SENTINEL_OPTIONS and v}
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    manager = driver.sentinel.Sentinel(sentinels, sentinel_kwargs={**timeouts, **own}, **options)
    client: redis_module.Redis = manager.master_for(unquote(service), retry=retry)
    return client


def is_sentinel(client: Any) -> bool:
    """Whether ``client`` reaches its server through Redis Sentinel (``master_for``)."""
    return getattr(client.connection_pool, "sentinel_manager", None) is not None


def describe(client: Any) -> tuple[str, list[str]]:
    """How to name a Sentinel client passed in (its sentinels, service and db), and the
    passwords to mask (the master's and the sentinels')."""
    pool = client.connection_pool
    manager = pool.sentinel_manager
    nodes = ",".join(
        netloc(
            s.connection_pool.connection_kwargs.get("host", "localhost"),
            s.connection_pool.connection_kwargs.get("port", DEFAULT_PORT),
        )
        for s in manager.sentinels
    )
    db = pool.connection_kwargs.get("db", 0) or 0
    passwords = [pool.connection_kwargs.get("password"), manager.sentinel_kwargs.get("password")]
    return f"{SCHEME}://{nodes}/{pool.service_name}/{db}", [str(p) for p in passwords if p]


def close(client: Any) -> None:
    """Close ``client`` and, for a Sentinel client, its connections to the sentinels."""
    client.close()
    if is_sentinel(client):
        for sentinel in client.connection_pool.sentinel_manager.sentinels:
            sentinel.close()


class MasterWatch:
    """Asks the sentinels of a Sentinel client where the master is, at most every
    ``every_s`` seconds on ``clock``; when they name another one, redis-py closes the
    idle connections to the old, so the next command reaches the new (where the
    store's claim script finds the change of identity). Does nothing for a client
    that does not go through Sentinel."""

    def __init__(
        self,
        client: Any,
        *,
        every_s: float = ASK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        pool = client.connection_pool
        self._ask: Callable[[], object] | None = (
            pool.get_master_address if is_sentinel(client) and pool.is_master else None
        )
        self._every_s = every_s
        self._clock = clock
        self._next = float("-inf")

    def __call__(self) -> None:
        if self._ask is None:
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._every_s
        self._ask()
