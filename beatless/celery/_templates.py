"""Each entry's task message, made once by ``app.send_task`` and filled in per firing.

A template is made by calling ``app.send_task`` itself, with a producer on a broker
connection whose Redis pushes are recorded instead of sent
(:mod:`beatless.celery._recording`): Celery's router, ``create_task_message`` and
``send_task_message``, then kombu's producer, serializer, compression and Redis channel
(bindings, priority keys, ``global_keyprefix``, ``x-expires``) produce the exact
commands ``send_task`` would run. The per-firing fields are passed as marker values,
and the template keeps where each marker landed. Filling a template for one firing
sets the task id, the per-firing beatless headers (occurrence, address, offset), a fresh
``delivery_tag`` and, when the message expires from the firing's lateness, ``expires``
and ``expiration``. It costs a few microseconds where ``send_task`` costs about half a
millisecond, so a release costs little more than the claim script. The run policy
header (``beatless_run``) is the same for every firing of an entry: the template
carries it as ``send_task`` wrote it.

A message that depends on the instant it is built in any other way (an entry with its
own ``expires``, ``countdown`` or ``eta``, or task protocol 1, whose body carries the
id) is built by ``app.send_task`` again for every firing instead. A template whose
route reads bindings from Redis (a named exchange) is made afresh every
``TEMPLATE_TTL_S``, as kombu would read them again.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis as redis_driver
from celery import signals
from kombu.exceptions import OperationalError

from beatless.core._logtext import shown
from beatless.errors import StoreUnavailable
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing, iso, to_datetime
from beatless.stores.redis.store import RedisStore, server_identity

from ._messages import ADDRESS_HEADER, OCCURRENCE_HEADER, OFFSET_HEADER, send_task_options
from ._recording import Command, NotRecordable, Recorder

logger = logging.getLogger(__name__)

TEMPLATE_TTL_S = 30.0
"""How long a template whose route reads bindings from Redis is reused."""
TIMED_OPTIONS = ("expires", "countdown", "eta")
"""Options that make a message depend on the instant it is built."""
_EXPIRES_MARK = datetime(2999, 12, 31, 23, 59, 58, 123457, tzinfo=UTC)
_PUBLISH_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)

Path = tuple[str | int, ...]


class CannotBuild(Exception):
    """``app.send_task`` failed to make an entry's message: raised each time its template
    is asked for, so that each firing is told (at WARNING, see
    :class:`~beatless.node.atomic.RedisAtomic`) and sent through ``app.send_task``."""


@dataclass(frozen=True, slots=True)
class Message:
    """One task message, as the Redis commands that push it."""

    commands: list[Command]
    exchange: str
    routing_key: str
    queues: tuple[str, ...]
    sent_event: dict[str, Any] | None = None

    def describe(self) -> str:
        queues = ", ".join(repr(q) for q in self.queues)
        if not self.exchange:
            return f"direct routing to queue {queues}"
        return (
            f"direct exchange {self.exchange!r}, routing key {self.routing_key!r}, "
            f"bound to queue {queues}"
        )


@dataclass(slots=True)
class Template:
    """One entry's message with the per-firing fields marked, ready to fill.

    The payload is kept as the text ``json.dumps`` writes, cut where each per-firing
    field's value goes: filling is joining the pieces with the firing's values, so a
    firing costs a few string operations, not a JSON encoding.
    """

    message: Message
    pieces: list[str]
    """The payload's text between the per-firing values."""
    slots: list[str]
    """The field whose JSON value goes after each piece but the last."""
    payload_at: tuple[int, int]
    """Which command, and which of its arguments, is the payload."""
    event_marks: dict[Path, str]
    expires: bool
    """Whether ``expires`` / ``expiration`` come from the firing's lateness."""
    timed: bool = False
    """Whether the message depends on the instant it is built: made per firing instead."""
    made_at: float = field(default_factory=time.monotonic)

    def fill(self, firing: Firing, now_s: float) -> Message:
        values = _values(firing, self.expires, now_s)
        parts = [self.pieces[0]]
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            parts.append(values[slot])
            parts.append(piece)
        command, argument = self.payload_at
        commands = [list(c) for c in self.message.commands]
        commands[command][argument] = "".join(parts)
        event = None
        if self.message.sent_event is not None:
            event = _filled(self.message.sent_event, self.event_marks, _raw(values))
        message = self.message
        return Message(commands, message.exchange, message.routing_key, message.queues, event)


class Builder:
    """Makes templates through ``app.send_task`` on a recording broker connection."""

    def __init__(self, app: Any, *, expires_from_lateness: bool = False) -> None:
        self.app = app
        self.expires_from_lateness = expires_from_lateness
        self.recorder = Recorder()
        self.connection = app.connection_for_write(transport=self.recorder.transport)
        errors = (*self.connection.connection_errors, *self.connection.channel_errors)
        # kombu's Redis transport lists KeyError, and Celery's QueueNotFound is one
        self._errors: tuple[type[BaseException], ...] = (
            OperationalError,
            *(error for error in errors if error is not KeyError),
        )
        try:
            self.channel = self.connection.default_channel
        except self._errors as exc:
            self.connection.release()
            raise StoreUnavailable(f"celery atomic enqueue: broker unreachable: {exc}") from None
        self.producer = _noting(app.amqp.Producer)(self.channel, auto_declare=False)
        self.mark = f"beatless-template-{uuid.uuid4().hex}"
        """The task id of every template: one marker, so that a result backend that
        subscribes to each sent id (``backend.on_task_call``) subscribes once."""
        self._templates: dict[int, tuple[Entry, Template | str | CannotBuild]] = {}

    def close(self) -> None:
        self._templates.clear()
        self.connection.release()

    def differs_from(self, store: RedisStore) -> str:
        """An empty string when ``store`` talks to the same Redis database as the broker."""
        if not self.recorder.records(self.channel):
            return "the broker's Redis connection cannot be recorded (a Unix socket?)"
        try:
            broker = server_identity(self.channel.client)
            claims = server_identity(store.client)
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

    def message(self, firing: Firing, now_s: float) -> Message | str:
        """``firing``'s message, or why it cannot be pushed by a claim script."""
        listening = [s.name for s in _PUBLISH_SIGNALS if s.receivers]
        if listening:
            return f"the app listens to {', '.join(listening)}, sent by app.send_task only"
        template = self.template(firing.entry)
        if isinstance(template, str):
            return template
        if template.timed:
            return self._build(firing, {})
        return template.fill(firing, now_s)

    def template(self, entry: Entry) -> Template | str:
        """``entry``'s template (made now, or reused), or why it has none; a
        :class:`CannotBuild` when ``app.send_task`` failed to make it (each time asked)."""
        cached = self._templates.get(id(entry))
        if cached is not None and cached[0] is entry:
            made = cached[1]
            if isinstance(made, CannotBuild):
                raise CannotBuild(str(made))
            if isinstance(made, str) or not made.message.exchange:
                return made
            if time.monotonic() - made.made_at < TEMPLATE_TTL_S:
                return made
        try:
            made = self._make_template(entry)
        except StoreUnavailable:
            raise
        except Exception as exc:
            failed = CannotBuild(shown(exc, quoted=False))
            self._templates[id(entry)] = (entry, failed)
            raise failed from exc
        self._templates[id(entry)] = (entry, made)
        return made

    def _timed(self, entry: Entry) -> bool:
        return (
            any(entry.options.get(name) is not None for name in TIMED_OPTIONS)
            or self.app.conf.task_protocol != 2
        )

    def _make_template(self, entry: Entry) -> Template | str:
        if self._timed(entry):
            made = self._build(Firing.of(entry, None, entry.name, round(time.time() * 1_000)), {})
            if isinstance(made, str):
                return made
            return Template(made, [], [], (0, 0), {}, expires=False, timed=True)
        marks = {name: f"{self.mark}:{name}" for name in ("occurrence", "address", "offset")}
        firing = Firing.of(entry, None, entry.name, round(time.time() * 1_000))
        expires = self.expires_from_lateness and entry.options.get("expires") is None
        overrides: dict[str, Any] = {
            "task_id": self.mark,
            "headers": {
                OCCURRENCE_HEADER: marks["occurrence"],
                ADDRESS_HEADER: marks["address"],
                OFFSET_HEADER: marks["offset"],
            },
        }
        if expires:
            overrides["expires"] = _EXPIRES_MARK
        made = self._build(firing, overrides)
        if isinstance(made, str):
            return made
        return self._marked(made, expires)

    def _build(self, firing: Firing, overrides: dict[str, Any]) -> Message | str:
        """What ``app.send_task`` pushes for ``firing`` (with ``overrides`` to its
        options), recorded; or why it cannot go through a claim script."""
        entry = firing.entry
        options = send_task_options(firing, expires_from_lateness=self.expires_from_lateness)
        headers = {**options["headers"], **overrides.pop("headers", {})}
        options.update(overrides, headers=headers)
        events = _Events()
        options.setdefault("event_dispatcher", events)
        try:
            with self.recorder.recording() as commands:
                self.app.send_task(
                    entry.task, entry.args, dict(entry.kwargs), producer=self.producer, **options
                )
        except self._errors as exc:
            raise StoreUnavailable(f"celery atomic enqueue: broker unreachable: {exc}") from None
        except NotRecordable as exc:
            return str(exc)
        return self._message(commands, self.producer.published, events.sent)

    def _message(
        self, commands: list[Command], published: dict[str, Any], sent_event: dict[str, Any] | None
    ) -> Message | str:
        deliveries = [c for c in commands if c[0].upper() in ("LPUSH", "RPUSH", "PUBLISH")]
        exchange = getattr(published.get("exchange"), "name", published.get("exchange")) or ""
        routing_key = str(published.get("routing_key") or "")
        kind = self._exchange_type(exchange, published.get("declare") or ())
        if kind != "direct" or any(c[0].upper() == "PUBLISH" for c in deliveries):
            return f"{kind} exchange {exchange!r}"
        if not deliveries:
            return f"exchange {exchange!r} routes key {routing_key!r} to no queue"
        return Message(commands, exchange, routing_key, self._queues(deliveries), sent_event)

    def _exchange_type(self, exchange: str, declared: Any) -> str:
        """The type of ``exchange`` as Celery routed to it: from the queues it declares
        or knows (``task_queues``), else as the broker's bindings say."""
        if not exchange:
            return "direct"
        for queue in (*declared, *self.app.amqp.queues.values()):
            own: Any = getattr(queue, "exchange", None)
            if getattr(own, "name", None) == exchange and getattr(own, "type", None):
                return str(own.type)
        return str(self.channel.typeof(exchange).type)

    def _queues(self, pushes: list[Command]) -> tuple[str, ...]:
        prefix = self.channel.global_keyprefix or ""
        names = (c[1].removeprefix(prefix).split(self.channel.sep)[0] for c in pushes)
        return tuple(dict.fromkeys(names))

    def _marked(self, message: Message, expires: bool) -> Template | str:
        at = next(i for i, c in enumerate(message.commands) if c[0].upper() in ("LPUSH", "RPUSH"))
        payload = message.commands[at][2]
        envelope = json.loads(payload)
        if self.mark in _body_text(envelope):
            return "its message body carries the task id"
        wanted = {self.mark: "id", _EXPIRES_MARK.isoformat(): "expires"}
        wanted.update((f"{self.mark}:{n}", n) for n in ("occurrence", "address", "offset"))
        marks = dict(_find(envelope, wanted))
        if payload.count(self.mark) != sum(1 for n in marks.values() if n != "expires"):
            return "a per-firing field lands where it cannot be filled in"
        event_marks = {}
        if message.sent_event is not None:
            event_marks = dict(_find(message.sent_event, wanted))
        # Every per-firing value as a marker of its own, then the text cut at the markers.
        properties = envelope["properties"]
        properties["delivery_tag"] = ""
        marks[("properties", "delivery_tag")] = "delivery_tag"
        if expires:
            properties["expiration"] = ""
            marks[("properties", "expiration")] = "expiration"
        token = f"{self.mark}#"
        marked = _filled(envelope, marks, {n: f"{token}{n}" for n in set(marks.values())})
        cut = re.split(f'"{re.escape(token)}([a-z_]+)"', json.dumps(marked))
        return Template(message, cut[0::2], cut[1::2], (at, 2), event_marks, expires)


def _noting(producer_class: type[Any]) -> type[Any]:
    """``producer_class``, noting the destination of its last ``publish``."""

    class NotingProducer(producer_class):  # type: ignore[misc]
        published: dict[str, Any]

        def publish(self, body: Any, **kwargs: Any) -> Any:
            self.published = {k: kwargs.get(k) for k in ("exchange", "routing_key", "declare")}
            return super().publish(body, **kwargs)

    return NotingProducer


class _Events:
    """Stands in for Celery's event dispatcher while a template is made: keeps the
    ``task-sent`` event's fields, sends nothing."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] | None = None

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **kwargs: Any) -> None:
        self.sent = copy.deepcopy(fields)


def publish_sent_events(app: Any, messages: list[Message]) -> None:
    """The ``task-sent`` event of each pushed message, as ``send_task`` publishes it."""
    events = [m.sent_event for m in messages if m.sent_event is not None]
    if not events:
        return
    try:
        with app.events.default_dispatcher() as dispatcher:
            for fields in events:
                dispatcher.send("task-sent", **fields)
    except Exception:
        logger.exception("could not publish task-sent events for %d firing(s)", len(events))


# -- markers -------------------------------------------------------------------------------


def _values(firing: Firing, expires: bool, now_s: float) -> dict[str, str]:
    """Each per-firing field of ``firing``, as the JSON text of its value."""
    values = {
        "id": f'"{firing.id}"',
        "occurrence": f'"{iso(firing.occurrence_ms)}"',
        "address": json.dumps(firing.address),
        "offset": str(firing.offset_ms),
        "delivery_tag": f'"{uuid.uuid4()}"',  # as kombu draws one for every publish
    }
    if expires:
        at = _expires_of(firing)
        left = (at - to_datetime(round(now_s * 1_000))).total_seconds()
        values["expires"] = f'"{at.isoformat()}"'
        values["expiration"] = f'"{int(max(left, 0.0) * 1000)}"'
    return values


def _raw(values: dict[str, str]) -> dict[str, Any]:
    """The values themselves, from their JSON text."""
    return {name: json.loads(text) for name, text in values.items()}


def _expires_of(firing: Firing) -> datetime:
    entry = firing.entry
    return to_datetime(firing.occurrence_ms) + entry.jitter + entry.max_late


def _find(value: Any, wanted: dict[str, str], path: Path = ()) -> Iterator[tuple[Path, str]]:
    """The paths of the leaves of ``value`` that are one of the ``wanted`` markers."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _find(item, wanted, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _find(item, wanted, (*path, index))
    elif isinstance(value, str) and value in wanted:
        yield path, wanted[value]


def _filled(value: Any, marks: dict[Path, str], values: dict[str, Any]) -> Any:
    """A copy of ``value`` with each marked leaf set; only the containers on a marked
    path are copied."""
    top = _copy(value)
    for path, name in marks.items():
        node = top
        for key in path[:-1]:
            child = _copy(node[key])
            node[key] = child
            node = child
        node[path[-1]] = values[name]
    return top


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value)


def _body_text(envelope: dict[str, Any]) -> str:
    body = envelope.get("body", "")
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        return base64.b64decode(body).decode("utf-8", "replace")
    return str(body)
