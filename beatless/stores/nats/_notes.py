"""The notes of the NATS store: a stream beside the bucket, ``NOTES_{bucket}``.

A note is the one message of its subject ``beatless.notes.{bucket}.{hash of kind}.{hash
of key}``, whose body is ``{"v": 1, "kind", "key", "value", "ttl_ms"}``; a kept note the
one message of its subject in the stream ``KEPT_{bucket}``, with no ``ttl_ms`` (see
:mod:`beatless.stores.nats.store`). The coroutines here run on the store's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from beatless.core.durations import describe, to_ms
from beatless.errors import ConfigError
from beatless.stores.base import KeptNote, Note
from beatless.stores.nats._jetstream import ATTEMPTS, BucketMissing, NoteStream, Stored, _together

NOTE_FORMAT = 1
"""The layout of a note's body; a message of any other layout is not read as a note."""
NOTES_MAX_AGE = timedelta(hours=24)
"""How long the notes stream keeps a message, and so the longest life of a note."""
STREAM_SETTLE_S = 0.05
"""The wait before a post tries again on a stream made at that moment, times the try."""
NOTE_TOKEN_DIGITS = 32
"""Hex digits of the hash of a kind or a key in a note's subject."""


@dataclass(frozen=True, slots=True)
class _Posted:
    """A note as a read found it: ``until_ms`` is its last millisecond on the server's clock,
    ``seq`` its message."""

    key: str
    value: str
    until_ms: int
    seq: int


async def _notes_of(stream: NoteStream, kind: str) -> tuple[list[_Posted], list[_Posted]]:
    """The notes of ``kind`` that live now on the server's clock, and those that expired."""
    try:
        snapshot = await stream.snapshot(f"{_token(kind)}.*")
    except BucketMissing:  # nothing was ever posted
        return [], []
    notes = [note for m in snapshot.messages if (note := _read_note(m, kind)) is not None]
    live = [note for note in notes if note.until_ms >= snapshot.now_ms]
    return live, [note for note in notes if note.until_ms < snapshot.now_ms]


def _check_notes(notes: Sequence[Note]) -> None:
    longest = to_ms(NOTES_MAX_AGE)
    for note in notes:
        if note.ttl_ms > longest:
            raise ConfigError(
                f"nats store: note {note.kind[:80]!r}/{note.key[:80]!r}: ttl_ms "
                f"{note.ttl_ms} is over {longest}, the {describe(NOTES_MAX_AGE)} the notes "
                f"stream keeps a message"
            )


def _note_subject(note: Note) -> str:
    return f"{_token(note.kind)}.{_token(note.key)}"


def _token(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:NOTE_TOKEN_DIGITS]


def _note_body(note: Note) -> bytes:
    fields = {
        "v": NOTE_FORMAT,
        "kind": note.kind,
        "key": note.key,
        "value": note.value,
        "ttl_ms": note.ttl_ms,
    }
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def _read_note(stored: Stored, kind: str) -> _Posted | None:
    """The note in a message of ``kind``'s subjects; ``None`` for a message that is not
    one (another program's, a newer layout), left for the stream's ``max_age``."""
    try:
        body = json.loads(stored.data)
    except ValueError:  # not UTF-8, or not JSON
        return None
    if not isinstance(body, dict) or body.get("v") != NOTE_FORMAT or body.get("kind") != kind:
        return None
    key, value, ttl = body.get("key"), body.get("value"), body.get("ttl_ms")
    if not (isinstance(key, str) and isinstance(value, str) and isinstance(ttl, int)):
        return None
    return _Posted(key, value, stored.stamp_ms + ttl, stored.seq)


def _kept_body(note: KeptNote) -> bytes:
    fields = {"v": NOTE_FORMAT, "kind": note.kind, "key": note.key, "value": note.value}
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


async def _kept_of(stream: NoteStream, kind: str) -> dict[str, str]:
    """The kept notes of ``kind``; a message in another form is not read."""
    try:
        snapshot = await stream.snapshot(f"{_token(kind)}.*")
    except BucketMissing:  # nothing was ever kept
        return {}
    found = (_kept_item(stored.data, kind) for stored in snapshot.messages)
    return dict(item for item in found if item is not None)


async def _kept_keys(stream: NoteStream, kind: str, keys: Sequence[str]) -> dict[str, str]:
    """The kept notes of ``kind`` named by ``keys`` (those that exist): one request per
    key, all at once, so the read costs what it asks, not what the kind holds."""
    unique = list(dict.fromkeys(keys))
    bodies = await _together(stream.last(f"{_token(kind)}.{_token(key)}") for key in unique)
    found = (_kept_item(body, kind) for body in bodies if body is not None)
    return {key: value for key, value in (i for i in found if i is not None) if key in unique}


def _kept_item(data: bytes, kind: str) -> tuple[str, str] | None:
    """A kept note's key and value from a message body; ``None`` for another form."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if isinstance(body, dict) and body.get("v") == NOTE_FORMAT and body.get("kind") == kind:
        key, value = body.get("key"), body.get("value")
        if isinstance(key, str) and isinstance(value, str):
            return key, value
    return None


class NotesOnStreams:
    """The notes of :class:`~beatless.stores.nats.store.NATSStore`, on the streams it
    hands them (a call with ``notes=True``)."""

    replicas: int

    async def _post(self, stream: NoteStream, notes: Sequence[Note]) -> None:
        latest = {(note.kind, note.key): note for note in notes}  # a later one replaces
        bounds = {note.kind: note.keep for note in notes if note.keep}

        async def publish() -> None:
            await _together(
                stream.publish(_note_subject(n), _note_body(n)) for n in latest.values()
            )

        for attempt in range(ATTEMPTS):
            try:
                await publish()
                break
            except BucketMissing:  # no stream takes the notes yet: the first post makes it
                if attempt == ATTEMPTS - 1:
                    raise
                await stream.create(max_age_ms=to_ms(NOTES_MAX_AGE), replicas=self.replicas)
                # On 2.9, a stream that another node is creating takes no message for a moment.
                await asyncio.sleep(attempt * STREAM_SETTLE_S)
        await _together(self._trim(stream, kind, keep) for kind, keep in bounds.items())

    async def _keep(self, stream: NoteStream, notes: Sequence[KeptNote]) -> None:
        """Publish each kept note as the one message of its subject, making the stream
        (no ``max_age``) at the first write."""
        latest = {(note.kind, note.key): note for note in notes}  # a later one replaces
        for attempt in range(ATTEMPTS):
            try:
                await _together(
                    stream.publish(f"{_token(n.kind)}.{_token(n.key)}", _kept_body(n))
                    for n in latest.values()
                )
            except BucketMissing:
                if attempt == ATTEMPTS - 1:
                    raise
                await stream.create(max_age_ms=0, replicas=self.replicas)
                await asyncio.sleep(attempt * STREAM_SETTLE_S)
            else:
                return

    async def _trim(self, stream: NoteStream, kind: str, keep: int) -> None:
        """Delete the notes of ``kind`` that expired and, beyond ``keep``, those that
        expire first."""
        live, expired = await _notes_of(stream, kind)
        live.sort(key=lambda note: note.until_ms)
        doomed = expired + live[: max(0, len(live) - keep)]
        await _together(stream.delete(note.seq) for note in doomed)

    async def _read(self, stream: NoteStream, kinds: list[str]) -> dict[str, dict[str, str]]:
        found = await _together(self._read_kind(stream, kind) for kind in kinds)
        return dict(zip(kinds, found, strict=True))

    async def _read_kind(self, stream: NoteStream, kind: str) -> dict[str, str]:
        live, expired = await _notes_of(stream, kind)
        await _together(stream.delete(note.seq) for note in expired)
        return {note.key: note.value for note in live}
