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
that a node name may hold ``|``), the live revision the claim carried after it
(:mod:`beatless.stores._records`). Any other value fails its own firing as ``CORRUPT``
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
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from beatless.core._drivers import driver
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike, to_ms
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores._epoch import adopt, horizon_ms
from beatless.stores.base import (
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    Epoch,
    KeptNote,
    Note,
    Outcome,
)
from beatless.stores.nats._facts import BucketChecks
from beatless.stores.nats._jetstream import (
    ATTEMPTS,
    CONCURRENCY,
    Bucket,
    BucketMissing,
    ConnectFailed,
    JetStreamError,
    LoopStuck,
    Message,
    NoJetStream,
    _together,
    is_full,
)
from beatless.stores.nats._judge import (
    _claim_key,
    _Decision,
    _decode,
    _raise_unless_wrong_last,
    _Record,
    _Settle,
    _State,
    _Unreadable,
)
from beatless.stores.nats._link import Link
from beatless.stores.nats._notes import (
    NOTES_MAX_AGE,
    NotesOnStreams,
    _check_notes,
    _kept_keys,
    _kept_of,
    _token,
)
from beatless.stores.nats._options import (
    _bucket_name,
    _mask,
    _positive,
    _replicas,
    _secrets,
    _split_servers,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TTL = timedelta(minutes=5)
DEFAULT_TIMEOUT = 5.0
"""Seconds to connect, and for each request; a whole call gets ``CALL_TIMEOUTS`` times it."""
CALL_TIMEOUTS = 3
OPTIONS = ("bucket", "ttl", "timeout", "replicas")
WRITTEN_KEPT = 100_000
"""Claims a store object remembers having written, for a commit without a read."""


class _Contended(Exception):
    """A key was written by others between every read and write of one call."""


class NATSStore(BucketChecks, NotesOnStreams, ClaimStore):
    """Claims in a NATS JetStream key-value bucket, shared by every node that uses it.

    ``servers`` is a ``nats://`` URL (or a list of them: several servers of one cluster).
    ``bucket`` is the bucket's name, ``beatless_{namespace}`` unless given; it is
    created at first use if missing, keeping messages ``ttl`` (a duration: seconds,
    ``"5m"``, ``timedelta``) with ``replicas`` copies. ``timeout`` bounds the connection
    and each request (seconds). Notes go to a stream beside the bucket, ``NOTES_{bucket}``,
    created at the first post.

    Nothing is sent until the first call. The store runs nats-py on an event loop of its
    own, in a thread it starts; its calls may come from any thread, and calls made at
    once run at once, their requests sharing the connection, so a commit never waits for
    another thread's long call. A server that cannot be reached raises
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
        # Calls made at once run at once (a node's loop commits the firings it sent, whose
        # leases are running, while its board claims missed-firing markers): nats-py sends
        # their requests on the one connection without waiting for each other's replies.
        self._link = Link(self._servers, self.bucket, self.timeout, self._scrub)
        # Notes have a connection of their own: a read of many notes (or one on a slow
        # server) never holds up a claim or a commit on the claims' connection.
        self._notes_link = Link(self._servers, self.bucket, self.timeout, self._scrub)
        self._epoch_lock = threading.Lock()
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
        with self._epoch_lock:  # calls of two threads may find the change at once
            adopt(self, state.epoch, logger=logger, label=self._said, horizon=forgot_before)
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

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        unique = list(dict.fromkeys(ids))

        async def read(kv: Bucket) -> list[Message]:
            return await _together(kv.get(_claim_key(i), direct=self._direct) for i in unique)

        found = zip(unique, self._call("read claim records", read) if unique else [], strict=True)
        decoded = ((id_, _decode(message.value)) for id_, message in found)
        return {id_: r.as_record() for id_, r in decoded if isinstance(r, _Record)}

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
        if keys is None:
            return self._call("read kept notes", lambda kv: _kept_of(kv.kept, kind), notes=True)
        return self._call("read kept notes", lambda kv: _kept_keys(kv.kept, kind, keys), notes=True)

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        subjects = [f"{_token(kind)}.{_token(key)}" for key in dict.fromkeys(keys)]

        async def purge(kv: Bucket) -> None:
            await _together(kv.kept.purge(subject) for subject in subjects)

        if subjects:
            self._call("delete kept notes", purge, notes=True)

    def close(self) -> None:
        """Refuse new calls, and close each connection once its calls under way ended."""
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

    # -- calls and their errors ------------------------------------------------------------

    def _call(self, what: str, make: Callable[[Bucket], Awaitable[T]], *, notes: bool = False) -> T:
        """Run ``make(bucket)`` on the store's loop (the notes' loop), bounded in time;
        errors become ours."""
        link = self._notes_link if notes else self._link
        if self._closed:
            raise StoreError(f"nats store {self._where}: cannot {what}: the store is closed")
        try:
            return link.run(make, self.timeout * CALL_TIMEOUTS)
        except Exception as exc:  # each kind is sorted by ``_translate``
            if self._closed:
                raise StoreError(
                    f"nats store {self._where}: cannot {what}: the store is closed"
                ) from None
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

    @property
    def _said(self) -> str:
        """The store, as its warnings name it."""
        where = shown(self._where, quoted=False, limit=ERROR_LIMIT)
        return f"nats store {where}, bucket {shown(self.bucket)}"


def _driver() -> ModuleType:
    return driver("nats.errors", "the nats store")
