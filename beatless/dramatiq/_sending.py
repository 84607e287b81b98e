"""The two-phase enqueue of a Dramatiq firing, with a deadline.

A won firing is enqueued with ``broker.enqueue`` (so the broker's middleware sees it as
any message), on a copy of the broker that talks to the broker's server through a
client of its own with the deadline in the client's own settings; the broker itself, and
the connections its workers consume from, are left as they are:

* ``RedisBroker``: a connection pool with the broker's connection settings and
  ``socket_timeout`` / ``socket_connect_timeout`` of a quarter of the deadline, retrying a
  command once after a connection error (a stale pooled socket) and never after a timeout.
* ``RabbitmqBroker``: pika parameters with ``socket_timeout``, ``stack_timeout`` and
  ``blocked_connection_timeout`` sized so that all of Dramatiq's enqueue attempts fit the
  deadline, TCP keepalive and user timeout (a host that stops acknowledging drops the
  connection), and publisher confirms on (``confirm_delivery``): a send returns once
  RabbitMQ has the message. A broker *process* that stops answering while its host still
  acknowledges (frozen, overloaded) is noticed only by AMQP heartbeats, which pika checks
  every ``heartbeat`` + 5 s: with RabbitMQ's default of 60 s a send waits up to about
  130 s. Lower ``heartbeat`` in the broker's parameters to bound that case too.
* any other broker: ``broker.enqueue`` itself, measured; a send over its deadline is
  logged by the loop.

A send that times out has an unknown outcome: the broker may have the message. The claim
is released and the firing sent again, so a second copy with the same message id (the
firing id) may reach the broker; a WARNING says so. It is the one residual case of the
two-phase path; a consumer that must not run a firing twice deduplicates on the id.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dramatiq import errors as dramatiq_errors

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.dramatiq._messages import message_for
from beatless.errors import ConfigError
from beatless.node._sending import COOLDOWN_S, Cooldown, timed_out, warn_outcome_unknown
from beatless.schedule.firing import Firing

if TYPE_CHECKING:
    from dramatiq import Actor, Broker, Message

logger = logging.getLogger(__name__)

REDIS_STEPS = 4
"""Blocking steps of a Redis enqueue, each bounded by one step's timeout: connect and
command, twice at most (one retry after a connection error)."""
RABBITMQ_ATTEMPTS = 6
"""Dramatiq's ``MAX_ENQUEUE_ATTEMPTS``, where the installed version does not say."""


_DRAMATIQ_BROKER_ERROR: type[Exception] = (
    getattr(dramatiq_errors, "BrokerConnectionError", None) or dramatiq_errors.ConnectionError
)
"""Dramatiq's own error for a broker it cannot talk to (renamed in Dramatiq 2)."""


def is_broker(broker: object, module: str, name: str) -> bool:
    """Whether ``broker`` is an instance of ``module.name``, without importing the module
    (and its driver: ``pika``, ``redis``): a broker of that class has imported it."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(broker, cls)


class Sender:
    """Enqueues a won firing with ``broker.enqueue``, giving up within ``deadline_s``.

    ``deadline_s`` is :func:`beatless.node.scheduler.send_deadline_s` of the lease;
    ``actor_of`` finds the actor of an entry's task; ``tenant_kwarg`` is as for
    :func:`~beatless.dramatiq._messages.message_for`. Connections are opened at the first
    send and closed by :meth:`close`. One send at a time. Raises what the send raised, or
    :class:`~beatless.errors.BrokerUnavailable` for :data:`COOLDOWN_S` after a failure.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        deadline_s: float,
        actor_of: Callable[[str], Actor[Any, Any]],
        tenant_kwarg: str | None,
        cooldown_s: float = COOLDOWN_S,
    ) -> None:
        if not deadline_s > 0:
            raise ConfigError(f"dramatiq sender: deadline_s must be positive, got {deadline_s!r}")
        self.broker = broker
        self.deadline_s = float(deadline_s)
        self.cooldown_s = cooldown_s
        self._actor_of = actor_of
        self._tenant_kwarg = tenant_kwarg
        self._lock = threading.Lock()
        self._cooldown = Cooldown(cooldown_s)
        self._closers: list[Callable[[], None]] = []
        self._connect: Callable[[], object] = lambda: None
        self._broker_errors: tuple[type[BaseException], ...] = (OSError, _DRAMATIQ_BROKER_ERROR)
        """Errors of the broker rather than of the message: they start the cooldown."""
        self.sending = self._sending_broker(broker)
        """The broker ``enqueue`` is called on: a bounded copy, or ``broker`` itself."""

    def __repr__(self) -> str:
        return f"Sender({type(self.broker).__name__}, deadline_s={self.deadline_s:g})"

    def __call__(self, firing: Firing) -> Message[Any]:
        """Enqueue one firing; the message as the broker enqueued it."""
        actor = self._actor_of(firing.entry.task)
        message = message_for(firing, actor, tenant_kwarg=self._tenant_kwarg)
        with self._lock:
            self._cooldown.refuse()
            began = time.monotonic()
            publishing = False
            try:
                self._connect()  # a failure here sent nothing
                publishing = True
                return self.sending.enqueue(message)
            except Exception as exc:
                took = time.monotonic() - began
                if not publishing or isinstance(exc, self._broker_errors):
                    self._cooldown.failed(exc)
                if publishing and (took >= self.deadline_s or timed_out(exc)):
                    warn_outcome_unknown(firing, exc, took, self.deadline_s, "message id")
                raise

    def close(self) -> None:
        """Close the connections this sender opened (never the broker's own)."""
        with self._lock:
            closers, self._closers = self._closers, []
        for close in closers:
            try:
                close()
            except Exception as exc:  # closing is best effort: the sockets go either way
                logger.debug(
                    "beatless sender: closing a broker connection failed: %s: %s",
                    type(exc).__name__,
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )

    # -- the bounded copy of the broker --------------------------------------------------

    def _sending_broker(self, broker: Broker) -> Broker:
        shadow: Broker | None = None
        if is_broker(broker, "dramatiq.brokers.redis", "RedisBroker"):
            shadow = self._redis_copy(broker)
        elif is_broker(broker, "dramatiq.brokers.rabbitmq", "RabbitmqBroker"):
            shadow = self._rabbitmq_copy(broker)
        if shadow is not None:
            return shadow
        logger.info(
            "beatless sender: no client deadline can be set on %s; each send is measured, "
            "and one over %.1fs is logged",
            type(broker).__name__,
            self.deadline_s,
        )
        return broker

    def _redis_copy(self, broker: Any) -> Any | None:
        """The broker over a connection pool of its own, with socket timeouts; ``None``
        when the broker's client has no plain pool to copy (Sentinel, cluster)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        pool = getattr(broker.client, "connection_pool", None)
        if pool is None or type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
            return None
        step_s = self.deadline_s / REDIS_STEPS
        own = redis.ConnectionPool(
            connection_class=pool.connection_class,
            **{
                **pool.connection_kwargs,
                "socket_timeout": step_s,
                "socket_connect_timeout": step_s,
                "retry_on_timeout": False,
                "retry_on_error": [],
                "retry": Retry(NoBackoff(), 1, (redis.ConnectionError,)),
            },
        )
        client = redis.Redis(connection_pool=own)
        shadow = copy.copy(broker)
        shadow.client = client
        shadow.scripts = {
            name: client.register_script(script.script) for name, script in broker.scripts.items()
        }
        self._closers.append(own.disconnect)
        self._broker_errors += (redis.ConnectionError, redis.TimeoutError)
        self._connect = lambda: own.release(_pool_connection(own))
        return shadow

    def _rabbitmq_copy(self, broker: Any) -> Any:
        """The broker on connections of its own, with pika's timeouts and confirms."""
        pika_errors = importlib.import_module("pika.exceptions")  # pika has no type hints
        given = broker.parameters
        several = isinstance(given, list | tuple)
        parameters = list(given) if several else [given]
        broker_module = sys.modules["dramatiq.brokers.rabbitmq"]
        attempts = getattr(broker_module, "MAX_ENQUEUE_ATTEMPTS", RABBITMQ_ATTEMPTS)
        step_s = self.deadline_s / ((attempts + 1) * len(parameters))
        bounded = [_bounded_pika(p, step_s) for p in parameters]
        shadow = copy.copy(broker)
        shadow.parameters = bounded if several else bounded[0]
        shadow.confirm_delivery = True
        shadow.state = threading.local()
        shadow.connections = set()
        shadow.channels = set()
        self._closers.append(shadow.close)
        self._broker_errors += (pika_errors.AMQPConnectionError,)
        self._connect = lambda: shadow.channel
        return shadow


def _pool_connection(pool: Any) -> Any:
    """A connected connection of a redis-py pool (whose ``get_connection`` took a command
    name before redis-py 5.3 and warns when given one since)."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return pool.get_connection("PING")
    return pool.get_connection()


def _bounded_pika(parameters: Any, step_s: float) -> Any:
    """A copy of pika connection parameters whose connection set-up ends within
    ``step_s``, and whose connection is dropped by the kernel when the broker's host stops
    acknowledging (TCP user timeout and keepalive, where the platform has them)."""
    bounded = copy.copy(parameters)
    for name in ("socket_timeout", "stack_timeout", "blocked_connection_timeout"):
        given = getattr(parameters, name)
        setattr(bounded, name, step_s if given is None else min(float(given), step_s))
    bounded.connection_attempts = 1
    bounded.tcp_options = {**_tcp_deadline(step_s), **(parameters.tcp_options or {})}
    return bounded


def _tcp_deadline(step_s: float) -> dict[str, int]:
    whole_s = max(1, round(step_s))
    options = {
        "TCP_USER_TIMEOUT": max(1, round(step_s * 1_000)),
        "TCP_KEEPIDLE": whole_s,
        "TCP_KEEPINTVL": 1,
        "TCP_KEEPCNT": whole_s,
    }
    return {name: value for name, value in options.items() if hasattr(socket, name)}
