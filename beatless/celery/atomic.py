"""Claim and enqueue in one step, for Celery on the Redis transport.

When the claim store is the broker's own Redis, a won firing's task message is pushed by
the claim script itself: the firing is in the queue if and only if it was won, whatever
instant a node dies at. The message is the one ``app.send_task`` sends, made by
``app.send_task`` itself on a broker connection whose pushes are recorded instead of
sent, once per entry, and filled in per firing (:mod:`beatless.celery.templates`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from beatless.core._logtext import shown
from beatless.core.durations import DurationLike
from beatless.errors import ConfigError, StoreError
from beatless.node.dispatch import (
    DEFAULT_LEASE,
    RECORDED,
    Dispatcher,
    TwoPhase,
    Wake,
    decide_claimed,
)
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing, claim_request
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.redis.store import Ready, RedisStore

from .messages import send_task_options
from .templates import Builder, Message, publish_sent_events

logger = logging.getLogger(__name__)

ATOMIC = "atomic"
TWO_PHASE = "two-phase"

# Arguments of ``app.send_task`` that choose how to publish rather than what: a firing
# that carries one is sent by ``app.send_task`` itself.
_OWN_PUBLISH = ("producer", "connection", "publisher", "router", "result_cls", "task_type")

Enqueue = Callable[[Firing], object]


class CeleryRedisAtomic(Dispatcher):
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
    :func:`~beatless.celery.messages.send_task_options`): claimed pending for ``lease``
    in sub-batches, each send checked against its claim's age and the firing's lateness,
    committed per sub-batch; a failed send releases the claim and the firing is retried
    while it is not late. That path serves topic, fanout and
    headers exchanges, a broker other than the store's Redis, Redis Sentinel, and options
    that choose their own producer, connection or router. :meth:`route_kind` says which
    path an entry takes and why.

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

    store: RedisStore

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
        self.store = store
        self.expires_from_lateness = expires_from_lateness
        self.fallback_enqueue = fallback_enqueue or self._send_task
        self.force_two_phase = force_two_phase
        self.two_phase = TwoPhase(store, self.fallback_enqueue, lease=lease)
        self.lease_ms = self.two_phase.lease_ms
        self._lock = threading.RLock()
        self._builder: Builder | None = None
        self._unusable: str | None = None
        """Why no firing can take the atomic path, once that is known."""

    def __repr__(self) -> str:
        return f"CeleryRedisAtomic({self.store!r}, force_two_phase={self.force_two_phase})"

    # -- the Dispatcher seam -------------------------------------------------------

    prepares_ahead = True

    def prepare(self, firings: Sequence[Firing], wake: Wake) -> Sequence[object]:
        """Fill each firing's message ahead of its release, as of its release (so its
        ``expiration`` is the one it would have then). A message that depends on the
        instant it is built (``countdown``, ``eta``, ``expires`` among the options; task
        protocol 1), one that goes two-phase, or one that cannot be built now, is built
        when due, where a failure is told."""
        built: list[Ready[Message] | None] = []
        for firing in firings:
            try:
                built.append(self._ahead(firing, wake))
            except Exception:
                built.append(None)
        return built

    def _ahead(self, firing: Firing, wake: Wake) -> Ready[Message] | None:
        with self._lock:
            if self._why_two_phase(firing) is not None:
                return None
            builder = self._builder_now()
            template = builder.template(firing.entry)
            if isinstance(template, str) or template.timed:
                return None
            message = builder.message(firing, firing.release_ms / 1_000)
        if isinstance(message, str):
            return None
        return self._ready(firing, message, wake)

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        """Claim each firing and enqueue the won ones: the atomic ones pushed by the claim
        script (with what :meth:`prepare` built, if anything), the others two-phase
        through ``fallback_enqueue`` on the same store."""
        atomic: list[tuple[Firing, Ready[Message]]] = []
        fallback: list[Firing] = []
        for firing in firings:
            built = wake.prepared(firing)
            if wake.is_late(firing):
                wake.decide(firing, DecisionOutcome.LATE)
                continue
            if isinstance(built, Ready) and self._why_two_phase(firing) is None:
                atomic.append((firing, built))
                continue
            message = self._message_or_none(firing)
            if message is None:
                fallback.append(firing)
            else:
                atomic.append((firing, self._ready(firing, message, wake)))
        self._push(atomic, wake)
        if fallback:
            self.two_phase.dispatch(fallback, wake)

    @staticmethod
    def _ready(firing: Firing, message: Message, wake: Wake) -> Ready[Message]:
        request, note = claim_request(firing), wake.history_template(firing)
        return Ready(message, request, json.dumps(message.commands), note)

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
            reason = self._why_two_phase(firing)
            if reason is not None:
                return TWO_PHASE, reason
            try:
                message = self._builder_now().message(firing, time.time())
            except StoreError:
                raise
            except Exception as exc:
                return TWO_PHASE, f"its message cannot be built ({shown(exc, quoted=False)})"
        if isinstance(message, str):
            return TWO_PHASE, message
        return ATOMIC, message.describe()

    # -- the atomic path -----------------------------------------------------------

    def _message_or_none(self, firing: Firing) -> Message | None:
        """The firing's message for the atomic path, or ``None`` for the two-phase path.

        A message that cannot be built (an unknown queue, arguments the serializer
        refuses) goes two-phase too, where ``app.send_task`` fails in its own words and
        the claim is released; only an unreachable Redis stops the whole batch.
        """
        with self._lock:
            if self._why_two_phase(firing) is not None:
                return None
            try:
                message = self._builder_now().message(firing, time.time())
            except StoreError:
                raise
            except Exception:
                logger.exception(
                    "firing %s of entry %s: its message cannot be built for the atomic path; "
                    "sending it through app.send_task",
                    firing.id,
                    shown(firing.entry.name),
                )
                return None
        if isinstance(message, str):
            logger.debug("firing %s goes two-phase: %s", firing.id, shown(message, quoted=False))
            return None
        return message

    def _push(self, atomic: list[tuple[Firing, Ready[Message]]], wake: Wake) -> None:
        if not atomic:
            return
        notes = [r.note for _, r in atomic]
        outcomes = self.store.claim_and_push(
            [r.request for _, r in atomic],
            [r.commands for _, r in atomic],
            node=wake.node,
            notes=notes if any(notes) else None,
        )
        won = []
        for (firing, ready), outcome in zip(atomic, outcomes, strict=True):
            recorded = ready.note is not None and outcome in RECORDED
            decide_claimed(wake, firing, outcome, recorded=recorded)
            if outcome.is_won:
                won.append(ready.message)
        publish_sent_events(self.app, won)

    # -- the two-phase path ----------------------------------------------------------

    def _send_task(self, firing: Firing) -> object:
        name, args, kwargs, options = self._call(firing)
        return self.app.send_task(name, args, kwargs, **options)

    # -- choosing the path -------------------------------------------------------------

    def _call(self, firing: Firing) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """The arguments of ``app.send_task`` for ``firing``."""
        entry = firing.entry
        options = send_task_options(firing, expires_from_lateness=self.expires_from_lateness)
        return entry.task, entry.args, dict(entry.kwargs), options

    def _why_two_phase(self, firing: Firing) -> str | None:
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

    def _check_broker(self) -> str:
        """An empty string when the store is the broker's own Redis, else why not."""
        return self._builder_now().differs_from(self.store)

    def _builder_now(self) -> Builder:
        if self._builder is None:
            self._builder = Builder(self.app, expires_from_lateness=self.expires_from_lateness)
        return self._builder
