"""The slots of the RabbitMQ store: what a claim publishes, and the scripts that claim.

A firing's slot is the classic queue ``{prefix}c.{firing id}`` of length one, bound to the
exchange ``{prefix}slots`` under ``claim.{id}`` once a claim reached it and under
``done.{id}`` once committed (see :mod:`beatless.stores.rabbitmq.store`). A claim's
message is ``v=1|{token}|{lease_ms}|{tag}|{node}``, the epoch record
``v=1|{started_ms}|{token}``. This process's own claims are kept in a :class:`_Ledger`.

The scripts are generators of ``_amqp`` steps (see :class:`_amqp.Session`); this module
imports neither pika nor ``_amqp``: the store hands them the ``_amqp`` module it loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from beatless.core._logtext import shown
from beatless.stores._epoch import new_token
from beatless.stores.base import ClaimRequest, Epoch, Outcome

logger = logging.getLogger("beatless.stores.rabbitmq.store")

FORMAT_VERSION = "v=1"
EXPIRY_SLACK_MS = 1_000
RATE_ALLOWANCE = 0.001
"""How much faster the node's monotonic clock may run than the broker's (ppm drift)."""
GET_GUARD = 0.25
"""A node gets its own pending message back (release, renewal) only while its claim is
younger than ``1 - GET_GUARD`` of its lease, so the message is surely still there."""
RENEW_RETRY_S = 0.005
"""How long a renewal waits before it publishes again to a slot that a claimant, who will
take its claim back, filled while the old claim was out."""
RENEW_PATIENCE_S = 2.0
"""How long a renewal keeps publishing to a slot that stays full (a claimant that died
before it took its claim back) before it lets its own claim go: ``HELD``."""
CONSUME_WAIT_S = 1.0
"""How long a renewal waits for its claim's message to be delivered to its consumer
(milliseconds, when the message is there)."""
HELD_MEMORY_S = 3_600
"""How long this process remembers that it saw a firing held (for ``TAKEOVER``)."""
_SLOT = {"x-max-length": 1, "x-overflow": "reject-publish", "x-queue-type": "classic"}
_RETRY = object()
"""A claim to run once more: its channel closed before it published anything."""


@dataclass(frozen=True, slots=True)
class _Hold:
    """A claim this process published and the broker took."""

    token: str
    sent: float
    """The monotonic clock just before the claim was published: its TTL began later."""
    lease_ms: int
    tag: str
    state: str = "pending"

    def runs(self, now: float, share: float = 0.0) -> bool:
        """Whether the lease surely still runs, with ``share`` of it kept in hand."""
        left = self.lease_ms * (1 - RATE_ALLOWANCE - share) - 1
        return self.state == "pending" and (now - self.sent) * 1_000 < left


class _Ledger:
    """The claims the nodes of this process hold in one broker and prefix."""

    _all: ClassVar[dict[tuple[str, str], _Ledger]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holds: dict[tuple[str, str], _Hold] = {}
        self.held: dict[tuple[str, str], float] = {}

    @classmethod
    def of(cls, broker: str, prefix: str) -> _Ledger:
        with cls._guard:
            return cls._all.setdefault((broker, prefix), cls())

    def get(self, node: str, id_: str) -> _Hold | None:
        with self.lock:
            return self.holds.get((node, id_))

    def put(self, node: str, id_: str, hold: _Hold | None) -> None:
        with self.lock:
            if hold is None:
                self.holds.pop((node, id_), None)
            else:
                self.holds[(node, id_)] = hold

    def saw_held(self, node: str, id_: str, now: float) -> None:
        with self.lock:
            self.held[(node, id_)] = now

    def was_held(self, node: str, id_: str) -> bool:
        """Whether a claim of this firing was answered ``HELD`` here: a win after it is a
        takeover, even in a slot that no claim reached through its binding yet."""
        with self.lock:
            return (node, id_) in self.held

    def sweep(self, now: float) -> None:
        with self.lock:
            old = [k for k, h in self.holds.items() if now - h.sent > 2 * h.lease_ms / 1e3 + 60]
            for key in old:
                del self.holds[key]
            for key in [k for k, seen in self.held.items() if now - seen > HELD_MEMORY_S]:
                del self.held[key]

    def clear(self) -> None:
        with self.lock:
            self.holds.clear()
            self.held.clear()


@dataclass(slots=True)
class _Attempt:
    """How far one claim got: published (outcome unknown until confirmed), in a slot no
    claim had reached (a first win), won; and when it was published (monotonic)."""

    sent: bool = False
    first: bool = False
    won: bool = False
    at: float = 0.0


def _single(step: Any) -> Any:
    return (yield step)


def _claim_body(token: str, lease_ms: int, tag: str, node: str) -> bytes:
    return f"{FORMAT_VERSION}|{token}|{lease_ms}|{tag}|{node}".encode()


def _token_of(body: bytes) -> str | None:
    parts = body.decode("utf-8", "replace").split("|", 2)
    return parts[1] if len(parts) == 3 and parts[0] == FORMAT_VERSION else None


def _parse_epoch(body: bytes) -> Epoch | None:
    parts = body.decode("utf-8", "replace").split("|", 2)
    if len(parts) != 3 or parts[0] != FORMAT_VERSION or not parts[1].isdigit() or not parts[2]:
        return None
    return Epoch(parts[2], int(parts[1]))


class SlotScripts:
    """The claim scripts of :class:`~beatless.stores.rabbitmq.store.RabbitMQStore`: one
    script per firing, run by its ``_run``."""

    _amqp: Any
    """The ``_amqp`` module, loaded by the store (it imports pika)."""
    prefix: str
    durable: bool
    _exchange: str
    _ledger: _Ledger
    _monotonic: Callable[[], float]
    _forgot_before_ms: int | None

    def _claim_script(self, r: ClaimRequest, node: str, lease_ms: int, hold_off: bool) -> Any:
        """One claim, as a script of steps (see ``_amqp``): renew this node's own claim,
        or ask whether the firing is committed, publish to its slot, and check again.
        ``hold_off``: whether the claim holds off (see :meth:`_forget`)."""
        hold = self._ledger.get(node, r.id)
        if hold is not None and hold.runs(self._monotonic()):
            return self._renew(r, node, lease_ms, hold)
        return self._first_claim(r, node, lease_ms, hold_off)

    def _first_claim(self, r: ClaimRequest, node: str, lease_ms: int, hold_off: bool) -> Any:
        """Ask whether the firing is committed, publish a claim to its slot (creating
        the slot if no claim ever reached it), then ask again."""
        a, queue = self._amqp, self._slot(r.id)
        token = new_token()[:16]
        attempt = _Attempt()
        try:
            if (yield self._is_committed(r.id)) is not a.Confirm.RETURNED:
                return Outcome.LOST, None
            published = yield from self._publish_claim(r, node, lease_ms, token, attempt)
            if published and (yield self._is_committed(r.id)) is not a.Confirm.RETURNED:
                yield from self._take_back(queue, token)  # committed meanwhile
                return Outcome.LOST, None
        except a.ChannelLost as lost:
            if not attempt.sent and lost.code in (0, 404, 406):
                return _RETRY  # refused before a claim was published: try once more
            attempt.won = False  # our claim may be in the slot: held until its lease ends
        if not attempt.won:
            return Outcome.HELD, None
        hold = _Hold(token, attempt.at, lease_ms, r.tag)
        if self._is_forgotten(r):
            return (yield from self._forget(r, queue, hold, hold_off))
        won = attempt.first and not self._ledger.was_held(node, r.id)
        return (Outcome.WON if won else Outcome.TAKEOVER), hold

    def _publish_claim(
        self, r: ClaimRequest, node: str, lease_ms: int, token: str, attempt: _Attempt
    ) -> Any:
        """Publish the claim through the slot's binding; if nothing is bound yet, declare
        the slot, publish to it by name, and bind it for the claims that come after. A
        claim the slot took while its holder renews (see :meth:`_renew`) is taken back."""
        a, queue = self._amqp, self._slot(r.id)
        body = _claim_body(token, lease_ms, r.tag, node)
        attempt.at, attempt.sent = self._monotonic(), True
        confirm = yield a.Publish(self._exchange, f"claim.{r.id}", body, lease_ms, self.durable)
        if confirm is a.Confirm.RETURNED:  # no claim reached this slot yet
            attempt.sent, attempt.first = False, True
            args = {**_SLOT, "x-expires": r.memory_ms + lease_ms + EXPIRY_SLACK_MS}
            yield a.Declare(queue, durable=self.durable, arguments=args, nowait=True)
            attempt.at, attempt.sent = self._monotonic(), True
            confirm = yield a.Publish("", queue, body, lease_ms, self.durable)
            if confirm is a.Confirm.ACK:
                yield a.Bind(queue, self._exchange, f"claim.{r.id}", nowait=True)
        if confirm is a.Confirm.ACK:
            _ready, consumers = yield a.Declare(queue, passive=True)  # outlive the lease
            if consumers:  # its holder has the claim out to renew it: the slot is not free
                yield from self._take_back(queue, token)
                confirm = a.Confirm.NACK
        attempt.won = confirm is a.Confirm.ACK
        return attempt.won

    def _renew(self, r: ClaimRequest, node: str, lease_ms: int, hold: _Hold) -> Any:
        """This node's own pending claim: publish a fresh one in its place (``WON``), or
        ``HELD`` if the claim was no longer there or its lease ran out meanwhile.

        The slot counts only ready messages, so while the old claim is out of it another
        claim can be published there. The old one is taken out by a consumer, which a
        passive declare counts: a claimant that finds one takes its claim back and is
        ``HELD`` (:meth:`_publish_claim`), and the fresh claim is published again until
        the slot takes it. The consumer is cancelled before the old claim is acknowledged,
        so the slot is never free while neither claim is in it."""
        a, now = self._amqp, self._monotonic()
        if not hold.runs(now, GET_GUARD):
            return Outcome.HELD, hold  # too close to its end to touch it safely
        queue = self._slot(r.id)
        left = hold.lease_ms * (1 - RATE_ALLOWANCE) / 1_000 - (now - hold.sent)
        got = yield a.Consume(queue, wait=min(max(left, 0.0), CONSUME_WAIT_S))
        if got is None or _token_of(got.body) != hold.token:
            return Outcome.HELD, None  # whatever was delivered goes back with the channel
        token = new_token()[:16]
        body = _claim_body(token, lease_ms, r.tag, node)
        give_up = self._monotonic() + RENEW_PATIENCE_S
        while True:
            sent = self._monotonic()
            confirm = yield a.Publish("", queue, body, lease_ms, self.durable)
            if confirm is a.Confirm.ACK:
                break
            if (
                confirm is a.Confirm.RETURNED
                or not hold.runs(self._monotonic())
                or self._monotonic() > give_up
            ):
                yield a.Settle(got.delivery_tag, ack=True)  # let the claim go
                return Outcome.HELD, None
            yield a.Sleep(RENEW_RETRY_S)  # a claimant's message, which it takes back
        yield a.Cancel()
        yield a.Settle(got.delivery_tag, ack=True)
        yield a.Declare(queue, passive=True)
        return Outcome.WON, _Hold(token, sent, lease_ms, r.tag)

    def _commit_one(self, id_: str, hold: _Hold) -> Any:
        a = self._amqp
        try:
            yield a.Declare(self._slot(id_), passive=True, nowait=True)  # memory from now
            yield a.Bind(self._slot(id_), self._exchange, f"done.{id_}")
        except a.ChannelLost:
            return False
        # Made only if the broker answered before the lease could have run out there.
        return hold.runs(self._monotonic())

    def _take_back(self, queue: str, token: str) -> Any:
        """Get this node's own pending message and acknowledge it, so the slot is free."""
        a = self._amqp
        got = yield a.Get(queue)
        if got is None:
            return None
        if _token_of(got.body) == token:
            yield a.Settle(got.delivery_tag, ack=True)
        else:
            logger.warning("rabbitmq store: slot %s held another claim than ours", shown(queue))
            yield a.Settle(got.delivery_tag, ack=False)
        return None

    def _look(self, id_: str) -> Any:
        """A late firing, answered without a write: ``LOST`` if it is committed, ``HELD``
        if a claim is in its slot (or out of it, being renewed), else ``LATE``; ``LATE``
        too when its slot is gone (a passive declare of it refused) or the broker refused
        the question. The declare counts as a use of an existing slot, as a commit's does."""
        a = self._amqp
        try:
            if (yield self._is_committed(id_)) is not a.Confirm.RETURNED:
                return Outcome.LOST
            ready, consumers = yield a.Declare(self._slot(id_), passive=True)
        except a.ChannelLost:
            return Outcome.LATE
        return Outcome.HELD if ready or consumers else Outcome.LATE

    def _is_committed(self, id_: str) -> Any:
        return self._amqp.Publish(self._exchange, f"done.{id_}", b"?", ttl_ms=0)

    def _forget(self, r: ClaimRequest, queue: str, hold: _Hold, hold_off: bool) -> Any:
        """A slot won for a firing before the horizon: committed (``FORGOTTEN``), or, while
        the claim holds off, given back at once (``RESEEDING``)."""
        if hold_off:
            yield from self._take_back(queue, hold.token)
            return Outcome.RESEEDING, None
        yield self._amqp.Bind(queue, self._exchange, f"done.{r.id}")
        return Outcome.FORGOTTEN, replace(hold, state="committed")

    def _is_forgotten(self, r: ClaimRequest) -> bool:
        return self._forgot_before_ms is not None and r.release_ms < self._forgot_before_ms

    def _slot(self, id_: str) -> str:
        return f"{self.prefix}c.{id_}"
