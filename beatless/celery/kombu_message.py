"""The task message ``app.send_task`` would push on kombu's Redis transport, built by
Celery and kombu themselves and recorded as Redis commands instead of being sent.

Celery's router and ``create_task_message`` make the message, then kombu's
``Producer.publish`` (serializer, compression, declaration of the queue) runs on a Redis
channel of the app's own broker connection whose last step, the ``LPUSH`` to the queue's
key, is recorded rather than sent. What ``app.send_task`` does around that build is
repeated step by step (it cannot be called without publishing and sending its signals);
the tests compare the result with ``app.send_task``'s field by field, so a change in a
future Celery shows up there.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis as redis_driver
from celery.app.amqp import Broadcast
from celery.utils.functional import maybe_list
from celery.utils.time import subtract_datetimes
from dateutil.parser import isoparse
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps as kombu_dumps

from beatless.errors import StoreUnavailable
from beatless.stores.redis import RedisStore

logger = logging.getLogger(__name__)

BINDINGS_TTL_S = 30.0
"""How long the bindings of a named direct exchange are reused before they are read again."""

Command = list[str]


@dataclass(frozen=True, slots=True)
class Message:
    """One task message, as the Redis commands that push it."""

    commands: list[Command]
    exchange: str
    routing_key: str
    queues: tuple[str, ...]
    sent_event: dict[str, Any] | None = None
    retry: bool = False
    policy: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        queues = ", ".join(repr(q) for q in self.queues)
        if not self.exchange:
            return f"direct routing to queue {queues}"
        return (
            f"direct exchange {self.exchange!r}, routing key {self.routing_key!r}, "
            f"bound to queue {queues}"
        )


class Builder:
    """Builds task messages through the app's broker connection, without sending them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.connection = app.connection_for_write()
        self._errors: tuple[type[BaseException], ...] = (
            *self.connection.connection_errors,
            *self.connection.channel_errors,
        )
        try:
            self.channel = _recording_channel(self.connection)
        except self._errors as exc:
            self.connection.release()
            raise StoreUnavailable(f"celery atomic enqueue: broker unreachable: {exc}") from None
        self.producer = None
        if self.channel is not None:
            self.producer = app.amqp.Producer(self.channel, auto_declare=False)
        parameters = inspect.signature(app.send_task).parameters
        self._named = frozenset(
            name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD
        )
        """The named arguments of ``app.send_task``: an option of that name binds to it."""

    def close(self) -> None:
        self.connection.release()

    def differs_from(self, store: RedisStore) -> str:
        """An empty string when ``store`` talks to the same Redis database as the broker."""
        channel = self.channel
        if channel is None:
            return f"the broker transport is {self.connection.transport_cls!r}, not redis"
        try:
            broker = _identity(channel.client)
            claims = _identity(store.client)
        except self._errors as exc:
            raise StoreUnavailable(f"celery atomic enqueue: cannot reach Redis: {exc}") from None
        except redis_driver.RedisError as exc:
            return f"cannot tell whether the claim store is the broker's Redis (INFO: {exc})"
        if broker != claims:
            return (
                f"the claim store (Redis {claims[0][:8]}…/db {claims[1]}) is not the broker's "
                f"Redis ({broker[0][:8]}…/db {broker[1]})"
            )
        return ""

    def build(
        self, name: str, args: Sequence[Any], kwargs: dict[str, Any], options: dict[str, Any]
    ) -> Message | str:
        """The message ``app.send_task(name, args, kwargs, **options)`` would push, or why
        it cannot be pushed by a claim script."""
        call = {"name": name, "args": args, "kwargs": kwargs}
        call.update((k, v) for k, v in options.items() if k in self._named)
        extra = {k: v for k, v in options.items() if k not in self._named}
        message, options = _task_message(self.app, call, extra)
        try:
            return self._record(message, options)
        except self._errors as exc:
            raise StoreUnavailable(f"celery atomic enqueue: broker unreachable: {exc}") from None

    def _record(self, message: Any, options: dict[str, Any]) -> Message | str:
        """Publish through kombu's producer on the recording channel; read what it recorded."""
        headers, properties, body, sent_event = message
        where = _destination(self.app, headers, properties, options)
        channel, producer = self.channel, self.producer
        if producer is None:
            return "the broker transport is not redis"
        channel.recorded = []
        producer.publish(body, **where.publish)
        recorded: list[tuple[str, str, list[Command]]] = channel.recorded
        channel.recorded = []
        exchange_type = channel.typeof(where.exchange).type if where.exchange else "direct"
        for kind in (where.exchange_type, exchange_type):
            if kind != "direct":
                return f"{kind} exchange {where.exchange!r}"
        if not recorded or any(kind != "queue" for kind, _, _ in recorded):
            return f"exchange {where.exchange!r} routes key {where.routing_key!r} to no queue"
        if sent_event is not None:
            sent_event.update(
                queue=where.queue, exchange=where.exchange, routing_key=where.routing_key
            )
        return Message(
            commands=[command for _, _, commands in recorded for command in commands],
            exchange=where.exchange,
            routing_key=where.routing_key,
            queues=tuple(dict.fromkeys(queue for _, queue, _ in recorded)),
            sent_event=sent_event,
            retry=where.retry,
            policy=where.policy,
        )


def _identity(client: Any) -> tuple[str, int]:
    run_id = str(client.info("server")["run_id"])
    return run_id, int(client.connection_pool.connection_kwargs.get("db", 0) or 0)


# -- what app.send_task does before it publishes -------------------------------------------


def _task_message(
    app: Any, call: dict[str, Any], options: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """``create_task_message`` called as ``app.send_task`` calls it; returns the message and
    the options left for ``send_task_message``."""
    name = call["name"]
    task_type = _registered(app, name)
    options = {**_exec_options(task_type), **options}
    limits = {k: _explicit_or_option(call, options, k) for k in ("time_limit", "soft_time_limit")}
    expires = _explicit_or_option(call, options, "expires")
    ignore_result = options.pop("ignore_result", None)
    options = app.amqp.router.route(
        options, call.get("route_name") or name, call.get("args"), call.get("kwargs"), task_type
    )
    if expires is not None:
        options["expiration"] = _expiration_s(app, expires, call.get("task_id"))
    root_id, parent_id = call.get("root_id"), call.get("parent_id")
    parent = app.current_worker_task if not root_id or not parent_id else None
    if parent:
        root_id = root_id or parent.request.root_id or parent.request.id
        parent_id = parent_id or parent.request.id
        if app.conf.task_inherit_parent_priority:
            options.setdefault("priority", parent.request.delivery_info.get("priority"))
    message = app.amqp.create_task_message(
        call["task_id"], name, call.get("args"), call.get("kwargs"),
        call.get("countdown"), call.get("eta"), call.get("group_id"), call.get("group_index"),
        expires, call.get("retries", 0), call.get("chord"),
        maybe_list(call.get("link")), maybe_list(call.get("link_error")),
        call.get("reply_to") or app.thread_oid, limits["time_limit"], limits["soft_time_limit"],
        app.conf.task_send_sent_event, root_id, parent_id, call.get("shadow"), call.get("chain"),
        ignore_result=ignore_result,
        replaced_task_nesting=call.get("replaced_task_nesting", 0),
        **options,
    )  # fmt: skip
    for stamp in options.pop("stamped_headers", None) or []:
        options.pop(stamp, None)
    return message, options


def _registered(app: Any, name: str) -> Any:
    get = getattr(app._tasks, "get", None)
    return get(name) if callable(get) else None


def _exec_options(task_type: Any) -> dict[str, Any]:
    get = getattr(task_type, "_get_exec_options", None)
    if not inspect.ismethod(get):
        return {}
    return {k: v for k, v in (get() or {}).items() if v is not None}


def _explicit_or_option(call: dict[str, Any], options: dict[str, Any], name: str) -> Any:
    """``send_task``'s rule: an explicit argument wins (``None`` clears), else the option."""
    if name in call:
        options.pop(name, None)
        return call[name]
    return options.pop(name, None)


def _expiration_s(app: Any, expires: Any, task_id: str | None) -> float:
    if isinstance(expires, datetime):
        seconds = float(subtract_datetimes(expires, app.now()).total_seconds())
    elif isinstance(expires, str):
        seconds = float(subtract_datetimes(isoparse(expires), app.now()).total_seconds())
    else:
        seconds = float(expires)
    if seconds < 0:
        logger.warning("%s has an expiration in the past (%ss ago); using 0", task_id, -seconds)
        return 0
    return seconds


# -- what send_task_message does before it publishes ---------------------------------------


@dataclass(frozen=True, slots=True)
class _Destination:
    exchange: str
    exchange_type: str
    """As ``send_task_message`` decides it (from the queue's exchange)."""
    routing_key: str
    queue: str | None
    retry: bool
    policy: dict[str, Any]
    publish: dict[str, Any]
    """The keyword arguments of ``Producer.publish``."""


_MESSAGE_ARGUMENTS = ("serializer", "compression", "timeout", "confirm_timeout")


def _destination(
    app: Any, headers: dict[str, Any], properties: dict[str, Any], options: dict[str, Any]
) -> _Destination:
    """Where ``send_task_message`` would publish, and the arguments it passes to
    ``Producer.publish`` (with retries off: the producer only records)."""
    conf, options = app.conf, dict(options)
    headers.update(options.pop("headers", None) or {})
    options.pop("event_dispatcher", None)
    retry, policy = options.pop("retry", None), options.pop("retry_policy", None)
    publish = {k: options.pop(k, None) for k in _MESSAGE_ARGUMENTS}
    route = _route(app, options)  # pops the destination arguments
    properties.update(options)
    retry = conf.task_publish_retry if retry is None else retry
    policy = {**conf.task_publish_retry_policy, **(policy or {})}
    publish.update(
        route.publish,
        serializer=publish["serializer"] or conf.task_serializer,
        compression=publish["compression"] or conf.task_compression,
        retry=False,
        headers=headers,
        **properties,
    )
    return _Destination(
        route.exchange,
        route.exchange_type,
        route.routing_key,
        route.queue,
        bool(retry),
        policy,
        publish,
    )


def _route(app: Any, options: dict[str, Any]) -> _Destination:
    """``send_task_message``'s rules for queue, exchange, routing key, delivery mode and
    declaration; ``publish`` holds the arguments of ``Producer.publish`` they decide."""
    amqp, pop = app.amqp, options.pop
    queue, exchange, routing_key = (
        pop("queue", None),
        pop("exchange", None),
        pop("routing_key", None),
    )
    exchange_type, delivery_mode = pop("exchange_type", None), pop("delivery_mode", None)
    declare = pop("declare", None)
    qname = queue
    if queue is None and exchange is None:
        queue = amqp.default_queue
    if isinstance(queue, str):
        qname, queue = queue, amqp.queues[queue]
    elif queue is not None:
        qname = queue.name
    queue_exchange = getattr(queue, "exchange", None)
    if delivery_mode is None:
        delivery_mode = getattr(queue_exchange, "delivery_mode", None)
        delivery_mode = delivery_mode or app.conf.task_default_delivery_mode
    if exchange_type is None:
        exchange_type = getattr(queue_exchange, "type", None) or "direct"
    if (not exchange or not routing_key) and exchange_type == "direct":
        exchange, routing_key = "", qname
    elif exchange is None:
        exchange = queue.exchange.name or amqp.default_exchange
        routing_key = routing_key or queue.routing_key or app.conf.task_default_routing_key
    if declare is None and queue is not None and not isinstance(queue, Broadcast):
        declare = [queue]
    publish = {
        "exchange": exchange,
        "routing_key": routing_key,
        "delivery_mode": delivery_mode,
        "declare": declare,
    }
    name = getattr(exchange, "name", exchange) or ""
    return _Destination(name, exchange_type, routing_key or "", qname, False, {}, publish)


# -- kombu's Redis channel, recording instead of pushing -------------------------------


def _recording_channel(connection: Any) -> Any:
    """A channel of kombu's own Redis transport whose pushes are recorded, not sent.

    Everything up to the push is kombu's code: ``prepare_message``, ``basic_publish``
    (``_inplace_augment_message``: body encoding, ``delivery_tag``), the exchange type's
    ``deliver`` and ``_lookup`` (bindings read from Redis, reused for ``BINDINGS_TTL_S``),
    ``_q_for_pri`` and ``priority_steps``, the queue's ``x-expires``. The recorded commands
    carry ``global_keyprefix``, as kombu's prefixed client would add it. ``None`` when the
    transport is not the plain Redis one (Sentinel, or another broker).
    """
    transport = connection.transport
    if type(transport) is not kombu_redis.Transport:
        return None
    channel_class = _recording_class(transport.Channel)
    channel = channel_class(connection.connection)
    transport.channels.append(channel)
    return channel


def _recording_class(base: type) -> type:
    class RecordingChannel(base):  # type: ignore[misc]
        recorded: list[tuple[str, str, list[Command]]]

        def _put(self, queue: str, message: Mapping[str, Any], **kwargs: Any) -> None:
            prefix = self.global_keyprefix
            key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
            payload: str = kombu_dumps(message)  # type: ignore[no-untyped-call]
            commands = [["LPUSH", prefix + key, payload]]
            expires = self._expires.get(queue) if self._expires else None
            if expires is not None:
                commands += [
                    ["PEXPIRE", prefix + self._q_for_pri(queue, p), str(expires)]
                    for p in self.priority_steps
                ]
            self.recorded.append(("queue", queue, commands))

        def _put_fanout(self, exchange: str, message: Any, routing_key: str, **kw: Any) -> None:
            self.recorded.append(("fanout", exchange, []))

        def get_table(self, exchange: str) -> list[Any]:
            tables: dict[str, tuple[float, list[Any]]] = self.__dict__.setdefault("_tables", {})
            now = time.monotonic()
            cached = tables.get(exchange)
            if cached is not None and now - cached[0] < BINDINGS_TTL_S:
                return cached[1]
            table = list(super().get_table(exchange))
            if table:
                tables[exchange] = (now, table)
            return table

    RecordingChannel.__name__ = RecordingChannel.__qualname__ = f"Recording{base.__name__}"
    return RecordingChannel
