"""The Redis claim store: leases judged on the Redis server's clock, one script per batch.

Every ``claim``, ``commit`` and ``release`` is one Lua script (``beatless/stores/lua/``,
package files whose headers give their keys and arguments), sent with ``EVALSHA``
(loaded once, loaded again when the server answers ``NOSCRIPT``), so a batch is one
round trip, and a script is atomic: two nodes cannot both win a firing. A batch of more
than ``CHUNK`` firings is sent as several scripts pipelined in the same round trip, so
that a burst does not hold Redis in one long script. The notes of a commit are written
by its script (the first, when there are several), after its claims; the notes of a
``claim_and_push`` by the script of their firings. Inside a script the store's clock
is ``TIME``: it decides whether a new claim is late and whether a lease is alive, so
skew between nodes changes nothing.

Keys live under one prefix, ``beatless:{namespace}:`` unless ``prefix`` says otherwise,
so two apps on one Redis never collide:

``{prefix}claim:{firing id}``
    A string ``v=2|{state}|{acquired_until}|{memory_ms}|{tag}|{node}``: the format
    version, ``pending`` or ``committed``, the end of the lease or of the memory in epoch
    milliseconds on the server's clock, the memory the claim asked for, the task tag of
    the request (hex digits; see :attr:`~beatless.stores.base.ClaimRequest.tag`), and
    the node that holds it (last, so that a node name may contain ``|``). A version 1
    record, ``v=1|{state}|{acquired_until}|{memory_ms}|{node}`` (an earlier beatless),
    is read as one without a tag, so it is never foreign. A pending claim expires
    ``lease_ms + memory_ms`` after it was written, so a takeover can still be reported
    after its lease ran out; a committed claim is alive ``memory_ms`` after the commit
    (rule 5 holds by construction) and expires ``EXPIRY_SLACK_MS`` later. Redis forgets
    both on its own. ``release`` ends a pending claim's lease (``acquired_until`` =
    now - 1) and keeps the record, so the next claim is a takeover. A value in any other
    form (another version, another program's value or type) fails its own firing as
    ``corrupt`` and is never overwritten; so does a version 2 record for a beatless that
    reads version 1 only: upgrade every node of a namespace together.
``{prefix}claim:{run id}``
    The run lease of an address (:func:`~beatless.schedule.firing.run_lease_id`): a claim record
    like any other, held pending by a worker while a run of the address is in progress
    (:mod:`beatless.node.runs`). A claim of a firing whose request names it
    (:attr:`~beatless.stores.base.ClaimRequest.run_id`) reads it in the same script and
    answers :attr:`~beatless.stores.base.Outcome.OVERLAP` while it is live and pending,
    writing the firing committed (its enqueue commands, on the atomic path, not run).
``{prefix}epoch``
    A string ``v=1|{started_ms}|{token}`` written (``SET NX``, no expiry) by the first
    claim that finds it absent: the store's identity. A Redis that lost its data (a
    restart without persistence, a flush) has none, so the next claim writes a new one
    and every store object that saw the old one notices.
``{prefix}probe:{random}``
    Written, read back and deleted by :meth:`RedisStore.probe`; expires in 10 s if a
    probe dies half-way.
``{prefix}last``
    A hash, one field per address: ``v=1|{firing id}|{occurrence_ms}|{claimed_ms}|{node}``,
    the last firing of that address a node won (or took over), for ``beatless status``.
    It holds one field per address claimed, and is forgotten ``LAST_RETENTION_MS``
    (30 days) after the namespace last won a firing.
``{prefix}notes:{digest}``
    A hash per kind of notes (:class:`~beatless.stores.base.Note`), named by the SHA-256
    of the kind in hex, since a kind is any text up to 1000 characters: one field per
    note, the note's key, whose value is ``v=1|{expires_ms}|{value}``. A note posted at
    ``t`` on the server's clock with ``ttl_ms`` expires at ``t + ttl_ms`` and is read
    through that millisecond; a read is ``TIME`` and one ``HGETALL`` per kind in one
    ``MULTI``, and drops the notes that expired (and any field in another form).
``{prefix}kept:{digest}``
    A hash per kind of kept notes (:class:`~beatless.stores.base.KeptNote`), with no
    expiry: see :mod:`beatless.stores.redis._kept`.
``{prefix}notes-expiry:{digest}``
    A sorted set beside each notes hash, the note's key scored by its ``expires_ms``: the
    index with which a script that writes notes (``notes.lua``: a post, a commit, a
    ``claim_and_push``) removes the kind's expired notes and, for a note with ``keep``,
    all but the ``keep`` that expire last, without reading the kind's values. Each
    write sets both keys to expire ``EXPIRY_SLACK_MS`` after the kind's last note, so a
    kind nobody posts to disappears on its own. A note costs its key twice (field and
    member), its value, about 25 bytes of record and score, and Redis's bookkeeping:
    about 20 bytes while its kind has at most 128 notes whose keys and field values fit
    in 64 bytes (Redis's compact encodings), about 150 beyond.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from beatless.core._drivers import driver
from beatless.core._logtext import WarnEvery, shown
from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.urls import mask_url, scrub, secrets_of
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores._epoch import (
    FAILOVER,
    NEW,
    describe_change,
    describe_failover,
    has_changed,
    horizon_ms,
    new_token,
)
from beatless.stores.base import (
    ITEM_TAIL_LIMIT,
    NOTE_VALUE_LIMIT,
    TOLERANCE_MS,
    UNKNOWN,
    ClaimRequest,
    ClaimStore,
    Epoch,
    Fact,
    KeptNote,
    Note,
    NoteItem,
    Outcome,
    StoreFacts,
    Verdict,
)
from beatless.stores.redis import _kept

if TYPE_CHECKING:
    import redis as redis_module
    from redis.commands.core import Script

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""The layout of a claim record written now. Version 1 records (no task tag) are read
too; a claim whose record has any other version is refused as
:attr:`~beatless.stores.base.Outcome.CORRUPT`. The epoch record and the last-winner hash
are ``v=1`` on their own."""
READ_VERSIONS = ("v=1", f"v={FORMAT_VERSION}")
LAST_VERSION = "v=1"
NOTE_VERSION = 1
"""The layout of a note's field value, ``v=1|{expires_ms}|{value}``; a field in any other
form is never read."""

PROBE_TTL_MS = 10_000
"""How long a probe key may outlive a probe that died between writing and deleting it."""

DEFAULT_SOCKET_TIMEOUT = 5.0
"""Seconds a client created from a URL waits to connect, and for each reply."""

DEFAULT_WAIT_TIMEOUT = 1.0
"""Seconds a claim or commit of a store with ``wait`` waits for its replicas (``WAIT``);
a two-phase claim waits at most a quarter of its lease, so that it can still be sent."""

WAIT_OPTIONS = ("wait", "wait_timeout")
"""The query options of a store URL that the store reads itself (the driver does not)."""

_UNACKNOWLEDGED = {
    "claim": (
        "its firings are not sent now and are claimed again while not late (a two-phase "
        "claim stays this node's; one claimed and enqueued in one script is in the queue "
        "on the primary, and is lost with the claim if the primary is)"
    ),
    "commit": (
        "the sent firings stay uncommitted, and nothing more is sent until they are committed again"
    ),
}

LAST_RETENTION_MS = 30 * 86_400_000
"""How long the last-winner hash outlives the last firing won in its namespace."""

EXPIRY_SLACK_MS = 1_000
"""How long Redis keeps a committed record past its ``acquired_until``, and a kind of notes
past its last note's expiry. Whether a claim or a note is alive is decided by comparing
its end with ``TIME``; the slack keeps Redis's own expiry, on a clock read at a slightly
different instant, from dropping the record before its last millisecond."""

CHUNK = 1_000
"""Firings per script. A larger batch is sent as several scripts pipelined in one round
trip, so that no single script holds Redis (often the broker as well) for long."""

SCHEMES = ("redis", "rediss", "unix")

SCRIPTS = "lua"
"""The package folder of the scripts: ``prelude.lua`` is loaded in front of each of
``claim.lua``, ``commit.lua`` and ``release.lua``, which read claim records, and
``notes.lua`` in front of ``claim.lua``, ``commit.lua`` and ``post.lua``, which write
notes. Each script's header gives its keys and ARGV."""


def _script(*names: str) -> str:
    folder = resources.files("beatless.stores.redis") / SCRIPTS
    return "".join((folder / name).read_text("utf-8") for name in names)


_CLAIM, _COMMIT = (_script("prelude.lua", "notes.lua", n) for n in ("claim.lua", "commit.lua"))
_COMMIT_WITHOUT_ROOM = "#!lua flags=allow-oom\n" + _COMMIT
"""The commit script, allowed to write when Redis is out of memory (Redis 7 and later):
run without notes when a commit is refused as full, it turns pending claims into
committed ones in place, growing no key by more than a few bytes."""
_RELEASE = _script("prelude.lua", "release.lua")
_POST = _script("notes.lua", "post.lua")

_OUTCOMES = {
    "W": Outcome.WON,
    "T": Outcome.TAKEOVER,
    "L": Outcome.LOST,
    "H": Outcome.HELD,
    "R": Outcome.RESEEDING,
    "X": Outcome.LATE,
    "E": Outcome.EARLY,
    "F": Outcome.FORGOTTEN,
    "C": Outcome.CORRUPT,
    "A": Outcome.FOREIGN,
    "O": Outcome.OVERLAP,
}


M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Ready(Generic[M]):
    """What :meth:`RedisStore.claim_and_push` needs of one firing, built ahead of its
    release or when due: its claim, the commands that enqueue its ``message`` (as JSON),
    and its history note."""

    message: M
    request: ClaimRequest
    commands: str
    note: Note | NoteItem | None


class RedisStore(ClaimStore):
    """Claims in Redis, shared by every node that points at the same server and prefix.

    ``client_or_url`` is a ``redis.Redis`` client, left open by :meth:`close`, or a
    ``redis://``, ``rediss://`` or ``unix://`` URL, whose client the store creates and
    closes. A created client waits ``socket_timeout`` (seconds, ``"2s"``, ``timedelta``;
    a ``socket_timeout`` in the URL wins) to connect and for each reply, and retries a
    broken connection once with no pause: the scheduler loop retries on its own until
    the firing is late. A client passed in keeps its own timeouts and retry policy.

    Nothing is sent to Redis until the first call. A connection that fails raises
    :class:`~beatless.errors.StoreUnavailable`; any other Redis error raises
    :class:`~beatless.errors.StoreError`. The password never appears in ``repr``, logs
    or error messages.
    """

    name = "redis"

    def __init__(
        self,
        client_or_url: redis_module.Redis | str,
        *,
        namespace: str = "default",
        prefix: str | None = None,
        socket_timeout: DurationLike = DEFAULT_SOCKET_TIMEOUT,
        wait: int = 0,
        wait_timeout: DurationLike = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        driver = _driver()
        if isinstance(client_or_url, str):
            client_or_url, wait, wait_timeout = wait_in_url(client_or_url, wait, wait_timeout)
        if prefix is not None and (not isinstance(prefix, str) or not prefix):
            raise ConfigError(f"redis store: prefix must be a non-empty string, got {prefix!r}")
        self.prefix = key_prefix("redis store", namespace, prefix)
        self._last_key = f"{self.prefix}last"
        self._epoch_key = f"{self.prefix}epoch"
        self._forgot_before_ms: int | None = None
        self._closed = False
        if isinstance(client_or_url, str):
            self._where = mask_url(client_or_url)
            self._secrets = secrets_of(client_or_url)
            self._client = _client_from_url(driver, client_or_url, socket_timeout, self._where)
            self._owns_client = True
        elif isinstance(client_or_url, driver.Redis):
            self._client = client_or_url
            self._where = _describe_client(client_or_url)
            self._secrets = _secrets_of_client(client_or_url)
            self._owns_client = False
        else:
            raise ConfigError(
                f"redis store: expected a redis.Redis client or a redis:// URL, got "
                f"{type(client_or_url).__name__}"
            )
        self.wait, self.wait_timeout_ms = _checked_wait(self._client, wait, wait_timeout)
        self._driver = driver
        self._lost = (driver.exceptions.RedisError, OSError)
        self._noscript = driver.exceptions.NoScriptError
        self._claim = self._client.register_script(_CLAIM)
        self._commit = self._client.register_script(_COMMIT)
        self._commit_anyway = self._client.register_script(_COMMIT_WITHOUT_ROOM)
        self._full_warned = WarnEvery()
        self._release = self._client.register_script(_RELEASE)
        self._post = self._client.register_script(_POST)
        logger.debug(
            "redis store %s opened with prefix %s",
            shown(self._where, quoted=False),
            shown(self.prefix),
        )

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"

    @property
    def client(self) -> redis_module.Redis:
        """The Redis client the store talks through (passed in, or opened from the URL)."""
        return self._client

    # -- the contract ---------------------------------------------------------------

    reseeds = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"redis store: lease_ms must be positive, got {lease_ms}")
        return self._claim_batch(requests, node, lease_ms, None, None, hold_off=hold_off)

    def claim_and_push(
        self,
        requests: Sequence[ClaimRequest],
        commands: Sequence[Sequence[Sequence[str]] | str],
        *,
        node: str,
        notes: Sequence[Note | NoteItem | None] | None = None,
    ) -> list[Outcome]:
        """Claim each firing and, for each one won, run its Redis commands in the same
        script: the building block of claim-and-enqueue on a broker's own Redis.

        ``commands[i]`` is the list of commands (``["LPUSH", key, payload]``, ...) that
        enqueue the message of ``requests[i]`` exactly as the broker's client would, or
        that list as JSON text (built ahead of the claim). A
        firing won this way is committed at once; there is nothing to commit or release.
        A live pending claim of a two-phase node (a fleet mid-rollout) gives ``HELD``.
        A firing refused (``LATE``, ``EARLY``, ``CORRUPT``), held, lost, ``FOREIGN``,
        ``FORGOTTEN`` or ``OVERLAP`` runs none of its commands; the overlap check reads
        the run-lease record in the same script, so a firing is enqueued only if no run of
        its address was in progress when it was won.

        ``notes[i]``, when given, is the history note of ``requests[i]``, written in the
        same script exactly when the firing's claim is written committed: when it is
        ``WON``, ``TAKEOVER``, ``OVERLAP`` or ``FORGOTTEN``, so a firing sent is never
        missing from its history. In its value the script replaces ``{{outcome}}`` with
        ``won``, ``takeover``, ``skipped_overlap`` or ``forgotten``, ``{{at_ms}}`` with
        its ``TIME`` in epoch milliseconds and ``{{lateness_ms}}`` with that time minus
        the request's ``release_ms``; the note lives ``ttl_ms`` from that time and its
        ``keep`` bounds its kind as in :meth:`post`. ``notes[i]`` may instead be a
        :class:`~beatless.stores.base.NoteItem`: the firing's item goes into its batch
        note, written once per script for all the firings of that batch noted in it
        (items closed with the outcome and the lateness, ``{{at_ms}}`` the script's
        time; split so that each note stays within ``NOTE_VALUE_LIMIT``). A ``None``
        note, or the note of a firing with any other outcome, writes nothing. Without
        ``notes`` the script gets no key or argument for them.
        """
        if len(commands) != len(requests):
            raise ValueError("claim_and_push: one list of commands per request")
        if notes is not None and len(notes) != len(requests):
            raise ValueError("claim_and_push: one note (or None) per request")
        return self._claim_batch(requests, node, 1, commands, notes, hold_off=self.holds_off)

    def _claim_batch(
        self,
        requests: Sequence[ClaimRequest],
        node: str,
        lease_ms: int,
        commands: Sequence[Sequence[Sequence[str]] | str] | None,
        notes: Sequence[Note | NoteItem | None] | None,
        *,
        hold_off: bool,
    ) -> list[Outcome]:
        self.refuse_claims()
        id_from = len(self._claim_key("")) + 1
        atomic = ("0" if commands is None else "1") + ("w" if self.wait else "")
        atomic += "h" if hold_off else ""
        seen = self.epoch.token if self.epoch is not None else ""
        horizon = "" if self._forgot_before_ms is None else self._forgot_before_ms
        head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node, lease_ms, TOLERANCE_MS]
        head += [LAST_RETENTION_MS, id_from, atomic, seen, horizon, new_token()]
        calls = []
        for start in range(0, len(requests), CHUNK):
            chunk = requests[start : start + CHUNK]
            # The distinct run-lease records of the chunk, numbered from 1 (0: none).
            run_ids = dict.fromkeys(r.run_id for r in chunk if r.run_id)
            runs = {run_id: j for j, run_id in enumerate(run_ids, 1)}
            keys = [self._last_key, self._epoch_key, *(self._claim_key(r.id) for r in chunk)]
            keys += [self._claim_key(run_id) for run_id in runs]
            args = head + [len(chunk)] + [_claim_arg(r, runs.get(r.run_id, 0)) for r in chunk]
            if commands is not None:
                args += [
                    c if isinstance(c, str) else json.dumps(c)
                    for c in commands[start : start + CHUNK]
                ]
            if notes is not None:
                note_keys, note_args = self._claim_notes(notes[start : start + CHUNK])
                keys += note_keys
                args += note_args
            calls.append((keys, args))
        # A two-phase claim must leave time to send within half its lease.
        timeout_ms = (
            self.wait_timeout_ms
            if commands is not None
            else min(self.wait_timeout_ms, max(1, lease_ms // 4))
        )
        with self._errors("claim"):
            replies = self._execute(self._claim, calls, "claim", timeout_ms)
        for reply in replies:
            self._adopt(_text(reply[1]))
        return [_OUTCOMES[letter] for letter in "".join(_text(r[0]) for r in replies)]

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        if not ids and not notes:
            return []
        note_keys, kinds = self._kinds(notes)
        head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node]
        calls = []
        # One script even without ids, for the notes.
        for start in range(0, max(len(ids), 1), CHUNK):
            chunk = ids[start : start + CHUNK]
            keys = [self._epoch_key, *(self._claim_key(i) for i in chunk)]
            args = [*head, len(chunk), NOTE_VERSION]
            if start == 0:
                # The notes go with the first script: the scripts of a pipeline run in
                # order, so a connection lost part-way has run the first ones only, and
                # no claim is committed without the notes.
                keys += note_keys
                args += kinds
            calls.append((keys, args))
        try:
            with self._errors("commit"):
                replies = self._execute(self._commit, calls, "commit", self.wait_timeout_ms)
        except StoreFull as exc:
            kept = self._commit_without_room(ids, node)
            raise StoreFull(str(exc), usage=exc.usage, kept=kept) from None
        if self.epoch is None and replies:
            # Only a first sighting: a changed epoch is left for the next claim to judge.
            self.epoch = _parse_epoch(_text(replies[-1][1]))
        return [flag == "1" for flag in "".join(_text(r[0]) for r in replies)]

    def _commit_without_room(self, ids: Sequence[str], node: str) -> list[bool] | None:
        """Commit the claims of ``ids`` without their notes, with the script that may
        write when Redis is out of memory: a claim whose message was sent must not be
        taken over when its lease runs out. ``None`` when that failed too (Redis before
        7 has no such script): the claims stay pending, and while Redis refuses writes,
        no other node can take them over either."""
        head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node]
        calls: list[tuple[list[str], list[str | int]]] = [
            (
                [self._epoch_key, *(self._claim_key(i) for i in ids[start : start + CHUNK])],
                [*head, len(ids[start : start + CHUNK]), NOTE_VERSION],
            )
            for start in range(0, len(ids), CHUNK)
        ]

        def commit() -> list[bool]:
            replies = self._run(self._commit_anyway, calls)
            return [flag == "1" for flag in "".join(_text(r[0]) for r in replies)]

        return commit_without_room(f"redis store {self._where}", len(ids), self._errors, commit)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        keys = [self._claim_key(i) for i in ids]
        calls: list[tuple[list[str], list[str | int]]] = [
            (keys[i : i + CHUNK], [FORMAT_VERSION, node]) for i in range(0, len(keys), CHUNK)
        ]
        with self._errors("release"):
            self._run(self._release, calls)

    def post(self, notes: Sequence[Note]) -> None:
        keys, kinds = self._kinds(notes)
        if not keys:
            return
        with self._errors("post notes"):
            self._run(self._post, [(keys, [NOTE_VERSION, EXPIRY_SLACK_MS, *kinds])])

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        """One ``MULTI``: an ``HSET`` per kind (see :mod:`beatless.stores.redis._kept`)."""
        if notes:
            with self._errors("keep notes"):
                pipe = self._client.pipeline(transaction=True)
                _kept.keep(pipe, notes, self._kept_key)
                pipe.execute()

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        with self._errors("read kept notes"):
            return _kept.read(self._client, kind, keys, self._kept_key)

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        with self._errors("delete kept notes"):
            _kept.delete(self._client, kind, keys, self._kept_key)

    def _kept_key(self, kind: str) -> str:
        return f"{self.prefix}kept:{_kept.kept_digest(kind)}"

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        asked = list(dict.fromkeys(kinds))
        if not asked:
            return {}
        with self._errors("read notes"):
            pipe = self._client.pipeline(transaction=True)
            pipe.time()
            for kind in asked:
                pipe.hgetall(self._notes_keys(kind)[0])
            (seconds, micros), *fields = pipe.execute()
        now_ms = int(seconds) * 1_000 + int(micros) // 1_000
        return {kind: _live_notes(f, now_ms) for kind, f in zip(asked, fields, strict=True)}

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """One ``MULTI``: ``TIME``, an ``HGETALL`` per kind of notes, an ``HMGET`` per kind
        of kept notes."""
        asked = list(dict.fromkeys(kinds))
        wanted = [(kind, keys) for kind, keys in kept.items() if keys]
        with self._errors("read notes"):
            pipe = self._client.pipeline(transaction=True)
            pipe.time()
            for kind in asked:
                pipe.hgetall(self._notes_keys(kind)[0])
            for kind, keys in wanted:
                _kept.queue_read(pipe, kind, keys, self._kept_key)
            (seconds, micros), *replies = pipe.execute()
        now_ms = int(seconds) * 1_000 + int(micros) // 1_000
        notes = {
            k: _live_notes(f, now_ms) for k, f in zip(asked, replies[: len(asked)], strict=True)
        }
        found: dict[str, dict[str, str]] = {kind: {} for kind in kept}
        for (kind, keys), values in zip(wanted, replies[len(asked) :], strict=True):
            found[kind] = _kept.read_reply(keys, values)
        return notes, found

    def time_ms(self) -> int:
        with self._errors("read the clock"):
            seconds, micros = self._client.time()
        return int(seconds) * 1_000 + int(micros) // 1_000

    def probe(self) -> None:
        """SET a probe key under the prefix (``PX`` 10 s), GET it back and DEL it."""
        key, value = f"{self.prefix}probe:{uuid.uuid4().hex}", uuid.uuid4().hex
        with self._errors("probe"):
            self._client.set(key, value, px=PROBE_TTL_MS)
            got = self._client.get(key)
            self._client.delete(key)
        if got is None or _text(got) != value:
            raise StoreError(
                f"redis store {self._where}: probe: wrote {key!r} but read back {got!r}"
            )

    def facts(self) -> StoreFacts:
        """``maxmemory-policy``, ``maxmemory``, ``appendonly``, ``save`` (``CONFIG GET``,
        or ``INFO`` where ``CONFIG`` is renamed), the role and the connected replicas
        (``INFO replication``), in one round trip."""
        config, info = ({}, {}) if self._closed else read_settings(self._client, self._lost)
        facts = judge_settings(self.facts_name, config, info)
        return with_wait(facts, info, self.wait, self.wait_timeout_ms) if self.wait else facts

    def quick_facts(self) -> StoreFacts | None:
        """``maxmemory-policy`` and ``maxmemory`` (:func:`read_policy`: one command)."""
        read = None if self._closed else read_policy(self._client, self._driver, self._lost)
        return None if read is None else StoreFacts(self.facts_name, (policy_fact(*read),))

    @property
    def facts_name(self) -> str:
        return f"redis store {self._where}"

    def server_run_id(self) -> str:
        """The server's ``run_id`` (``INFO server``): it changes when Redis restarts."""
        with self._errors("read the server's run_id"):
            return str(self._client.info("server")["run_id"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()

    # -- reading, for ``beatless status`` ------------------------------------------------

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The last firing won for each address, newest first, at most ``limit`` of them.

        Each is a dict of ``id``, ``address``, ``occurrence_ms``, ``node`` (the winner),
        ``claimed_ms`` (when the store granted it, on its clock), and ``committed`` and
        ``until_ms`` from the claim record, both ``None`` once Redis forgot the claim.
        """
        with self._errors("read the last winners"):
            fields = self._client.hgetall(self._last_key)
            known = (_last_row(_text(k), _text(v)) for k, v in fields.items())
            rows = sorted(
                (row for row in known if row is not None),
                key=lambda row: (-row["claimed_ms"], row["id"]),
            )[: max(0, limit)]
            records = self._client.mget([self._claim_key(r["id"]) for r in rows]) if rows else []
        for row, record in zip(rows, records, strict=True):
            state, until_ms = _state_of(record)
            row["committed"] = None if state is None else state == "committed"
            row["until_ms"] = until_ms
        return rows

    # -- internals ------------------------------------------------------------------------

    def _claim_key(self, id_: str) -> str:
        return f"{self.prefix}claim:{id_}"

    def _notes_keys(self, kind: str) -> tuple[str, str]:
        """The keys of a kind: its notes hash and that hash's expiry index."""
        digest = hashlib.sha256(kind.encode()).hexdigest()
        return f"{self.prefix}notes:{digest}", f"{self.prefix}notes-expiry:{digest}"

    def _kinds(self, notes: Sequence[Note]) -> tuple[list[str], list[str | int]]:
        """The keys of the kinds of ``notes``, and the notes as ``post.lua`` and
        ``commit.lua`` take them (see :func:`note_args`)."""
        return note_args(notes, self._notes_keys)

    def _claim_notes(
        self, notes: Sequence[Note | NoteItem | None]
    ) -> tuple[list[str], list[str | int]]:
        """The keys and the ARGV that ``claim.lua`` takes for one note (or none) per
        request: the distinct kinds' keys, numbered from 1; per request its note, or its
        item's batch number (``@g``) and item; then the batch notes. A batch takes items
        while the note they would make, every item closed at its longest, stays within
        ``NOTE_VALUE_LIMIT``; the next item opens another batch of the same template."""
        templates = [n.batch if isinstance(n, NoteItem) else n for n in notes if n is not None]
        kinds = dict.fromkeys(note.kind for note in templates)
        numbers = {kind: k for k, kind in enumerate(kinds, 1)}
        keys = [key for kind in kinds for key in self._notes_keys(kind)]
        args: list[str | int] = [NOTE_VERSION, len(kinds)]
        batches: list[Note] = []
        open_: dict[Note, tuple[int, int]] = {}
        """The batch each template fills now, by number, and its longest size so far."""
        for note in notes:
            if note is None:
                args += ["", "", ""]
            elif isinstance(note, NoteItem):
                size = len(note.item.encode()) + ITEM_TAIL_LIMIT + 1
                number, used = open_.get(note.batch, (0, 0))
                if not number or used + size > NOTE_VALUE_LIMIT:
                    batches.append(note.batch)
                    number, used = len(batches), len(note.batch.value.encode()) + 20
                open_[note.batch] = (number, used + size)
                args += [f"@{number}", "", note.item]
            else:
                args += [f"{numbers[note.kind]}|{note.ttl_ms}|{note.keep}", note.key, note.value]
        args.append(len(batches))
        for batch in batches:
            args += [f"{numbers[batch.kind]}|{batch.ttl_ms}|{batch.keep}", batch.key, batch.value]
        return keys, args

    def _adopt(self, record: str) -> None:
        """Adopt the epoch a claim saw; warn when it is not the one last seen."""
        epoch = _parse_epoch(record)
        if epoch is None:
            return
        seen, self.epoch = self.epoch, epoch
        failover = epoch_cause(record) == FAILOVER
        if not (failover and self.wait):
            # With ``wait``, a claim on the old primary counted only once a replica had
            # it: the script forgets pending claims only, on its own.
            self._forgot_before_ms = horizon_ms(seen, epoch, self._forgot_before_ms)
        if seen is None or not has_changed(seen, epoch):
            return
        try:
            run_id = self.server_run_id()
        except StoreError:
            run_id = "unknown"
        logger.warning(
            "redis store %s (server run_id %s): %s",
            shown(self._where, quoted=False),
            shown(run_id, quoted=False),
            describe_failover(seen, epoch, waits=self.wait > 0)
            if failover
            else describe_change(seen, epoch),
        )

    def _execute(
        self, script: Script, calls: list[tuple[list[str], list[str | int]]], what: str, ms: int
    ) -> list[Any]:
        """:meth:`_run`, and with ``wait``, :meth:`_run_acknowledged` waiting ``ms``."""
        if not self.wait:
            return self._run(script, calls)
        return self._run_acknowledged(script, calls, what, ms)

    def _run_acknowledged(
        self, script: Script, calls: list[tuple[list[str], list[str | int]]], what: str, ms: int
    ) -> list[Any]:
        """Run ``script`` once per call, then ``WAIT`` for :attr:`wait` replicas to have
        what they wrote, up to ``ms``, in one pipeline (one connection, one round trip).
        Raise :class:`~beatless.errors.StoreUnavailable` when fewer acknowledged: what the
        scripts wrote stands on the primary, but does not count yet (see "Waiting for a
        replica" in docs/stores.md). A call answered ``NOSCRIPT`` is run again, once the
        script is loaded, with its own ``WAIT``."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        acked: Any = 0
        for _attempt in range(2):
            pipe = self._client.pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.wait(self.wait, ms)
            *got, acked = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(todo, got, strict=True):
                if isinstance(reply, self._noscript):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                replies[i] = reply
            if isinstance(acked, Exception):
                raise acked
            if not missing:
                break
            self._client.script_load(script.script)
            todo = missing
        if int(acked) < self.wait:
            raise StoreUnavailable(
                f"redis store {self._where}: {what}: {int(acked)} of {self.wait} replica(s) "
                f"acknowledged it within {ms} ms (wait={self.wait}), so it does not count: "
                + _UNACKNOWLEDGED.get(what, "")
                + "; check the replicas' lag (INFO replication) or raise wait_timeout"
            )
        return replies

    def _run(self, script: Script, calls: list[tuple[list[str], list[str | int]]]) -> list[Any]:
        """Run ``script`` once per call: one EVALSHA, or several pipelined in one round trip.

        A script the server does not know (``NOSCRIPT``, after a restart or ``SCRIPT
        FLUSH``) is loaded and run again; redis-py's ``Script`` does it for a single call.
        """
        if len(calls) <= 1:
            return [script(keys, args) for keys, args in calls]
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        for index, reply in enumerate(replies):
            if isinstance(reply, self._noscript):
                replies[index] = script(*calls[index])
            elif isinstance(reply, Exception):
                raise reply
        return replies

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        if self._closed:
            raise StoreError(f"redis store {self._where}: cannot {what}: the store is closed")
        try:
            with driver_errors(self._driver, f"redis store {self._where}", what, self._secrets):
                yield
        except StoreFull as exc:
            raise self._full(exc) from None

    def _full(self, exc: StoreFull) -> StoreFull:
        """``exc`` with how full Redis is (``INFO memory``), said at WARNING at most once
        per ``FULL_WARN_EVERY_MS``."""
        try:
            usage = usage_of(self._client.info("memory"))
        except self._lost:
            usage = None
        return told_full(exc, usage, self._full_warned)


def told_full(exc: StoreFull, usage: str | None, warned: WarnEvery) -> StoreFull:
    """``exc`` with ``usage`` (how full Redis is), said at WARNING at most once per
    ``FULL_WARN_EVERY_MS`` (``warned``: the store's own)."""
    told = f"{exc} ({usage})" if usage else str(exc)
    if warned.allows("full", FULL_WARN_EVERY_MS, int(time.monotonic() * 1_000)):
        logger.warning(
            "%s: Redis is full and refuses writes; claims are refused and their firings "
            "missed (reported) until it has room: raise maxmemory, free memory, or give "
            "the claim store a Redis of its own",
            told,
        )
    return StoreFull(told, usage=usage, kept=exc.kept)


def commit_without_room(
    store: str,
    count: int,
    errors: Callable[[str], AbstractContextManager[None]],
    commit: Callable[[], list[bool]],
) -> list[bool] | None:
    """What ``commit`` returns: it runs the commit script flagged ``allow-oom``
    (``_COMMIT_WITHOUT_ROOM``) on the ``count`` claims of a commit refused as full, within
    the store's ``errors``. ``None`` when that fails too (Redis before 7 has no such
    flag): said at WARNING; the claims stay pending, and while Redis refuses writes no
    other node can take them over."""
    try:
        with errors("commit without room"):
            return commit()
    except StoreError as exc:
        logger.warning(
            "%s: %d sent firing(s) left pending (%s); while Redis refuses writes no other "
            "node can take them over",
            shown(store, quoted=False),
            count,
            exc,
        )
        return None


SETTINGS = ("maxmemory-policy", "maxmemory", "appendonly", "save")
"""The settings :meth:`RedisStore.facts` reads with ``CONFIG GET``."""
INFO_SECTIONS = ("memory", "persistence", "replication")
"""The ``INFO`` sections it reads beside them, and falls back on when ``CONFIG`` is
renamed or disabled (managed Redis): ``maxmemory_policy``, ``maxmemory``,
``used_memory``, ``aof_enabled``, ``role``, ``connected_slaves``."""
EVICTING = ("allkeys-", "volatile-")
"""The prefixes of the ``maxmemory-policy`` values that evict keys. Claims carry a TTL,
so the ``volatile-*`` policies evict them as readily as ``allkeys-*``."""
NEARLY_FULL = 0.9
"""A Redis under ``noeviction`` this full (``used_memory / maxmemory``) is warned about."""
FULL_WARN_EVERY_MS = 60_000
"""A store that refuses writes as full says so at WARNING at most this often."""
FIX_POLICY = (
    "run CONFIG SET maxmemory-policy noeviction (and CONFIG REWRITE), or give the claim "
    "store a Redis of its own"
)


def read_settings(
    client: Any, errors: tuple[type[BaseException], ...]
) -> tuple[dict[str, str], dict[str, Any]]:
    """``CONFIG GET`` of each of ``SETTINGS`` and ``INFO`` of each of ``INFO_SECTIONS``,
    in one round trip: ``(config, info)``. A command refused (``CONFIG`` renamed) is left
    out of its dict; a connection that fails (``errors``) leaves both empty."""
    try:
        pipe = client.pipeline(transaction=False)
        for name in SETTINGS:
            pipe.config_get(name)
        for section in INFO_SECTIONS:
            pipe.info(section)
        replies = pipe.execute(raise_on_error=False)
    except errors:
        return {}, {}
    config: dict[str, str] = {}
    for reply in replies[: len(SETTINGS)]:
        if isinstance(reply, dict):
            config.update({_text(k): _text(v) for k, v in reply.items()})
    info: dict[str, Any] = {}
    for reply in replies[len(SETTINGS) :]:
        if isinstance(reply, dict):
            info.update({_text(k): v for k, v in reply.items()})
    return config, info


def read_policy(
    client: Any, driver: ModuleType, errors: tuple[type[BaseException], ...]
) -> tuple[object, int | None] | None:
    """``maxmemory-policy`` and ``maxmemory`` in one command: ``CONFIG GET maxmemory*``, or
    ``INFO memory`` where ``CONFIG`` is refused (renamed, or not granted); ``None`` if
    neither answers."""
    try:
        try:
            config = {_text(k): v for k, v in client.config_get("maxmemory*").items()}
            return config.get("maxmemory-policy"), _number(config.get("maxmemory"))
        except driver.exceptions.ResponseError:
            info = client.info("memory")
            return info.get("maxmemory_policy"), _number(info.get("maxmemory"))
    except errors:
        return None


def judge_settings(store: str, config: dict[str, str], info: dict[str, Any]) -> StoreFacts:
    """The facts of one Redis server from what :func:`read_settings` read."""
    maxmemory = _number(config.get("maxmemory", info.get("maxmemory")))
    facts = (
        policy_fact(config.get("maxmemory-policy", info.get("maxmemory_policy")), maxmemory),
        _maxmemory_fact(maxmemory, _number(info.get("used_memory")), config, info),
        *_persistence_facts(config, info),
        *_replication_facts(info),
    )
    return StoreFacts(store, facts, usage=usage_of(info, maxmemory))


def policy_fact(policy: object, maxmemory: int | None) -> Fact:
    name = "maxmemory-policy"
    if policy is None:
        why = "could not be read (CONFIG and INFO refused): make sure it is noeviction"
        return Fact(name, UNKNOWN, Verdict.WARN, why)
    value = _text(policy)
    if not value.startswith(EVICTING):
        return Fact(name, value)
    if maxmemory == 0:
        why = (
            "evicts keys, claims included, once a maxmemory is set (none is: nothing is "
            f"evicted now, and a limit set later is noticed within a second); {FIX_POLICY}"
        )
        return Fact(name, value, Verdict.WARN, why)
    why = (
        "Redis evicts keys when its memory is full, claims included (they carry a TTL, so "
        "volatile-* policies evict them too), and a firing whose claim was evicted is sent "
        f"again; {FIX_POLICY}"
    )
    return Fact(name, value, Verdict.REFUSE, why)


def _maxmemory_fact(
    maxmemory: int | None, used: int | None, config: dict[str, str], info: dict[str, Any]
) -> Fact:
    if maxmemory is None:
        return Fact("maxmemory", UNKNOWN, Verdict.WARN, "could not be read")
    if maxmemory == 0:
        return Fact("maxmemory", "0 (no limit)")
    value = _size(maxmemory)
    policy = _text(config.get("maxmemory-policy", info.get("maxmemory_policy", "")))
    if used is not None and used >= NEARLY_FULL * maxmemory and not policy.startswith(EVICTING):
        why = (
            f"used_memory {_size(used)} is {used / maxmemory:.0%} of it: a full Redis refuses "
            "claims, and their firings are missed (reported); raise maxmemory or free memory"
        )
        return Fact("maxmemory", value, Verdict.WARN, why)
    return Fact("maxmemory", value)


def _persistence_facts(config: dict[str, str], info: dict[str, Any]) -> list[Fact]:
    aof = config.get("appendonly")
    if aof is None and "aof_enabled" in info:
        aof = "yes" if _number(info["aof_enabled"]) else "no"
    save = config.get("save")
    saved = Fact("save", UNKNOWN if save is None else repr(save))
    if aof == "yes":
        return [Fact("appendonly", aof), saved]
    if aof is None:
        why = "could not be read: a Redis without persistence forgets every claim on restart"
        return [Fact("appendonly", UNKNOWN, Verdict.WARN, why), saved]
    lost = (
        "every claim"
        if save == ""
        else "the claims written since the last snapshot"
        if save
        else "the claims written since the last snapshot, if it saves any"
    )
    why = (
        f"a restart forgets {lost}: firings released up to then are not sent again, they "
        "are reported forgotten (missed); appendonly yes keeps them"
    )
    return [Fact("appendonly", aof, Verdict.WARN, why), saved]


def _replication_facts(info: dict[str, Any]) -> list[Fact]:
    role = info.get("role")
    if role is None:
        return [Fact("role", UNKNOWN, Verdict.WARN, "could not be read (INFO replication)")]
    role = _text(role)
    if role != "master":
        why = "a replica: claims must be written on the primary; point the URL at it"
        return [Fact("role", role, Verdict.REFUSE, why)]
    replicas = _number(info.get("connected_slaves")) or 0
    if not replicas:
        return [Fact("role", role), Fact("connected replicas", "0")]
    why = (
        "replication is asynchronous: a replica promoted by a failover may lack the last "
        "claims; firings released up to the failover that nobody holds there are reported "
        "forgotten (missed), not sent again; wait=1 in the store URL makes each claim wait "
        "for a replica"
    )
    return [Fact("role", role), Fact("connected replicas", str(replicas), Verdict.WARN, why)]


def usage_of(info: dict[str, Any], maxmemory: int | None = None) -> str | None:
    """``used_memory 7.9 MiB of maxmemory 8.0 MiB (99%)`` from ``INFO memory``; ``None``
    when it has no ``used_memory``."""
    used = _number(info.get("used_memory"))
    limit = _number(info.get("maxmemory")) if maxmemory is None else maxmemory
    if used is None:
        return None
    if not limit:
        return f"used_memory {_size(used)}, no maxmemory"
    return f"used_memory {_size(used)} of maxmemory {_size(limit)} ({used / limit:.0%})"


def _number(value: object) -> int | None:
    if isinstance(value, int):
        return value
    text = _text(value) if value is not None else ""
    return int(text) if text.isdigit() else None


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} GiB"


def is_oom(error: BaseException) -> bool:
    """Whether a Redis error is a write refused because memory is full (``OOM command
    not allowed``, also when raised inside a script)."""
    oom = getattr(getattr(type(error), "__module__", None), "startswith", None)
    named = type(error).__name__ == "OutOfMemoryError" and oom is not None and oom("redis")
    return named or "command not allowed when used memory" in str(error)


def key_prefix(store: str, namespace: object, prefix: str | None) -> str:
    """The prefix of a store's keys: ``prefix``, or ``beatless:{namespace}:``; a namespace
    that is not a non-empty string is refused, naming ``store``."""
    if not isinstance(namespace, str) or not namespace:
        raise ConfigError(f"{store}: namespace must be a non-empty string, got {namespace!r}")
    return prefix if prefix is not None else f"beatless:{namespace}:"


def _driver(store: str = "the redis store") -> ModuleType:
    return driver("redis", store)


def note_args(
    notes: Sequence[Note], notes_keys: Callable[[str], tuple[str, str]]
) -> tuple[list[str], list[str | int]]:
    """The keys of the kinds of ``notes`` (``notes_keys`` names a kind's hash and its
    expiry index), and the notes as ``post.lua`` and ``commit.lua`` take them: per kind,
    its keep, its count and its notes."""
    by_kind: dict[str, list[Note]] = {}
    for note in notes:
        by_kind.setdefault(note.kind, []).append(note)
    keys: list[str] = []
    args: list[str | int] = []
    for kind, posted in by_kind.items():
        keys += notes_keys(kind)
        # The kind's bound is the last one its notes ask for.
        keep = next((note.keep for note in reversed(posted) if note.keep), 0)
        args += [keep, len(posted)]
        for note in posted:
            args += [note.key, note.ttl_ms, note.value]
    return keys, args


@contextmanager
def driver_errors(
    driver: ModuleType,
    store: str,
    what: str,
    secrets: Sequence[str],
    *,
    unavailable: tuple[type[BaseException], ...] = (),
    failed: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """redis-py's errors as beatless's, for the store that ``store`` names (its kind and
    masked URL), with ``secrets`` masked in every message: a refused login is a
    :class:`~beatless.errors.StoreError` that says to check it; a connection lost, timed
    out or read-only (and ``unavailable``) is :class:`~beatless.errors.StoreUnavailable`,
    which the loop retries; any other Redis error (and ``failed``) is a
    :class:`~beatless.errors.StoreError`."""
    exc = driver.exceptions
    try:
        yield
    except (exc.AuthenticationError, exc.AuthorizationError) as error:
        raise StoreError(
            f"{store}: cannot {what}: {_masked(error, secrets)}; check the user name and password"
        ) from None
    except (exc.ConnectionError, exc.TimeoutError, exc.ReadOnlyError, *unavailable) as error:
        raise StoreUnavailable(f"{store}: cannot {what}: {_masked(error, secrets)}") from None
    except (exc.RedisError, *failed) as error:
        if is_oom(error):
            raise StoreFull(f"{store}: cannot {what}: {_masked(error, secrets)}") from None
        raise StoreError(f"{store}: cannot {what}: {_masked(error, secrets)}") from None


def _masked(exc: BaseException, secrets: Sequence[str]) -> str:
    text = str(exc) or type(exc).__name__
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _client_from_url(
    driver: ModuleType, url: str, socket_timeout: DurationLike, where: str
) -> redis_module.Redis:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"redis store: unknown URL scheme {scheme!r} in {where}: use redis://host:port/db, "
            f"rediss://host:port/db or unix:///path/to/redis.sock"
        )
    timeout = as_timedelta(socket_timeout, name="redis store: socket_timeout").total_seconds()
    if timeout <= 0:
        raise ConfigError(f"redis store: socket_timeout must be positive, got {socket_timeout!r}")
    retry = driver.retry.Retry(driver.backoff.NoBackoff(), 1)
    try:
        client: redis_module.Redis = driver.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=retry
        )
    except ValueError as exc:
        raise ConfigError(f"redis store: bad URL {where}: {scrub(str(exc), url)}") from None
    return client


def _secrets_of_client(client: redis_module.Redis) -> list[str]:
    password = client.connection_pool.connection_kwargs.get("password")
    return [str(password)] if password else []


def _describe_client(client: redis_module.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{db}"


def _claim_arg(request: ClaimRequest, run: int) -> str:
    """Request ``request`` as the claim script reads it; ``run`` numbers its run-lease
    key among the script's keys (``0``: none)."""
    r = request
    if r.memory_ms <= 0 or r.max_late_ms < 0:
        raise ConfigError(
            f"redis store: firing {r.id} ({r.address!r}): memory_ms must be positive and "
            f"max_late_ms not negative, got {r.memory_ms} and {r.max_late_ms}"
        )
    numbers = f"{r.occurrence_ms}|{r.max_late_ms}|{r.memory_ms}|{r.release_ms}"
    return f"{numbers}|{r.tag}|{run}|{r.address}"


def _parse_epoch(record: str) -> Epoch | None:
    """``v=2|{started_ms}|{token}|{replid}|{cause}`` (or an earlier ``v=1|{started_ms}|
    {token}``) as an :class:`Epoch` (``None`` when there is none)."""
    parts = record.split("|", 2)
    if len(parts) != 3 or not parts[0].startswith("v=") or not parts[1].isdigit():
        return None
    token = parts[2] if parts[0] == "v=1" else parts[2].split("|", 1)[0]
    return Epoch(token, int(parts[1]))


def epoch_cause(record: str) -> str:
    """What began the epoch of a record: ``failover`` (a promoted replica) or ``new``."""
    parts = record.split("|")
    return parts[4] if len(parts) == 5 and parts[0] != "v=1" else NEW


def wait_in_url(url: str, wait: int, timeout: DurationLike) -> tuple[str, int, DurationLike]:
    """``url`` without its ``wait`` and ``wait_timeout`` options, and their values (those
    given when the URL has none): the driver would refuse them."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in WAIT_OPTIONS}
    if not ours:
        return url, wait, timeout
    rest = urlencode([(k, v) for k, v in query if k not in WAIT_OPTIONS])
    given = ours.get("wait", str(wait))
    if not given.isdigit():
        raise ConfigError(
            f"redis store {mask_url(url)}: wait={given!r} must be a number of replicas (0, 1, ...)"
        )
    return urlunsplit(parts._replace(query=rest)), int(given), ours.get("wait_timeout", timeout)


def _checked_wait(client: Any, wait: int, timeout: DurationLike) -> tuple[int, int]:
    """``wait`` and ``timeout`` in ms, checked: a timeout under the client's socket
    timeout, so that ``WAIT`` answers before the connection gives up."""
    if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0:
        raise ConfigError(f"redis store: wait must be 0 or more replicas, got {wait!r}")
    ms = int(as_timedelta(timeout, name="redis store: wait_timeout").total_seconds() * 1_000)
    if ms <= 0:
        raise ConfigError(f"redis store: wait_timeout must be positive, got {timeout!r}")
    socket_s = client.connection_pool.connection_kwargs.get("socket_timeout")
    if wait and socket_s and ms >= socket_s * 1_000:
        raise ConfigError(
            f"redis store: wait_timeout {ms} ms must be under the socket timeout "
            f"({socket_s * 1_000:.0f} ms), or every unacknowledged claim is a lost connection"
        )
    return wait, ms


def with_wait(facts: StoreFacts, info: dict[str, Any], wait: int, timeout_ms: int) -> StoreFacts:
    """``facts`` of a store whose claims wait for ``wait`` replicas: too few connected is a
    refusal (every claim would time out); enough is no longer a warning."""
    replicas = _number(info.get("connected_slaves"))
    if replicas is None:
        return facts
    asked = Fact("wait", f"{wait} replica(s) within {timeout_ms} ms")
    if replicas < wait:
        why = (
            f"wait={wait} asks {wait} replica(s) to acknowledge each claim and {replicas} "
            "is connected: every claim would time out; start a replica, or drop wait from "
            "the store URL"
        )
        got = Fact("connected replicas", str(replicas), Verdict.REFUSE, why)
    else:
        got = Fact("connected replicas", str(replicas))
    kept = tuple(f for f in facts.facts if f.name != "connected replicas")
    return replace(facts, facts=(*kept, got, asked))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _last_row(address: str, value: str) -> dict[str, Any] | None:
    parts = value.split("|", 4)
    if len(parts) != 5 or parts[0] != LAST_VERSION:
        return None
    _version, id_, occurrence_ms, claimed_ms, node = parts
    return {
        "id": id_,
        "address": address,
        "occurrence_ms": int(occurrence_ms),
        "node": node,
        "claimed_ms": int(claimed_ms),
    }


def _live_notes(fields: dict[Any, Any], now_ms: int) -> dict[str, str]:
    """The notes of one kind's hash that are live at ``now_ms``, ``{key: value}``."""
    live = {}
    for key, record in fields.items():
        version, _, rest = _text(record).partition("|")
        expires_ms, bar, value = rest.partition("|")
        readable = version == f"v={NOTE_VERSION}" and bar and expires_ms.isdigit()
        if readable and int(expires_ms) >= now_ms:
            live[_text(key)] = value
    return live


def _state_of(record: Any) -> tuple[str | None, int | None]:
    if record is None:
        return None, None
    parts = _text(record).split("|", 3)
    if len(parts) != 4 or parts[0] not in READ_VERSIONS:
        return None, None
    return parts[1], int(parts[2])


def server_identity(client: Any) -> tuple[str, int]:
    """``(run_id, db)`` of the server and database a redis-py client talks to.

    ``run_id`` is drawn by a Redis server when it starts, so two clients with the same
    identity reach one server, whatever host name or address each was given.
    """
    run_id = str(client.info("server")["run_id"])
    return run_id, int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
