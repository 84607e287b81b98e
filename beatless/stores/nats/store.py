"""The NATS JetStream claim store: one key-value bucket, claims by revision-checked writes.

A claim is the key ``claim.{firing id}`` of the bucket. A first claim is a *create*: a
publish with ``Nats-Expected-Last-Subject-Sequence: 0``, which JetStream refuses once
the key has a value, so two nodes cannot both create it. Every later change (re-claim,
takeover, commit, release) is a publish that expects the revision the node just read,
so it fails if anyone wrote the key in between, and the node reads and decides again.
The decision itself is :func:`~beatless.stores.base.judge`, as for SQLite. The stream's
``Nats-Msg-Id`` duplicate window is not used: it only tells a publisher that the same id
was seen, not who holds the firing, whether the claim is pending or committed, nor
when its lease ends.

A firing whose entry skips overlapping runs names its address's run-lease record
(:attr:`~beatless.stores.base.ClaimRequest.run_id`), the key ``claim.{run id}`` of the
same bucket. Its claim reads that key right before its first write (and again before
each retry), and a live pending record there makes a claim that would be won
:attr:`~beatless.stores.base.Outcome.OVERLAP`, written committed. The write checks only
the firing's own revision, so the answer is that of a read just before the write: a run
that starts after the read is refused by the worker's own run-lease check.

The value is ``v=1|{state}|{until_ms}|{memory_ms}|{tag}|{node}``: ``pending`` or
``committed``, the end of the lease or of the memory in epoch milliseconds on the
server's clock, the memory the claim asked for, the task tag and the node (last, so
that a node name may hold ``|``). Any other value fails its own firing as ``CORRUPT``
and is never overwritten.

**The store's clock.** NATS has no time call, but the server stamps every message it
stores. Each call starts by writing the key ``clock`` and reading the stream's info:
the stamp of the stream's last message is then a reading of the server's clock taken
after the call began and before any claim is written. Leases, lateness and earliness
are judged on it and written with it, so skew between nodes changes nothing (a server
that reports its own time in the stream info, as servers newer than 2.9 do, is read there).

**Memory.** The bucket forgets a message ``ttl`` after it was written (the stream's
``max_age``, 5 minutes unless the URL says otherwise): that fixed window is what
:attr:`NATSStore.remembers` returns, so start-up checks rule 5 against it. Within it, a
claim lives as its value says. A bucket that exists with a shorter ``max_age``, or with a
count or size limit that discards old messages, is refused.

**Notes.** The notes live beside the bucket, in the stream ``NOTES_{bucket}`` over the
subjects ``beatless.notes.{bucket}.>``: a note is the one message of the subject
``beatless.notes.{bucket}.{kind hash}.{key hash}`` (32 hex digits of SHA-256 each, so any
text fits a subject), whose body is ``{"v": 1, "kind", "key", "value", "ttl_ms"}``. A post
publishes each note, which replaces the subject's last message, and the server stamps
it: the note lives through that stamp plus ``ttl_ms``. A read makes a consumer per kind
that starts at the last message of each subject of the kind, pulls them all at once and
judges them on the instant the server made the consumer; so notes, like claims, are
measured on the server's clock. A read deletes the expired notes it meets; a post whose
notes have a ``keep`` reads those kinds and deletes their expired notes and, beyond
``keep``, those that expire first. The stream's ``max_age``, ``NOTES_MAX_AGE`` (24 hours:
the longest ``ttl_ms`` a note may have, that of a node's history), removes the rest. A
note costs one stored message until it is deleted, at the latest ``NOTES_MAX_AGE`` after
its post: its body (kind, key and value as JSON, and some 50 bytes), its subject (some
80 bytes and the bucket's name), and a few dozen bytes of JetStream's record and index.
The notes a commit carries (each firing's history) are published while the commit's
writes go out, in the same call, so they add no round trip to wait for; but the bucket and
the notes stream share no operation (:attr:`NATSStore.commits_notes` is false): a node
that dies mid-call may leave a committed firing without its history note, or the note of
a firing it sent whose claim then runs out pending.

**Kept notes** (:meth:`NATSStore.keep_notes`) live in a second stream of the same form,
``KEPT_{bucket}`` over ``beatless.kept.{bucket}.>``, with no ``max_age``: a kept note is
the one message of its subject (body ``{"v": 1, "kind", "key", "value"}``), replaced by
the next write and deleted by a purge of its subject. A bucket's TTL is per stream,
which is why they cannot share the notes stream.

**Identity.** The epoch is the bucket's stream: its creation time on the server's clock,
and a token hashed from that instant and the stream's description, where beatless puts a
random token when it creates the bucket. The bucket is created with ``deny_purge`` (NATS
refuses to lift it later), no roll-ups and no message deletes, so its claims can only
be lost with the stream itself (deleted, or a server that lost its storage); the next
call creates it again, with a new epoch. A key in the bucket could not serve: it would
expire with the window whenever no node wrote it for ``ttl``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from beatless.core._drivers import driver
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike, as_timedelta, describe, to_ms
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores._epoch import describe_change, has_changed, horizon_ms
from beatless.stores.base import (
    UNKNOWN,
    ClaimRequest,
    ClaimStore,
    Epoch,
    Fact,
    KeptNote,
    Note,
    Outcome,
    StoreFacts,
    Verdict,
    judge,
)
from beatless.stores.nats._jetstream import (
    WRONG_LAST_SEQUENCE,
    Bucket,
    BucketInfo,
    BucketMissing,
    ConnectFailed,
    JetStreamError,
    Link,
    LoopStuck,
    Message,
    NoJetStream,
    NoteStream,
    Stored,
    bucket_config,
    is_full,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

FORMAT_VERSION = 1
"""The layout of a claim value; a value of any other version is ``CORRUPT``."""
DEFAULT_TTL = timedelta(minutes=5)
DEFAULT_TIMEOUT = 5.0
"""Seconds to connect, and for each request; a whole call gets ``CALL_TIMEOUTS`` times it."""
CALL_TIMEOUTS = 3
CONCURRENCY = 256
"""Requests of one batch in flight at once."""
ATTEMPTS = 5
"""Reads and writes of one key in one call before it gives up as contended."""
OPTIONS = ("bucket", "ttl", "timeout", "replicas")
NOTE_FORMAT = 1
"""The layout of a note's body; a message of any other layout is not read as a note."""
NOTES_MAX_AGE = timedelta(hours=24)
"""How long the notes stream keeps a message, and so the longest life of a note."""
STREAM_SETTLE_S = 0.05
"""The wait before a post tries again on a stream made at that moment, times the try."""
NOTE_TOKEN_DIGITS = 32
"""Hex digits of the hash of a kind or a key in a note's subject."""
WRITTEN_KEPT = 100_000
"""Claims a store object remembers having written, for a commit without a read."""
_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]{0,16}")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(slots=True)
class _Record:
    node: str
    committed: bool
    until_ms: int
    memory_ms: int
    tag: str

    def encode(self) -> bytes:
        state = "committed" if self.committed else "pending"
        fields = (f"v={FORMAT_VERSION}", state, self.until_ms, self.memory_ms, self.tag, self.node)
        return "|".join(map(str, fields)).encode()


class _Unreadable:
    """A value this version cannot read: its firing is refused as ``CORRUPT``."""


_UNREADABLE = _Unreadable()


def _decode(value: bytes | None) -> _Record | _Unreadable | None:
    if value is None:
        return None
    try:
        version, state, until, memory, tag, node = value.decode().split("|", 5)
    except ValueError:  # not UTF-8, or too few fields
        return _UNREADABLE
    valid = version == f"v={FORMAT_VERSION}" and state in ("pending", "committed")
    numbers = _DIGITS.fullmatch(until) and _DIGITS.fullmatch(memory)
    if not (valid and numbers and _HEX.fullmatch(tag)):
        return _UNREADABLE
    return _Record(node, state == "committed", int(until), int(memory), tag)


@dataclass(frozen=True, slots=True)
class _State:
    """What one call knows of the bucket: the server's clock and the epoch."""

    now_ms: int
    epoch: Epoch


class _Contended(Exception):
    """A key was written by others between every read and write of one call."""


class NATSStore(ClaimStore):
    """Claims in a NATS JetStream key-value bucket, shared by every node that uses it.

    ``servers`` is a ``nats://`` URL (or a list of them: several servers of one cluster).
    ``bucket`` is the bucket's name, ``beatless_{namespace}`` unless given; it is
    created at first use if missing, keeping messages ``ttl`` (a duration: seconds,
    ``"5m"``, ``timedelta``) with ``replicas`` copies. ``timeout`` bounds the connection
    and each request (seconds). Notes go to a stream beside the bucket, ``NOTES_{bucket}``,
    created at the first post.

    Nothing is sent until the first call. The store runs nats-py on an event loop of its
    own, in a thread it starts; its calls may come from any thread and run one at a
    time. A server that cannot be reached raises
    :class:`~beatless.errors.StoreUnavailable`; refused credentials or permissions and
    a bucket that cannot hold claims safely raise :class:`~beatless.errors.StoreError`.
    Passwords and tokens never appear in ``repr``, logs or error messages.
    """

    name = "nats"
    commits_notes = False

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        namespace: str = "default",
        bucket: str | None = None,
        ttl: DurationLike = DEFAULT_TTL,
        timeout: DurationLike = DEFAULT_TIMEOUT,
        replicas: int | str = 1,
    ) -> None:
        self._driver = _driver()
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        if not self._servers or not all(isinstance(s, str) and s for s in self._servers):
            raise ConfigError(f"nats store: give one nats:// URL or more, got {servers!r}")
        self._where = ",".join(_mask(s) for s in self._servers)
        self._secrets = [s for url in self._servers for s in _secrets(url)]
        self.bucket = _bucket_name(bucket, namespace)
        self.ttl = _positive(ttl, "ttl")
        self.timeout = _positive(timeout, "timeout").total_seconds()
        self.replicas = _replicas(replicas)
        self._link = Link(self._servers, self.bucket, self.timeout, self._scrub)
        self._lock = threading.Lock()
        # Notes have a connection and a lock of their own: a read of many notes (or one on
        # a slow server) never holds up a claim or a commit, whose lease is running.
        self._notes_link = Link(self._servers, self.bucket, self.timeout, self._scrub)
        self._notes_lock = threading.Lock()
        self._closed = False
        self._direct = False
        self._server_time = False
        self._forgot_before_ms: int | None = None
        self._written: dict[str, tuple[str, int, _Record]] = {}
        """What this object wrote last for a firing: epoch token, revision, record."""
        self._warned_purgeable = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> NATSStore:
        """Open ``nats://[user:password@]host[:port][,host2[:port]...]/[?option=value...]``.

        The options ``bucket``, ``ttl``, ``timeout`` and ``replicas`` may be given in the
        query; keyword ``options`` win over them. A token goes as the user:
        ``nats://token@host:4222``.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() != "nats":
            raise ConfigError(f"not a nats URL: {_mask(url)!r}; write nats://host:4222")
        if not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(
                f"nats URL {_mask(url)!r}: write nats://host:4222 or nats://host1:4222,"
                f"host2:4222, with options in the query (?bucket=name&ttl=5m)"
            )
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"nats URL {_mask(url)!r}: unknown option {', '.join(unknown)}; the options "
                f"are {', '.join(OPTIONS)}"
            )
        for key, values in query.items():
            options.setdefault(key, values[-1])
        return cls(_split_servers(parts.netloc), **options)

    def __repr__(self) -> str:
        return f"NATSStore({self._where!r}, bucket={self.bucket!r})"

    @property
    def remembers(self) -> timedelta:
        """The bucket's window: a claim is forgotten ``ttl`` after its last write."""
        return self.ttl

    @property
    def requests(self) -> int:
        """How many requests this store object sent to the server (each has a reply)."""
        return self._link.requests + self._notes_link.requests

    # -- the contract ---------------------------------------------------------------

    def time_ms(self) -> int:
        return self._call("read the clock", self._state).now_ms

    def probe(self) -> None:
        """Write a key ``probe.{random}``, read it back from the stream's leader and
        write a delete marker over it (the marker expires with the bucket's window)."""
        value = secrets.token_hex(16).encode()

        async def run(kv: Bucket) -> Message:
            await self._state(kv)
            key = f"probe.{secrets.token_hex(8)}"
            revision = await kv.put(key, value, last=0)
            got = await kv.get(key, direct=False)
            await kv.delete(key, last=got.revision or revision)
            return got

        got = self._call("probe", run)
        if got.value != value:
            raise StoreError(
                f"nats store {self._where}: probe: wrote a key in bucket {self.bucket!r} but "
                f"read back {got.value!r}"
            )

    reseeds = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"nats store: lease_ms must be positive, got {lease_ms}")
        for request in requests:
            _claim_key(request.id)
            if request.run_id:
                _claim_key(request.run_id)
        if not requests:
            return []
        state, forgot_before, outcomes = self._call(
            "claim", lambda kv: self._claim_all(kv, requests, node, lease_ms, hold_off)
        )
        self._adopt(state.epoch, forgot_before)
        return outcomes

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        for id_ in ids:
            _claim_key(id_)
        _check_notes(notes)
        if not ids:
            self.post(notes)
            return []
        state, done = self._call("commit", lambda kv: self._commit_all(kv, ids, node, notes))
        if self.epoch is None:
            self.epoch = state.epoch  # a first sighting; a changed epoch waits for a claim
        return done

    def release(self, ids: Sequence[str], *, node: str) -> None:
        for id_ in ids:
            _claim_key(id_)
        if ids:
            self._call("release", lambda kv: self._settle_all(kv, ids, node, commit=False))

    notes_live_ms = to_ms(NOTES_MAX_AGE)

    def post(self, notes: Sequence[Note]) -> None:
        _check_notes(notes)
        if notes:
            self._call("post notes", lambda kv: self._post(kv.notes, notes), notes=True)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        unique = list(dict.fromkeys(kinds))
        if not unique:
            return {}
        return self._call("read notes", lambda kv: self._read(kv.notes, unique), notes=True)

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        if notes:
            self._call("keep notes", lambda kv: self._keep(kv.kept, notes), notes=True)

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        found = self._call("read kept notes", lambda kv: _kept_of(kv.kept, kind), notes=True)
        return found if keys is None else {key: found[key] for key in keys if key in found}

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        subjects = [f"{_token(kind)}.{_token(key)}" for key in dict.fromkeys(keys)]

        async def purge(kv: Bucket) -> None:
            await _together(kv.kept.purge(subject) for subject in subjects)

        if subjects:
            self._call("delete kept notes", purge, notes=True)

    def close(self) -> None:
        with self._lock, self._notes_lock:
            self._closed = True
            self._link.close()
            self._notes_link.close()

    # -- claims, on the store's event loop -------------------------------------------------

    async def _claim_all(
        self,
        kv: Bucket,
        requests: Sequence[ClaimRequest],
        node: str,
        lease_ms: int,
        hold_off: bool = False,
    ) -> tuple[_State, int | None, list[Outcome]]:
        state = await self._state(kv)
        forgot_before = horizon_ms(self.epoch, state.epoch, self._forgot_before_ms)
        decide = _Decision(node, lease_ms, state.now_ms, forgot_before, state.epoch.token, hold_off)
        outcomes: list[Outcome | None] = [None] * len(requests)
        # The same firing twice in a batch: the second is decided after the first.
        seen: Counter[str] = Counter()
        rounds: list[list[int]] = []
        for index, request in enumerate(requests):
            turn = seen[request.id]
            seen[request.id] += 1
            if turn == len(rounds):
                rounds.append([])
            rounds[turn].append(index)
        gate = asyncio.Semaphore(CONCURRENCY)
        for indexes in rounds:
            done = await asyncio.gather(
                *(self._claim_one(kv, requests[i], decide, gate) for i in indexes)
            )
            for index, outcome in zip(indexes, done, strict=True):
                outcomes[index] = outcome
        return state, forgot_before, [o for o in outcomes if o is not None]

    async def _claim_one(
        self, kv: Bucket, request: ClaimRequest, decide: _Decision, gate: asyncio.Semaphore
    ) -> Outcome:
        key = _claim_key(request.id)
        async with gate:
            running = await self._run_lease(kv, request)
            outcome, record = decide(request, None, running)
            if record is not None:  # first try a create: most firings are new
                try:
                    revision = await kv.put(key, record.encode(), 0)
                    return self._wrote(request.id, decide.epoch, revision, record, outcome)
                except JetStreamError as exc:
                    _raise_unless_wrong_last(exc)
            for attempt in range(ATTEMPTS):
                # The first read may come from any replica; a retry asks the leader.
                found = await kv.get(key, direct=self._direct and attempt == 0)
                if attempt > 0:  # a write was refused meanwhile: read the run lease again
                    running = await self._run_lease(kv, request)
                outcome, record = decide(request, _decode(found.value), running)
                if record is None:
                    return outcome
                try:
                    revision = await kv.put(key, record.encode(), found.revision)
                except JetStreamError as exc:
                    _raise_unless_wrong_last(exc)
                    continue
                return self._wrote(request.id, decide.epoch, revision, record, outcome)
        raise _Contended(request.id)

    async def _run_lease(self, kv: Bucket, request: ClaimRequest) -> _Record | None:
        """The record of the request's run lease, read now (``None``: the request names
        none, the bucket holds none, or one this version cannot read)."""
        if not request.run_id:
            return None
        found = await kv.get(_claim_key(request.run_id), direct=self._direct)
        record = _decode(found.value)
        return record if isinstance(record, _Record) else None

    def _wrote(
        self, id_: str, epoch: str, revision: int, record: _Record, outcome: Outcome
    ) -> Outcome:
        """Keep what this store object wrote, so a commit or release need not read it."""
        if len(self._written) >= WRITTEN_KEPT:
            self._written.clear()
        self._written[id_] = (epoch, revision, record)
        return outcome

    async def _commit_all(
        self, kv: Bucket, ids: Sequence[str], node: str, notes: Sequence[Note]
    ) -> tuple[_State, list[bool]]:
        """Commit ``ids`` and publish ``notes`` at the same time: the notes add no round
        trip to wait for, but they are two operations (see ``commits_notes``)."""
        commit = self._settle_all(kv, ids, node, commit=True)
        if not notes:
            return await commit
        # Both run to their end before an error of either is raised: nothing of the call
        # is left running on the loop when the next call starts.
        settled, posted = await asyncio.gather(
            commit, self._post(kv.notes, notes), return_exceptions=True
        )
        if isinstance(settled, BaseException):
            raise settled
        if isinstance(posted, BaseException):
            raise posted
        return settled

    async def _settle_all(
        self, kv: Bucket, ids: Sequence[str], node: str, *, commit: bool
    ) -> tuple[_State, list[bool]]:
        state = await self._state(kv)
        gate = asyncio.Semaphore(CONCURRENCY)
        unique = list(dict.fromkeys(ids))
        settle = _Settle(node, state.now_ms, commit, state.epoch.token)
        done = await asyncio.gather(*(self._settle_one(kv, i, settle, gate) for i in unique))
        by_id = dict(zip(unique, done, strict=True))
        return state, [by_id[i] for i in ids]

    async def _settle_one(
        self, kv: Bucket, id_: str, settle: _Settle, gate: asyncio.Semaphore
    ) -> bool:
        """Commit (or release) this node's claim; whether it was this node's to settle."""
        key = _claim_key(id_)
        known = self._written.pop(id_, None)
        async with gate:
            for attempt in range(ATTEMPTS):
                record: _Record | _Unreadable | None
                if known is not None and known[0] == settle.epoch:
                    # What this object wrote: the write checks that it still is.
                    _epoch, revision, record = known
                else:
                    found = await kv.get(key, direct=self._direct and attempt == 0)
                    revision, record = found.revision, _decode(found.value)
                known = None
                settled = settle(record)
                if settled is None:
                    return False
                try:
                    await kv.put(key, settled.encode(), revision)
                except JetStreamError as exc:
                    _raise_unless_wrong_last(exc)
                    continue
                return True
        raise _Contended(id_)

    # -- notes, on the store's event loop ----------------------------------------------------

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

    # -- the bucket: clock, epoch, creation --------------------------------------------------

    async def _state(self, kv: Bucket) -> _State:
        """The server's clock now and the bucket's epoch; the bucket is made if missing."""
        info = await kv.reading(self._new_bucket, write_clock=not self._server_time)
        if 0 < info.max_age_ms < to_ms(self.ttl):
            info = await self._lengthen(kv, info)
        self._check(info)
        self._server_time = info.server_ms is not None
        now = info.server_ms if info.server_ms is not None else info.last_ms
        if now is None:
            raise StoreError(f"nats store {self._where}: bucket {self.bucket!r} has no clock")
        # A new stream has a new creation instant, and a bucket made by beatless a new
        # random token in its description as well.
        token = hashlib.sha256(f"{info.created}|{info.description}".encode()).hexdigest()
        return _State(now, Epoch(token[:32], info.created_ms))

    def _new_bucket(self) -> dict[str, object]:
        return bucket_config(
            self.bucket,
            description=f"beatless claims (format {FORMAT_VERSION}), epoch {secrets.token_hex(16)}",
            max_age_ms=to_ms(self.ttl),
            replicas=self.replicas,
        )

    async def _lengthen(self, kv: Bucket, info: BucketInfo) -> BucketInfo:
        """A bucket that keeps claims for less than this store's ``ttl`` (made with a
        shorter one): made to keep them for the ``ttl``. Lengthening is safe while other
        nodes run with the shorter ``ttl``: each needs at least its own."""
        was = describe(timedelta(milliseconds=info.max_age_ms))
        try:
            longer = await kv.keep_for(to_ms(self.ttl))
        except (JetStreamError, BucketMissing, TimeoutError) as exc:  # refused, or denied
            logger.warning(
                "nats store %s: bucket %s keeps claims for %s; lengthening it to the ttl %s "
                "failed (%s)",
                shown(self._where, quoted=False),
                shown(self.bucket),
                was,
                describe(self.ttl),
                exc,
            )
            return info
        logger.warning(
            "nats store %s: bucket %s kept claims for %s, less than the ttl %s: it keeps "
            "them for %s from now on",
            shown(self._where, quoted=False),
            shown(self.bucket),
            was,
            describe(self.ttl),
            describe(self.ttl),
        )
        return longer

    def lengthen_memory(self, needed: timedelta) -> str:
        """Open the store with a ``ttl`` over ``needed``, in whole minutes."""
        minutes = to_ms(needed) // 60_000 + 1
        return (
            f"open the store with ?ttl={minutes}m (or &ttl={minutes}m after other options; "
            f"the bucket is lengthened to it at start)"
        )

    def _check(self, info: BucketInfo) -> None:
        """Refuse a bucket that would forget claims sooner than this store says it keeps them."""
        where, name, need = self._where, self.bucket, to_ms(self.ttl)
        if 0 < info.max_age_ms < need:
            raise StoreError(
                f"nats store {where}: bucket {name!r} keeps claims for "
                f"{describe(timedelta(milliseconds=info.max_age_ms))}, less than the ttl "
                f"{describe(self.ttl)} this store promises, and it could not be lengthened; "
                f"give the NATS user the right to update the stream (STREAM.UPDATE), "
                f"lengthen its max age with `nats stream edit KV_{name} --max-age "
                f"{describe(self.ttl)}`, or open the store with ?ttl= no longer than the "
                f"bucket's max age"
            )
        if info.drops_old:
            raise StoreError(
                f"nats store {where}: bucket {name!r} has a message count or size limit that "
                f"discards old messages, so claims could be forgotten early; remove the limit"
            )
        self._direct = info.direct and info.replicas == 1
        if info.purgeable and not self._warned_purgeable:
            self._warned_purgeable = True
            logger.warning(
                "nats store %s: bucket %s allows purges or roll-ups (it was not created by "
                "beatless): a purge would empty it unnoticed, and a firing could be sent twice",
                shown(where, quoted=False, limit=ERROR_LIMIT),
                shown(name),
            )

    def facts(self) -> StoreFacts:
        """The bucket's storage (``file`` or ``memory``), its replicas and its size limit
        (``STREAM.INFO``)."""
        store = f"nats store {self._where}"
        try:
            info = self._call("read its settings", lambda kv: kv.info(), notes=True)
        except StoreError:
            why = "could not be read"
            unread = (Fact(n, UNKNOWN, Verdict.WARN, why) for n in ("storage", "replicas"))
            return StoreFacts(store, tuple(unread))
        facts = [Fact("storage", info.storage)]
        if info.storage != "file":
            why = "a restart of the server forgets every claim; use a bucket with file storage"
            facts[0] = Fact("storage", info.storage, Verdict.WARN, why)
        facts.append(Fact("replicas", str(info.replicas)))
        usage = None
        if info.max_bytes > 0:
            share = info.bytes / info.max_bytes
            usage = f"{info.bytes} bytes of max_bytes {info.max_bytes} ({share:.0%})"
        return StoreFacts(store, tuple(facts), usage=usage)

    # -- calls and their errors ------------------------------------------------------------

    def _call(self, what: str, make: Callable[[Bucket], Awaitable[T]], *, notes: bool = False) -> T:
        """Run ``make(bucket)`` on the store's loop (the notes' loop), bounded in time;
        errors become ours."""
        lock, link = (self._notes_lock, self._notes_link) if notes else (self._lock, self._link)
        with lock:
            if self._closed:
                raise StoreError(f"nats store {self._where}: cannot {what}: the store is closed")
            try:
                return link.run(make, self.timeout * CALL_TIMEOUTS)
            except Exception as exc:  # each kind is sorted by ``_translate``
                raise self._translate(what, exc, link) from None

    def _translate(self, what: str, exc: Exception, link: Link) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        prefix = f"nats store {self._where}: cannot {what}"
        if link.refusal:
            return StoreError(
                f"{prefix}: {link.refusal}; check the user name, password or token and the "
                f"subjects this user may use ($JS.API.>, $KV.{self.bucket}.>, "
                f"beatless.notes.{self.bucket}.>, beatless.kept.{self.bucket}.>, _INBOX.>)"
            )
        outage = self._outage(exc)
        if outage is not None:
            return StoreUnavailable(f"{prefix}: {outage}")
        if isinstance(exc, NoJetStream):
            return StoreError(
                f"{prefix}: JetStream does not answer: start nats-server with JetStream "
                f"enabled (-js) and give this account JetStream access"
            )
        if isinstance(exc, JetStreamError) or is_full(exc):
            full = is_full(exc)
            told = f"{prefix}: {'the stream is full: ' * full}{self._scrub(exc)}"
            return StoreFull(told) if full else StoreError(told)
        return StoreError(f"{prefix}: {type(exc).__name__}: {self._scrub(exc)}")

    def _outage(self, exc: Exception) -> str | None:
        """What makes ``exc`` a passing outage, worth retrying; ``None``: it is not one."""
        errors, text = self._driver.errors, self._scrub(exc)
        reasons: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
            (ConnectFailed, f"cannot connect: {text}"),
            (LoopStuck, "no answer"),
            (BucketMissing, f"bucket {self.bucket!r} vanished during the call"),
            (_Contended, f"firing {text} was written by others throughout"),
            ((asyncio.TimeoutError, errors.TimeoutError), "no answer in time"),
            ((errors.Error, OSError), text),
        )
        return next((reason for kinds, reason in reasons if isinstance(exc, kinds)), None)

    def _scrub(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _adopt(self, epoch: Epoch, forgot_before_ms: int | None) -> None:
        if self.epoch is not None and has_changed(self.epoch, epoch):
            logger.warning(
                "nats store %s, bucket %s: %s",
                shown(self._where, quoted=False, limit=ERROR_LIMIT),
                shown(self.bucket),
                describe_change(self.epoch, epoch),
            )
        self.epoch, self._forgot_before_ms = epoch, forgot_before_ms


@dataclass(frozen=True, slots=True)
class _Decision:
    """Decides one claim: its outcome, and the record to write (``None``: none)."""

    node: str
    lease_ms: int
    now: int
    forgot_before_ms: int | None
    epoch: str
    """The token of the epoch the decision was made in."""
    hold_off: bool = False

    def __call__(
        self,
        request: ClaimRequest,
        held: _Record | _Unreadable | None,
        running: _Record | None = None,
    ) -> tuple[Outcome, _Record | None]:
        """``running``: the record of the request's run lease, if it has one."""
        if isinstance(held, _Unreadable):
            return Outcome.CORRUPT, None
        outcome = judge(
            request,
            held,
            self.node,
            self.now,
            self.forgot_before_ms,
            running=running,
            hold_off=self.hold_off,
        )
        if outcome in (Outcome.FORGOTTEN, Outcome.OVERLAP):
            until = self.now + request.memory_ms
            return outcome, _Record(self.node, True, until, request.memory_ms, request.tag)
        if not outcome.is_won:
            return outcome, None
        until = self.now + self.lease_ms
        return outcome, _Record(self.node, False, until, request.memory_ms, request.tag)


@dataclass(frozen=True, slots=True)
class _Settle:
    """Decides a commit (or a release): the record to write, ``None`` when it is not the
    node's to settle."""

    node: str
    now: int
    commit: bool
    epoch: str

    def __call__(self, record: _Record | _Unreadable | None) -> _Record | None:
        node, now = self.node, self.now
        if not isinstance(record, _Record) or record.node != node:
            return None
        if self.commit:
            if record.until_ms < now:
                return None
            return _Record(node, True, now + record.memory_ms, record.memory_ms, record.tag)
        if record.committed or record.until_ms < now:
            return None
        return _Record(node, False, now - 1, record.memory_ms, record.tag)


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
    found: dict[str, str] = {}
    for stored in snapshot.messages:
        try:
            body = json.loads(stored.data)
        except ValueError:
            continue
        if isinstance(body, dict) and body.get("v") == NOTE_FORMAT and body.get("kind") == kind:
            key, value = body.get("key"), body.get("value")
            if isinstance(key, str) and isinstance(value, str):
                found[key] = value
    return found


async def _together(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` at once, at most ``CONCURRENCY`` of them in flight."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def bounded(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return await asyncio.gather(*(bounded(call) for call in calls))


def _raise_unless_wrong_last(exc: JetStreamError) -> None:
    if exc.err_code != WRONG_LAST_SEQUENCE:
        raise exc


def _claim_key(id_: str) -> str:
    if not isinstance(id_, str) or not _KEY.fullmatch(id_):
        raise ConfigError(
            f"nats store: firing id {id_!r} cannot be a key: use letters, digits and -/_=."
        )
    return f"claim.{id_}"


def _bucket_name(bucket: str | None, namespace: str) -> str:
    if bucket is None:
        if not isinstance(namespace, str) or not _BUCKET.fullmatch(namespace):
            raise ConfigError(
                f"nats store: namespace {namespace!r} cannot name a bucket (letters, digits, "
                f"- and _ only); name one with ?bucket="
            )
        return f"beatless_{namespace}"
    if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket):
        raise ConfigError(f"nats store: bucket {bucket!r}: use letters, digits, - and _ only")
    return bucket


def _positive(value: DurationLike, what: str) -> timedelta:
    delta = as_timedelta(value, name=f"nats store: {what}")
    if delta <= timedelta(0):
        raise ConfigError(f"nats store: {what} must be positive, got {value!r}")
    return delta


def _replicas(value: int | str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 5:
        raise ConfigError(f"nats store: replicas must be 1 to 5, got {value!r}")
    return count


def _split_servers(netloc: str) -> list[str]:
    """``user:pw@h1:4222,h2:4222`` as one URL per server, each with the credentials."""
    userinfo, _, hosts = netloc.rpartition("@")
    auth = f"{userinfo}@" if userinfo else ""
    return [f"nats://{auth}{host}" for host in hosts.split(",") if host]


def _mask(url: str) -> str:
    """``url`` with its password, or its token (a user with no password), masked."""
    masked = mask_url(url)
    parts = urlsplit(masked)
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at and ":" not in userinfo:
        masked = masked.replace(f"{userinfo}@", "***@", 1)
    return masked


def _secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    token = [parts.username] if parts.username and parts.password is None else []
    return secrets_of(url) + token


def _driver() -> ModuleType:
    return driver("nats.errors", "the nats store")
