"""The JetStream key-value calls of the NATS claim store, over nats-py's core client.

Only nats-py's ``request`` is used: the JetStream API is NATS's documented wire API (JSON
requests on ``$JS.API.*`` subjects; a publish to a stream's subject is answered with an
acknowledgement), so the store reads exactly the fields it needs (a stream's creation
time, the stamp of its last message) and sends exactly the headers it means, whatever
nats-py version is installed. A key-value bucket ``B`` is the stream ``KV_B`` over the
subjects ``$KV.B.>``; a key's revision is the stream sequence of its last message. Its
notes are the stream ``NOTES_B`` over the subjects ``beatless.notes.B.>``, one message per
subject, read through a consumer made for each read.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from beatless.core._logtext import shown

if TYPE_CHECKING:
    from nats.aio.client import Client

logger = logging.getLogger("beatless.stores.nats.store")
T = TypeVar("T")

CONCURRENCY = 256
"""Requests of one batch in flight at once."""
ATTEMPTS = 5
"""Reads and writes of one key in one call before it gives up as contended."""

WRONG_LAST_SEQUENCE = 10071
"""A publish whose expected last revision of its key was not the key's revision."""
STREAM_NOT_FOUND = 10059
STREAM_NAME_IN_USE = 10058
"""A stream of that name exists with another configuration (another node created it)."""
SUBJECTS_OVERLAP = 10065
"""A stream takes some of the subjects already: on 2.9, the same stream that another node
is creating at that moment."""
NO_MESSAGE_FOUND = 10037
MESSAGE_GONE = 10057
"""A message delete that found no message: another node deleted it, or a post replaced it."""
CLOCK_KEY = "clock"
"""Written at the start of a call: the stamp the server gives it is its clock then."""

EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
KV_OPERATION = "KV-Operation"
_DELETE = b"DEL"
_PURGE = b"PURGE"
NS_PER_MS = 1_000_000
END_OF_BATCH = ("404", "408")
"""The statuses that end a pull that does not wait: no message left, or fewer than asked."""
ACK_TOKENS = 9
"""The tokens of a delivered message's reply subject, on servers without domains (2.9)."""
READER_IDLE_MS = 60_000
"""How long a reader's consumer outlives its last pull, should its read be cut short."""

_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


class JetStreamError(Exception):
    """An error the JetStream API answered with: its code and description."""

    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(f"{description} (JetStream error {err_code})")
        self.err_code = err_code
        self.description = description


FULL_CODES = frozenset({10023, 10047, 10054, 10077})
"""JetStream's answers to a write refused for want of room: insufficient resources,
insufficient storage, maximum bytes exceeded, maximum messages exceeded."""


def is_full(exc: BaseException) -> bool:
    """Whether a JetStream error (or a publish acknowledgement's) refused a write for want
    of room: a storage limit, or resources the server has run out of."""
    if isinstance(exc, JetStreamError) and exc.err_code in FULL_CODES:
        return True
    text = str(exc).lower()
    return (
        "insufficient resources" in text
        or "insufficient storage" in text
        or ("maximum" in text and "exceeded" in text)
    )


class BucketMissing(Exception):
    """Nothing answers for the bucket's stream: it was never created, or deleted."""


class NoJetStream(Exception):
    """The server does not answer JetStream's API: not enabled, or not for this account."""


class ConnectFailed(Exception):
    """The client could not connect; the text is the last error the driver reported."""


class LoopStuck(Exception):
    """The link's event loop did not finish a call in time."""


@dataclass(frozen=True, slots=True)
class Message:
    """The last message of a key: its revision (0: none) and value (``None``: none, or
    a delete marker, whose revision is still what a write must expect)."""

    revision: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class BucketInfo:
    """What ``STREAM.INFO`` says of a bucket, times in epoch milliseconds."""

    created: str
    """The stream's creation instant as the server wrote it: it changes when the bucket
    is deleted and created again."""
    created_ms: int
    description: str
    max_age_ms: int
    """How long the stream keeps a message; 0 for ever."""
    replicas: int
    direct: bool
    drops_old: bool
    """A count or size limit that discards old messages: claims could vanish early."""
    purgeable: bool
    """A purge or a roll-up could empty the bucket without deleting it."""
    last_ms: int | None
    """The stamp of the stream's last message, on the server's clock."""
    server_ms: int | None
    """The server's clock when it answered, where the server tells it (newer servers than 2.9)."""
    storage: str = "file"
    """Where the stream keeps its messages: ``file``, or ``memory`` (lost on a restart)."""
    max_bytes: int = -1
    """The stream's size limit in bytes; -1 for none."""
    bytes: int = 0
    """The bytes the stream holds now."""


def parse_stamp_ms(text: str) -> int:
    """An RFC 3339 instant as the server writes it (nanoseconds, ``Z``) in epoch ms."""
    found = _STAMP.fullmatch(text)
    if found is None:
        raise ValueError(f"not an RFC 3339 instant: {text!r}")
    base, fraction, zone = found.groups()
    instant = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    millis = int((fraction or "0")[:3].ljust(3, "0"))
    return int(instant.astimezone(UTC).timestamp()) * 1_000 + millis


def bucket_info(response: dict[str, Any]) -> BucketInfo:
    """A :class:`BucketInfo` from a ``STREAM.INFO`` (or ``STREAM.CREATE``) response."""
    config, state = response["config"], response.get("state") or {}
    limited = config.get("max_msgs", -1) > 0 or config.get("max_bytes", -1) > 0
    last_ts = state.get("last_ts")
    return BucketInfo(
        created=str(response["created"]),
        created_ms=parse_stamp_ms(response["created"]),
        description=str(config.get("description") or ""),
        max_age_ms=int(config.get("max_age") or 0) // NS_PER_MS,
        replicas=int(config.get("num_replicas") or 1),
        direct=bool(config.get("allow_direct")),
        drops_old=limited and config.get("discard", "old") == "old",
        purgeable=not config.get("deny_purge") or bool(config.get("allow_rollup_hdrs")),
        last_ms=parse_stamp_ms(last_ts) if state.get("messages") and last_ts else None,
        server_ms=parse_stamp_ms(response["ts"]) if response.get("ts") else None,
        storage=str(config.get("storage") or "file"),
        max_bytes=int(config.get("max_bytes", -1)),
        bytes=int(state.get("bytes") or 0),
    )


def _last_per_subject(
    name: str, subjects: str, *, description: str, max_age_ms: int, replicas: int
) -> dict[str, object]:
    """A file stream that keeps the last message of each subject for ``max_age_ms``."""
    return {
        "name": name,
        "description": description,
        "subjects": [subjects],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": max_age_ms * NS_PER_MS,
        "max_msgs_per_subject": 1,
        "max_msg_size": -1,
        "storage": "file",
        "num_replicas": replicas,
        "duplicate_window": min(max_age_ms, 120_000) * NS_PER_MS,
        "allow_rollup_hdrs": False,
    }


def bucket_config(
    name: str, *, description: str, max_age_ms: int, replicas: int
) -> dict[str, object]:
    """The stream of a new bucket: one value per key, kept ``max_age_ms``, which no purge,
    roll-up or message delete can empty (NATS refuses to lift ``deny_purge`` later)."""
    stream = _last_per_subject(
        f"KV_{name}",
        f"$KV.{name}.>",
        description=description,
        max_age_ms=max_age_ms,
        replicas=replicas,
    )
    return stream | {
        "discard": "new",
        "allow_direct": True,
        "mirror_direct": False,
        "deny_delete": True,
        "deny_purge": True,
    }


def notes_config(name: str, subjects: str, *, max_age_ms: int, replicas: int) -> dict[str, object]:
    """The stream of a bucket's notes: the last message of each subject, kept ``max_age_ms``,
    which readers may delete one by one."""
    stream = _last_per_subject(
        name, subjects, description="beatless notes", max_age_ms=max_age_ms, replicas=replicas
    )
    return stream | {"discard": "old", "deny_delete": False, "deny_purge": False}


class Bucket:
    """One bucket's requests, each bounded by ``timeout`` seconds; ``requests`` counts them,
    its notes' as well."""

    def __init__(self, client: Client, name: str, timeout: float) -> None:
        self.client = client
        self.name = name
        self.stream = f"KV_{name}"
        self.prefix = f"$KV.{name}."
        self.timeout = timeout
        self.requests = 0
        self.notes = NoteStream(self)
        self.kept = NoteStream(self, "kept")
        """Kept notes: a stream of the same form with no ``max_age``."""

    async def _request(
        self, subject: str, payload: bytes = b"", headers: dict[str, str] | None = None
    ) -> Any:
        from nats.errors import NoRespondersError

        self.requests += 1
        try:
            return await self.client.request(
                subject, payload, timeout=self.timeout, headers=headers
            )
        except NoRespondersError:
            raise BucketMissing(self.stream) from None

    async def _api(self, call: str, body: dict[str, object] | None = None) -> dict[str, Any]:
        payload = json.dumps(body).encode() if body is not None else b""
        reply = await self._request(f"$JS.API.{call}.{self.stream}", payload)
        response: dict[str, Any] = json.loads(reply.data)
        error = response.get("error")
        if error:
            if error.get("err_code") == STREAM_NOT_FOUND:
                raise BucketMissing(self.stream)
            raise JetStreamError(int(error.get("err_code", 0)), str(error.get("description")))
        return response

    async def info(self) -> BucketInfo:
        return bucket_info(await self._api("STREAM.INFO"))

    async def keep_for(self, max_age_ms: int) -> BucketInfo:
        """Make the bucket keep each message ``max_age_ms``: its own configuration, read
        now, updated with that ``max_age`` alone (NATS takes a longer one at any time;
        what the bucket forgot is not brought back)."""
        config = dict((await self._api("STREAM.INFO"))["config"])
        config["max_age"] = max_age_ms * NS_PER_MS
        return bucket_info(await self._api("STREAM.UPDATE", config))

    async def reading(
        self, new: Callable[[], dict[str, object]], *, write_clock: bool = True
    ) -> BucketInfo:
        """The bucket's info, read after writing the key ``clock`` so that its ``last_ms``
        is the server's clock at a moment after the call began. A missing bucket is created
        with the stream configuration ``new()`` (:func:`bucket_config`); one created
        meanwhile by another node is left as it is."""
        try:
            if write_clock:
                await self.put(CLOCK_KEY, b"")
            return await self.info()
        except BucketMissing:
            pass
        try:
            await self._api("STREAM.CREATE", new())
            logger.info("nats store: created bucket %s", shown(self.name))
        except BucketMissing:  # nothing answers the JetStream API
            raise NoJetStream from None
        except JetStreamError as exc:
            # Another node created it at the same instant: by name, or (the server's
            # answer while the first create is still settling) by its subjects.
            if exc.err_code not in (STREAM_NAME_IN_USE, SUBJECTS_OVERLAP):
                raise
        await self.put(CLOCK_KEY, b"")
        return await self.info()

    async def put(self, key: str, value: bytes, last: int | None = None) -> int:
        """Write ``value`` as the key's next revision and return it. With ``last``, only
        if the key's revision is ``last`` now (0: it has none); else :class:`JetStreamError`
        with :data:`WRONG_LAST_SEQUENCE`."""
        return await self._publish(key, value, None if last is None else {EXPECTED_LAST: str(last)})

    async def delete(self, key: str, last: int) -> int:
        """Write a delete marker over the key's revision ``last``."""
        return await self._publish(key, b"", {EXPECTED_LAST: str(last), KV_OPERATION: "DEL"})

    async def _publish(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        reply = await self._request(self.prefix + key, value, headers)
        ack: dict[str, Any] = json.loads(reply.data)
        error = ack.get("error")
        if error:
            raise JetStreamError(int(error.get("err_code", 0)), str(error.get("description")))
        return int(ack["seq"])

    async def get(self, key: str, *, direct: bool) -> Message:
        """The key's last message. ``direct`` asks any replica that holds the stream (fast,
        and on one replica exact); otherwise the stream's leader answers."""
        subject = self.prefix + key
        if direct:
            reply = await self._request(f"$JS.API.DIRECT.GET.{self.stream}.{subject}")
            headers = reply.headers or {}
            if headers.get("Status") == "404":
                return Message(0, None)
            if headers.get("Status"):
                raise JetStreamError(0, f"direct get: {headers.get('Description', 'failed')}")
            op = headers.get(KV_OPERATION, "").encode()
            value = None if op in (_DELETE, _PURGE) else bytes(reply.data)
            return Message(int(headers["Nats-Sequence"]), value)
        try:
            response = await self._api("STREAM.MSG.GET", {"last_by_subj": subject})
        except JetStreamError as exc:
            if exc.err_code == NO_MESSAGE_FOUND:
                return Message(0, None)
            raise
        message = response["message"]
        raw_headers = base64.b64decode(message.get("hdrs") or "")
        if _operation(raw_headers) in (_DELETE, _PURGE):
            return Message(int(message["seq"]), None)
        return Message(int(message["seq"]), base64.b64decode(message.get("data") or ""))


@dataclass(frozen=True, slots=True)
class Stored:
    """A message as a reader receives it: its stream sequence, the server's stamp of its
    write in epoch milliseconds, and its body."""

    seq: int
    stamp_ms: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The last message of each subject under a filter, and the server's clock when the
    read began (the instant it made the read's consumer)."""

    now_ms: int
    messages: list[Stored]


class NoteStream:
    """The notes of a bucket: the stream ``NOTES_{bucket}``, its subjects under ``prefix``.

    Its requests count with the bucket's. A call on a stream that does not exist raises
    :class:`BucketMissing`; one that JetStream does not answer, :class:`NoJetStream`.
    """

    def __init__(self, bucket: Bucket, family: str = "notes") -> None:
        self.bucket = bucket
        self.client = bucket.client
        self.name = f"{family.upper()}_{bucket.name}"
        self.prefix = f"beatless.{family}.{bucket.name}."

    async def _api(self, call: str, body: dict[str, object] | None = None) -> dict[str, Any]:
        from nats.errors import NoRespondersError

        payload = json.dumps(body).encode() if body is not None else b""
        self.bucket.requests += 1
        try:
            reply = await self.client.request(
                f"$JS.API.{call}", payload, timeout=self.bucket.timeout
            )
        except NoRespondersError:
            raise NoJetStream from None
        response: dict[str, Any] = json.loads(reply.data)
        error = response.get("error")
        if error:
            if error.get("err_code") == STREAM_NOT_FOUND:
                raise BucketMissing(self.name)
            raise JetStreamError(int(error.get("err_code", 0)), str(error.get("description")))
        return response

    async def create(self, *, max_age_ms: int, replicas: int) -> None:
        """Make the stream; one another node made, or is making, is left as it is."""
        config = notes_config(
            self.name, f"{self.prefix}>", max_age_ms=max_age_ms, replicas=replicas
        )
        try:
            await self._api(f"STREAM.CREATE.{self.name}", config)
            logger.info("nats store: created stream %s", shown(self.name))
        except JetStreamError as exc:
            if exc.err_code not in (STREAM_NAME_IN_USE, SUBJECTS_OVERLAP):
                raise

    async def publish(self, subject: str, body: bytes) -> None:
        """Write ``body`` as the last message of ``prefix + subject``."""
        from nats.errors import NoRespondersError

        self.bucket.requests += 1
        try:
            reply = await self.client.request(
                self.prefix + subject, body, timeout=self.bucket.timeout
            )
        except NoRespondersError:  # no stream takes the subject
            raise BucketMissing(self.name) from None
        error = json.loads(reply.data).get("error")
        if error:
            raise JetStreamError(int(error.get("err_code", 0)), str(error.get("description")))

    async def delete(self, seq: int) -> None:
        """Delete the message ``seq``, unless it is gone already."""
        try:
            await self._api(f"STREAM.MSG.DELETE.{self.name}", {"seq": seq, "no_erase": True})
        except JetStreamError as exc:
            if exc.err_code != MESSAGE_GONE:
                raise

    async def last(self, subject: str) -> bytes | None:
        """The body of the last message of ``prefix + subject`` (``None``: it has none, or
        the stream is missing): one request, whatever the stream holds besides."""
        try:
            response = await self._api(
                f"STREAM.MSG.GET.{self.name}", {"last_by_subj": self.prefix + subject}
            )
        except BucketMissing:
            return None
        except JetStreamError as exc:
            if exc.err_code == NO_MESSAGE_FOUND:
                return None
            raise
        return base64.b64decode(response["message"].get("data") or "")

    async def purge(self, subject: str) -> None:
        """Delete every message of ``prefix + subject`` (nothing, if the stream is missing)."""
        with contextlib.suppress(BucketMissing):
            await self._api(f"STREAM.PURGE.{self.name}", {"filter": self.prefix + subject})

    async def snapshot(self, subjects: str) -> Snapshot:
        """The last message of each subject matching ``prefix + subjects``: a consumer that
        starts there, and one pull of as many messages as it counts, which does not wait."""
        inbox = self.client.new_inbox()
        subscription = await self.client.subscribe(inbox)
        try:
            consumer = await self._api(
                f"CONSUMER.CREATE.{self.name}",
                {
                    "stream_name": self.name,
                    "config": {
                        "deliver_policy": "last_per_subject",
                        "filter_subject": self.prefix + subjects,
                        "ack_policy": "none",
                        "mem_storage": True,
                        "num_replicas": 1,
                        "inactive_threshold": READER_IDLE_MS * NS_PER_MS,
                    },
                },
            )
            name, pending = consumer["name"], int(consumer["num_pending"])
            messages: list[Stored] = []
            if pending:
                pull = json.dumps({"batch": pending, "no_wait": True}).encode()
                self.bucket.requests += 1
                await self.client.publish(
                    f"$JS.API.CONSUMER.MSG.NEXT.{self.name}.{name}", pull, reply=inbox
                )
                while len(messages) < pending:
                    message = await subscription.next_msg(timeout=self.bucket.timeout)
                    headers = message.headers or {}
                    status = headers.get("Status")
                    if status in END_OF_BATCH:  # some were deleted since the count
                        break
                    if status:
                        raise JetStreamError(0, f"pull: {headers.get('Description', status)}")
                    messages.append(_stored(message.reply, message.data))
            await self.client.publish(f"$JS.API.CONSUMER.DELETE.{self.name}.{name}")
        finally:
            await subscription.unsubscribe()
        return Snapshot(parse_stamp_ms(consumer["created"]), messages)


def _stored(reply: str, data: bytes) -> Stored:
    """A delivered message, its sequence and stamp read from its reply subject:
    ``$JS.ACK.{stream}.{consumer}.{delivered}.{seq}.{consumer seq}.{stamp ns}.{pending}``,
    where newer servers add a domain and an account hash after ``ACK`` and a token last."""
    tokens = reply.split(".")
    if len(tokens) == ACK_TOKENS:
        tokens[2:2] = ["", ""]
    return Stored(int(tokens[7]), int(tokens[9]) // NS_PER_MS, data)


def _operation(raw_headers: bytes) -> bytes:
    """The ``KV-Operation`` of a message's raw ``NATS/1.0`` header block (``b""``: none)."""
    for line in raw_headers.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == KV_OPERATION.lower().encode():
            return value.strip()
    return b""


async def _together(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` at once, at most ``CONCURRENCY`` of them in flight."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def bounded(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return await asyncio.gather(*(bounded(call) for call in calls))
