"""The Redis Cluster claim store: the Redis store's scripts, one script per slot.

A Lua script may touch the keys of one hash slot only. This store therefore files every
claim under a *bucket*: the first two hex digits of its id (for an id that does not
start with two, of the SHA-256 of the id), 256 buckets in all. A bucket is a hash tag,
``{3f}``, so all its keys share one slot and one master, and a batch is split by bucket:
one script per bucket (``claim.lua``, ``commit.lua``, ``release.lua`` of the Redis store,
unchanged), all of them sent in one pipeline, which reaches every master at once.

What is atomic, and what is not:

* **Per firing, exactly as on one Redis.** Every claim, commit and release of a firing
  runs in its bucket's script on one master, on that master's clock (``TIME``), so
  exactly one node wins it, leases and lateness are judged as the Redis store judges
  them, and skew between nodes changes nothing.
* **Per bucket, not per batch.** A batch is one script per bucket; each is atomic, the
  batch as a whole is not (on one Redis a batch over ``CHUNK`` firings is not either).
  A connection lost mid-batch may leave some buckets claimed and not others; every
  firing still has exactly one outcome, and the scheduler retries what it was not told.
* **Overlap is read a round trip earlier.** An address's run lease (its record's id is
  not the firing's) lives in another bucket. Before a batch whose requests name run
  leases, the store reads them (``running.lua``, on their own masters' clocks) and tells
  each claim script which are held. A run that starts between that read and the claim
  is not seen: the firing is won and enqueued, and the worker's own run-lease check
  refuses the run, as on a store that does not check overlap. A worker's once-only
  record and run lease are two claims in two buckets: each exact, not one step.
* **Live revisions are read beside the claims.** A namespace's revisions are a hash in
  a slot of their own, so the note a claim's live check needs is read with ``HGET`` in
  the same pipeline as the claim scripts; a claim the script won is answered
  ``STALE`` when that note shows a newer revision in force at its occurrence, and stays
  pending, the node's (see "Live revisions" in :mod:`beatless.stores.base`).
* **Notes are written apart from commits.** A kind of notes lives under a hash tag of
  its own, ``{notes:<digest>}``, so the history of a batch spread over 256 buckets can
  share no script with its commits (:attr:`commits_notes` is false): ``commit`` posts
  its notes right after the commit scripts, and the scheduler posts its history notes at
  its next sync. A post of several kinds is one script per kind, in one pipeline.
* **Epoch per bucket.** A master that loses its memory (a restart without persistence, a
  ``FLUSHALL``) loses the epochs of the buckets it serves and nothing else. Each bucket
  has its own epoch record, written with the others by the first store object to meet
  the namespace; every store object reads all of them at its first call, so a bucket
  that later comes back without its record is noticed by the next claim there, and the
  firings of that bucket released before the new record plus ``10 s`` that nobody holds
  come back :attr:`~beatless.stores.base.Outcome.FORGOTTEN` (or are held off, below).
  The store object's :attr:`epoch` is a digest of every bucket's: it changes when any of
  them does. A failover to a replica (its master killed, ``CLUSTER FAILOVER``) is
  noticed bucket by bucket as on one Redis: the claim script finds another
  ``master_replid`` in the bucket's epoch record, on a server that continued its
  history, and writes the epoch again, begun by a ``failover``; the firings of that
  master's buckets whose claims the replica may lack are answered ``forgotten`` (tested
  in ``tests/test_store_cluster_failover.py``).
* **Re-seeding, on one digest.** The nodes re-seed as on any store (see "Re-seeding" in
  :mod:`beatless.stores.base` and :mod:`beatless.node._reseed`); what they must agree on
  is the epoch their notes name, here the digest, while each store object meets a
  bucket's change only by a claim in that bucket. Two rules make them agree. A claim
  that meets a changed bucket reads every bucket's epoch again (``epochs.lua``, one
  pipeline, as at the first call; it writes the records still absent), so the digest
  covers every bucket of the master that lost its memory, not only those claimed. And a
  node re-reads them all before it writes back (:meth:`recheck_epoch`), which it does
  when its own claim met the change or when another node's note names a digest it has
  not met: a node whose claims never landed in those buckets learns of the change from
  the note, reads the same records, and so names the same digest. Records written once
  stay until the next loss, so the digest is the same for every node that reads after
  the last change; a node that read too early sees the others' notes name a later one,
  reads again and re-seeds for it. Two masters that lose their memory at different
  times give two digests, each re-seeded and settled in turn (one, if the second loss
  comes before the first is settled). Each bucket keeps its own horizon, adopted with
  its change, whether a claim or a re-read met it, and the claim script holds off
  (``RESEEDING``, nothing written) an absent firing released before it, as on one
  Redis; :meth:`settle` drops every bucket's horizon only while the digest is the one
  the gate opened for. A failover is still answered ``forgotten`` in the buckets its
  claims met (the script's failover horizon is never held off), and is met bucket by
  bucket, so it may take a few digests before the gate opens.
* **No claim and enqueue in one step.** A broker's queue is one key in one slot (kombu
  and Dramatiq do not speak Redis Cluster at all), so no script can both claim a firing
  of any bucket and push its message. The store has no ``claim_and_push``: Celery and
  Dramatiq take the two-phase path with it (claim pending, enqueue, commit; see
  :mod:`beatless.node.dispatch`), with the guarantees the two-phase path gives.

Keys, under ``beatless:{namespace}:`` unless ``prefix`` says otherwise (a prefix may not
contain ``{`` or ``}``, which would change the hash tags):

The keys, and the buckets they are filed under, are described in
:mod:`beatless.stores.redis._buckets`; the store's connection is in
:mod:`beatless.stores.redis._cluster_client`, its epochs per bucket in
:mod:`beatless.stores.redis._cluster_epochs`.

The store's clock, for :meth:`time_ms`, is ``TIME`` on the client's default node; the
claims of a bucket are judged on its master's clock. Keep the masters' clocks in step
(NTP), as any Redis host's.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from beatless.core._logtext import WarnEvery
from beatless.core.durations import DurationLike
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError, StoreError, StoreFull
from beatless.stores._epoch import EVICTED, new_token
from beatless.stores._fences import found_stale, live_checks
from beatless.stores.base import (
    OUTCOME_LETTERS,
    TOLERANCE_MS,
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    Epoch,
    Fact,
    KeptNote,
    Note,
    Outcome,
    StoreFacts,
)
from beatless.stores.redis import _kept
from beatless.stores.redis._buckets import (
    ANYWAY,
    BUCKETS,
    CLAIM_LUA,
    COMMIT_LUA,
    HELD_RUN,
    POST_LUA,
    READ_LOG_LUA,
    READ_NOTES_LUA,
    RELEASE_LUA,
    RUNNING_LUA,
    SCHEMES,
    Call,
    Lua,
    bucket_of,
    chunks,
    cluster_options,
    describe_client,
    first_of_each_master,
)
from beatless.stores.redis._client import (
    DEFAULT_SOCKET_TIMEOUT,
    key_prefix,
    redis_driver,
)
from beatless.stores.redis._cluster_epochs import BucketEpochs, Changed
from beatless.stores.redis._facts import (
    EvictedEpoch,
    judge_settings,
    policy_fact,
    read_policy,
    read_settings,
)
from beatless.stores.redis._logs import Logs, kind_notes
from beatless.stores.redis._wire import (
    EXPIRY_SLACK_MS,
    FORMAT_VERSION,
    NOTE_VERSION,
    PROBE_TTL_MS,
    READ_KINDS,
    READ_PAGE,
    as_text,
    claim_arg,
    claim_record,
    commit_without_room,
    live_notes,
    live_records,
    note_args,
    read_pages,
)

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["BUCKETS", "SCHEMES", "RedisClusterStore"]


class RedisClusterStore(BucketEpochs, ClaimStore):
    """Claims in a Redis Cluster, shared by every node that points at the same cluster
    and prefix. See the module docstring for the layout and what is atomic.

    ``client_or_url`` is a ``redis.cluster.RedisCluster``, left open by :meth:`close`,
    or a URL ``redis+cluster://[user:password@]host:port[,host:port...]`` (TLS:
    ``rediss+cluster://``) naming one or more nodes to start from, whose client the store
    creates at its first call and closes. Options of redis-py's URLs go in the query
    (``?socket_timeout=2``, which wins over ``socket_timeout``). A created client waits
    ``socket_timeout`` to connect and for each reply; redis-py follows the cluster's
    redirections and retries a lost node a few times on its own.

    A connection that fails raises :class:`~beatless.errors.StoreUnavailable`, as does
    a cluster that is down or has a slot without a master; any other error raises
    :class:`~beatless.errors.StoreError`. The password never appears in ``repr``, logs
    or error messages.
    """

    name = "redis-cluster"
    commits_notes = False

    def __init__(
        self,
        client_or_url: RedisCluster | str,
        *,
        namespace: str = "default",
        prefix: str | None = None,
        socket_timeout: DurationLike = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        driver = redis_driver("the redis cluster store")
        self.prefix = key_prefix("redis cluster store", namespace, prefix)
        if not isinstance(self.prefix, str) or not self.prefix or {"{", "}"} & set(self.prefix):
            raise ConfigError(
                f"redis cluster store: the prefix must be a non-empty string without '{{' or "
                f"'}}' (they would change the hash tags that place keys), got {self.prefix!r}"
            )
        self._driver = driver
        self._lock = threading.Lock()
        self._closed = False
        self._epochs: dict[str, Epoch] = {}
        self._horizons: dict[str, int] = {}
        self._evicted = EvictedEpoch()
        self._full_warned = WarnEvery()
        self._logs = Logs(self._notes_keys, self._log_key, EXPIRY_SLACK_MS)
        self._client: RedisCluster | None
        if isinstance(client_or_url, str):
            self._where = mask_url(client_or_url)
            self._secrets = secrets_of(client_or_url)
            self._options = cluster_options(driver, client_or_url, socket_timeout, self._where)
            self._client, self._owns_client = None, True
        elif isinstance(client_or_url, driver.cluster.RedisCluster):
            self._client, self._owns_client = client_or_url, False
            self._where, self._secrets = describe_client(client_or_url)
        else:
            raise ConfigError(
                f"redis cluster store: expected a redis.cluster.RedisCluster client or a "
                f"redis+cluster:// URL, got {type(client_or_url).__name__}"
            )

    def __repr__(self) -> str:
        return f"RedisClusterStore({self._where!r}, prefix={self.prefix!r})"

    # -- the contract ---------------------------------------------------------------

    reseeds = True
    checks_revisions = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"redis cluster store: lease_ms must be positive, got {lease_ms}")
        if not requests:
            return []
        self.refuse_claims()
        args = [claim_arg(r, 0) for r in requests]  # refuses bad numbers before any call
        with self._errors("claim"):
            self._read_epochs()
            running = self._running(requests)
            for i, request in enumerate(requests):
                if request.run_id in running:
                    args[i] = claim_arg(request, HELD_RUN)
            notes, numbers = live_checks(requests)  # read beside the scripts, in their pipeline
            reads = [(self._kept_key(kind), field) for kind, field in notes]
            head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node, lease_ms]
            places = list(chunks([r.id for r in requests]))
            calls = [
                self._claim_call(
                    head,
                    bucket,
                    [requests[i].id for i in chunk],
                    [args[i] for i in chunk],
                    "0h" if hold_off else "0",
                )
                for bucket, chunk in places
            ]
            replies = self._run(CLAIM_LUA, calls, reads)
        replies, read = replies[: len(calls)], replies[len(calls) :]
        values = [_kept.field_value(value) for value in read]
        outcomes: list[Outcome] = [Outcome.CORRUPT] * len(requests)
        changed: list[Changed] = []
        for (bucket, chunk), reply in zip(places, replies, strict=True):
            for i, letter in zip(chunk, as_text(reply[0]), strict=True):
                outcomes[i] = OUTCOME_LETTERS[letter]
            self._adopt(bucket, as_text(reply[1]), changed)
        found_stale(requests, outcomes, numbers, values)
        if changed:
            self._logs.forget()
            try:
                # Every bucket at once: the others of a master that lost its memory too.
                with self._errors("read the epochs"):
                    self._adopt_all(changed)
            except StoreError:
                pass  # the outcomes stand; a node re-reads them before it re-seeds
            self._warn_changed(changed)
        return outcomes

    def _claim_call(
        self, head: list[str | int], bucket: str, ids: list[str], args: list[str], mode: str
    ) -> Call:
        """The keys and ARGV of ``claim.lua`` for the claims ``ids`` of one bucket: ``head``
        (version, slack, node, lease), this store object's view of the bucket's epoch, and
        the requests as ``args``."""
        seen = self._epochs.get(bucket)
        keys = [self._key(bucket, "epoch")]
        keys += [self._claim_key(bucket, id_) for id_ in ids]
        id_from = len(self._claim_key(bucket, "")) + 1
        tail: list[str | int] = [TOLERANCE_MS, 0, id_from, mode]
        tail += [seen.token if seen else "", self._horizons.get(bucket, ""), new_token()]
        return keys, [*head, *tail, len(ids), *args]

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        """Commit the claims of ``ids``, then post ``notes``. Claims refused as full are
        committed again without room, as :meth:`RedisStore.commit
        <beatless.stores.redis.store.RedisStore.commit>` does (a script flagged ``allow-oom``):
        :class:`~beatless.errors.StoreFull` then carries ``kept``, also when only the notes
        were refused."""
        places = list(chunks(ids))
        head: list[str | int] = [FORMAT_VERSION, EXPIRY_SLACK_MS, node]
        calls: list[Call] = [
            (
                [self._key(bucket, "epoch")] + [self._claim_key(bucket, ids[i]) for i in chunk],
                [*head, len(chunk), NOTE_VERSION],
            )
            for bucket, chunk in places
        ]

        def commit(lua: Lua) -> list[bool]:
            kept = [False] * len(ids)
            for (_bucket, chunk), reply in zip(places, self._run(lua, calls), strict=True):
                for i, flag in zip(chunk, as_text(reply[0]), strict=True):
                    kept[i] = flag == "1"
            return kept

        try:
            with self._errors("commit"):
                if ids:
                    self._read_epochs()  # a first sighting; a changed epoch waits for a claim
                kept = commit(COMMIT_LUA)
        except StoreFull as exc:
            where = f"redis cluster store {self._where}"
            again = commit_without_room(where, len(ids), self._errors, partial(commit, ANYWAY))
            raise StoreFull(str(exc), usage=exc.usage, kept=again) from None
        if notes:
            try:
                self.post(notes)
            except StoreFull as exc:
                raise StoreFull(str(exc), usage=exc.usage, kept=kept) from None
        return kept

    def release(self, ids: Sequence[str], *, node: str) -> None:
        calls: list[Call] = [
            ([self._claim_key(bucket, ids[i]) for i in chunk], [FORMAT_VERSION, node])
            for bucket, chunk in chunks(ids)
        ]
        if calls:
            with self._errors("release"):
                self._run(RELEASE_LUA, calls)

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        keys = [self._claim_key(bucket_of(id_), id_) for id_ in ids]
        with self._errors("read claim records"):
            values = self._connected().mget_nonatomic(keys) if keys else []
        found = ((id_, claim_record(value)) for id_, value in zip(ids, values, strict=True))
        return {id_: record for id_, record in found if record is not None}

    def post(self, notes: Sequence[Note]) -> None:
        by_kind: dict[str, list[Note]] = {}
        for note in notes:
            by_kind.setdefault(note.kind, []).append(note)
        calls: list[Call] = []
        extends: list[tuple[str, float]] = []
        for posted in by_kind.values():
            keys, args = note_args(posted, self._logs, extends)
            calls.append((keys, [NOTE_VERSION, EXPIRY_SLACK_MS, *args]))
        if calls:
            with self._errors("post notes"):
                self._run(POST_LUA, calls)
            self._logs.made(extends)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """One script per kind (``read_notes.lua``: its hash's first page), ``READ_KINDS`` kinds
        a round trip, then the pages that follow of the big ones (:meth:`_paged`)."""
        asked = list(dict.fromkeys(kinds))
        calls: list[Call] = [([self._notes_keys(kind)[0]], [READ_PAGE]) for kind in asked]
        with self._errors("read notes"):
            replies = self._run_parts(READ_NOTES_LUA, calls)
            hashes = self._paged(asked, [page for _, _, page in replies])
        return {
            kind: live_notes(hashes[kind], int(seconds) * 1_000 + int(micros) // 1_000)
            for kind, (seconds, micros, _) in zip(asked, replies, strict=True)
        }

    def read_logs(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """One script per kind (``read_log.lua``: its hash's first page and its log, in
        its slot), ``READ_KINDS`` kinds a round trip, then the pages that follow
        (:meth:`_paged`); a key in both reads the log's note, and the kind
        is bounded over both (:func:`~beatless.stores.redis._logs.kind_notes`)."""
        asked = list(dict.fromkeys(kinds))
        calls: list[Call] = [
            ([self._notes_keys(kind)[0], self._log_key(kind)], [READ_PAGE]) for kind in asked
        ]
        with self._errors("read notes"):
            replies = self._run_parts(READ_LOG_LUA, calls)
            hashes = self._paged(asked, [page for _, _, page, _ in replies])
        found = {}
        for kind, (seconds, micros, _, entries) in zip(asked, replies, strict=True):
            now_ms = int(seconds) * 1_000 + int(micros) // 1_000
            log = [(id_, dict(zip(pairs[::2], pairs[1::2], strict=True))) for id_, pairs in entries]
            found[kind] = kind_notes(live_records(hashes[kind], now_ms), log, now_ms)
        return found

    def _paged(self, asked: Sequence[str], pages: Sequence[Any]) -> dict[str, dict[Any, Any]]:
        """Each kind's hash from its first page (``[cursor, [key, record, ...]]``, read by
        the script) and the pages that follow, read by ``HSCAN`` (each at its master), one
        cluster pipeline per page for all the kinds that have one."""
        fields = {
            kind: dict(zip(flat[::2], flat[1::2], strict=True))
            for kind, (_, flat) in zip(asked, pages, strict=True)
        }
        cursors = {kind: int(c) for kind, (c, _) in zip(asked, pages, strict=True) if int(c)}
        client = self._connected()
        read_pages(client.pipeline, lambda kind: self._notes_keys(kind)[0], fields, cursors)
        return fields

    def _run_parts(self, lua: Lua, calls: list[Call]) -> list[Any]:
        """:meth:`_run` of ``calls``, ``READ_KINDS`` a pipeline (see ``READ_KINDS``)."""
        replies: list[Any] = []
        for start in range(0, len(calls), READ_KINDS):
            replies += self._run(lua, calls[start : start + READ_KINDS])
        return replies

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        """One pipeline: an ``HSET`` per kind, each kind's hash in one slot."""
        if notes:
            with self._errors("keep notes"):
                pipe = self._connected().pipeline()
                _kept.keep(pipe, notes, self._kept_key)
                pipe.execute()

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        with self._errors("read kept notes"):
            return _kept.read(self._connected(), kind, keys, self._kept_key)

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        with self._errors("delete kept notes"):
            _kept.delete(self._connected(), kind, keys, self._kept_key)

    def _kept_key(self, kind: str) -> str:
        return f"{self.prefix}{{kept:{_kept.kept_digest(kind)}}}"

    def time_ms(self) -> int:
        with self._errors("read the clock"):
            seconds, micros = self._connected().time()
        return int(seconds) * 1_000 + int(micros) // 1_000

    def probe(self) -> None:
        """SET a probe key (``PX`` 10 s) on every master, GET each back and DEL it."""
        value = uuid.uuid4().hex
        with self._errors("probe"):
            client = self._connected()
            keys = first_of_each_master(client, lambda bucket: self._key(bucket, f"probe:{value}"))
            pipe = client.pipeline()
            for key in keys:
                pipe.set(key, value, px=PROBE_TTL_MS)
                pipe.get(key)
                pipe.delete(key)
            replies = pipe.execute()
        for key, got in zip(keys, replies[1::3], strict=True):
            if got is None or as_text(got) != value:
                raise StoreError(
                    f"redis cluster store {self._where}: probe: wrote {key!r} but read back {got!r}"
                )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            client, self._client = self._client, None
        if self._owns_client and client is not None:
            client.close()

    def facts(self) -> StoreFacts:
        """The facts of each primary, as :meth:`RedisStore.facts
        <beatless.stores.redis.store.RedisStore.facts>` reads them, each named with its node
        (``maxmemory-policy @10.0.0.1:7000``); one that cannot be read is unknown."""
        store = f"redis cluster store {self._where}"
        lost = (self._driver.exceptions.RedisError, OSError, StoreError)
        try:
            client = self._connected()
            primaries = client.get_primaries()
        except lost:
            return judge_settings(store, {}, {})
        facts: list[Fact] = []
        usages: list[str] = []
        for primary in primaries:
            config, info = read_settings(client.get_redis_connection(primary), lost)
            judged = judge_settings(store, config, info)
            at = f"{primary.host}:{primary.port}"
            facts += [Fact(f"{f.name} @{at}", f.value, f.verdict, f.why) for f in judged.facts]
            usages += [f"{at} {judged.usage}"] if judged.usage else []
        return StoreFacts(store, tuple(facts), usage="; ".join(usages) or None)

    def watch(self, *, quick: bool = False) -> StoreFacts:
        """:meth:`ClaimStore.watch <beatless.stores.base.ClaimStore.watch>`; while a store
        object that started on good settings finds a primary with an evicting policy,
        every bucket's epoch record is begun again
        (:class:`~beatless.stores.redis._facts.EvictedEpoch`)."""
        running = self.watched is not None
        facts = super().watch(quick=quick)
        label = f"redis cluster store {self._where}"
        self._evicted.after_watch(running, facts, self._evicted_epochs, label)
        return facts

    def _evicted_epochs(self) -> None:
        with self._errors("begin its epochs again"):
            self._epoch_records(cause=EVICTED)

    def quick_facts(self) -> StoreFacts | None:
        """``maxmemory-policy`` and ``maxmemory`` of each primary (:func:`read_policy
        <beatless.stores.redis.store.read_policy>`), named as :meth:`facts` names them; a
        primary that does not answer keeps what was read of it last."""
        lost = (self._driver.exceptions.RedisError, OSError, StoreError)
        try:
            client = self._connected()
            primaries = client.get_primaries()
        except lost:
            return None
        facts = []
        for primary in primaries:
            read = read_policy(client.get_redis_connection(primary), self._driver, lost)
            if read is not None:
                fact = policy_fact(*read)
                at = f"{primary.host}:{primary.port}"
                facts.append(Fact(f"{fact.name} @{at}", fact.value, fact.verdict, fact.why))
        return StoreFacts(f"redis cluster store {self._where}", tuple(facts))

    # -- internals ------------------------------------------------------------------------

    def _running(self, requests: Sequence[ClaimRequest]) -> set[str]:
        """The run leases named by ``requests`` that are held now, each read in its slot."""
        run_ids = list(dict.fromkeys(r.run_id for r in requests if r.run_id))
        if not run_ids:
            return set()
        places = list(chunks(run_ids))
        calls: list[Call] = [
            ([self._claim_key(bucket, run_ids[i]) for i in chunk], [FORMAT_VERSION])
            for bucket, chunk in places
        ]
        replies = self._run(RUNNING_LUA, calls)
        held = set()
        for (_bucket, chunk), flags in zip(places, replies, strict=True):
            held |= {
                run_ids[i] for i, flag in zip(chunk, as_text(flags), strict=True) if flag == "1"
            }
        return held
