"""The steps of the RabbitMQ store's channel scripts, and what they answer.

A script is a generator that yields steps and is sent each step's result (see
:class:`~beatless.stores.rabbitmq._amqp.Session`, which runs them). These are plain
values: this module imports no driver, so the store's scripts can be written without
pika, which only ``_amqp`` imports.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any


class Confirm(enum.Enum):
    """What the broker said of a message published with ``mandatory`` set."""

    ACK = "ack"
    """Taken by the queue it was routed to."""
    NACK = "nack"
    """Routed, and refused: the queue is full (``x-overflow: reject-publish``)."""
    RETURNED = "returned"
    """Routed nowhere: no queue by that name, or no binding for that routing key."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``body``; the result is a :class:`Confirm`."""

    exchange: str
    routing_key: str
    body: bytes
    ttl_ms: int | None = None
    persistent: bool = False


@dataclass(frozen=True, slots=True)
class Declare:
    """Declare a queue (``passive``: only check it, which also counts as a use for its
    ``x-expires``); the result is its counts of ready messages and of consumers."""

    queue: str
    passive: bool = False
    durable: bool = False
    arguments: dict[str, Any] | None = None
    nowait: bool = False
    """Send it and go on (result ``None``): the next step on the channel is done after
    it, and a refusal closes the channel (:class:`ChannelLost` at a later step)."""


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    """Declare a direct exchange; the result is ``None``."""

    exchange: str
    durable: bool = False


@dataclass(frozen=True, slots=True)
class Bind:
    """Bind a queue to an exchange; the result is ``None``."""

    queue: str
    exchange: str
    routing_key: str
    nowait: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """``basic.get`` with acknowledgement; the result is a :class:`Message` or ``None``."""

    queue: str


@dataclass(frozen=True, slots=True)
class Consume:
    """Consume ``queue`` one message at a time; the result is the first
    :class:`Message` delivered, or ``None`` when none came within ``wait`` seconds.

    The consumer is counted by a passive :class:`Declare` of the queue while it lasts:
    until a :class:`Cancel`, or the end of the script, when the channel is closed (and
    the broker puts back what it delivered and nobody settled)."""

    queue: str
    wait: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the script's consumer (:class:`Consume`); the result is ``None``. Messages
    it delivered may still be settled."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` on the I/O loop (other scripts go on); the result is ``None``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Settle:
    """Acknowledge a message got (``ack``) or give it back to its queue (``ack=False``)."""

    delivery_tag: int
    ack: bool


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete a queue; the result is ``None``."""

    queue: str


@dataclass(frozen=True, slots=True)
class Read:
    """Consume a stream queue from ``offset`` (a number, or ``"first"``) to its end; the
    result is the list of :class:`Message` read, in order, or ``None`` when none came
    within ``quiet`` seconds of the consumer starting (an empty stream, or a start past
    its end). Channels take ``prefetch`` messages at a time (:class:`Session`).

    AMQP has no end of a stream. RabbitMQ reads a stream for a consumer in the channel's
    own process, as soon as an acknowledgement gives credit, before it handles the next
    method: so the step acknowledges all it got and asks a no-op (``basic.qos``), and an
    answer with no delivery before it means the reader reached the end with credit to
    spare. The consumer is never cancelled: pika rejects a delivery that crosses a
    cancel, and a stream answers a reject by closing the connection. The channel is
    closed after the script instead, and opened again."""

    queue: str
    offset: int | str
    quiet: float


@dataclass(frozen=True, slots=True)
class Message:
    delivery_tag: int
    body: bytes
    offset: int = -1
    """Its place in the stream, for a message read by :class:`Read`."""


Step = (
    Publish
    | Declare
    | DeclareExchange
    | Bind
    | Get
    | Consume
    | Cancel
    | Sleep
    | Settle
    | Delete
    | Read
)
Script = Generator[Step, Any, Any]


class ChannelLost(Exception):
    """Thrown into a script whose channel closed under it (the broker refused a step,
    or the connection went): the outcome of its step in flight is unknown."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
