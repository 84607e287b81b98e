"""Claim and enqueue in one step, for Celery on the Redis transport.

When the claim store is the broker's own Redis, a won firing's task message is pushed by
the claim script itself: the firing is in the queue if and only if it was won, whatever
instant a node dies at. The message is the one ``app.send_task`` sends, made by
``app.send_task`` itself on a broker connection whose pushes are recorded instead of
sent, once per entry, and filled in per firing (:mod:`beatless.celery._templates`). The
claim, the fall-back to ``app.send_task`` and the push are the shared skeleton,
:class:`~beatless.node.atomic.RedisAtomic`; this module supplies the message and its
commands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from beatless.core._logtext import shown
from beatless.core.durations import DurationLike
from beatless.errors import ConfigError, StoreError
from beatless.node.atomic import RedisAtomic
from beatless.node.dispatch import DEFAULT_LEASE, Enqueue
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing
from beatless.stores.redis.store import RedisStore

from ._messages import send_task_options
from ._templates import Builder, Message, publish_sent_events

ATOMIC = "atomic"
TWO_PHASE = "two-phase"

# Arguments of ``app.send_task`` that choose how to publish rather than what: a firing
# that carries one is sent by ``app.send_task`` itself.
_OWN_PUBLISH = ("producer", "connection", "publisher", "router", "result_cls", "task_type")


class CeleryRedisAtomic(RedisAtomic[Message]):
    """Claims firings in the broker's own Redis and pushes each won task message in the
    same script, as kombu's Redis transport would push it; a stock worker consumes it.

    One object serves a whole schedule. A firing goes through the **atomic** path when
    its route is direct (the default queue, a queue of ``task_queues`` on a direct
    exchange, ``queue=`` / ``routing_key=`` options): its message is built with Celery's
    and kombu's own code and pushed by :meth:`RedisStore.claim_and_push
    <beatless.stores.redis.store.RedisStore.claim_and_push>`. Any other firing goes through the
    **two-phase** path on the same store, the core's
    :class:`~beatless.node.dispatch.TwoPhase` with ``fallback_enqueue(firing)`` as its send
    (by default ``app.send_task`` with
    :func:`~beatless.celery._messages.send_task_options`): claimed pending for ``lease``
    in sub-batches, each send checked against its claim's age and the firing's lateness,
    committed per sub-batch; a failed send releases the claim and the firing is retried
    while it is not late. That path serves topic, fanout and
    headers exchanges, a broker other than the store's Redis, Redis Sentinel, and options
    that choose their own producer, connection or router. :meth:`route_kind` says which
    path an entry takes and why. A firing whose message cannot be built when due (an
    unknown queue, arguments the serializer refuses) is told at WARNING and goes
    two-phase too, where ``app.send_task`` fails in its own words and the claim is
    released; only an unreachable Redis stops the whole wake.

    Each entry's message is made once by ``app.send_task`` on a recording broker
    connection and filled in per firing (task id, beatless headers, ``delivery_tag``,
    expiry), so a release costs the claim script and a few microseconds per firing; a
    node that loses a claim simply drops the message. Because the template is made by
    ``send_task``, an app with ``before_task_publish`` / ``after_task_publish`` (or the
    deprecated ``task_sent``) receivers sends its firings two-phase, through
    ``app.send_task`` at the moment of sending, so that each signal stands for one
    message really sent; ``force_two_phase=True`` does the same for every entry. The
    atomic path publishes the ``task-sent`` event of a won firing when
    ``task_send_sent_event`` is on, after the push.

    The ``global_keyprefix``, ``sep``, ``priority_steps`` and a queue's ``x-expires`` of
    the broker's transport options are honoured because kombu's own channel computes the
    commands. A template whose route reads a named exchange's bindings from Redis is made
    again every ``TEMPLATE_TTL_S``. Redis Sentinel (``sentinel://``) goes two-phase; kombu
    has no Redis Cluster transport. The store and the broker must be one Redis database:
    it is checked once from the servers themselves (``run_id`` and db number, not the
    URL's spelling), and everything goes two-phase if not.

    Nothing is sent to Redis until the first call; the broker connection it opens is
    closed by :meth:`close`, the store is not.
    """

    sent_through = "app.send_task"

    def __init__(
        self,
        app: Any,
        store: RedisStore,
        *,
        expires_from_lateness: bool = False,
        fallback_enqueue: Enqueue | None = None,
        force_two_phase: bool = False,
        lease: DurationLike = DEFAULT_LEASE,
    ) -> None:
        if not isinstance(store, RedisStore):
            raise ConfigError(
                f"celery atomic enqueue needs a RedisStore, got {type(store).__name__}"
            )
        self.app = app
        self.expires_from_lateness = expires_from_lateness
        self.fallback_enqueue = fallback_enqueue or self._send_task
        self.force_two_phase = force_two_phase
        super().__init__(store, self.fallback_enqueue, lease=lease)
        self._lock = threading.RLock()
        self._builder: Builder | None = None
        self._unusable: str | None = None
        """Why no firing can take the atomic path, once that is known."""

    def __repr__(self) -> str:
        return f"CeleryRedisAtomic({self.store!r}, force_two_phase={self.force_two_phase})"

    # -- the hooks of the atomic path ----------------------------------------------

    def build(self, firing: Firing, *, ahead: bool) -> Message | str:
        """``firing``'s message as ``app.send_task`` makes it, filled in as of its release
        (``ahead``) or now; or why it goes two-phase. Ahead, a message that depends on the
        instant it is built (``countdown``, ``eta``, ``expires`` among the options; task
        protocol 1) gives a reason: it is built when due."""
        with self._lock:
            builder = self._builder_now()
            if not ahead:
                return builder.message(firing, time.time())
            template = builder.template(firing.entry)
            if isinstance(template, str):
                return template
            if template.timed:
                return "its message depends on the instant it is sent"
            return builder.message(firing, firing.release_ms / 1_000)

    def commands(self, message: Message) -> Sequence[Sequence[str]]:
        return message.commands

    def pushed(self, messages: list[Message]) -> None:
        publish_sent_events(self.app, messages)

    def why_two_phase(self, firing: Firing) -> str | None:
        with self._lock:
            if self.force_two_phase:
                return "force_two_phase is set"
            if self._unusable is None:
                self._unusable = self._check_broker()
            if self._unusable:
                return self._unusable
        own = [name for name in _OWN_PUBLISH if name in firing.entry.options]
        if own:
            return f"option {own[0]!r} chooses its own way to publish"
        return None

    # -- the rest ------------------------------------------------------------------

    def close(self) -> None:
        """Close the broker connection opened for building messages."""
        with self._lock:
            if self._builder is not None:
                self._builder.close()
                self._builder = None

    def route_kind(self, entry: Entry) -> tuple[str, str]:
        """``("atomic" | "two-phase", reason)`` for ``entry``, for the start-up log line.

        It builds the message of one made-up firing of the entry, which declares its
        queue on the broker the way Celery's producer does before its first publish.
        Raises :class:`~beatless.errors.StoreUnavailable` when Redis cannot be reached.
        """
        firing = Firing.of(entry, None, entry.name, round(time.time() * 1_000))
        with self._lock:
            reason = self.why_two_phase(firing)
            if reason is not None:
                return TWO_PHASE, reason
            try:
                message = self.build(firing, ahead=False)
            except StoreError:
                raise
            except Exception as exc:
                return TWO_PHASE, f"its message cannot be built ({shown(exc, quoted=False)})"
        if isinstance(message, str):
            return TWO_PHASE, message
        return ATOMIC, message.describe()

    # -- the two-phase path ----------------------------------------------------------

    def _send_task(self, firing: Firing) -> object:
        name, args, kwargs, options = self._call(firing)
        return self.app.send_task(name, args, kwargs, **options)

    def _call(self, firing: Firing) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """The arguments of ``app.send_task`` for ``firing``."""
        entry = firing.entry
        options = send_task_options(firing, expires_from_lateness=self.expires_from_lateness)
        return entry.task, entry.args, dict(entry.kwargs), options

    def _check_broker(self) -> str:
        """An empty string when the store is the broker's own Redis, else why not."""
        return self._builder_now().differs_from(self.store)

    def _builder_now(self) -> Builder:
        if self._builder is None:
            self._builder = Builder(self.app, expires_from_lateness=self.expires_from_lateness)
        return self._builder
