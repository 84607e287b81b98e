"""One AMQP 0-9-1 connection for the RabbitMQ store, driven from the calling thread.

The store's work is many small exchanges with the broker, independent from one firing
to the next: publish a message and learn whether the queue took it, declare a queue,
bind it, get a message. :meth:`Session.run` takes one *script* per firing, a generator
that yields steps and is sent each step's result, and runs up to ``width`` scripts at
once, each on a channel of its own in publisher-confirm mode. The steps of one script
run in order on one channel; a batch of any size costs a few round trips, not a few per
firing.

A :class:`Read` consumes a stream queue to its end, for the notes. :class:`Sessions` keeps
the claim connections of one store object: one for each call under way at once.

The connection is pika's ``SelectConnection`` on an I/O loop of its own that is driven
only inside :meth:`Session.run`, as pika's ``BlockingConnection`` does: heartbeats are
answered while the store works, and a connection left idle past the broker's heartbeat
timeout is closed by the broker and opened again at the next call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from beatless.core._drivers import message
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores.rabbitmq._steps import (
    Bind,
    Cancel,
    ChannelLost,
    Confirm,
    Consume,
    Declare,
    DeclareExchange,
    Delete,
    Get,
    Message,
    Publish,
    Read,
    Script,
    Settle,  # noqa: F401 - the store's scripts use it as `_amqp.Settle`
    Sleep,
    Step,
)

try:  # whoever imports this module first gets the install hint, not a ModuleNotFoundError
    import pika  # type: ignore[import-untyped]
    from pika import spec
    from pika.adapters import select_connection  # type: ignore[import-untyped]
    from pika.channel import Channel  # type: ignore[import-untyped]
except ImportError:
    raise ConfigError(message("pika", "the rabbitmq store")) from None

_CLOSE_WAIT_S = 1.0
_READ_ACK_EVERY = 100
"""A read acknowledges what it got at least this often, so the broker keeps sending."""


class _Reader:
    """How far one :class:`Read` got: the messages, the last delivery tag acknowledged,
    the deliveries since the last no-op was sent, and whether one is awaited."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.acked = 0
        self.fresh = 0
        self.syncing = False
        self.done = False
        self.timer: Any = None


class _Lane:
    """One channel, running one script at a time."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.channel: Channel | None = None
        self.ready = False
        self.script: Script | None = None
        self.index = -1
        self.step: Step | None = None
        self.returned = False
        self.reader: _Reader | None = None
        """The read this channel served: the channel is closed when its script ends."""
        self.consumer: str | None = None
        """The tag of the script's :class:`Consume` (``""`` once cancelled): a channel
        that had a consumer is closed when its script ends."""
        self.delivered = False
        self.timer: Any = None


class Session:
    """An AMQP connection with ``width`` confirm-mode channels; see the module docstring.

    ``where`` names the broker in messages (its URL with the password masked); ``setup``
    gives the scripts to run on every new connection before any other (declaring what
    a broker that restarted may have lost); ``prefetch`` is how many messages a
    :class:`Read` is sent ahead of its acknowledgements. Not thread-safe: the store
    calls it under its own lock.
    """

    def __init__(
        self,
        parameters: pika.ConnectionParameters,
        *,
        width: int,
        timeout: float,
        where: str,
        setup: Callable[[], Sequence[Script]] = tuple,
        prefetch: int = 1,
    ) -> None:
        self._parameters = parameters
        self._prefetch = prefetch
        self._setup = setup
        self._width = width
        self._timeout = timeout
        self._where = where
        self._ioloop: Any = None
        self._conn: pika.SelectConnection | None = None
        self._lanes: list[_Lane] = []
        self._failure: BaseException | None = None
        self._opened = False
        self.blocked: str | None = None
        """Why the broker blocks this connection (``low on memory``, ``low on disk``:
        ``Connection.Blocked``), until it says ``Connection.Unblocked``; ``None`` when it
        does not."""
        self.blocked_in_call: str | None = None
        """Why the broker blocked this connection at any time during the current call,
        even if it unblocked it since: a call that then runs out of time was held up by
        the alarm, and is refused as full, not as unreachable."""
        self.generation = 0
        """Counts the connections opened: a new one may reach a broker that restarted."""
        self.sent: Counter[str] = Counter()
        """AMQP methods sent, by step kind (``Publish``, ``Declare``, ...): for benchmarks."""
        self._todo: deque[tuple[int, Script]] = deque()
        self._results: list[Any] = []
        self._left = 0

    @property
    def is_open(self) -> bool:
        return self._conn is not None and self._opened and self._failure is None

    def run(self, scripts: Sequence[Script]) -> list[Any]:
        """Run ``scripts``, ``width`` at a time; their return values, in order. A script
        that raised gives its exception as its result (a :class:`ChannelLost` when its
        channel closed under it). Raises :class:`~beatless.errors.StoreUnavailable` when
        the connection fails or the run outlasts the timeout, and
        :class:`~beatless.errors.StoreFull` when the broker blocks publishing, or the run
        outlasts the timeout after the broker blocked it at any time during the call (an
        alarm that cleared just before the timeout still held the call up)."""
        if not scripts:
            return []
        deadline = time.monotonic() + self._timeout
        self.blocked_in_call = None
        self._ensure_open(deadline)
        if self.blocked is not None:
            raise StoreFull(
                f"rabbitmq store {self._where}: cannot run: the broker blocks publishing "
                f"({self.blocked}: a memory or disk alarm); nothing was sent"
            )
        return self._execute(scripts, deadline)

    def _execute(self, scripts: Sequence[Script], deadline: float) -> list[Any]:
        self._todo = deque(enumerate(scripts))
        self._results = [None] * len(scripts)
        self._left = len(scripts)
        for lane in self._lanes:
            self._next(lane)
        self._drive(lambda: self._left == 0 and self._written(), deadline, "run")
        return self._results

    def _written(self) -> bool:
        """Whether pika wrote every frame it was given, as pika's ``BlockingConnection``
        waits for: a script's last step may need no reply (an acknowledgement, another
        node's claim given back to its slot), and must reach the broker now, not at this
        connection's next call, which may be long after."""
        conn = self._conn
        return conn is None or conn._transport is None or conn._get_write_buffer_size() == 0

    def close(self) -> None:
        """Close the connection (waiting a moment for the broker's reply)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:  # a connection that failed while closing has nothing more to say
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                if conn.is_open:
                    conn.close()
                    end = time.monotonic() + _CLOSE_WAIT_S
                    while not conn.is_closed and time.monotonic() < end:
                        self._poll(end)
        finally:
            self._ioloop.close()
            self._ioloop, self._opened, self._lanes = None, False, []

    def abandon(self) -> None:
        """Forget the connection without a word to the broker (after a fork: the socket
        belongs to the parent process)."""
        self._conn, self._ioloop, self._opened, self._lanes = None, None, False, []

    # -- opening -------------------------------------------------------------------------

    def _ensure_open(self, deadline: float) -> None:
        if self._conn is not None and self.is_open:
            self._poll(time.monotonic())  # hear of a close the broker sent while idle
        if self._conn is not None and not self.is_open:
            self.close()
        if self._conn is None:
            self._connect(deadline)

    def _connect(self, deadline: float) -> None:
        self._failure, self._opened, self.blocked = None, False, None
        self._ioloop = select_connection.IOLoop()
        self._ioloop.activate_poller()
        self._conn = pika.SelectConnection(
            self._parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
            custom_ioloop=self._ioloop,
        )
        self._conn.add_on_connection_blocked_callback(self._on_blocked)
        self._conn.add_on_connection_unblocked_callback(self._on_unblocked)
        self._lanes = [_Lane(n) for n in range(self._width)]
        self.generation += 1
        try:
            self._drive(lambda: self._opened, deadline, "connect")
            for lane in self._lanes:
                self._open_lane(lane)
            self._drive(lambda: all(lane.ready for lane in self._lanes), deadline, "connect")
            self._check_setup(self._execute(self._setup(), deadline))
        except BaseException:
            self.close()
            raise

    def _check_setup(self, results: list[Any]) -> None:
        for result in results:
            if isinstance(result, BaseException):
                raise StoreError(f"rabbitmq store {self._where}: cannot connect: {result}")

    def _on_open(self, _conn: Any) -> None:
        self._opened = True

    def _on_open_error(self, _conn: Any, error: BaseException | str) -> None:
        self._failure = error if isinstance(error, BaseException) else Exception(str(error))

    def _on_blocked(self, _conn: Any, frame: Any) -> None:
        self.blocked = self.blocked_in_call = str(getattr(frame.method, "reason", "") or "blocked")

    def _on_unblocked(self, _conn: Any, _frame: Any) -> None:
        self.blocked = None

    def _on_close(self, _conn: Any, reason: BaseException) -> None:
        self._failure = reason
        for lane in self._lanes:
            lane.ready = False
            if lane.script is not None:
                self._advance(lane, error=ChannelLost(320, f"connection closed: {reason}"))

    def _open_lane(self, lane: _Lane) -> None:
        def opened(channel: Channel) -> None:
            lane.channel = channel
            channel.add_on_close_callback(lambda _ch, reason: self._on_lane_closed(lane, reason))
            channel.add_on_return_callback(lambda *_args: _mark_returned(lane))
            channel.add_callback(lambda _frame: self._on_empty(lane), [spec.Basic.GetEmpty], False)
            channel.basic_qos(prefetch_count=self._prefetch)  # for reads; claims never consume
            channel.confirm_delivery(
                ack_nack_callback=lambda frame: self._on_confirm(lane, frame),
                callback=lambda _frame: self._on_lane_ready(lane),
            )

        if self._conn is not None:
            self._conn.channel(on_open_callback=opened)

    def _on_lane_ready(self, lane: _Lane) -> None:
        lane.ready = True
        self._next(lane)

    def _on_lane_closed(self, lane: _Lane, reason: BaseException) -> None:
        lane.ready, lane.channel = False, None
        if lane.script is not None:
            code = getattr(reason, "reply_code", 0)
            self._advance(lane, error=ChannelLost(code, getattr(reason, "reply_text", str(reason))))
        if self._conn is not None and self._conn.is_open and self._failure is None:
            self._open_lane(lane)

    # -- running scripts ------------------------------------------------------------------

    def _next(self, lane: _Lane) -> None:
        """Start scripts on a free lane until one waits for a reply."""
        while lane.ready and lane.script is None and self._todo:
            lane.index, lane.script = self._todo.popleft()
            self._advance(lane, None)

    def _resume(self, lane: _Lane, value: Any = None, error: BaseException | None = None) -> None:
        """A reply (or a failure) for the lane's script: go on, then start the next."""
        if lane.script is not None:
            self._advance(lane, value, error)
        self._next(lane)

    def _advance(self, lane: _Lane, value: Any = None, error: BaseException | None = None) -> None:
        """Send the script its last step's result (or throw ``error`` into it) and issue
        its next step; steps that need no reply are done on the spot."""
        script = lane.script
        while script is not None:
            try:
                step = script.throw(error) if error is not None else script.send(value)
            except StopIteration as stop:
                self._finish(lane, stop.value)
                return
            except Exception as exc:  # the script's error is its result
                self._finish(lane, exc)
                return
            if error is not None or not lane.ready:
                script.close()  # a script must not go on on a channel that is gone
                self._finish(lane, error or ChannelLost(0, "channel closed"))
                return
            lane.step, value = step, None
            try:
                if self._issue(lane, step):
                    return  # the reply resumes the script
            except pika.exceptions.AMQPError as exc:
                error = ChannelLost(0, str(exc))

    def _issue(self, lane: _Lane, step: Step) -> bool:
        """Send ``step`` on the lane's channel; whether the script waits for a reply."""
        channel = lane.channel
        if channel is None:
            raise pika.exceptions.ChannelWrongStateError("channel closed")
        self.sent[type(step).__name__] += 1

        def reply(value: Any) -> None:
            self._resume(lane, value)

        if isinstance(step, Publish):
            lane.returned = False
            properties = pika.BasicProperties(
                delivery_mode=2 if step.persistent else 1,
                expiration=None if step.ttl_ms is None else str(step.ttl_ms),
            )
            channel.basic_publish(
                step.exchange, step.routing_key, step.body, properties, mandatory=True
            )
        elif isinstance(step, Declare):
            channel.queue_declare(
                step.queue,
                passive=step.passive,
                durable=step.durable,
                arguments=step.arguments,
                callback=None
                if step.nowait
                else lambda f: reply((f.method.message_count, f.method.consumer_count)),
            )
            return not step.nowait
        elif isinstance(step, DeclareExchange):
            channel.exchange_declare(
                step.exchange, "direct", durable=step.durable, callback=lambda _f: reply(None)
            )
        elif isinstance(step, Bind):
            channel.queue_bind(
                step.queue,
                step.exchange,
                step.routing_key,
                callback=None if step.nowait else lambda _f: reply(None),
            )
            return not step.nowait
        elif isinstance(step, Get):
            channel.basic_get(
                step.queue, lambda _c, m, _p, body: reply(Message(m.delivery_tag, body))
            )
        elif isinstance(step, Consume | Cancel | Sleep):
            return self._issue_held(lane, channel, step)
        elif isinstance(step, Delete):
            channel.queue_delete(step.queue, callback=lambda _f: reply(None))
        elif isinstance(step, Read):
            self._start_read(lane, channel, step)
        elif step.ack:
            channel.basic_ack(step.delivery_tag)
            return False
        else:
            channel.basic_nack(step.delivery_tag, requeue=True)
            return False
        return True

    def _issue_held(self, lane: _Lane, channel: Channel, step: Consume | Cancel | Sleep) -> bool:
        """The steps of a script that holds a message with a consumer."""
        if isinstance(step, Consume):
            self._start_consume(lane, channel, step)
        elif isinstance(step, Sleep):
            lane.timer = self._ioloop.call_later(step.seconds, lambda: self._on_slept(lane))
        else:
            tag, lane.consumer = lane.consumer, ""  # its channel is still closed at the end
            if not tag:
                return False
            channel.basic_cancel(tag, callback=lambda _f: self._resume(lane, None))
        return True

    def _on_confirm(self, lane: _Lane, frame: Any) -> None:
        if not isinstance(lane.step, Publish) or lane.script is None:
            return
        if isinstance(frame.method, spec.Basic.Nack):
            self._resume(lane, Confirm.NACK)
        else:
            self._resume(lane, Confirm.RETURNED if lane.returned else Confirm.ACK)

    def _on_empty(self, lane: _Lane) -> None:
        if isinstance(lane.step, Get) and lane.script is not None:
            self._resume(lane, None)

    def _finish(self, lane: _Lane, result: Any) -> None:
        self._results[lane.index] = result
        self._left -= 1
        lane.script, lane.step, lane.index = None, None, -1
        if lane.timer is not None:
            self._ioloop.remove_timeout(lane.timer)
            lane.timer = None
        if lane.reader is not None:
            self._end_read(lane)
        elif lane.consumer is not None:
            lane.consumer = None
            self._close_lane(lane)

    def _on_slept(self, lane: _Lane) -> None:
        lane.timer = None
        if isinstance(lane.step, Sleep) and lane.script is not None:
            self._resume(lane, None)

    def _close_lane(self, lane: _Lane) -> None:
        """Close a lane's channel (it is opened again): for a consumer it may still be
        sent messages, or a message it holds that goes back to its queue."""
        channel, lane.ready = lane.channel, False
        if channel is not None and channel.is_open:
            channel.close()

    # -- consuming a queue ----------------------------------------------------------------

    def _start_consume(self, lane: _Lane, channel: Channel, step: Consume) -> None:
        lane.delivered = False

        def delivered(_ch: Channel, method: Any, _properties: Any, body: bytes) -> None:
            if isinstance(lane.step, Consume) and not lane.delivered and lane.script is not None:
                lane.delivered = True
                if lane.timer is not None:
                    self._ioloop.remove_timeout(lane.timer)
                    lane.timer = None
                self._resume(lane, Message(method.delivery_tag, body))

        def waited() -> None:
            lane.timer = None
            if isinstance(lane.step, Consume) and not lane.delivered and lane.script is not None:
                lane.delivered = True
                self._resume(lane, None)

        def started(_frame: Any) -> None:
            if isinstance(lane.step, Consume) and not lane.delivered:
                lane.timer = self._ioloop.call_later(step.wait, waited)

        def consume(_frame: Any) -> None:
            lane.consumer = channel.basic_consume(step.queue, delivered, callback=started)

        channel.basic_qos(prefetch_count=1, callback=consume)  # one message held at a time

    # -- reading a stream -----------------------------------------------------------------

    def _start_read(self, lane: _Lane, channel: Channel, step: Read) -> None:
        reader = lane.reader = _Reader()

        def started(_frame: Any) -> None:
            if lane.reader is reader and not reader.messages:
                reader.timer = self._ioloop.call_later(
                    step.quiet, lambda: self._on_read_quiet(lane, reader)
                )

        def delivered(_ch: Channel, method: Any, properties: Any, body: bytes) -> None:
            if lane.reader is reader and not reader.done:
                offset = (properties.headers or {}).get("x-stream-offset", -1)
                reader.messages.append(Message(method.delivery_tag, body, int(offset)))
                self._on_read(lane, reader)

        channel.basic_consume(
            step.queue, delivered, arguments={"x-stream-offset": step.offset}, callback=started
        )

    def _on_read(self, lane: _Lane, reader: _Reader) -> None:
        if reader.timer is not None:
            self._ioloop.remove_timeout(reader.timer)
            reader.timer = None
        reader.fresh += 1
        if not reader.syncing:
            self._sync_read(lane, reader)
        elif reader.messages[-1].delivery_tag - reader.acked >= _READ_ACK_EVERY:
            self._ack_read(lane, reader)

    def _ack_read(self, lane: _Lane, reader: _Reader) -> None:
        last = reader.messages[-1].delivery_tag
        if lane.channel is not None and last > reader.acked:
            lane.channel.basic_ack(last, multiple=True)
            reader.acked = last

    def _sync_read(self, lane: _Lane, reader: _Reader) -> None:
        """Acknowledge all that came, then ask the no-op that tells whether more did."""
        self._ack_read(lane, reader)
        if lane.channel is None:
            return
        reader.fresh, reader.syncing = 0, True
        lane.channel.basic_qos(
            prefetch_count=self._prefetch, callback=lambda _f: self._on_read_synced(lane, reader)
        )

    def _on_read_synced(self, lane: _Lane, reader: _Reader) -> None:
        reader.syncing = False
        if lane.reader is not reader or reader.done:
            return
        if reader.fresh:
            self._sync_read(lane, reader)
            return
        reader.done = True
        self._resume(lane, reader.messages)

    def _on_read_quiet(self, lane: _Lane, reader: _Reader) -> None:
        reader.timer = None
        if lane.reader is reader and not reader.done and not reader.messages:
            reader.done = True
            self._resume(lane, None)

    def _end_read(self, lane: _Lane) -> None:
        """Close the channel that served a read: its consumer may still be sent messages."""
        reader, lane.reader = lane.reader, None
        if reader is not None and reader.timer is not None:
            self._ioloop.remove_timeout(reader.timer)
        self._close_lane(lane)

    # -- the I/O loop ---------------------------------------------------------------------

    def _drive(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        while not done():
            if self._failure is not None:
                raise self._error(what, self._failure)
            if time.monotonic() >= deadline:
                blocked = self.blocked or self.blocked_in_call
                self.close()
                if blocked is not None:  # even if it unblocked the connection since
                    raise StoreFull(
                        f"rabbitmq store {self._where}: cannot {what}: the broker blocked "
                        f"publishing ({blocked}: a memory or disk alarm) and did not "
                        f"answer within {self._timeout:g}s"
                    )
                raise StoreUnavailable(
                    f"rabbitmq store {self._where}: cannot {what}: no answer within "
                    f"{self._timeout:g}s"
                )
            self._poll(deadline)
        if self._failure is not None and what == "run":  # the connection went mid-run
            raise self._error(what, self._failure)

    def _poll(self, deadline: float) -> None:
        wake = self._ioloop.call_later(max(deadline - time.monotonic(), 0), lambda: None)
        try:
            self._ioloop.poll()
            self._ioloop.process_timeouts()
        finally:
            self._ioloop.remove_timeout(wake)

    def _error(self, what: str, failure: BaseException) -> StoreError:
        self.close()
        text = describe(failure)
        exc = pika.exceptions
        if isinstance(failure, exc.ProbableAuthenticationError | exc.AuthenticationError) or (
            isinstance(failure, exc.ConnectionClosedByBroker) and failure.reply_code == 403
        ):
            return StoreError(
                f"rabbitmq store {self._where}: cannot {what}: {text}; check the user name "
                f"and password"
            )
        if isinstance(failure, exc.ProbableAccessDeniedError) or (
            isinstance(failure, exc.ConnectionClosedByBroker) and failure.reply_code == 530
        ):
            return StoreError(
                f"rabbitmq store {self._where}: cannot {what}: {text}; check that the virtual "
                f"host exists and that the user may use it"
            )
        if isinstance(failure, exc.ConnectionBlockedTimeout):
            return StoreFull(
                f"rabbitmq store {self._where}: cannot {what}: the broker blocked publishing "
                f"for {self._timeout:g}s (a memory or disk alarm), and the connection was "
                f"closed: {text}"
            )
        return StoreUnavailable(f"rabbitmq store {self._where}: cannot {what}: {text}")


class Sessions:
    """The claim connections of one store object: a call runs on a session that no other
    call is using, opened when every session is busy, and left for the next call when it
    ends. Calls made at once from threads of their own (a node's loop committing a firing
    it sent while its board claims missed-firing markers) so never wait for each other:
    a commit whose lease is running is never held up by a long call of another thread.
    A process keeps as many connections as it made calls at once; one left idle past the
    broker's heartbeat timeout is opened again at its next call. Thread-safe."""

    def __init__(self, open_session: Callable[[], Session], *, where: str) -> None:
        self._open = open_session
        self._where = where
        self._lock = threading.Lock()
        self._closed = False
        self.idle: list[Session] = []
        """The sessions no call is using, the last used at the end."""
        self.opened: list[Session] = []

    @contextlib.contextmanager
    def take(self, what: str) -> Iterator[Session]:
        """A session of this call's own, for ``what`` (named in the error of a closed store)."""
        with self._lock:
            if self._closed:
                raise StoreError(
                    f"rabbitmq store {self._where}: cannot {what}: the store is closed"
                )
            session = self.idle.pop() if self.idle else None
            if session is None:
                session = self._open()
                self.opened.append(session)
        try:
            yield session
        finally:
            self._give_back(session)

    def _give_back(self, session: Session) -> None:
        """Keep ``session`` for the next call; close it if the store was closed meanwhile."""
        with self._lock:
            if not self._closed:
                self.idle.append(session)
                return
        session.close()

    def sent(self) -> Counter[str]:
        """AMQP methods sent by every session, by step kind (for benchmarks)."""
        total: Counter[str] = Counter()
        for session in self.opened:
            total.update(session.sent)
        return total

    def close(self) -> None:
        """Close the idle sessions; a session in use is closed when its call ends."""
        with self._lock:
            self._closed = True
            idle, self.idle = self.idle, []
        for session in idle:
            session.close()

    def abandon(self) -> None:
        """Forget every session without a word to the broker (after a fork: the sockets
        belong to the parent process, and so may the lock)."""
        self._lock = threading.Lock()
        self.idle, self.opened = [], []


def _mark_returned(lane: _Lane) -> None:
    lane.returned = True


def describe(error: BaseException) -> str:
    """A driver error as one line: pika nests the cause of a failed connection."""
    inner = getattr(error, "exception", None) or getattr(error, "exceptions", None)
    if isinstance(inner, list) and inner:
        return describe(inner[-1])
    if isinstance(inner, BaseException):
        return describe(inner)
    return str(error) or type(error).__name__
