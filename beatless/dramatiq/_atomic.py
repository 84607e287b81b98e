"""Claim and enqueue in one script on the Redis of Dramatiq's ``RedisBroker``.

For each firing won, the claim script runs the very commands of the ``enqueue`` branch
of the broker's ``dispatch.lua``, under the broker's namespace::

    ZADD  {namespace}:__heartbeats__  {now_ms} {broker_id}
    HSET  {namespace}:{queue}.msgs    {redis_message_id} {message.encode()}
    RPUSH {namespace}:{queue}         {redis_message_id}

``redis_message_id`` is a fresh UUID, as ``RedisBroker.enqueue`` draws one; the
message's own id is the firing id; ``now_ms`` is when the message was built (up to a
second before the release: the loop builds messages ahead while it would sleep, see
:meth:`~beatless.node.atomic.RedisAtomic.prepare`). A stock Dramatiq worker consumes the
message as if ``actor.send`` had enqueued it. The queue is the actor's canonical queue (a
firing is never delayed: its release has already come). The claim, the fall-back to
``broker.enqueue`` and the push are the shared skeleton,
:class:`~beatless.node.atomic.RedisAtomic`; this module supplies the message and its
commands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from dramatiq import Message, Middleware

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike
from beatless.dramatiq._messages import message_for
from beatless.errors import ConfigError
from beatless.node.atomic import RedisAtomic
from beatless.node.dispatch import DEFAULT_LEASE
from beatless.schedule.firing import Firing
from beatless.stores.redis.store import RedisStore, server_identity

if TYPE_CHECKING:
    import redis
    from dramatiq.brokers.redis import RedisBroker

logger = logging.getLogger(__name__)


def same_redis(a: redis.Redis, b: redis.Redis) -> bool:
    """Whether two clients reach the same server and database, asked of the servers
    (``run_id`` and db: see :func:`~beatless.stores.redis.store.server_identity`), so that
    ``localhost`` and ``127.0.0.1`` are one server. ``False`` when either cannot answer:
    the two-phase path is then taken, which is safe on any pair of servers."""
    import redis

    try:
        return server_identity(a) == server_identity(b)
    except (redis.RedisError, OSError) as exc:
        logger.warning(
            "beatless: cannot tell whether the claim store is the broker's Redis (%s); "
            "claiming two-phase",
            shown(exc, quoted=False, limit=ERROR_LIMIT),
        )
        return False


def url_is_broker_redis(url: str, broker: RedisBroker) -> bool:
    """Whether a ``redis://`` store URL reaches the broker's own server and database."""
    import redis

    try:
        probe = redis.Redis(connection_pool=redis.ConnectionPool.from_url(url))
    except ValueError as exc:
        raise ConfigError(f"redis store: bad URL: {exc}") from None
    try:
        return same_redis(probe, broker.client)
    finally:
        probe.close()


class RedisBrokerStore(RedisAtomic[Message[Any]]):
    """The atomic :class:`~beatless.node.dispatch.Dispatcher` over the broker's own Redis.

    ``store`` is a :class:`~beatless.stores.redis.store.RedisStore` whose client talks to the
    broker's server and database; ``actor_of`` finds the actor of an entry's task. A
    firing whose message cannot be built for the claim script is told at WARNING and goes
    two-phase on the same store, through ``enqueue`` (the middleware passes its bounded
    :class:`~beatless.dramatiq._sending.Sender`; ``broker.enqueue`` by default), where it
    fails (or not) in Dramatiq's own words; it never stops the other firings of the wake.
    """

    name = "redis (the broker's own, atomic)"

    sent_through = "broker.enqueue"

    def __init__(
        self,
        broker: RedisBroker,
        store: RedisStore,
        actor_of: Callable[[str], Any],
        *,
        tenant_kwarg: str | None,
        owns_store: bool = True,
        lease: DurationLike = DEFAULT_LEASE,
        enqueue: Callable[[Firing], object] | None = None,
    ) -> None:
        self.broker = broker
        self._actor_of = actor_of
        self._tenant_kwarg = tenant_kwarg
        self._owns_store = owns_store
        self._told: str | None = None
        super().__init__(store, enqueue or self._enqueue, lease=lease)

    def __repr__(self) -> str:
        return f"RedisBrokerStore({self.store!r}, namespace={self.broker.namespace!r})"

    # -- the hooks of the atomic path ----------------------------------------------

    def build(self, firing: Firing, *, ahead: bool) -> Message[Any]:
        """``firing``'s message, with a fresh ``redis_message_id`` as ``RedisBroker.enqueue``
        draws one; the same ahead of the release as when due."""
        return self._message(firing)

    def commands(self, message: Message[Any]) -> list[list[str]]:
        """The commands ``RedisBroker.enqueue`` runs for ``message`` (see the module doc),
        with the heartbeat of now: when the message is built."""
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
        now_ms = int(time.time() * 1000)
        return [
            ["ZADD", f"{namespace}:__heartbeats__", str(now_ms), str(self.broker.broker_id)],
            ["HSET", f"{namespace}:{queue}.msgs", redis_id, payload],
            ["RPUSH", f"{namespace}:{queue}", redis_id],
        ]

    def pushed(self, messages: list[Message[Any]]) -> None:
        for message in messages:
            self.broker.emit_after("enqueue", message, None)

    def why_two_phase(self, firing: Firing | None = None) -> str | None:
        """Why every firing goes through ``broker.enqueue`` now, or ``None`` (the same for
        every ``firing``).

        A middleware with its own ``before_enqueue`` expects to see (and may change) each
        message before it is sent; the claim script cannot call it for the winner alone,
        so such a broker's firings are sent two-phase, through ``broker.enqueue``.
        """
        hooked = [
            type(m).__name__
            for m in self.broker.middleware
            if type(m).before_enqueue is not Middleware.before_enqueue
        ]
        if not hooked:
            return None
        why = f"middleware {', '.join(hooked)} hooks before_enqueue"
        if why != self._told:
            self._told = why
            logger.info(
                "beatless: firings go two-phase through broker.enqueue: %s",
                shown(why, quoted=False, limit=ERROR_LIMIT),
            )
        return why

    # -- the rest ------------------------------------------------------------------

    def _enqueue(self, firing: Firing) -> None:
        actor = self._actor_of(firing.entry.task)
        self.broker.enqueue(message_for(firing, actor, tenant_kwarg=self._tenant_kwarg))

    def _message(self, firing: Firing) -> Message[Any]:
        return message_for(
            firing,
            self._actor_of(firing.entry.task),
            tenant_kwarg=self._tenant_kwarg,
            extra={"redis_message_id": str(uuid4())},
        )

    def close(self) -> None:
        """Close the claim store if it was opened for this one (never the broker's client)."""
        if self._owns_store:
            self.store.close()
