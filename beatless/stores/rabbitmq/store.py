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
``{prefix}notes``, a stream queue
    The notes (:meth:`~RabbitMQStore.post`): a stream is the one kind of queue that is
    read without taking its messages. A post is one message, ``{"v": 1, "notes":
    [[kind, key, value, expires_ms, keep], ...]}`` in JSON, its expiry on the local
    clock, published with a confirm (one round trip; the first post of a namespace
    declares the stream). A read (:meth:`~RabbitMQStore.read_notes`) consumes the stream
    from where this store object stopped (see ``_amqp.Read`` for how it knows the end)
    and folds it as the broker would if it could: the last note of a kind and key
    wins, each post's ``keep`` is applied after its notes, and notes whose expiry passed
    are dropped. The stream's retention trims, not the reads: messages are kept
    ``x-max-age`` 25 h (a note may live at most 24 h: the hour more covers skew between
    the broker's clock, which trims, and the nodes', which expire), in segments of
    8 MB so that trimming happens, and never more than 500 MB.

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

A renewal (a node claiming again a firing whose claim it holds: a run lease or a
once-only record at every heartbeat) takes its message out of the slot and publishes a
fresh one. It takes it with a consumer, not ``basic.get``, and every claim the slot
takes is followed by a passive declare that counts the slot's consumers: a claim that
finds one is a renewal's gap, and takes its message back (``HELD``) while the renewal
publishes again until the slot takes its fresh claim. The renewal cancels its consumer
only after that, then acknowledges the old message, so no claim wins a slot whose holder
is renewing it. A renewer whose connection drops mid-renewal loses its claim (its old
message goes back to the slot, and expires when its lease would have ended).

Lateness and earliness are judged on the local clock (``clock``): RabbitMQ has no clock
to read. A live claim decides first all the same: a late claim asks, without a write,
whether the firing is committed (``LOST``) or its slot holds a claim (``HELD``).
Leases are measured by the broker (message TTL, ``x-expires``), so skew between nodes
cannot make a live lease look expired; a commit counts as made only if the broker
confirmed it before the node's own monotonic clock reached the end of the lease. So
nothing of the node's own may hold a commit up: calls made at once, from threads of
their own, each run on a connection of their own (``_amqp.Sessions``), and the notes on
one more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from beatless.core._drivers import driver
from beatless.core._logtext import shown
from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.stores._epoch import adopt, new_token
from beatless.stores.base import (
    ClaimRequest,
    ClaimStore,
    Epoch,
    Fact,
    Note,
    Outcome,
    StoreFacts,
    Verdict,
)
from beatless.stores.rabbitmq._notes import (
    NOTE_TTL_LIMIT_MS,
    NOTES_PREFETCH,
    NotesStream,
    _Board,
    _check_notes,
    _notes_body,
)
from beatless.stores.rabbitmq._slots import (
    _RETRY,
    _SLOT,
    FORMAT_VERSION,
    GET_GUARD,
    SlotScripts,
    _Hold,
    _Ledger,
    _parse_epoch,
    _single,
)
from beatless.stores.rabbitmq._url import count, flag, prefix_of, split_url

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
DEFAULT_CHANNELS = 16
EPOCH_READS = 20
PROBE_TTL_MS = 10_000


def _driver() -> Any:
    return driver("pika", "the rabbitmq store")


class RabbitMQStore(SlotScripts, NotesStream, ClaimStore):
    """Claims in a RabbitMQ broker, shared by every node that uses the same virtual host
    and prefix. See the module docstring for what is kept and why.

    ``url`` is ``amqp://user:password@host:port/vhost`` (or ``amqps://``); pika's own URL
    options (``heartbeat``, ``ssl_options``, ...) pass through. The store's options may
    be given in the URL too; keywords win: ``durable`` (default true: durable queues and
    persistent messages, which survive a broker restart; false: transient ones, cheaper,
    and a restart then reads as a store that lost its memory), ``timeout`` (seconds,
    ``"2s"``; to connect and for each call), ``channels`` (claims run at once, each on a
    channel), ``prefix``. ``clock`` gives the time for lateness (seconds, ``time.time``).

    A post costs one message in the notes stream, its JSON and about a hundred bytes
    more, kept 25 h (until its segment is trimmed) whatever the notes' time to live: keep
    posts small and few. A read costs two round trips and a channel opened again, and
    reads what was posted since this store object's last read; the first read of a
    store object reads every message the stream still holds (up to 25 h of posts). Each
    store object keeps the live notes it has read, of every kind, in memory (kind, key,
    value and expiry of each). On a cluster, a read may miss a post of the last
    moments, until the node it reads from has its copy. A note may live at most 24 h:
    a longer ``ttl_ms`` is refused.

    The notes a commit carries (each firing's history) are one post, published in the
    same batch of channel scripts as the commit's binds, so they add no round trip (until
    this store object has seen the notes stream work, they are posted right after the
    commit instead: a stream still starting may close the connection under the batch).
    The slots and the stream share no operation, so :attr:`commits_notes` is false: a
    node that dies mid-commit may leave a committed firing without its history note, or
    the note of a firing it sent whose claim then runs out pending.

    Nothing is sent until the first call. An unreachable broker raises
    :class:`~beatless.errors.StoreUnavailable`; a refused login or virtual host raises
    :class:`~beatless.errors.StoreError`. The password never appears in ``repr``, logs
    or errors. One store object may be shared by the threads of a process: calls made at
    once run on connections of their own (one more is opened when every one is in use),
    so a call never waits for another thread's.

    The store does not check run leases (:attr:`checks_overlap` is false): reading the
    run-lease record of a firing's address would mean fetching another node's message
    from its slot, which opens the slot to a second claim. A firing whose entry skips
    overlapping runs is claimed as any other, never answered
    :attr:`~beatless.stores.base.Outcome.OVERLAP`, and enqueued; the worker's own
    run-lease check (:mod:`beatless.node.runs`, claims of this store like any other) refuses
    the run while another run of its address holds the run lease. A worker's heartbeat
    renews the run lease without ever leaving the slot to another claim (see the module
    docstring), so a run lease excludes every other run while it is renewed.
    """

    name = "rabbitmq"
    commits_notes = False
    checks_overlap = False

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
        pika = _driver()  # before _amqp, which imports pika as it loads
        from beatless.stores.rabbitmq import _amqp

        self._where = mask_url(url)
        self._secrets = secrets_of(url)
        given, rest = split_url(url, self._where)
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(
                f"rabbitmq store: namespace must be a non-empty string, got {namespace!r}"
            )
        self.prefix = prefix_of(prefix if prefix is not None else given.get("prefix"), namespace)
        self.durable = flag(durable if durable is not None else given.get("durable", "true"))
        seconds = as_timedelta(
            timeout if timeout is not None else given.get("timeout", DEFAULT_TIMEOUT),
            name="rabbitmq store: timeout",
        ).total_seconds()
        if seconds <= 0:
            raise ConfigError(f"rabbitmq store: timeout must be positive, got {timeout!r}")
        width = count(channels if channels is not None else given.get("channels", DEFAULT_CHANNELS))
        try:
            params = pika.URLParameters(rest)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"rabbitmq store: bad URL {self._where}: {self._mask(exc)}") from None
        params.socket_timeout = params.stack_timeout = seconds
        params.blocked_connection_timeout = seconds
        # A claim, a commit, a release each run on a connection no other call is using, so
        # a call of one thread never waits for another's: a node's loop commits the
        # firings it sent, whose leases are running, while its board claims missed-firing
        # markers (a long call, at a node's start, on a loaded broker).
        self._sessions = _amqp.Sessions(
            lambda: _amqp.Session(
                params, width=width, timeout=seconds, where=self._where, setup=self._declarations
            ),
            where=self._where,
        )
        # Notes have a connection and a lock of their own: a stream read that waits (a
        # first read of a long stream, a stream being created) never holds up a claim or
        # a commit, whose lease is running.
        self._notes_session = _amqp.Session(
            params, width=1, timeout=seconds, where=self._where, prefetch=NOTES_PREFETCH
        )
        self._notes_lock = threading.Lock()
        self._amqp = _amqp
        self._ledger = _Ledger.of(f"{params.host}:{params.port}{params.virtual_host}", self.prefix)
        self._clock, self._monotonic = clock, monotonic
        self._epoch_lock = threading.Lock()
        self._pid = os.getpid()
        self._forgot_before_ms: int | None = None
        self._closed = False
        self._exchange = f"{self.prefix}slots"
        self._epoch_queue = f"{self.prefix}epoch"
        self._notes_queue = f"{self.prefix}notes"
        self._board = _Board()
        self._notes_seen = False

    def __repr__(self) -> str:
        return f"RabbitMQStore({self._where!r}, prefix={self.prefix!r}, durable={self.durable})"

    def facts(self) -> StoreFacts:
        """The queues this store declares: classic slot queues (a queue of length one
        that refuses a second message needs the classic type), durable or not. Read from
        its own settings: nothing is asked of the broker."""
        queues = Fact(
            "slot queues",
            "classic",
            why="each firing's slot lives on one node of a cluster, not replicated",
        )
        store = f"rabbitmq store {self._where}"
        if self.durable:
            return StoreFacts(store, (queues, Fact("durable", "yes")))
        why = (
            "transient queues and messages: a broker restart forgets every claim, and the "
            "firings released before it are reported forgotten; drop ?durable=false"
        )
        return StoreFacts(store, (queues, Fact("durable", "no", Verdict.WARN, why)))

    # -- the contract ---------------------------------------------------------------

    def time_ms(self) -> int:
        """The local clock: RabbitMQ has none to read."""
        return int(self._clock() * 1_000)

    reseeds = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"rabbitmq store: lease_ms must be positive, got {lease_ms}")
        if not requests:
            return []
        with self._connection("claim") as session:
            self._follow_epoch(session)
            return self._claim_batch(requests, node, lease_ms, session, hold_off)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        _check_notes(notes)
        done = self._commit(ids, node) if ids else []
        self.post(notes)  # right after: the notes stream is not the claims' queues
        return done

    def _commit(self, ids: Sequence[str], node: str) -> list[bool]:
        with self._connection("commit") as session:
            if self.epoch is None:
                self.epoch = self._read_epoch(session)
            now = self._monotonic()
            holds = [self._ledger.get(node, id_) for id_ in ids]
            work = [(i, h) for i, h in enumerate(holds) if h is not None and h.runs(now)]
            scripts = [self._commit_one(ids[i], hold) for i, hold in work]
            results = self._run(scripts, "commit", session)
            done = [h is not None and h.state == "committed" for h in holds]
            for (i, hold), ok in zip(work, results, strict=True):
                done[i] = ok is True
                self._ledger.put(
                    node, ids[i], replace(hold, state="committed") if done[i] else None
                )
            return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        if not ids:
            return
        with self._connection("release") as session:
            now = self._monotonic()
            scripts = []
            for id_ in dict.fromkeys(ids):
                hold = self._ledger.get(node, id_)
                if hold is None or hold.state != "pending":
                    continue
                self._ledger.put(node, id_, replace(hold, state="released"))
                if hold.runs(now, GET_GUARD):
                    scripts.append(self._take_back(self._slot(id_), hold.token))
            self._run(scripts, "release", session)

    notes_live_ms = NOTE_TTL_LIMIT_MS
    why_not_kept = "its notes live at most 24 hours, in a stream trimmed by age"

    def post(self, notes: Sequence[Note]) -> None:
        if not notes:
            return
        _check_notes(notes)
        with self._notes_lock:
            self._setup("post notes")
            body = _notes_body(notes, self.time_ms())
            self._use_notes(lambda: self._write_notes(body, "post notes"))

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        if not kinds:
            return {}
        with self._notes_lock:
            self._setup("read notes")
            self._use_notes(self._catch_up)
            return self._board.read(kinds, self.time_ms())

    def probe(self) -> None:
        """Declare a queue under the prefix (expiring in 10 s), publish a message to it
        with a confirm, get it back, and delete the queue."""
        with self._connection("probe") as session:
            queue, value = f"{self.prefix}probe.{uuid.uuid4().hex}", uuid.uuid4().hex.encode()
            (got,) = self._run([self._probe_script(queue, value)], "probe", session)
        if isinstance(got, BaseException):
            raise StoreError(f"rabbitmq store {self._where}: probe: {self._mask(got)}")
        if got != value:
            raise StoreError(f"rabbitmq store {self._where}: probe: wrote {value!r}, read {got!r}")

    def close(self) -> None:
        """Close the connections; one in use by a call of another thread is closed when
        that call ends."""
        if self._closed:
            return
        self._closed = True
        if self._pid == os.getpid():
            self._sessions.close()
            with self._notes_lock:
                self._notes_session.close()

    # -- claims -----------------------------------------------------------------------

    def _claim_batch(
        self,
        requests: Sequence[ClaimRequest],
        node: str,
        lease_ms: int,
        session: Any,
        hold_off: bool,
    ) -> list[Outcome]:
        now = self._monotonic()
        self._ledger.sweep(now)
        outcomes, first = self._triage(requests, node, now)
        late = [i for i in first.values() if outcomes[i] is Outcome.LATE]
        scripts = [self._look(requests[i].id) for i in late]
        looks = self._run(scripts, "claim", session) if late else []
        for i, look in zip(late, looks, strict=True):
            if isinstance(look, BaseException):
                raise look
            outcomes[i] = look  # a live claim decides first, even for a late firing
        todo = [i for i in first.values() if outcomes[i] is None]
        for _attempt in range(2):  # once more for what was refused before it was sent
            scripts = [self._claim_script(requests[i], node, lease_ms, hold_off) for i in todo]
            again = []
            for i, result in zip(todo, self._run(scripts, "claim", session), strict=True):
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

    # -- notes --------------------------------------------------------------------------

    # -- the epoch ----------------------------------------------------------------------

    def _follow_epoch(self, session: Any) -> None:
        """Adopt the broker's epoch; when it changed, keep the horizon for ``FORGOTTEN``."""
        seen = self.epoch
        if seen is not None:
            probe = self._amqp.Publish(self._exchange, f"epoch.{seen.token}", b"?", ttl_ms=0)
            (confirm,) = self._run([_single(probe)], "claim", session)
            if isinstance(confirm, self._amqp.ChannelLost):  # the exchange itself is gone
                (error,) = self._run([self._declare_exchange()], "claim", session)
                if error is not None:
                    raise StoreError(f"rabbitmq store {self._where}: cannot claim: {error}")
            elif confirm is not self._amqp.Confirm.RETURNED:
                return
        current = self._read_epoch(session)
        label = f"rabbitmq store {shown(self._where, quoted=False)}"
        with self._epoch_lock:  # calls of two threads may find the change at once
            if adopt(self, current, logger=logger, label=label):
                self._ledger.clear()  # the broker lost the claims this process held

    def _read_epoch(self, session: Any) -> Epoch:
        for _attempt in range(EPOCH_READS):
            (result,) = self._run([self._epoch_script()], "read the epoch", session)
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
        if self._pid != os.getpid():  # the sockets belong to the parent process
            self._sessions.abandon()
            self._notes_session.abandon()
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

    @contextlib.contextmanager
    def _connection(self, what: str) -> Iterator[Any]:
        """A session of this call's own (see ``_amqp.Sessions``), for ``what``."""
        self._setup(what)
        with self._sessions.take(what) as session:
            yield session

    def _run(self, scripts: list[Any], what: str, session: Any) -> list[Any]:
        try:
            results: list[Any] = session.run(scripts)
        except StoreError as exc:
            raise type(exc)(self._mask(exc)) from None
        return results

    def _mask(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text
