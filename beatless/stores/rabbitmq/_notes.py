"""The notes of the RabbitMQ store: one stream queue, ``{prefix}notes``, read into a board.

A post is one message of the stream, ``{"v": 1, "notes": [[kind, key, value, expires_ms,
keep], ...]}``; a store object reads the stream from where it stopped into its
:class:`_Board`, which keeps the live notes of every kind (see
:class:`~beatless.stores.rabbitmq.store.RabbitMQStore` for the costs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.stores.base import Note
from beatless.stores.rabbitmq._slots import _single
from beatless.stores.rabbitmq._steps import Message

logger = logging.getLogger("beatless.stores.rabbitmq.store")

NOTES_FORMAT = 1
NOTE_TTL_LIMIT_MS = 24 * 3_600_000
"""The longest time to live of a note: the stream keeps its messages an hour longer."""
_NOTES_STREAM = {
    "x-queue-type": "stream",
    "x-max-age": "25h",
    "x-stream-max-segment-size-bytes": 8_000_000,
    "x-max-length-bytes": 500_000_000,
}
NOTES_PREFETCH = 500
"""How many messages a read of the notes is sent ahead of its acknowledgements."""
NOTES_QUIET_S = 1.0
"""How long a read waits for the first message of a stream that always has one, before
it takes the stream for new (empty, or made anew since this store object last read)."""
NOTES_READS = 3
"""How many times a read starts over (on a stream found empty, or made anew)."""
NOTES_START_S = 0.25
"""How long a new stream is given to start (RabbitMQ takes a few milliseconds)."""
_Row = tuple[str, str, str, int, int]
"""A note as posted: kind, key, value, expiry (epoch milliseconds), keep."""


class _Board:
    """The live notes a store object has read, and the message of the stream it stopped
    at: the next read starts there, and only checks that it finds the same message."""

    def __init__(self) -> None:
        self.notes: dict[str, dict[str, tuple[int, str]]] = {}
        self.offset: int | None = None
        self.digest = b""

    def clear(self) -> None:
        self.notes.clear()
        self.offset, self.digest = None, b""

    def resume_at(self) -> int | str:
        return "first" if self.offset is None else self.offset

    def follow(self, messages: list[Message], now_ms: int) -> bool:
        """Apply the messages read from :meth:`resume_at`; ``False``, with nothing
        applied, when the first is another than the one the board stopped at (the stream
        was made anew). A first message further on is fine: retention removed the one
        the board stopped at, and all before, older than any live note."""
        first = messages[0]
        if self.offset is not None and first.offset <= self.offset:
            if first.offset < self.offset or _digest(first.body) != self.digest:
                return False
            messages = messages[1:]
        for message in messages:
            self._apply(_parse_notes(message.body), now_ms)
        last = messages[-1] if messages else first
        self.offset, self.digest = last.offset, _digest(last.body)
        for kind in list(self.notes):
            self._live(kind, now_ms)
        return True

    def read(self, kinds: Sequence[str], now_ms: int) -> dict[str, dict[str, str]]:
        return {
            kind: {key: value for key, (_, value) in self._live(kind, now_ms).items()}
            for kind in kinds
        }

    def _apply(self, rows: list[_Row], now_ms: int) -> None:
        """One post: write its notes, then bound the kinds it gave a ``keep``."""
        bounds: dict[str, int] = {}
        for kind, key, value, expires_ms, keep in rows:
            self.notes.setdefault(kind, {})[key] = (expires_ms, value)
            if keep:
                bounds[kind] = keep
        for kind, keep in bounds.items():
            kept = self._live(kind, now_ms)
            if len(kept) > keep:
                by_expiry = sorted(kept.items(), key=lambda item: item[1][0])
                for key, _ in by_expiry[: len(kept) - keep]:
                    del kept[key]

    def _live(self, kind: str, now_ms: int) -> dict[str, tuple[int, str]]:
        """The notes of ``kind``, with those whose time ran out removed."""
        notes = self.notes.get(kind)
        if notes is None:
            return {}
        for key in [key for key, (until, _) in notes.items() if until < now_ms]:
            del notes[key]
        if not notes:
            del self.notes[kind]
        return notes


def _check_notes(notes: Sequence[Note]) -> None:
    for note in notes:
        if note.ttl_ms > NOTE_TTL_LIMIT_MS:
            raise ConfigError(
                f"rabbitmq store: note {note.kind[:80]!r}/{note.key[:80]!r}: ttl_ms="
                f"{note.ttl_ms} is over {NOTE_TTL_LIMIT_MS} (24 h), the longest the notes "
                f"stream keeps a message; post the note again within 24 h instead"
            )


def _notes_body(notes: Sequence[Note], now_ms: int) -> bytes:
    rows = [[n.kind, n.key, n.value, now_ms + n.ttl_ms, n.keep] for n in notes]
    record = {"v": NOTES_FORMAT, "notes": rows}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


def _parse_notes(body: bytes) -> list[_Row]:
    """The notes of one post; none for a message of another format (a newer beatless,
    another program), which is skipped."""
    try:
        record = json.loads(body)
    except ValueError:
        record = None
    rows = (
        record.get("notes")
        if isinstance(record, dict) and record.get("v") == NOTES_FORMAT
        else None
    )
    if not isinstance(rows, list):
        logger.debug("rabbitmq store: skipped a notes message of another format")
        return []
    return [
        (row[0], row[1], row[2], row[3], row[4])
        for row in rows
        if isinstance(row, list)
        and len(row) == 5
        and all(isinstance(text, str) for text in row[:3])
        and all(isinstance(number, int) for number in row[3:])
    ]


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=8).digest()


class NotesStream:
    """The notes of :class:`~beatless.stores.rabbitmq.store.RabbitMQStore`, on a session of
    their own (``_notes_session``)."""

    _amqp: Any
    _where: str
    _notes_queue: str
    _notes_session: Any
    _notes_seen: bool
    _board: _Board
    _run: Callable[..., list[Any]]
    _mask: Callable[[BaseException], str]
    time_ms: Callable[[], int]

    def _use_notes(self, call: Callable[[], bool]) -> None:
        """Run ``call`` (which says whether it found the stream); once more, a moment
        later, if it fails before this store object saw the stream work. A stream being
        created refuses a publish or a consume that comes before it started, by closing
        the channel or the whole connection (RabbitMQ 3.10): a race that only nodes
        posting their first notes at once run into."""
        try:
            self._notes_seen = call()
        except StoreError:
            if self._notes_seen:
                raise
            time.sleep(NOTES_START_S)
            self._notes_seen = call()

    def _write_notes(self, body: bytes, what: str) -> bool:
        (result,) = self._run([self._post_script(body)], what, self._notes_session)
        return self._check_post(result, what)

    def _check_post(self, result: Any, what: str) -> bool:
        """Raise what a post script ended with, if it failed; ``True``: the stream took it."""
        if isinstance(result, BaseException):
            raise StoreError(f"rabbitmq store {self._where}: cannot {what}: {self._mask(result)}")
        return True

    def _post_script(self, body: bytes) -> Any:
        """Publish one post to the stream, declaring it first if no post reached it yet."""
        a, queue = self._amqp, self._notes_queue
        confirm = yield a.Publish("", queue, body)
        if confirm is a.Confirm.RETURNED:
            try:
                yield a.Declare(queue, durable=True, arguments=_NOTES_STREAM)
            except a.ChannelLost as lost:
                return StoreError(
                    f"stream queue {queue} not declared ({lost.text}): notes need RabbitMQ "
                    f"3.9 or later, with streams enabled"
                )
            confirm = yield a.Publish("", queue, body)
        if confirm is not a.Confirm.ACK:
            return StoreError(f"stream queue {queue} refused the notes ({confirm.value})")
        return None

    def _catch_up(self) -> bool:
        """Read the stream from where this store object stopped to its end, into the
        board; whether there is a stream.

        A stream, once written, keeps its last message (RabbitMQ trims whole segments,
        when a write starts a new one), and the read starts at the last message the
        board applied: so a read that gets nothing found a stream that is empty, which
        an empty post makes readable, or made anew, which is read again from its start."""
        board, a = self._board, self._amqp
        for _attempt in range(NOTES_READS):
            start = board.resume_at()
            read = a.Read(self._notes_queue, start, NOTES_QUIET_S)
            (got,) = self._run([_single(read)], "read notes", self._notes_session)
            if isinstance(got, a.ChannelLost) and got.code == 404:  # nothing was ever posted
                board.clear()
                return False
            if isinstance(got, BaseException):
                raise StoreError(
                    f"rabbitmq store {self._where}: cannot read notes: {self._mask(got)}"
                )
            if got is None and start == "first":
                self._write_notes(_notes_body((), 0), "read notes")
            elif got is None or not board.follow(got, self.time_ms()):
                board.clear()
            else:
                return True
        raise StoreUnavailable(
            f"rabbitmq store {self._where}: cannot read notes: stream {self._notes_queue} "
            f"sent nothing within {NOTES_QUIET_S:g}s, {NOTES_READS} times"
        )
