"""Claim and enqueue in one script on the Redis of Dramatiq's ``RedisBroker``.

For each firing won, the claim script runs the very commands of the ``enqueue`` branch
of the broker's ``dispatch.lua``, under the broker's namespace::

    ZADD  {namespace}:__heartbeats__  {now_ms} {broker_id}
    HSET  {namespace}:{queue}.msgs    {redis_message_id} {message.encode()}
    RPUSH {namespace}:{queue}         {redis_message_id}

``redis_message_id`` is a fresh UUID, as ``RedisBroker.enqueue`` draws one; the
message's own id is the firing id. A stock Dramatiq worker consumes the message as if
``actor.send`` had enqueued it. The queue is the actor's canonical queue (a firing is
never delayed: its release has already come).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from beatless.dramatiq.messages import message_for
from beatless.errors import ConfigError
from beatless.firing import Firing
from beatless.stores.base import ClaimRequest, Outcome
from beatless.stores.redis import RedisStore

if TYPE_CHECKING:
    import redis
    from dramatiq import Message
    from dramatiq.brokers.redis import RedisBroker

logger = logging.getLogger(__name__)

_SAME_SERVER_KEYS = ("host", "port", "db", "path", "username")
_DEFAULTS: dict[str, Any] = {"host": "localhost", "port": 6379, "db": 0}


def same_redis(a: redis.Redis, b: redis.Redis) -> bool:
    """Whether two clients talk to the same server and database (as configured)."""
    ka = a.connection_pool.connection_kwargs
    kb = b.connection_pool.connection_kwargs

    def norm(kwargs: dict[str, Any], key: str) -> str:
        value = kwargs.get(key, None if kwargs.get("path") else _DEFAULTS.get(key))
        return "" if value is None else str(value)

    return all(norm(ka, key) == norm(kb, key) for key in _SAME_SERVER_KEYS)


def url_is_broker_redis(url: str, broker: RedisBroker) -> bool:
    """Whether a ``redis://`` store URL names the broker's own server and database."""
    import redis

    try:
        probe = redis.Redis(connection_pool=redis.ConnectionPool.from_url(url))
    except ValueError as exc:
        raise ConfigError(f"redis store: bad URL: {exc}") from None
    try:
        return same_redis(probe, broker.client)
    finally:
        probe.close()


class RedisBrokerStore:
    """An :class:`~beatless.stores.base.AtomicStore` over the broker's own Redis.

    ``store`` is a :class:`~beatless.stores.redis.RedisStore` whose client talks to the
    broker's server and database; ``actor_of`` finds the actor of an entry's task.
    """

    name = "redis (the broker's own, atomic)"

    def __init__(
        self,
        broker: RedisBroker,
        store: RedisStore,
        actor_of: Callable[[str], Any],
        *,
        tenant_kwarg: str | None,
        owns_store: bool = True,
    ) -> None:
        self.broker = broker
        self.store = store
        self._actor_of = actor_of
        self._tenant_kwarg = tenant_kwarg
        self._owns_store = owns_store

    def __repr__(self) -> str:
        return f"RedisBrokerStore({self.store!r}, namespace={self.broker.namespace!r})"

    def claim_and_enqueue(self, firings: Sequence[Firing], *, node: str) -> list[Outcome]:
        messages = [self._message(firing) for firing in firings]
        now_ms = int(time.time() * 1000)
        commands = [self.commands(message, now_ms) for message in messages]
        requests = [ClaimRequest.of(firing) for firing in firings]
        outcomes = self.store.claim_and_push(requests, commands, node=node)
        for message, outcome in zip(messages, outcomes, strict=True):
            if outcome.is_won:
                self.broker.emit_after("enqueue", message, None)
        return outcomes

    def _message(self, firing: Firing) -> Message[Any]:
        message = message_for(
            firing, self._actor_of(firing.entry.task), tenant_kwarg=self._tenant_kwarg
        )
        return message.copy(options={"redis_message_id": str(uuid4())})

    def commands(self, message: Message[Any], now_ms: int) -> list[list[str]]:
        """The commands ``RedisBroker.enqueue`` runs for ``message`` (see the module doc)."""
        namespace, queue = self.broker.namespace, message.queue_name
        redis_id = str(message.options["redis_message_id"])
        data = message.encode()
        try:
            payload = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                "the atomic Redis path needs a text message encoding (Dramatiq's JSONEncoder); "
                "with a binary encoder, use a claim store other than the broker's Redis"
            ) from None
        return [
            ["ZADD", f"{namespace}:__heartbeats__", str(now_ms), str(self.broker.broker_id)],
            ["HSET", f"{namespace}:{queue}.msgs", redis_id, payload],
            ["RPUSH", f"{namespace}:{queue}", redis_id],
        ]

    def close(self) -> None:
        """Close the claim store if it was opened for this one (never the broker's client)."""
        if self._owns_store:
            self.store.close()
