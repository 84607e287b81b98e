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

Keys, records and scripts: :mod:`beatless.stores.redis._wire`; the server's settings,
judged: :mod:`beatless.stores.redis._facts`.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from beatless.core._logtext import WarnEvery, shown
from beatless.core.durations import DurationLike
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores._epoch import (
    EVICTED,
    FAILOVER,
    describe_change,
    describe_failover,
    has_changed,
    horizon_ms,
    new_token,
)
from beatless.stores.base import (
    OUTCOME_LETTERS,
    TOLERANCE_MS,
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    KeptNote,
    Note,
    NoteItem,
    Outcome,
    StoreFacts,
)
from beatless.stores.redis import _kept, _sentinel
from beatless.stores.redis._client import (
    DEFAULT_SOCKET_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT,
    SCHEMES,
    UNACKNOWLEDGED,
    Call,
    checked_wait,
    client_from_url,
    describe_client,
    driver_errors,
    key_prefix,
    masked,
    redis_driver,
    run_acknowledged,
    run_scripts,
    secrets_of_client,
    server_identity,
    wait_in_url,
)
from beatless.stores.redis._facts import (
    EvictedEpoch,
    PolicyWatch,
    judge_settings,
    policy_fact,
    read_settings,
    read_usage,
    told_full,
    with_wait,
)
from beatless.stores.redis._logs import Logs, kind_notes
from beatless.stores.redis._packer import packer_of
from beatless.stores.redis._refresh import Refresh
from beatless.stores.redis._wire import (
    CHUNK,
    CLAIM,
    CLAIM_NOTES,
    CLAIM_NOTES_ANYWAY,
    COMMIT,
    COMMIT_WITHOUT_ROOM,
    EPOCHS,
    EXPIRY_SLACK_MS,
    FORMAT_VERSION,
    NOTE_VERSION,
    NOTING_LIFE_MS,
    POST,
    PROBE_TTL_MS,
    READ_KINDS,
    READ_PAGE,
    RELEASE,
    Pushed,
    Ready,
    as_text,
    claim_args,
    claim_note_args,
    claim_record,
    commit_without_room,
    epoch_cause,
    live_notes,
    live_records,
    note_args,
    parse_epoch,
    push_args,
    pushed_commands,
    read_pages,
)

if TYPE_CHECKING:
    import redis as redis_module
    from redis.commands.core import Script

logger = logging.getLogger(__name__)

_NOTED = frozenset({Outcome.WON, Outcome.TAKEOVER, Outcome.OVERLAP, Outcome.FORGOTTEN})
"""The outcomes whose history note the claim's notes script writes."""

__all__ = ["SCHEMES", "Pushed", "Ready", "RedisStore", "pushed_commands", "server_identity"]


class RedisStore(ClaimStore):
    """Claims in Redis, shared by every node that points at the same server and prefix.

    ``client_or_url`` is a ``redis.Redis`` client, left open by :meth:`close`, or a
    ``redis://``, ``rediss://``, ``unix://`` or ``redis+sentinel://`` URL (Redis
    Sentinel: :mod:`beatless.stores.redis._sentinel`), whose client the store creates
    and closes. A client through Sentinel (a URL's, or one of ``master_for`` passed in)
    follows a failover to the promoted master, where the claim script finds the change
    of identity, as it finds a promoted replica's.

    A created client waits ``socket_timeout`` (seconds, ``"2s"``, ``timedelta``; a
    ``socket_timeout`` in the URL wins) to connect and for each reply, and retries a
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
        driver = redis_driver()
        if isinstance(client_or_url, str):
            client_or_url, wait, wait_timeout = wait_in_url(client_or_url, wait, wait_timeout)
        if prefix is not None and (not isinstance(prefix, str) or not prefix):
            raise ConfigError(f"redis store: prefix must be a non-empty string, got {prefix!r}")
        self.prefix = key_prefix("redis store", namespace, prefix)
        self._epoch_key = f"{self.prefix}epoch"
        self._logs = Logs(self._notes_keys, self._log_key, EXPIRY_SLACK_MS)
        self._refresh = Refresh(
            self._notes_keys, NOTE_VERSION, EXPIRY_SLACK_MS, self._server_version
        )
        self._policy = PolicyWatch()
        self._evicted = EvictedEpoch()
        self._forgot_before_ms: int | None = None
        self._closed = False
        if isinstance(client_or_url, str):
            self._where = mask_url(client_or_url)
            self._secrets = secrets_of(client_or_url)
            self._client = client_from_url(driver, client_or_url, socket_timeout, self._where)
            self._owns_client = True
        elif isinstance(client_or_url, driver.Redis):
            self._client = client_or_url
            self._where = describe_client(client_or_url)
            self._secrets = secrets_of_client(client_or_url)
            self._owns_client = False
        else:
            raise ConfigError(
                f"redis store: expected a redis.Redis client or a redis:// URL, got "
                f"{type(client_or_url).__name__}"
            )
        self.wait, self.wait_timeout_ms = checked_wait(self._client, wait, wait_timeout)
        self._follow = _sentinel.MasterWatch(self._client)
        self._driver = driver
        self._lost = (driver.exceptions.RedisError, OSError)
        self._noscript = driver.exceptions.NoScriptError
        self._claim = self._client.register_script(CLAIM)
        self._epochs_script = self._client.register_script(EPOCHS)
        self._claim_notes = self._client.register_script(CLAIM_NOTES)
        self._claim_notes_anyway = self._client.register_script(CLAIM_NOTES_ANYWAY)
        self._commit = self._client.register_script(COMMIT)
        self._commit_anyway = self._client.register_script(COMMIT_WITHOUT_ROOM)
        self._full_warned = WarnEvery()
        self._release = self._client.register_script(RELEASE)
        self._post = self._client.register_script(POST)
        self._packer = packer_of(self._client)
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
    checks_revisions = True

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
        commands: Sequence[Sequence[Sequence[str]] | str | Pushed],
        *,
        node: str,
        notes: Sequence[Note | NoteItem | None] | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> list[Outcome]:
        """Claim each firing and, for each one won, run its Redis commands in the same
        script: the building block of claim-and-enqueue on a broker's own Redis.

        ``commands[i]`` is the list of commands (``["LPUSH", key, payload]``, ...) that
        enqueue the message of ``requests[i]`` exactly as the broker's client would, that
        list checked and laid out ahead of the claim (:func:`pushed_commands`), or that
        list as JSON text (every argument a JSON string). The script receives every
        argument as an argument of its own and runs each command on them as they came. A
        firing won this way is committed at once; there is nothing to commit or release.
        A live pending claim of a two-phase node (a fleet mid-rollout) gives ``HELD``.
        A firing refused (``LATE``, ``EARLY``, ``CORRUPT``), held, lost, ``FOREIGN``,
        ``FORGOTTEN`` or ``OVERLAP`` runs none of its commands; the overlap check reads
        the run-lease record in the same script, so a firing is enqueued only if no run of
        its address was in progress when it was won.

        ``notes[i]``, when given, is the history note of ``requests[i]``, written exactly
        when the firing's claim is written committed: when it is ``WON``, ``TAKEOVER``,
        ``OVERLAP`` or ``FORGOTTEN``. The notes are written by a script of their own
        (``claim_notes.lua``) sent once the claim scripts have answered (with ``wait``, in
        their pipeline, before its ``WAIT``), so that the messages reach the queue, and a
        consumer can pop them, before the notes are written: the claim script
        leaves its letters and its ``TIME`` under a key of the call's own, which the notes
        script reads and deletes. The notes script may write when Redis is over its
        ``maxmemory`` (Redis 7 and later), as the claim script could once it had written;
        should it still fail, that is said at WARNING (the firings sent have no history
        then, and a missed-firing sweep may count them missed). In a note's value the
        script replaces ``{{outcome}}`` with ``won``, ``takeover``, ``skipped_overlap`` or
        ``forgotten``, ``{{at_ms}}`` with the claim script's ``TIME`` in epoch
        milliseconds and ``{{lateness_ms}}`` with that time minus the request's
        ``release_ms``; the note lives ``ttl_ms`` from that time and its
        ``keep`` bounds its kind as in :meth:`post` (a logged note is one ``XADD`` to its
        kind's log: :mod:`beatless.stores.redis._logs`). ``notes[i]`` may instead be a
        :class:`~beatless.stores.base.NoteItem`: the firing's item goes into its batch
        note, written once per notes script for all the firings of that batch noted in it
        (items closed with the outcome and the lateness, ``{{at_ms}}`` the script's
        time; split so that each note stays within ``NOTE_VALUE_LIMIT``). A ``None``
        note, or the note of a firing with any other outcome, writes nothing. Without
        ``notes`` the script gets no key or argument for them.

        ``before_send``, when given, is called once the call is packed, right before it is
        sent (with redis-py packing in Python on a store made from a URL; else before the
        call): a node that readied its claims ahead of their release waits there.
        """
        if len(commands) != len(requests):
            raise ValueError("claim_and_push: one list of commands per request")
        if notes is not None and len(notes) != len(requests):
            raise ValueError("claim_and_push: one note (or None) per request")
        return self._claim_batch(
            requests, node, 1, commands, notes, hold_off=self.holds_off, before_send=before_send
        )

    def _claim_batch(
        self,
        requests: Sequence[ClaimRequest],
        node: str,
        lease_ms: int,
        commands: Sequence[Sequence[Sequence[str]] | str | Pushed] | None,
        notes: Sequence[Note | NoteItem | None] | None,
        *,
        hold_off: bool,
        before_send: Callable[[], None] | None = None,
    ) -> list[Outcome]:
        self.refuse_claims()
        id_from = len(self._claim_key("")) + 1
        atomic = ("0" if commands is None else "1") + ("w" if self.wait else "")
        atomic += "h" if hold_off else ""
        seen = self.epoch.token if self.epoch is not None else ""
        horizon = "" if self._forgot_before_ms is None else self._forgot_before_ms
        head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node, lease_ms, TOLERANCE_MS]
        head += [0, id_from, atomic, seen, horizon, new_token()]
        calls = []
        noted: list[Call] = []
        noted_from: list[int] = []
        """Where the requests of each notes script start."""
        extends: list[tuple[str, float]] = []
        for start in range(0, len(requests), CHUNK):
            chunk = requests[start : start + CHUNK]
            # The distinct run-lease records of the chunk, numbered from 1 (0: none).
            run_ids = dict.fromkeys(r.run_id for r in chunk if r.run_id)
            runs = {run_id: j for j, run_id in enumerate(run_ids, 1)}
            keys = [self._epoch_key, *(self._claim_key(r.id) for r in chunk)]
            live_keys, requests_args = claim_args(chunk, runs, self._kept_key)
            keys += [*(self._claim_key(run_id) for run_id in runs), *live_keys]
            args = head + requests_args
            pushes = [] if commands is None else commands[start : start + CHUNK]
            pushed = [c if isinstance(c, Pushed) else pushed_commands(c) for c in pushes]
            after: list[str | int] = [""] if pushed else []
            chunk_notes = [] if notes is None else notes[start : start + CHUNK]
            if any(note is not None for note in chunk_notes):
                # Written by a script of their own, right after the claims (claim.lua,
                # "Notes"): the claim leaves its letters under a key of this call's own.
                noting = f"{self.prefix}noting:{new_token()}"
                keys.append(noting)
                after = [NOTING_LIFE_MS]
                note_keys, note_args_ = claim_note_args(chunk_notes, chunk, self._logs, extends)
                noted_from.append(start)
                noted.append(
                    (
                        self._notes_script(),
                        [noting, *note_keys],
                        [NOTE_VERSION, EXPIRY_SLACK_MS, *note_args_],
                    )
                )
            # The commands' arguments go last, after the notes: each firing's head names
            # where its own start.
            heads, pushed_args = push_args(pushed, len(args) + len(pushed) + len(after) + 1)
            args += [*heads, *after, *pushed_args]
            calls.append((keys, args))
        # A two-phase claim must leave time to send within half its lease.
        timeout_ms = (
            self.wait_timeout_ms
            if commands is not None
            else min(self.wait_timeout_ms, max(1, lease_ms // 4))
        )
        # Packed before the wait for the release: the claims, and with ``wait`` the notes
        # and the WAIT of the same pipeline (else the notes follow the claims' replies).
        sent = len(calls) + (len(noted) + 1 if self.wait else 0)
        with self._errors("claim"), self._holding(sent, before_send):
            replies = self._execute(self._claim, calls, "claim", timeout_ms, then=noted)
        replies, noted_replies = replies[: len(calls)], replies[len(calls) :]
        self._logs.made(extends)
        for reply in replies:
            self._adopt(as_text(reply[1]))
        outcomes = [OUTCOME_LETTERS[letter] for letter in "".join(as_text(r[0]) for r in replies)]
        self._unnoted(noted_replies, noted_from, outcomes)
        return outcomes

    def _notes_script(self) -> Script:
        """The script that writes a claim script's notes: flagged ``allow-oom`` on Redis 7
        and later (asked once), so that a claim that pushed Redis over its ``maxmemory``
        still has its firings' history written, as one script with the claims had."""
        return self._claim_notes_anyway if self._refresh.supported() else self._claim_notes

    def _unnoted(
        self, replies: Sequence[Any], starts: Sequence[int], outcomes: Sequence[Outcome]
    ) -> None:
        """Say at WARNING when the notes script of a claim script that noted firings failed,
        or found none of its letters (evicted): the firings it sent have no history then,
        so a missed-firing sweep may count them missed."""
        for reply, start in zip(replies, starts, strict=True):
            chunk = outcomes[start : start + CHUNK]
            noted = sum(outcome in _NOTED for outcome in chunk)
            if not noted or reply == 1:
                continue
            cause = (
                masked(reply, self._secrets)
                if isinstance(reply, Exception)
                else "what the claim left for it was gone: evicted?"
            )
            logger.warning(
                "redis store %s: the history of %d claimed firing(s) was not written (%s); "
                "a missed-firing sweep may count them missed",
                shown(self._where, quoted=False),
                noted,
                cause,
            )

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        if not ids and not notes:
            return []
        extends: list[tuple[str, float]] = []
        note_keys, kinds = note_args(notes, self._logs, extends)
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
        self._logs.made(extends)
        if self.epoch is None and replies:
            # Only a first sighting: a changed epoch is left for the next claim to judge.
            self.epoch = parse_epoch(as_text(replies[-1][1]))
        return [flag == "1" for flag in "".join(as_text(r[0]) for r in replies)]

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
            return [flag == "1" for flag in "".join(as_text(r[0]) for r in replies)]

        return commit_without_room(f"redis store {self._where}", len(ids), self._errors, commit)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        keys = [self._claim_key(i) for i in ids]
        calls: list[tuple[list[str], list[str | int]]] = [
            (keys[i : i + CHUNK], [FORMAT_VERSION, node]) for i in range(0, len(keys), CHUNK)
        ]
        with self._errors("release"):
            self._run(self._release, calls)

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        with self._errors("read claim records"):
            values = self._client.mget([self._claim_key(i) for i in ids]) if ids else []
        found = ((id_, claim_record(value)) for id_, value in zip(ids, values, strict=True))
        return {id_: record for id_, record in found if record is not None}

    def post(self, notes: Sequence[Note]) -> None:
        """One script that writes ``notes`` and sweeps their kinds; the notes of a kind this
        store object swept lately, kept in place with no bound, in one ``MULTI`` instead
        (:mod:`beatless.stores.redis._refresh`)."""
        extends: list[tuple[str, float]] = []
        with self._errors("post notes"):
            quick, scripted = self._refresh.split(notes)
            keys, kinds = note_args(scripted, self._logs, extends)
            if keys:
                self._run(self._post, [(keys, [NOTE_VERSION, EXPIRY_SLACK_MS, *kinds])])
                self._refresh.swept(scripted)
            if quick:
                self._refresh.write(self._client, quick)
        self._logs.made(extends)

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
        return self._read(kinds, logs=False)

    def read_logs(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """One pipeline: ``TIME``, then per kind the ``HGETALL`` of its hash and the
        ``XRANGE`` of its log (:mod:`beatless.stores.redis._logs`); a key in both reads
        the log's note, and the kind is bounded over both
        (:func:`~beatless.stores.redis._logs.kind_notes`)."""
        return self._read(kinds, logs=True)

    def _read(self, kinds: Sequence[str], *, logs: bool) -> dict[str, dict[str, str]]:
        """``READ_KINDS`` kinds a round trip, each its own pipeline dated by its ``TIME``."""
        asked = list(dict.fromkeys(kinds))
        found: dict[str, dict[str, str]] = {}
        for start in range(0, len(asked), READ_KINDS):
            found |= self._read_part(asked[start : start + READ_KINDS], logs=logs)
        return found

    def _read_part(self, asked: Sequence[str], *, logs: bool) -> dict[str, dict[str, str]]:
        """The hashes by ``HSCAN`` of ``READ_PAGE`` fields, not ``HGETALL``: a small hash
        comes whole in its first page, and a big one (the entries' notes of a big
        schedule, 100,000 fields and 30 MB) a page a call, where one ``HGETALL`` held the
        server 72 to 76 ms, every claim waiting behind it. The pages after the first go one
        round trip a page, for all the kinds that have one."""
        with self._errors("read notes"):
            pipe = self._client.pipeline(transaction=False)  # no MULTI: see read_synced
            pipe.time()
            for kind in asked:
                pipe.hscan(self._notes_keys(kind)[0], 0, count=READ_PAGE)
                if logs:
                    pipe.xrange(self._log_key(kind))
            (seconds, micros), *replies = pipe.execute()
            pages = replies[::2] if logs else replies
            fields = {kind: page[1] for kind, page in zip(asked, pages, strict=True)}
            cursors = {kind: page[0] for kind, page in zip(asked, pages, strict=True) if page[0]}
            read_pages(
                lambda: self._client.pipeline(transaction=False),
                lambda kind: self._notes_keys(kind)[0],
                fields,
                cursors,
            )
        now_ms = int(seconds) * 1_000 + int(micros) // 1_000
        if not logs:
            return {kind: live_notes(fields[kind], now_ms) for kind in asked}
        return {
            kind: kind_notes(live_records(fields[kind], now_ms), entries, now_ms)
            for kind, entries in zip(asked, replies[1::2], strict=True)
        }

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """One pipeline: ``TIME``, an ``HGETALL`` per kind of notes, an ``HMGET`` per kind
        of kept notes. Not a ``MULTI``: a Redis over its ``maxmemory`` refuses every command
        queued in one, reads included, and a node must still read the live schedule's head
        while the store refuses writes. ``TIME`` goes first, so what is read is never older
        than the time the read is dated."""
        return self._synced([], kinds, kept, settings=False)

    def post_and_read(
        self, notes: Sequence[Note], kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """A node's sync in one round trip: the refreshes of ``notes``
        (:meth:`Refresh.queue <beatless.stores.redis._refresh.Refresh.queue>`), the reads
        of :meth:`read_synced` and the eviction policy (:meth:`quick_facts` takes it), in
        one pipeline; the notes that need a script are posted first, by script (a kind
        due its sweep, a bound, a log). A write refused raises, as :meth:`post` does, and
        what was read is dropped."""
        quick, scripted = self._refresh.split(notes)
        if scripted:
            self.post(scripted)
        return self._synced(quick, kinds, kept, settings=True)

    def _synced(
        self,
        quick: Sequence[Note],
        kinds: Sequence[str],
        kept: Mapping[str, Sequence[str]],
        *,
        settings: bool,
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        asked = list(dict.fromkeys(kinds))
        wanted = [(kind, keys) for kind, keys in kept.items() if keys]
        with self._errors("read notes"):
            pipe = self._client.pipeline(transaction=False)
            writes = self._refresh.queue(pipe, quick) if quick else 0
            pipe.time()
            for kind in asked:
                pipe.hgetall(self._notes_keys(kind)[0])
            for kind, keys in wanted:
                _kept.queue_read(pipe, kind, keys, self._kept_key)
            watched = settings and self._policy.queue(pipe)
            replies = pipe.execute(raise_on_error=False)
        if watched:
            self._policy.took(replies.pop())
        for what, part in (("post notes", replies[:writes]), ("read notes", replies[writes:])):
            failed = next((reply for reply in part if isinstance(reply, Exception)), None)
            if failed is not None:
                with self._errors(what):
                    raise failed
        self._refresh.wrote(quick)
        (seconds, micros), *replies = replies[writes:]
        now_ms = int(seconds) * 1_000 + int(micros) // 1_000
        self._refresh.saw(now_ms)
        notes = {
            k: live_notes(f, now_ms) for k, f in zip(asked, replies[: len(asked)], strict=True)
        }
        found: dict[str, dict[str, str]] = {kind: {} for kind in kept}
        for (kind, keys), values in zip(wanted, replies[len(asked) :], strict=True):
            found[kind] = _kept.read_reply(keys, values)
        return notes, found

    def time_ms(self) -> int:
        with self._errors("read the clock"):
            seconds, micros = self._client.time()
        now_ms = int(seconds) * 1_000 + int(micros) // 1_000
        self._refresh.saw(now_ms)
        return now_ms

    def load_scripts(self) -> None:
        """Load the claim, claim notes and commit scripts on the server ahead of their
        first run: a first batch answered ``NOSCRIPT`` is packed and sent again (a burst's
        claims carry megabytes). Loaded again on ``NOSCRIPT`` all the same (a restart,
        ``SCRIPT FLUSH``). Raises :class:`~beatless.errors.StoreUnavailable` when Redis
        cannot be reached."""
        with self._errors("load its scripts"):
            for script in (self._claim, self._notes_script(), self._commit):
                self._client.script_load(script.script)

    def probe(self) -> None:
        """SET a probe key under the prefix (``PX`` 10 s), GET it back and DEL it."""
        key, value = f"{self.prefix}probe:{uuid.uuid4().hex}", uuid.uuid4().hex
        with self._errors("probe"):
            self._client.set(key, value, px=PROBE_TTL_MS)
            got = self._client.get(key)
            self._client.delete(key)
        if got is None or as_text(got) != value:
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

    def watch(self, *, quick: bool = False) -> StoreFacts:
        """:meth:`ClaimStore.watch <beatless.stores.base.ClaimStore.watch>`; while a store
        object that started on good settings finds an evicting policy, the epoch record
        is begun again (:class:`~beatless.stores.redis._facts.EvictedEpoch`)."""
        running = self.watched is not None
        facts = super().watch(quick=quick)
        self._evicted.after_watch(running, facts, self._evicted_epoch, self.facts_name)
        return facts

    def _evicted_epoch(self) -> None:
        with self._errors("begin its epoch again"):
            self._epochs_script(keys=[self._epoch_key], args=[new_token(), EVICTED])

    def quick_facts(self) -> StoreFacts | None:
        """``maxmemory-policy`` and ``maxmemory``: as the sync just read them
        (:meth:`post_and_read`), else in one command (:func:`read_policy`)."""
        read = self._policy.recent()
        if read is None and not self._closed:
            read = self._policy.read(self._client, self._driver, self._lost)
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
            _sentinel.close(self._client)

    # -- internals ------------------------------------------------------------------------

    def _claim_key(self, id_: str) -> str:
        return f"{self.prefix}claim:{id_}"

    def _notes_keys(self, kind: str) -> tuple[str, str]:
        """The keys of a kind: its notes hash and that hash's expiry index."""
        digest = hashlib.sha256(kind.encode()).hexdigest()
        return f"{self.prefix}notes:{digest}", f"{self.prefix}notes-expiry:{digest}"

    def _server_version(self) -> str | None:
        """The server's ``redis_version`` (``INFO server``); ``None`` where ``INFO`` is
        refused (renamed, or not granted)."""
        try:
            return str(self._client.info("server").get("redis_version"))
        except self._driver.exceptions.ResponseError:
            return None

    def _log_key(self, kind: str) -> str:
        """The key of a kind's log (:mod:`beatless.stores.redis._logs`)."""
        return f"{self.prefix}log:{hashlib.sha256(kind.encode()).hexdigest()}"

    def _adopt(self, record: str) -> None:
        """Adopt the epoch a claim saw; warn when it is not the one last seen."""
        epoch = parse_epoch(record)
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
        self._logs.forget()
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
        self,
        script: Script,
        calls: list[tuple[list[str], list[str | int]]],
        what: str,
        ms: int,
        then: Sequence[Call] = (),
    ) -> list[Any]:
        """:meth:`_run`, and with ``wait``, :meth:`_run_acknowledged` waiting ``ms``; the
        calls of ``then`` follow (their errors are replies): once the others answered, or
        with ``wait`` in the same pipeline, before the ``WAIT``."""
        if not self.wait:
            return self._run(script, calls, then)
        return self._run_acknowledged(script, calls, what, ms, then)

    def _run_acknowledged(
        self,
        script: Script,
        calls: list[tuple[list[str], list[str | int]]],
        what: str,
        ms: int,
        then: Sequence[Call] = (),
    ) -> list[Any]:
        """Run ``script`` once per call, then ``WAIT`` for :attr:`wait` replicas to have
        what they wrote, up to ``ms``, in one pipeline (one connection, one round trip).
        Raise :class:`~beatless.errors.StoreUnavailable` when fewer acknowledged: what the
        scripts wrote stands on the primary, but does not count yet (see "Waiting for a
        replica" in docs/stores.md). A call answered ``NOSCRIPT`` is run again, once the
        script is loaded, with its own ``WAIT``."""
        replies, acked = run_acknowledged(
            self._client,
            script,
            calls,
            replicas=self.wait,
            ms=ms,
            noscript=self._noscript,
            then=then,
        )
        if acked < self.wait:
            raise StoreUnavailable(
                f"redis store {self._where}: {what}: {acked} of {self.wait} replica(s) "
                f"acknowledged it within {ms} ms (wait={self.wait}), so it does not count: "
                + UNACKNOWLEDGED.get(what, "")
                + "; check the replicas' lag (INFO replication) or raise wait_timeout"
            )
        return replies

    def _holding(
        self, commands: int, before_send: Callable[[], None] | None
    ) -> AbstractContextManager[None]:
        """Call ``before_send`` once the next ``commands`` commands of this thread are
        packed (:meth:`Packer.holding <beatless.stores.redis._packer.Packer.holding>`), or
        now when the client packs otherwise."""
        if before_send is None:
            return nullcontext()
        if self._packer is not None:
            return self._packer.holding(commands, before_send)
        before_send()
        return nullcontext()

    def _run(
        self,
        script: Script,
        calls: list[tuple[list[str], list[str | int]]],
        then: Sequence[Call] = (),
    ) -> list[Any]:
        """Run ``script`` once per call, one EVALSHA or several pipelined in one round
        trip, then, once they answered, the calls of ``then`` (their errors are replies).

        A script the server does not know (``NOSCRIPT``, after a restart or ``SCRIPT
        FLUSH``) is loaded and run again; redis-py's ``Script`` does it for a single call.
        """
        return run_scripts(self._client, script, calls, noscript=self._noscript, then=then)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        if self._closed:
            raise StoreError(f"redis store {self._where}: cannot {what}: the store is closed")
        try:
            with driver_errors(self._driver, f"redis store {self._where}", what, self._secrets):
                self._follow()
                yield
        except StoreFull as exc:
            raise self._full(exc) from None

    def _full(self, exc: StoreFull) -> StoreFull:
        """``exc`` with how full Redis is, said at WARNING at most once a minute."""
        return told_full(exc, read_usage(self._client, self._lost), self._full_warned)
