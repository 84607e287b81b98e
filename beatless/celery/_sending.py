"""The two-phase send of a Celery firing, with a deadline.

A won firing is sent with ``app.send_task`` (options from
:func:`~beatless.celery._messages.send_task_options`), through a producer on a broker
connection of beatless's own: the app's configuration, and the connections its workers
and callers use, are left as they are. That connection carries the deadline in the
transport's own options, so that every blocking step of a send gives up in time:

* Redis transport: ``socket_timeout`` and ``socket_connect_timeout`` (kombu leaves both
  unset, which waits forever on a broker that stopped answering), ``retry_on_timeout``
  off.
* py-amqp (RabbitMQ): ``connect_timeout``, ``read_timeout``, ``write_timeout``, and
  publisher confirms (``confirm_publish``) waited for at most one step.
* every transport: at most one more attempt after a connection error, at once, and only
  while that attempt can end before the deadline (kombu's retry policy).

Other transports are measured, not bounded: a send that overran its deadline is logged
by the loop.

A send that times out has an unknown outcome: the broker may have taken the message and
the answer was lost. The claim is released and the firing sent again, so a second copy
with the same task id (the firing id) may reach the broker; a WARNING says so. It is the
one residual case of the two-phase path; a consumer that must not run a firing twice
deduplicates on the task id.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any

from kombu.exceptions import OperationalError

from beatless.celery._messages import send_task_options
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import BeatlessError, ConfigError
from beatless.node._sending import COOLDOWN_S, Cooldown, timed_out, warn_outcome_unknown
from beatless.schedule.firing import Firing

logger = logging.getLogger(__name__)

ATTEMPTS = 2
"""A send is tried at most twice: once more after a connection error, on a new connection."""
STEPS_PER_ATTEMPT = 5
"""Blocking steps of one attempt, each bounded by one step's timeout: connect, handshake,
channel open, publish, confirm."""


class SendTimeout(BeatlessError, TimeoutError):
    """A send gave up at its deadline; whether the broker took the message is unknown."""


_BROKER_ERRORS: tuple[type[BaseException], ...] = (OperationalError, OSError)
"""What a send raises when the broker cannot be reached or does not answer (kombu wraps
the transport's own errors in ``OperationalError``; :class:`SendTimeout` is an
``OSError``). Other errors are the message's own and leave the broker usable."""

_OWN_PUBLISH = ("producer", "connection", "publisher")
"""Options of an entry that choose their own way to the broker; such an entry is sent as
it asks, measured but not bounded."""


class Sender:
    """Sends a won firing with ``app.send_task``, giving up within ``deadline_s``.

    ``deadline_s`` is :func:`beatless.node.scheduler.send_deadline_s` of the lease. The
    broker connection is opened at the first send, reused, and closed by :meth:`close`
    (reopened after a failed send). Calls are serialised: one send at a time. Raises
    what the send raised (:class:`SendTimeout` when it gave up at the deadline), or
    :class:`~beatless.errors.BrokerUnavailable` for :data:`COOLDOWN_S` after a failure.
    """

    def __init__(
        self,
        app: Any,
        *,
        deadline_s: float,
        expires_from_lateness: bool = False,
        cooldown_s: float = COOLDOWN_S,
    ) -> None:
        if not deadline_s > 0:
            raise ConfigError(f"celery sender: deadline_s must be positive, got {deadline_s!r}")
        self.app = app
        self.deadline_s = float(deadline_s)
        self.step_s = self.deadline_s / (ATTEMPTS * STEPS_PER_ATTEMPT)
        """The timeout of one blocking step (connect, read, write, confirm)."""
        self.expires_from_lateness = expires_from_lateness
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._connection: Any = None
        self._producer: Any = None
        self._give_up_at = 0.0
        self._cooldown = Cooldown(cooldown_s)
        self._publish_timeouts: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"Sender(app={self.app.main!r}, deadline_s={self.deadline_s:g})"

    def __call__(self, firing: Firing) -> Any:
        """Send one firing; its ``AsyncResult`` once the broker took it."""
        entry = firing.entry
        args = (entry.task, list(entry.args), dict(entry.kwargs))
        options = send_task_options(firing, expires_from_lateness=self.expires_from_lateness)
        with self._lock:
            self._cooldown.refuse()
            began = time.monotonic()
            self._give_up_at = began + self.deadline_s
            publishing = False
            try:
                if not any(name in options for name in _OWN_PUBLISH):
                    options["producer"] = self._connected()
                    options.update(self._bounded_options())
                publishing = True
                return self.app.send_task(*args, **options)
            except Exception as exc:
                self._failed(exc)
                took = time.monotonic() - began
                cause = exc.__cause__ if isinstance(exc, SendTimeout) else exc
                if publishing and (took >= self.deadline_s or timed_out(cause)):
                    warn_outcome_unknown(firing, exc, took, self.deadline_s, "task id")
                raise

    def close(self) -> None:
        """Close the connection this sender opened (after the send in progress, if any)."""
        with self._lock:
            connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            try:
                connection.release()
            except Exception as exc:  # closing is best effort: the socket goes either way
                logger.debug(
                    "beatless sender: closing the broker connection failed: %s: %s",
                    type(exc).__name__,
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )
                connection.collect()

    # -- the connection ------------------------------------------------------------------

    def _connected(self) -> Any:
        """The producer, its connection up: a failure here sent nothing."""
        producer = self._open()
        producer.channel  # noqa: B018 - resolving the channel connects, within the step timeouts
        return producer

    def _open(self) -> Any:
        if self._producer is None:
            connection = self.app.connection_for_write(connect_timeout=self.step_s)
            connection.transport_options.update(self._transport_options(connection))
            self._connection = connection
            self._producer = self.app.amqp.Producer(connection, auto_declare=False)
            self._publish_timeouts = _publish_timeouts(self.app, self.step_s)
        return self._producer

    def _transport_options(self, connection: Any) -> dict[str, Any]:
        """The deadline in the transport's own options; the app's own options are kept
        (``global_keyprefix``, ...), and a shorter timeout the user set wins."""
        transport = connection.transport
        given = connection.transport_options
        options: dict[str, Any] = dict(self._retry_policy())
        if getattr(transport, "driver_type", None) == "redis":
            for key in ("socket_timeout", "socket_connect_timeout"):
                options[key] = _at_most(given.get(key), self.step_s)
            options["retry_on_timeout"] = False
        elif getattr(transport, "driver_name", None) == "py-amqp":
            for key in ("read_timeout", "write_timeout"):
                options[key] = _at_most(given.get(key), self.step_s)
            options["confirm_publish"] = True
        else:
            logger.info(
                "beatless sender: the %s transport has no socket deadline beatless can set; "
                "each send is measured, and one over %.1fs is logged",
                getattr(transport, "driver_name", type(transport).__name__),
                self.deadline_s,
            )
        return options

    def _retry_policy(self) -> dict[str, Any]:
        return {
            "max_retries": ATTEMPTS - 1,
            "interval_start": 0,
            "interval_step": 0,
            "interval_max": 0,
            "errback": self._before_retry,
        }

    def _bounded_options(self) -> dict[str, Any]:
        """Publish options that keep the send within the deadline; an entry's own
        ``retry=False`` is kept, its ``retry_policy`` is not (it may be unbounded)."""
        return {"retry_policy": self._retry_policy(), **self._publish_timeouts}

    def _before_retry(self, exc: BaseException, interval: float) -> None:
        """kombu's errback, before each new attempt: give up unless it can end in time."""
        if time.monotonic() + interval + self.step_s * STEPS_PER_ATTEMPT > self._give_up_at:
            raise SendTimeout(
                f"gave up after {exc!r}: another attempt would end past the "
                f"{self.deadline_s:.1f}s deadline"
            ) from exc

    # -- failures ------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        """Drop the connection (no network: the next send opens a fresh one); an error of
        the broker, not of the firing's message, starts the cooldown."""
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            if isinstance(exc, (*_BROKER_ERRORS, *connection.connection_errors)):
                self._cooldown.failed(exc)
            connection.collect()


def _publish_timeouts(app: Any, step_s: float) -> dict[str, float]:
    """``timeout`` and ``confirm_timeout`` of the publish, where Celery passes them on."""
    parameters = inspect.signature(app.amqp.send_task_message).parameters
    return {name: step_s for name in ("timeout", "confirm_timeout") if name in parameters}


def _at_most(given: Any, limit: float) -> float:
    return limit if given is None else min(float(given), limit)
