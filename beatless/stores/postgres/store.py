"""The PostgreSQL claim store: one server-side function call per batch, on the server's clock.

Every ``claim``, ``commit`` and ``release`` is one call of a PL/pgSQL function
(``beatless/stores/sql/postgres.sql``, a package file whose header says what it
creates), so a batch is one round trip and one transaction: it commits whole or not at
all; a commit that carries notes calls the notes' function after the commit's in the
same statement, still one round trip and one transaction. Inside a call the store's
clock is ``clock_timestamp()``, read once: it decides whether a new claim is late or
early and whether a lease is alive, so skew between nodes changes nothing. Each call
locks the rows of its batch in one order (by firing id), so two nodes racing for
overlapping batches wait on each other, never in a cycle.

A firing whose entry skips overlapping runs names its address's run-lease record
(:attr:`~beatless.stores.base.ClaimRequest.run_id`), an ordinary row of ``claims``. A
claim of it that would be won reads that row in the same call, right before writing, by
primary key and without locking it: under ``READ COMMITTED`` the read sees every claim
committed before it, and a lock would make the workers' heartbeats wait for a whole
batch (and be taken out of the batch's id order). A live pending run lease makes the
claim :attr:`~beatless.stores.base.Outcome.OVERLAP`, written committed for its memory.

Everything lives in one schema, ``beatless`` unless the URL says ``?schema=``:

``version``
    One row: the schema's version (:data:`SCHEMA_VERSION`). A schema at a newer version
    is refused with both versions named; an older one (or one missing a function) is
    brought up to date by the first node that opens it, under an advisory lock, so that
    nodes starting together create it once. A node that finds the schema current sends
    no DDL at all, so a role without the ``CREATE`` privilege can use a schema that an
    administrator created.
``epochs``
    One row per namespace: a random token and the server's clock when the first claim
    wrote it. A dropped schema (or a deleted row) makes the next claim write a new one,
    and every store object that saw the old one reports what the old one may have held
    as :attr:`~beatless.stores.base.Outcome.FORGOTTEN`. A schema dropped while nodes
    run is created again by the first call that misses it.
``claims``
    One row per claim, keyed by namespace and firing id: the format of the row, pending
    or committed, the end of the lease or of the memory, when the row may be deleted,
    the memory asked for, when the claim was granted, the occurrence, the task tag, the
    node and the address. A row of another format fails its own firing as
    :attr:`~beatless.stores.base.Outcome.CORRUPT` and is never overwritten. Each claim
    call then deletes up to a bounded number of rows past their memory, skipping rows
    that another call holds (``FOR UPDATE SKIP LOCKED``), so the table stays bounded
    without a sweeper of its own and without long locks.
``notes``
    One row per note (:meth:`PostgresStore.post`), keyed by namespace and the SHA-256
    digests of its kind and key, so that names of any length fit a btree entry: the
    end of its time on the server's clock, the kind and key as posted and the value's
    UTF-8 bytes. A note costs a row of about 110 bytes beside its namespace, kind, key
    and value (a value past 2 kB is compressed), an entry of about 80 bytes beside the
    namespace in the primary key, and one of about 20 in the index of ends. Each post
    deletes up to a bounded number of notes past their time, of any kind, as each
    claim deletes claims.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from beatless.core._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless.core.durations import DurationLike
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores._epoch import adopt, new_token
from beatless.stores._fences import live_checks
from beatless.stores.base import (
    OUTCOME_LETTERS,
    TOLERANCE_MS,
    ClaimRecord,
    ClaimRequest,
    ClaimStore,
    Epoch,
    Note,
    Outcome,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
from beatless.stores._pool import Pool
from beatless.stores.postgres._connection import (
    Link,
    Watchdog,
    check_node,
    check_request,
    checked_conninfo,
    checked_schema,
    checked_timeout,
    conninfo_params,
    describe_where,
    is_refusal,
    postgres_driver,
    socket_of,
    split_url,
)
from beatless.stores.postgres._facts import ServerWatch, settings_facts, timeline_of
from beatless.stores.postgres._kept import KeptNotes, digest
from beatless.stores.postgres._schema import SCHEMA_VERSION, Schema, Statements

logger = logging.getLogger(__name__)

__all__ = ["CHUNK", "SCHEMA_VERSION", "SWEEP_MIN", "PostgresStore", "settings_facts", "timeline_of"]

T = TypeVar("T")

DEFAULT_SCHEMA = "beatless"
DEFAULT_NAMESPACE = "default"
DEFAULT_TIMEOUT = 5.0
"""Seconds to connect, and for the server to run one call (``statement_timeout``)."""
DEADLINE_SLACK_S = 2.0
"""How long past ``timeout`` a call may go unanswered before the store cuts its
connection: a server that stopped answering (frozen, or a link that holds packets)."""
SWEEP_MIN = 200
"""Expired rows each claim or post call may delete, at least; twice the batch when
larger, so that deletion keeps pace with insertion."""
CHUNK = 5_000
"""Firings per function call; a larger batch is several calls, so that no transaction
holds many thousands of row locks for long."""
_LOST_SCHEMA = ("42883", "42P01", "3F000")
"""undefined_function, undefined_table, invalid_schema_name: the schema is gone."""
_TRANSIENT_STATES = ("40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300")
_SESSION_ENDED = ("57P01", "57P02", "57P03")
"""admin_shutdown, crash_shutdown, cannot_connect_now: the server ended the session."""
_FULL_STATES = ("53100",)
"""``disk_full``: a write refused because the server's disk is full (:class:`StoreFull`)."""
FULL_WARN_EVERY_S = 60.0
MAX_CONNECTIONS = 8
"""Connections one store object opens at most, one for each call under way at once: a
node makes two calls at once (its loop's and its board's); a call past them waits."""


class PostgresStore(ServerWatch, KeptNotes, ClaimStore):
    """Claims in a PostgreSQL schema, shared by every node that points at the same one.

    ``conn_or_url`` is a ``postgresql://`` (or ``postgres://``) URL, whose connection
    the store opens, reopens after a failure and closes; or a ``psycopg.Connection``,
    which it uses as it is and leaves open (and cannot reopen). A URL may carry
    ``?schema=`` and ``?timeout=`` (the keywords win) beside libpq's own parameters
    (``sslmode``, ``application_name``, ...). ``namespace`` keeps the claims and the
    epoch of several schedules apart in one schema. ``timeout`` (seconds, ``"2s"``,
    ``timedelta``) bounds connecting and each call on the server; a call left
    unanswered for ``timeout`` + 2 s more has its connection cut. ``clock`` is for
    tests only: a clock they move by hand, read by each call and used by the server in
    place of its own (``None``: the server's clock, as every node must use it).

    Nothing is sent until the first call; the first call creates or upgrades the schema
    if needed. A connection that fails raises :class:`~beatless.errors.StoreUnavailable`;
    a refused login, a missing database or privilege, and any other error raise
    :class:`~beatless.errors.StoreError`. The password never appears in ``repr``, logs
    or error messages. One store object may be shared by the threads of a process: calls
    made at once run on connections of their own (one more is opened when every one is
    in use, up to :data:`MAX_CONNECTIONS`), so a commit never waits for another thread's
    long call; a connection passed in serves one call at a time. A child process that
    inherits the store opens connections of its own.
    """

    name = "postgres"

    def __init__(
        self,
        conn_or_url: psycopg.Connection[Any] | str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        schema: str | None = None,
        timeout: DurationLike | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        driver = postgres_driver()
        self._full_warned = WarnEvery()
        if not isinstance(namespace, str) or not namespace or "\x00" in namespace:
            raise ConfigError(
                f"postgres store: namespace must be a non-empty string, got {namespace!r}"
            )
        self.namespace = namespace
        self._conninfo: str | None = None
        self._given: psycopg.Connection[Any] | None = None
        if isinstance(conn_or_url, str):
            self._where = mask_url(conn_or_url)
            self._secrets = secrets_of(conn_or_url)
            conninfo, found = split_url(conn_or_url, self._where)
            schema = schema if schema is not None else found.get("schema")
            timeout = timeout if timeout is not None else found.get("timeout")
            self._conninfo = checked_conninfo(driver, conninfo, self._where)
        elif isinstance(conn_or_url, driver.Connection):
            if not conn_or_url.autocommit:
                raise ConfigError(
                    "postgres store: a connection passed in must be in autocommit mode "
                    "(psycopg.connect(..., autocommit=True)): each call is its own transaction"
                )
            self._given = conn_or_url
            self._where = describe_where(conn_or_url)
            self._secrets = [str(conn_or_url.info.password)] if conn_or_url.info.password else []
        else:
            raise ConfigError(
                f"postgres store: expected a psycopg.Connection or a postgresql:// URL, got "
                f"{type(conn_or_url).__name__}"
            )
        self.schema = checked_schema(DEFAULT_SCHEMA if schema is None else schema)
        self.timeout_s = checked_timeout(DEFAULT_TIMEOUT if timeout is None else timeout)
        self._owns_conn = self._conninfo is not None
        self._driver = driver
        self._statements = Statements(self.schema)
        self._epoch_lock = threading.Lock()
        self._pid = os.getpid()
        self._repair = False
        self._closed = False
        # A call takes a connection no other call is using, so that a node's loop commits
        # the firings it sent, whose leases are running, while its board makes a long call
        # (missed-firing markers after a pause, a sync on a loaded server).
        name = f"postgres store {self._where}"
        self._links: Pool[Link] = (
            Pool(Link, Link.drop, name=name, limit=MAX_CONNECTIONS)
            if self._owns_conn
            else Pool(lambda: Link(self._given, owned=False), Link.drop, name=name, limit=1)
        )
        self._forgot_before_ms: int | None = None
        self._timeline: int | None = None
        self._watchdog = Watchdog()
        self._clock = clock
        logger.debug(
            "postgres store %s opened with schema %s, namespace %s",
            shown(self._where, quoted=False),
            shown(self.schema),
            shown(self.namespace),
        )

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, schema={self.schema!r})"

    # -- the contract ---------------------------------------------------------------

    reseeds = True
    checks_revisions = True

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=self.holds_off)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if lease_ms <= 0:
            raise ConfigError(f"postgres store: lease_ms must be positive, got {lease_ms}")
        check_node(node)
        for request in requests:
            check_request(request)
        self.refuse_claims()
        outcomes: list[Outcome] = []
        for start in range(0, len(requests), CHUNK):
            chunk = requests[start : start + CHUNK]
            outcomes += self._claim_chunk(chunk, node, lease_ms, hold_off)
        return outcomes

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        """One call of ``commit_v1`` per :data:`CHUNK` ids; the notes ride in the first, one
        statement that calls ``post_v1`` after it. A batch of one chunk (every batch a
        node commits in practice) is then one round trip and one transaction; a node that
        dies between the calls of a larger one leaves its notes committed with the first
        chunk's claims, so a history item is never missing for a committed firing."""
        check_node(node)
        if not ids:
            self.post(notes)
            return []
        flags = ""
        for start in range(0, len(ids), CHUNK):
            chunk = list(ids[start : start + CHUNK])
            args: tuple[Any, ...] = (self.namespace, node, chunk, self._now_ms())
            if start == 0 and notes:
                query, args = self._statements.commit_notes, (*self._note_args(notes), *args)
                row = self._row("commit and post notes", query, args)
            else:
                row = self._row("commit", self._statements.commit, args)
            flags += row[0]
            if self.epoch is None and row[1] is not None:
                # Only a first sighting: a changed epoch is left for the next claim to judge.
                self.epoch = Epoch(row[1], int(row[2]))
        return [flag == "1" for flag in flags]

    def release(self, ids: Sequence[str], *, node: str) -> None:
        check_node(node)
        for start in range(0, len(ids), CHUNK):
            args = (self.namespace, node, list(ids[start : start + CHUNK]), self._now_ms())
            self._row("release", self._statements.release, args)

    def post(self, notes: Sequence[Note]) -> None:
        """One call of ``post_v1``: one round trip and one transaction."""
        if not notes:
            return
        self._row("post notes", self._statements.post, self._note_args(notes))

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """One query of the ``notes`` table, by primary key, for every kind asked."""
        found: dict[str, dict[str, str]] = {kind: {} for kind in kinds}
        if not found:
            return found
        by_id = {digest(kind): kind for kind in found}
        args = (self.namespace, list(by_id), self._now_ms())
        query = self._statements.read_notes
        rows = self._call("read notes", lambda conn: conn.execute(query, args).fetchall())
        for kind_id, key, value in rows:
            found[by_id[bytes(kind_id)]][key] = bytes(value).decode()
        return found

    def time_ms(self) -> int:
        """``clock_timestamp()`` on the server, in epoch milliseconds: one round trip."""
        if self._clock is not None:
            return int(self._clock() * 1_000)
        row = self._row("read the clock", self._statements.now, ())
        return int(row[0])

    def probe(self) -> None:
        """Create or check the schema, then write a row of the ``claims`` table under this
        namespace, read it back and delete it, in one transaction that is rolled back:
        no other session ever sees it."""
        probe_id, node = f"probe:{uuid.uuid4().hex}", f"probe:{uuid.uuid4().hex}"
        got = self._call("probe", lambda c: self._probe(c, probe_id, node))
        if got != node:
            raise StoreError(
                f"postgres store {self._where}: probe: wrote a row to {self.schema}.claims "
                f"but read back {got!r}"
            )

    def close(self) -> None:
        """Close the connections (not one passed in); one in use by a call of another
        thread is closed when that call ends."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.stop()
        self._links.close()

    # -- reading, for ``beatless status`` ------------------------------------------------

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The ``limit`` most recent claims of this namespace still remembered, newest
        first: dicts of ``id``, ``address``, ``occurrence_ms``, ``node`` (the winner),
        ``committed``, ``until_ms`` and ``claimed_ms`` (when the store granted it)."""
        args = (self.namespace, max(0, limit))
        rows = self._call("read the recent claims", lambda c: self._fetch_all(c, args))
        keys = ("id", "address", "occurrence_ms", "node", "committed", "until_ms", "claimed_ms")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    reads_claims = True

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        args = (self.namespace, list(dict.fromkeys(ids)))
        query = self._statements.records
        rows = self._call("read claim records", lambda c: c.execute(query, args).fetchall())
        return {
            id_: ClaimRecord(node, committed, until, rev)
            for id_, node, committed, until, rev in rows
        }

    def __len__(self) -> int:
        """How many claim rows the schema holds now, every namespace, expired ones not yet
        swept included."""
        row = self._row("count the claims", self._statements.count, ())
        return int(row[0])

    # -- internals ------------------------------------------------------------------------

    def _claim_chunk(
        self, requests: Sequence[ClaimRequest], node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        if not requests:
            return []
        seen = self.epoch.token if self.epoch is not None else ""
        notes, numbers = live_checks(requests)
        args = (
            self.namespace,
            node,
            lease_ms,
            TOLERANCE_MS,
            seen,
            self._forgot_before_ms,
            new_token(),
            max(SWEEP_MIN, 2 * len(requests)),
            [r.id for r in requests],
            [r.address for r in requests],
            [r.occurrence_ms for r in requests],
            [r.max_late_ms for r in requests],
            [r.memory_ms for r in requests],
            [r.release_ms for r in requests],
            [r.tag for r in requests],
            [r.run_id for r in requests],
            numbers,
            [digest(kind) for kind, _ in notes],
            [digest(key) for _, key in notes],
            [r.revision for r in requests],
            hold_off,
            self._now_ms(),
        )
        letters, token, started_ms = self._row("claim", self._statements.claim, args)
        self._adopt(Epoch(token, int(started_ms)))
        return [OUTCOME_LETTERS[letter] for letter in letters]

    def _note_args(self, notes: Sequence[Note]) -> tuple[Any, ...]:
        """The arguments of ``post_v1``, in its order."""
        return (
            self.namespace,
            [digest(n.kind) for n in notes],
            [digest(n.key) for n in notes],
            [n.kind for n in notes],
            [n.key for n in notes],
            [n.value.encode() for n in notes],
            [n.ttl_ms for n in notes],
            [n.keep for n in notes],
            max(SWEEP_MIN, 2 * len(notes)),
            self._now_ms(),
        )

    def _now_ms(self) -> int | None:
        """The reading of ``clock`` the functions use instead of the server's, if any."""
        return None if self._clock is None else int(self._clock() * 1_000)

    def _adopt(self, epoch: Epoch) -> None:
        """Adopt the epoch a claim saw; warn when it is not the one last seen."""
        label = (
            f"postgres store {shown(self._where, quoted=False)} "
            f"(schema {shown(self.schema)}, namespace {shown(self.namespace)})"
        )
        with self._epoch_lock:  # calls of two threads may find the change at once
            adopt(self, epoch, logger=logger, label=label)

    def _row(
        self, what: str, query: sql.Composed | sql.SQL, args: Sequence[Any]
    ) -> tuple[Any, ...]:
        """Send one statement (one round trip) and return the one row it answers."""
        row = self._call(what, lambda conn: conn.execute(query, args).fetchone())
        if row is None:
            raise StoreError(f"postgres store {self._where}: cannot {what}: no row returned")
        return tuple(row)

    def _fetch_all(self, conn: psycopg.Connection[Any], args: Sequence[Any]) -> list[Any]:
        return conn.execute(self._statements.recent, args).fetchall()

    def _probe(self, conn: psycopg.Connection[Any], probe_id: str, node: str) -> str | None:
        # Rolled back at the end, so that no other session ever sees the probe row.
        with conn.transaction(force_rollback=True):
            conn.execute(self._statements.probe_write, (self.namespace, probe_id, node))
            row = conn.execute(self._statements.probe_read, (self.namespace, probe_id)).fetchone()
            conn.execute(self._statements.probe_delete, (self.namespace, probe_id))
        return None if row is None else str(row[0])

    def _call(self, what: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn`` on a connection no other call is using (opened, and the schema
        made ready, first), under the watchdog, with every driver error translated.

        A call that finds the schema or a function missing (someone dropped the schema)
        creates it again and runs once more: its epoch will be new. A call that finds the
        connection it reused cut (the server restarted, or dropped its sessions) runs
        once more at once on a new one, so that a commit is not left to the next wake,
        nor a lease to run out meanwhile: every call here may be run twice (a claim the
        node already holds is won again, a commit or a release of its own claims is
        the same twice).
        """
        if self._pid != os.getpid():
            # Connections must not cross a fork: the child opens its own and leaves the
            # parent's sockets alone (the pool forgets them).
            self._pid, self._given, self._watchdog = os.getpid(), None, Watchdog()
        with self._links.take() as link:
            for attempt in (1, 2):
                with self._errors(what):
                    reused = link.conn is not None and link.ready
                    conn = self._connection(link)
                    began = time.monotonic()
                    try:
                        with self._watchdog.bound(link.sock, self.timeout_s + DEADLINE_SLACK_S):
                            return fn(conn)
                    except self._driver.Error as exc:
                        if attempt == 1 and self._was_cut(link, exc, reused, began):
                            logger.info(
                                "postgres store %s: the connection was cut (%s); running the "
                                "call again on a new one",
                                shown(self._where, quoted=False),
                                shown(self._mask(exc), quoted=False, limit=ERROR_LIMIT),
                            )
                            link.drop()
                            continue
                        if attempt == 2 or exc.sqlstate not in _LOST_SCHEMA:
                            raise
                        logger.warning(
                            "postgres store %s: schema %s or one of its functions is missing "
                            "(%s); creating it again: every claim it held is lost, and the "
                            "next claims report what may have been enqueued as forgotten",
                            shown(self._where, quoted=False),
                            shown(self.schema),
                            shown(self._mask(exc), quoted=False),
                        )
                        link.ready, self._repair = False, True
        raise AssertionError("unreachable")  # pragma: no cover

    def _was_cut(self, link: Link, exc: Exception, reused: bool, began: float) -> bool:
        """Whether ``exc`` says that a connection opened before this call was cut by the
        server, at once rather than after a wait (a link that holds the bytes, cut by the
        watchdog, is not tried again: that would double the wait)."""
        conn = link.conn
        if not reused or not link.owned or conn is None:
            return False
        if not isinstance(exc, self._driver.OperationalError | self._driver.InterfaceError):
            return False
        cut = conn.broken or conn.closed or exc.sqlstate in _SESSION_ENDED
        return cut and time.monotonic() - began < self.timeout_s / 2

    def _connection(self, link: Link) -> psycopg.Connection[Any]:
        """The connection of ``link``, opened (again) if need be, its schema checked."""
        conn = link.conn
        if conn is not None and (conn.closed or conn.broken):
            if not link.owned:
                raise StoreUnavailable(
                    f"postgres store {self._where}: the connection passed in is closed"
                )
            link.drop()
            conn = None
        if conn is None:
            conn = link.conn = self._connect()
            link.ready = False
        if link.sock is None:
            link.sock = socket_of(conn)
        if not link.ready:
            with self._watchdog.bound(link.sock, self.timeout_s + DEADLINE_SLACK_S):
                Schema(self._driver, self.schema, self._where).prepare(conn, force=self._repair)
            link.ready, self._repair = True, False
        return conn

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conninfo is None:
            raise StoreUnavailable(f"postgres store {self._where}: no URL to connect with")
        params = conninfo_params(self._driver, self._conninfo)
        extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = max(2, round(self.timeout_s))
        if "application_name" not in params:
            extra["application_name"] = "beatless"
        conn: psycopg.Connection[Any] = self._driver.connect(self._conninfo, **extra)
        try:
            timeout_ms = str(max(1, round(self.timeout_s * 1_000)))
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (timeout_ms,))
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        driver = self._driver
        try:
            yield
        except (StoreError, ConfigError):
            raise
        except driver.Error as exc:
            text = f"postgres store {self._where}: cannot {what}: {self._mask(exc)}"
            if exc.sqlstate == "42501":
                raise StoreError(
                    f"{text}; grant the role USAGE on schema {self.schema} and SELECT, "
                    f"INSERT, UPDATE, DELETE on its tables, or CREATE on the database for "
                    f"the first node"
                ) from None
            if isinstance(exc, driver.OperationalError | driver.InterfaceError):
                if exc.sqlstate is None and is_refusal(str(exc)):
                    raise StoreError(
                        f"{text}; check the user name, password and database name"
                    ) from None
                if exc.sqlstate is None or exc.sqlstate in _TRANSIENT_STATES:
                    raise StoreUnavailable(text) from None
            if exc.sqlstate in _TRANSIENT_STATES:
                raise StoreUnavailable(text) from None
            if exc.sqlstate in _FULL_STATES:
                raise self._full(text) from None
            raise StoreError(text) from None

    def _full(self, text: str) -> StoreFull:
        """A write refused as the disk is full, said at WARNING at most once a minute."""
        if self._full_warned.allows("full", int(FULL_WARN_EVERY_S * 1_000), _monotonic_ms()):
            logger.warning(
                "%s: the server's disk is full and refuses writes; claims are refused and "
                "their firings missed (reported) until it has room: free disk space",
                text,
            )
        return StoreFull(text)

    def _mask(self, exc: BaseException) -> str:
        text = " ".join((str(exc) or type(exc).__name__).split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1_000)
