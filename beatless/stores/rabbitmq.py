"""The RabbitMQ claim store: a stock broker decides who wins, with no plugin.

For Celery or Dramatiq users on RabbitMQ, so that beatless needs no Redis. Everything
the store knows lives in queues and bindings under one prefix, ``beatless.{namespace}.``
unless ``prefix`` says otherwise:

``{prefix}c.{firing id}``, the *slot*
    A classic queue with ``x-max-length: 1`` and ``x-overflow: reject-publish``. A claim
    publishes one message to it with publisher confirms: the broker takes the first
    (``basic.ack``: won) and refuses every other while it is there (``basic.nack``:
    held). The message, ``v=1|{token}|{lease_ms}|{tag}|{node}``, carries the lease as
    its per-message TTL, so the broker drops a pending claim when its lease runs out, on
    the broker's clock, and the next claim is taken. A claim published first with
    ``mandatory`` set is returned when the slot does not exist: the claimant declares it
    and publishes again, and wins a firing nobody tried before (``WON``); a win in a
    slot that existed is a ``TAKEOVER``. The slot expires (``x-expires``) ``memory_ms +
    lease_ms`` after its last use; the winner touches it (a passive declare) when it
    wins and when it commits.
``{prefix}done``, a direct exchange
    A commit binds the slot to it with the firing id as routing key. A claim first asks
    whether the firing is committed by publishing a message with TTL 0 to that routing
    key: returned means no binding, so not committed; a routed one (acknowledged or
    refused, never kept) means committed, ``LOST``. The binding goes with its slot, so
    a committed claim is remembered ``memory_ms`` after the commit.
``{prefix}epoch``
    A queue holding one message, ``v=1|{started_ms}|{token}``, written when the queue is
    found missing, and bound to ``{prefix}done`` with routing key ``epoch.{token}``. A
    claim asks whether that binding still routes (one more TTL-0 message): a broker
    that lost its definitions has neither, and the next claim writes a new epoch.

Nothing is ever read with ``basic.get`` by a node that is not sure the message is its
own: RabbitMQ counts only *ready* messages against ``x-max-length``, so a message got
and not yet acknowledged leaves the slot open to another publish. A node knows its own
claims instead (:class:`_Ledger`: the token and the monotonic instant just before its
claim was published, whose TTL started later), and touches its message only while its
lease certainly runs. Hence what other nodes cannot see: the task tag and the node of
another process's claim. ``FOREIGN`` is answered only for a claim this process holds
under another tag; another node's claim of another task is ``HELD`` or ``LOST``, and a
claim this node made from another process (or whose confirm was lost with a connection)
is ``HELD`` until its lease runs out and it is taken over.

Lateness and earliness are judged on the local clock (``clock``): RabbitMQ has no clock
to read. Leases are measured by the broker (message TTL, ``x-expires``), so skew between
nodes cannot make a live lease look expired; a commit counts as made only if the broker
confirmed it before the node's own monotonic clock reached the end of the lease.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from beatless._logtext import shown
from beatless.durations import DurationLike, as_timedelta
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.stores._epoch import describe_change, has_changed, horizon_ms, new_token
from beatless.stores.base import ClaimRequest, ClaimStore, Epoch, Outcome
from beatless.urls import mask_url, secrets_of

logger = logging.getLogger(__name__)

FORMAT_VERSION = "v=1"
DEFAULT_TIMEOUT = 5.0
DEFAULT_CHANNELS = 16
EXPIRY_SLACK_MS = 1_000
RATE_ALLOWANCE = 0.001
"""How much faster the node's monotonic clock may run than the broker's (ppm drift)."""
GET_GUARD = 0.25
"""A node gets its own pending message back (release, renewal) only while its claim is
younger than ``1 - GET_GUARD`` of its lease, so the message is surely still there."""
EPOCH_READS = 20
HELD_MEMORY_S = 3_600
"""How long this process remembers that it saw a firing held (for ``TAKEOVER``)."""
PROBE_TTL_MS = 10_000
_MAX_PREFIX = 180
_OPTIONS = {"durable", "timeout", "channels", "prefix"}
_SLOT = {"x-max-length": 1, "x-overflow": "reject-publish", "x-queue-type": "classic"}


def _driver() -> Any:
    try:
        import pika  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            "the rabbitmq store needs the pika package: pip install 'beatless[rabbitmq]'"
        ) from None
    return pika


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


class RabbitMQStore(ClaimStore):
    """Claims in a RabbitMQ broker, shared by every node that uses the same virtual host
    and prefix. See the module docstring for what is kept and why.

    ``url`` is ``amqp://user:password@host:port/vhost`` (or ``amqps://``); pika's own URL
    options (``heartbeat``, ``ssl_options``, ...) pass through. The store's options may
    be given in the URL too; keywords win: ``durable`` (default true: durable queues and
    persistent messages, which survive a broker restart; false: transient ones, cheaper,
    and a restart then reads as a store that lost its memory), ``timeout`` (seconds,
    ``"2s"``; to connect and for each call), ``channels`` (claims run at once, each on a
    channel), ``prefix``. ``clock`` gives the time for lateness (seconds, ``time.time``).

    Nothing is sent until the first call. An unreachable broker raises
    :class:`~beatless.errors.StoreUnavailable`; a refused login or virtual host raises
    :class:`~beatless.errors.StoreError`. The password never appears in ``repr``, logs
    or errors. One store object may be shared by the threads of a process.

    The store does not check run leases (:attr:`checks_overlap` is false): reading the
    run-lease record of a firing's address would mean fetching another node's message
    from its slot, which opens the slot to a second claim. A firing whose entry skips
    overlapping runs is claimed as any other, never answered
    :attr:`~beatless.stores.base.Outcome.OVERLAP`, and enqueued; the worker's own
    run-lease check (:mod:`beatless.runs`, claims of this store like any other) refuses
    the run while another run of its address holds the run lease. But a renewal fetches
    the node's own message and publishes a fresh one: a claim of another node that lands
    in that one round trip takes the slot, and the renewing node gets ``HELD``. So the
    store does not hold run leases (:attr:`holds_run_leases` is false) and a schedule
    with ``overlap = "skip"`` is refused at start on it.
    """

    name = "rabbitmq"
    checks_overlap = False
    holds_run_leases = False

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        prefix: str | None = None,
        durable: bool | str | None = None,
        timeout: DurationLike | None = None,
        channels: int | str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        from beatless.stores import _amqp

        pika = _driver()
        self._where = mask_url(url)
        self._secrets = secrets_of(url)
        given, rest = _split_url(url, self._where)
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(
                f"rabbitmq store: namespace must be a non-empty string, got {namespace!r}"
            )
        self.prefix = _prefix(prefix if prefix is not None else given.get("prefix"), namespace)
        self.durable = _flag(durable if durable is not None else given.get("durable", "true"))
        seconds = as_timedelta(
            timeout if timeout is not None else given.get("timeout", DEFAULT_TIMEOUT),
            name="rabbitmq store: timeout",
        ).total_seconds()
        if seconds <= 0:
            raise ConfigError(f"rabbitmq store: timeout must be positive, got {timeout!r}")
        width = _count(
            channels if channels is not None else given.get("channels", DEFAULT_CHANNELS)
        )
        try:
            params = pika.URLParameters(rest)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"rabbitmq store: bad URL {self._where}: {self._mask(exc)}") from None
        params.socket_timeout = params.stack_timeout = seconds
        params.blocked_connection_timeout = seconds
        self._session = _amqp.Session(
            params, width=width, timeout=seconds, where=self._where, setup=self._declarations
        )
        self._amqp = _amqp
        self._ledger = _Ledger.of(f"{params.host}:{params.port}{params.virtual_host}", self.prefix)
        self._clock, self._monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._forgot_before_ms: int | None = None
        self._closed = False
        self._exchange = f"{self.prefix}slots"
        self._epoch_queue = f"{self.prefix}epoch"

    def __repr__(self) -> str:
        return f"RabbitMQStore({self._where!r}, prefix={self.prefix!r}, durable={self.durable})"

    # -- the contract ---------------------------------------------------------------

    def time_ms(self) -> int:
        """The local clock: RabbitMQ has none to read."""
        return int(self._clock() * 1_000)

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"rabbitmq store: lease_ms must be positive, got {lease_ms}")
        if not requests:
            return []
        with self._lock:
            self._setup("claim")
            self._follow_epoch()
            return self._claim_batch(requests, node, lease_ms)

    def commit(self, ids: Sequence[str], *, node: str) -> list[bool]:
        if not ids:
            return []
        with self._lock:
            self._setup("commit")
            if self.epoch is None:
                self.epoch = self._read_epoch()
            now = self._monotonic()
            holds = [self._ledger.get(node, id_) for id_ in ids]
            work = [(i, h) for i, h in enumerate(holds) if h is not None and h.runs(now)]
            scripts = [self._commit_one(ids[i], hold) for i, hold in work]
            done = [h is not None and h.state == "committed" for h in holds]
            for (i, hold), ok in zip(work, self._run(scripts, "commit"), strict=True):
                done[i] = ok is True
                self._ledger.put(
                    node, ids[i], replace(hold, state="committed") if done[i] else None
                )
            return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        if not ids:
            return
        with self._lock:
            self._setup("release")
            now = self._monotonic()
            scripts = []
            for id_ in dict.fromkeys(ids):
                hold = self._ledger.get(node, id_)
                if hold is None or hold.state != "pending":
                    continue
                self._ledger.put(node, id_, replace(hold, state="released"))
                if hold.runs(now, GET_GUARD):
                    scripts.append(self._take_back(self._slot(id_), hold.token))
            self._run(scripts, "release")

    def probe(self) -> None:
        """Declare a queue under the prefix (expiring in 10 s), publish a message to it
        with a confirm, get it back, and delete the queue."""
        with self._lock:
            self._setup("probe")
            queue, value = f"{self.prefix}probe.{uuid.uuid4().hex}", uuid.uuid4().hex.encode()
            (got,) = self._run([self._probe_script(queue, value)], "probe")
        if isinstance(got, BaseException):
            raise StoreError(f"rabbitmq store {self._where}: probe: {self._mask(got)}")
        if got != value:
            raise StoreError(f"rabbitmq store {self._where}: probe: wrote {value!r}, read {got!r}")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._pid == os.getpid():
                self._session.close()

    # -- claims -----------------------------------------------------------------------

    def _claim_batch(
        self, requests: Sequence[ClaimRequest], node: str, lease_ms: int
    ) -> list[Outcome]:
        now = self._monotonic()
        self._ledger.sweep(now)
        outcomes, first = self._triage(requests, node, now)
        todo = [i for i in first.values() if outcomes[i] is None]
        for _attempt in range(2):  # once more for what was refused before it was sent
            scripts = [self._claim_script(requests[i], node, lease_ms) for i in todo]
            again = []
            for i, result in zip(todo, self._run(scripts, "claim"), strict=True):
                if result is _RETRY:
                    again.append(i)
                else:
                    outcomes[i] = self._settle(requests[i], node, result, now)
            todo = again
        return [outcomes[first[r.id]] or Outcome.HELD for r in requests]

    def _triage(
        self, requests: Sequence[ClaimRequest], node: str, now: float
    ) -> tuple[list[Outcome | None], dict[str, int]]:
        """What is decided without the broker: this process's own live claim under
        another tag (``FOREIGN``), ``LATE`` and ``EARLY`` on the local clock. Also the
        index of the first request of each firing (the same firing twice in a batch)."""
        now_ms = int(self._clock() * 1_000)
        outcomes: list[Outcome | None] = [None] * len(requests)
        first: dict[str, int] = {}
        for i, r in enumerate(requests):
            if first.setdefault(r.id, i) != i:
                continue
            hold = self._ledger.get(node, r.id)
            if hold is not None and hold.runs(now):
                if r.tag and hold.tag and r.tag != hold.tag:
                    outcomes[i] = Outcome.FOREIGN
            elif r.is_late(now_ms):
                outcomes[i] = Outcome.LATE
            elif r.is_early(now_ms):
                outcomes[i] = Outcome.EARLY
        return outcomes, first

    def _settle(self, r: ClaimRequest, node: str, result: Any, now: float) -> Outcome:
        """Note a claim's result in the ledger; its outcome. A script whose channel closed
        under it may have left its claim in the slot: held until that lease ends."""
        if isinstance(result, BaseException) and not isinstance(result, self._amqp.ChannelLost):
            raise result
        outcome: Outcome = result[0] if isinstance(result, tuple) else Outcome.HELD
        hold: _Hold | None = result[1] if isinstance(result, tuple) else None
        self._ledger.put(node, r.id, hold)
        if outcome is Outcome.HELD:
            self._ledger.saw_held(node, r.id, now)
        return outcome

    def _claim_script(self, r: ClaimRequest, node: str, lease_ms: int) -> Any:
        """One claim, as a script of steps (see ``_amqp``): renew this node's own claim,
        or ask whether the firing is committed, publish to its slot, and check again."""
        hold = self._ledger.get(node, r.id)
        if hold is not None and hold.runs(self._monotonic()):
            return self._renew(r, node, lease_ms, hold)
        return self._first_claim(r, node, lease_ms)

    def _first_claim(self, r: ClaimRequest, node: str, lease_ms: int) -> Any:
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
            yield a.Bind(queue, self._exchange, f"done.{r.id}")
            return Outcome.FORGOTTEN, replace(hold, state="committed")
        won = attempt.first and not self._ledger.was_held(node, r.id)
        return (Outcome.WON if won else Outcome.TAKEOVER), hold

    def _publish_claim(
        self, r: ClaimRequest, node: str, lease_ms: int, token: str, attempt: _Attempt
    ) -> Any:
        """Publish the claim through the slot's binding; if nothing is bound yet, declare
        the slot, publish to it by name, and bind it for the claims that come after."""
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
        elif confirm is a.Confirm.ACK:
            yield a.Declare(queue, passive=True, nowait=True)  # outlive the lease from now
        attempt.won = confirm is a.Confirm.ACK
        return attempt.won

    def _renew(self, r: ClaimRequest, node: str, lease_ms: int, hold: _Hold) -> Any:
        """This node's own pending claim: publish a fresh one in its place (``WON``), or
        ``HELD`` if another claim took the slot while the old one was out."""
        a = self._amqp
        if not hold.runs(self._monotonic(), GET_GUARD):
            return Outcome.HELD, hold  # too close to its end to touch it safely
        queue = self._slot(r.id)
        got = yield a.Get(queue)
        if got is None or _token_of(got.body) != hold.token:
            if got is not None:
                yield a.Settle(got.delivery_tag, ack=False)
            return Outcome.HELD, None
        token = new_token()[:16]
        sent = self._monotonic()
        confirm = yield a.Publish(
            "", queue, _claim_body(token, lease_ms, r.tag, node), lease_ms, self.durable
        )
        yield a.Settle(got.delivery_tag, ack=True)
        if confirm is not a.Confirm.ACK:
            return Outcome.HELD, None
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
            logger.warning("rabbitmq store: slot %s held another claim than ours", queue)
            yield a.Settle(got.delivery_tag, ack=False)
        return None

    def _is_committed(self, id_: str) -> Any:
        return self._amqp.Publish(self._exchange, f"done.{id_}", b"?", ttl_ms=0)

    def _is_forgotten(self, r: ClaimRequest) -> bool:
        return self._forgot_before_ms is not None and r.release_ms < self._forgot_before_ms

    # -- the epoch ----------------------------------------------------------------------

    def _follow_epoch(self) -> None:
        """Adopt the broker's epoch; when it changed, keep the horizon for ``FORGOTTEN``."""
        seen = self.epoch
        if seen is not None:
            probe = self._amqp.Publish(self._exchange, f"epoch.{seen.token}", b"?", ttl_ms=0)
            (confirm,) = self._run([_single(probe)], "claim")
            if isinstance(confirm, self._amqp.ChannelLost):  # the exchange itself is gone
                (error,) = self._run([self._declare_exchange()], "claim")
                if error is not None:
                    raise StoreError(f"rabbitmq store {self._where}: cannot claim: {error}")
            elif confirm is not self._amqp.Confirm.RETURNED:
                return
        current = self._read_epoch()
        self._forgot_before_ms = horizon_ms(seen, current, self._forgot_before_ms)
        if seen is not None and has_changed(seen, current):
            self._ledger.clear()  # the broker lost the claims this process held
            logger.warning(
                "rabbitmq store %s: %s",
                shown(self._where, quoted=False),
                describe_change(seen, current),
            )
        self.epoch = current

    def _read_epoch(self) -> Epoch:
        for _attempt in range(EPOCH_READS):
            (result,) = self._run([self._epoch_script()], "read the epoch")
            if isinstance(result, Epoch):
                return result
            if isinstance(result, StoreError):
                raise result
            if isinstance(result, self._amqp.ChannelLost):
                if result.code != 406:  # not PRECONDITION_FAILED: refused, or the link went
                    raise StoreError(
                        f"rabbitmq store {self._where}: cannot read the epoch: queue "
                        f"{self._epoch_queue} refused ({result.text})"
                    )
                raise StoreError(
                    f"rabbitmq store {self._where}: cannot read the epoch: queue "
                    f"{self._epoch_queue} refused ({result.text}); every node of a namespace "
                    f"must use the same durable= setting"
                )
            time.sleep(0.01)  # another node is reading it this instant
        raise StoreUnavailable(f"rabbitmq store {self._where}: the epoch record stays out of reach")

    def _epoch_script(self) -> Any:
        a, queue = self._amqp, self._epoch_queue
        absent = (yield a.Publish("", queue, b"?", ttl_ms=0)) is a.Confirm.RETURNED
        yield a.Declare(queue, durable=self.durable, arguments=_SLOT)
        if absent:
            record = f"{FORMAT_VERSION}|{int(self._clock() * 1_000)}|{new_token()}".encode()
            yield a.Publish("", queue, record, persistent=self.durable)
        got = yield a.Get(queue)
        if got is None:
            return None
        yield a.Settle(got.delivery_tag, ack=False)
        epoch = _parse_epoch(got.body)
        if epoch is None:
            return StoreError(
                f"rabbitmq store {self._where}: unreadable epoch record {got.body!r} in {queue}"
            )
        yield a.Bind(queue, self._exchange, f"epoch.{epoch.token}")
        return epoch

    # -- plumbing -----------------------------------------------------------------------

    def _slot(self, id_: str) -> str:
        return f"{self.prefix}c.{id_}"

    def _probe_script(self, queue: str, value: bytes) -> Any:
        a = self._amqp
        args = {"x-expires": PROBE_TTL_MS, "x-queue-type": "classic"}
        yield a.Declare(queue, durable=self.durable, arguments=args)
        yield a.Publish("", queue, value)
        got = yield a.Get(queue)
        if got is not None:
            yield a.Settle(got.delivery_tag, ack=True)
        yield a.Delete(queue)
        return None if got is None else got.body

    def _setup(self, what: str) -> None:
        if self._closed:
            raise StoreError(f"rabbitmq store {self._where}: cannot {what}: the store is closed")
        if self._pid != os.getpid():  # the socket belongs to the parent process
            self._session.abandon()
            self._pid = os.getpid()
            self._ledger.clear()

    def _declarations(self) -> list[Any]:
        """What each new connection declares first: the exchange commits bind to."""
        return [self._declare_exchange()]

    def _declare_exchange(self) -> Any:
        a = self._amqp
        try:
            yield a.DeclareExchange(self._exchange, self.durable)
        except a.ChannelLost as lost:
            if lost.code != 406:  # not PRECONDITION_FAILED: refused (403), or the link went
                return StoreError(f"exchange {self._exchange} not declared ({lost.text})")
            return StoreError(
                f"exchange {self._exchange} exists with other settings ({lost.text}); every node "
                f"of a namespace must use the same durable= setting"
            )
        return None

    def _run(self, scripts: list[Any], what: str) -> list[Any]:
        try:
            return self._session.run(scripts)
        except StoreError as exc:
            raise type(exc)(self._mask(exc)) from None

    def _mask(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


@dataclass(slots=True)
class _Attempt:
    """How far one claim got: published (outcome unknown until confirmed), in a slot no
    claim had reached (a first win), won; and when it was published (monotonic)."""

    sent: bool = False
    first: bool = False
    won: bool = False
    at: float = 0.0


_RETRY = object()
"""A claim to run once more: its channel closed before it published anything."""


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


def _split_url(url: str, where: str) -> tuple[dict[str, str], str]:
    """The store's own options from the URL's query, and the URL for pika without them."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("amqp", "amqps"):
        raise ConfigError(
            f"rabbitmq store: unknown URL scheme {parts.scheme!r} in {where}: use "
            f"amqp://user:password@host:5672/vhost or amqps://..."
        )
    if not parts.hostname:
        raise ConfigError(f"rabbitmq store: URL {where} names no host")
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in _OPTIONS}
    rest = urlencode([(k, v) for k, v in pairs if k not in _OPTIONS])
    return ours, urlunsplit(parts._replace(query=rest))


def _prefix(prefix: str | None, namespace: str) -> str:
    value = prefix if prefix is not None else f"beatless.{namespace}."
    if not value or len(value.encode()) > _MAX_PREFIX or value.startswith("amq."):
        raise ConfigError(
            f"rabbitmq store: prefix {value!r} must be 1 to {_MAX_PREFIX} bytes and not start "
            f"with 'amq.' (queue names are at most 255 bytes)"
        )
    return value


def _flag(value: bool | str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"rabbitmq store: durable must be true or false, got {value!r}")


def _count(value: int | str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 256:
        raise ConfigError(f"rabbitmq store: channels must be 1 to 256, got {value!r}")
    return count
