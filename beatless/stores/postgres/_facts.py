"""The settings of a PostgreSQL server that decide whether its claims survive, judged."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from beatless.core._logtext import shown
from beatless.errors import StoreError
from beatless.stores.base import (
    TOLERANCE_MS,
    UNKNOWN,
    Fact,
    StoreFacts,
    Verdict,
)

if TYPE_CHECKING:
    from types import ModuleType

    from psycopg import sql

logger = logging.getLogger("beatless.stores.postgres.store")
"""The store's own logger: what moved here logs as it did."""


SETTINGS_QUERY = (
    "SELECT current_setting('synchronous_commit'), current_setting('fsync'), "
    "pg_is_in_recovery(), current_setting('synchronous_standby_names'), "
    "(SELECT count(*) FROM pg_stat_replication), "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END"
)
"""What :meth:`PostgresStore.facts` reads, in one round trip."""


def timeline_of(walfile: object) -> int | None:
    """The timeline of a write-ahead log file's name (its first 8 hex digits), or
    ``None`` (a standby, or a name not read)."""
    text = str(walfile) if walfile else ""
    try:
        return int(text[:8], 16) if len(text) >= 8 else None
    except ValueError:
        return None


def settings_facts(store: str, row: Sequence[Any] | None) -> StoreFacts:
    """The facts of a PostgreSQL server from the row of ``SETTINGS_QUERY`` (``None``: unread)."""
    if row is None:
        why = "could not be read"
        names = ("synchronous_commit", "fsync", "standby", "replicas")
        return StoreFacts(store, tuple(Fact(n, UNKNOWN, Verdict.WARN, why) for n in names))
    sync_commit, fsync, standby, standby_names, replicas = row
    facts = [Fact("synchronous_commit", str(sync_commit))]
    if sync_commit == "off":
        why = (
            "a crash of the server loses the last claims it acknowledged (up to three "
            "wal_writer_delay), and their firings may be sent again; ALTER ROLE ... SET "
            "synchronous_commit = on for the role the nodes use"
        )
        facts[0] = Fact("synchronous_commit", "off", Verdict.WARN, why)
    if fsync == "off":
        why = "a crash of the server's host may lose or corrupt claims; set fsync = on"
        facts.append(Fact("fsync", "off", Verdict.WARN, why))
    else:
        facts.append(Fact("fsync", str(fsync)))
    if standby:
        why = "a standby (in recovery) is read-only: point the URL at the primary"
        facts.append(Fact("standby", "yes", Verdict.REFUSE, why))
    else:
        facts.append(Fact("standby", "no"))
    count = int(replicas or 0)
    if count and not standby_names:
        why = (
            "replication is asynchronous (synchronous_standby_names is empty): a standby "
            "promoted by a failover may lack the last claims, and their firings may be sent "
            "again"
        )
        facts.append(Fact("replicas", str(count), Verdict.WARN, why))
    else:
        sync = f" (synchronous: {standby_names})" if count and standby_names else ""
        facts.append(Fact("replicas", f"{count}{sync}"))
    return StoreFacts(store, tuple(facts))


class ServerWatch:
    """The part of :class:`~beatless.stores.postgres.store.PostgresStore` that reads the
    server's settings and follows its timeline (a promoted standby starts a new one)."""

    _where: str
    schema: str
    namespace: str
    _timeline: int | None
    _forgot_before_ms: int | None
    _statements: Any
    _driver: ModuleType

    if TYPE_CHECKING:  # the store's own, which these methods call

        def _row(
            self, what: str, query: sql.Composed | sql.SQL, args: Sequence[Any]
        ) -> tuple[Any, ...]: ...

        def time_ms(self) -> int: ...

    def facts(self) -> StoreFacts:
        """``synchronous_commit``, ``fsync``, whether the server is a standby
        (``pg_is_in_recovery()``) and its replicas (``pg_stat_replication``,
        ``synchronous_standby_names``), in one round trip."""
        try:
            row = self._row("read its settings", self._driver.sql.SQL(SETTINGS_QUERY), ())
        except StoreError:
            row = None
        if row is not None:
            self._follow_timeline(timeline_of(row[5]))
        return settings_facts(f"postgres store {self._where}", row and row[:5])

    def _follow_timeline(self, timeline: int | None) -> None:
        """Note the server's timeline (read with its facts, at start and every sync); a
        new one is a promoted standby (or a restore to a point in time), which may lack
        the last claims: from now plus the tolerance back, the firings nobody holds are
        answered forgotten, as after a lost epoch (see docs/stores.md, "Failover").

        The latest timeline any node of the namespace saw is kept in the store
        (``timeline_v1``), so a node that starts on a promoted standby compares the
        server's timeline with the one the fleet saw before, not only with its own."""
        if timeline is None:
            return
        seen, self._timeline = self._timeline, timeline
        if seen is None or timeline != seen:
            recorded = self._record_timeline(timeline)
            seen = recorded if seen is None else seen
        if seen is None or timeline == seen:
            return
        try:
            horizon = self.time_ms() + TOLERANCE_MS
        except StoreError:
            horizon = int(time.time() * 1_000) + TOLERANCE_MS
        self._forgot_before_ms = max(self._forgot_before_ms or 0, horizon)
        logger.warning(
            "postgres store %s (schema %s, namespace %s): the server's timeline changed "
            "from %d to %d: a standby was promoted (or the database restored), and it may "
            "lack the last claims of the old primary; firings released before %d ms that "
            "nobody holds are written committed and reported forgotten, not enqueued",
            shown(self._where, quoted=False),
            shown(self.schema),
            shown(self.namespace),
            seen,
            timeline,
            horizon,
        )

    def _record_timeline(self, timeline: int) -> int | None:
        """Record ``timeline`` as the namespace's latest; the one recorded before (``None``:
        none, or the store could not be asked)."""
        try:
            row = self._row(
                "record its timeline", self._statements.timeline, (self.namespace, timeline)
            )
        except StoreError:
            return None
        return None if row[0] is None else int(row[0])
