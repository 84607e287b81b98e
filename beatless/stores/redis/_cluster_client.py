"""The Redis Cluster store's client: its keys, its connection, and how a batch of scripts
reaches every master in one pipeline, with the errors told as the store's (see
:mod:`beatless.stores.redis.cluster`)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from beatless.core._logtext import WarnEvery
from beatless.errors import StoreError, StoreFull
from beatless.stores.redis._buckets import Call, Lua, Unreachable, pipelined
from beatless.stores.redis._client import driver_errors
from beatless.stores.redis._facts import primaries_usage, told_full

if TYPE_CHECKING:
    from redis.cluster import RedisCluster


class ClusterClient:
    """The connection of a :class:`~beatless.stores.redis.cluster.RedisClusterStore`:
    the store's ``__init__`` sets what is declared here."""

    prefix: str
    _driver: Any
    """The ``redis`` module."""
    _lock: threading.Lock
    _closed: bool
    _client: RedisCluster | None
    _owns_client: bool
    _options: dict[str, Any]
    """How to create the client, when the store was given a URL."""
    _where: str
    """The cluster as messages name it, its password masked."""
    _secrets: Sequence[str]
    _full_warned: WarnEvery

    def _key(self, bucket: str, name: str) -> str:
        return f"{self.prefix}{{{bucket}}}:{name}"

    def _claim_key(self, bucket: str, id_: str) -> str:
        return f"{self.prefix}{{{bucket}}}:claim:{id_}"

    def _notes_keys(self, kind: str) -> tuple[str, str]:
        """The keys of a kind, in one slot: its notes hash and that hash's expiry index."""
        notes = f"{self.prefix}{{notes:{hashlib.sha256(kind.encode()).hexdigest()}}}"
        return notes, f"{notes}:expiry"

    def _log_key(self, kind: str) -> str:
        """The key of a kind's log, in the slot of its hash."""
        return f"{self._notes_keys(kind)[0]}:log"

    def _connected(self) -> Any:
        """The cluster client (a ``RedisCluster``, typed loosely: redis-py types few of
        its methods), created at the first call, since redis-py's connects at once."""
        with self._lock:
            if self._closed:
                raise StoreError(f"redis cluster store {self._where}: the store is closed")
            if self._client is None:
                self._client = self._driver.cluster.RedisCluster(**self._options)
            return self._client

    def _master_of(self, bucket: str) -> str:
        exc = self._driver.exceptions
        try:
            return str(self._connected().get_node_from_key(self._key(bucket, "epoch")).name)
        except (StoreError, exc.RedisError, exc.RedisClusterException):
            return "unknown"

    def _run(self, lua: Lua, calls: list[Call], reads: Sequence[tuple[str, str]] = ()) -> list[Any]:
        """Run ``lua`` once per call, in one pipeline with the ``HGET`` of each of ``reads``
        (their replies follow the calls'): redis-py sends each call to the master of its
        keys' slot, every master at once. A script a master does not know (``NOSCRIPT``: a
        new or restarted master) is loaded on every master and the calls it refused are
        sent again."""
        client = self._connected()
        replies = pipelined(client, lua, calls, reads)
        unknown = [i for i, reply in enumerate(replies) if isinstance(reply, self._noscript)]
        if unknown:
            client.script_load(lua.text)
            again = pipelined(client, lua, [calls[i] for i in unknown])
            for i, reply in zip(unknown, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    @property
    def _noscript(self) -> type[BaseException]:
        return self._driver.exceptions.NoScriptError  # type: ignore[no-any-return]

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        exc = self._driver.exceptions
        down = (exc.ClusterDownError, exc.TryAgainError, exc.SlotNotCoveredError)
        try:
            with driver_errors(
                self._driver,
                f"redis cluster store {self._where}",
                what,
                self._secrets,
                unavailable=(*down, Unreachable),
                failed=(exc.RedisClusterException,),
            ):
                try:
                    yield
                except exc.RedisClusterException as error:
                    if isinstance(error.__cause__, exc.ConnectionError | exc.TimeoutError):
                        raise Unreachable(str(error)) from None
                    raise
        except StoreFull as full:
            raise self._full(full) from None

    def _full(self, exc: StoreFull) -> StoreFull:
        """``exc`` with how full each primary is (``INFO memory``), said at WARNING at
        most once per ``FULL_WARN_EVERY_MS``, as the Redis store says it."""
        try:
            usage = primaries_usage(self._connected())
        except (self._driver.exceptions.RedisError, OSError, StoreError):
            usage = None
        return told_full(exc, usage, self._full_warned)
